//! The web dashboard: three static files compiled into the binary and served by the API's
//! front door without a token — they hold no data; the page asks the API (`/v1/...`) for
//! everything, with the bearer token the user gives it, which stays in the browser tab.
//!
//! Invariants: the page writes what the API answers into the DOM as text, never as markup
//! (job names, failure causes and component names are written by tenants), and every asset
//! is served with a Content-Security-Policy that lets only this origin's own script and
//! style run and forbids framing — so a tenant's text cannot become script, and the page
//! cannot be framed to click its buttons.

/// One static file.
#[derive(Debug, Clone, Copy)]
pub struct Asset {
    /// Its media type.
    pub content_type: &'static str,
    /// Its bytes.
    pub body: &'static [u8],
}

/// Sent with every asset.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data:; form-action 'none'; frame-ancestors 'none'; base-uri 'none'";

const INDEX: Asset = Asset { content_type: "text/html; charset=utf-8", body: include_bytes!("dashboard/index.html") };

/// The asset at `path`, if it is one (`/` and `/ui/` are the page).
pub fn asset(path: &str) -> Option<Asset> {
    match path {
        "/" | "/ui" | "/ui/" | "/ui/index.html" => Some(INDEX),
        "/ui/app.js" => {
            Some(Asset { content_type: "text/javascript; charset=utf-8", body: include_bytes!("dashboard/app.js") })
        }
        "/ui/app.css" => {
            Some(Asset { content_type: "text/css; charset=utf-8", body: include_bytes!("dashboard/app.css") })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_script_and_style() {
        let page = std::str::from_utf8(asset("/ui/").unwrap().body).unwrap();
        assert!(page.contains(r#"<script src="/ui/app.js"></script>"#));
        assert!(page.contains(r#"href="/ui/app.css""#));
        // No inline script or handler: the policy would block it, and tenant text must never
        // be able to add one.
        assert_eq!(page.matches("<script").count(), 1);
        assert!(!page.contains(" onclick=") && !page.contains("javascript:"));
        assert!(asset("/ui/app.js").is_some() && asset("/ui/app.css").is_some());
        assert!(asset("/ui/../Cargo.toml").is_none() && asset("/v1/jobs").is_none());
    }

    #[test]
    fn the_script_never_writes_markup() {
        let js = std::str::from_utf8(asset("/ui/app.js").unwrap().body).unwrap();
        for sink in ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("] {
            assert!(!js.contains(sink), "app.js uses {sink}");
        }
    }
}
