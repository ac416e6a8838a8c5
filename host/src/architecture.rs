//! The module layering `ARCHITECTURE.md` claims, checked against the source: a module uses
//! only modules of lower layers (never one of its own layer, never one above), so the
//! physical plan, the protocol and the sandbox stay separable from where they are deployed.
//!
//! Doc comments and `#[cfg(test)]` modules are not dependencies (a unit test may build its
//! input with a higher layer's parser).

/// Layers, lowest first. A module may use modules of lower layers only.
const LAYERS: &[&[&str]] = &[
    &["ids", "record", "keygroup", "declared", "disk_budget", "pem", "logging", "io_runtime"],
    &["graph"],
    &["checkpoint"],
    &["sandbox"],
    &["operator", "connectors"],
    &["job"],
    &["runtime"],
    &["scaffold", "cluster"],
    &["api", "bench"],
];

/// Modules restricted further than their layer: (module, the only modules it may use).
const ONLY: &[(&str, &[&str])] = &[("scaffold", &["sandbox"])];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The `crate::<module>` paths a source file names outside comments and test modules.
fn uses(src: &str) -> Vec<String> {
    let code = src.split("#[cfg(test)]").next().unwrap_or("");
    let mut out = Vec::new();
    for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let name: String = rest.chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

/// Every violation under `src`: (file, used module, why).
fn violations(src: &std::path::Path) -> Vec<String> {
    let mut bad = Vec::new();
    let mut files = vec![src.to_path_buf()];
    while let Some(p) = files.pop() {
        if p.is_dir() {
            files.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        if p.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let rel = p.strip_prefix(src).unwrap();
        let first = rel.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
        let module = first.trim_end_matches(".rs").to_string();
        let Some(own) = layer(&module) else { continue };
        let text = std::fs::read_to_string(&p).unwrap();
        for used in uses(&text) {
            if used == module {
                continue;
            }
            let why = match (layer(&used), ONLY.iter().find(|(m, _)| *m == module)) {
                (None, _) => Some("a module missing from the layer table".to_string()),
                (_, Some((_, allowed))) if !allowed.contains(&used.as_str()) => {
                    Some(format!("`{module}` may use only {allowed:?}"))
                }
                (Some(l), _) if l >= own => Some(format!("layer {l} used from layer {own}")),
                _ => None,
            };
            if let Some(why) = why {
                bad.push(format!("{}: uses `crate::{used}` ({why})", rel.display()));
            }
        }
    }
    bad.sort();
    bad.dedup();
    bad
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_dependencies_point_one_way() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let bad = violations(&src);
        assert!(bad.is_empty(), "dependencies against ARCHITECTURE.md's layering:\n{}", bad.join("\n"));
    }

    #[test]
    fn arch_the_check_sees_an_upward_use_and_ignores_comments_and_tests() {
        let src = "//! see crate::runtime\nuse crate::graph::logical::JobGraph;\nfn f() { crate::runtime::x(); }\n\
                   #[cfg(test)]\nmod tests { use crate::job::parse; }\n";
        assert_eq!(uses(src), ["graph", "runtime"]);
        assert!(layer("runtime") > layer("checkpoint"));
    }
}
