//! The files `weir new` writes, per language: pure text, filled from the templates in
//! `templates/` (compiled into the binary, so `weir new` works wherever `weir` is installed).

use std::path::{Path, PathBuf};

use super::{Language, Manifest};

const JOB: &str = include_str!("templates/common/job.toml");
const INPUT: &str = include_str!("templates/common/input.txt");
const EXPECTED: &str = include_str!("templates/common/expected.txt");
const TEST: &str = include_str!("templates/common/test.sh");
const GITIGNORE: &str = include_str!("templates/common/gitignore");
const README: &str = include_str!("templates/common/README.md");
const RUST_CARGO: &str = include_str!("templates/rust/Cargo.toml.tmpl");
const RUST_CONFIG: &str = include_str!("templates/rust/cargo-config.toml.tmpl");
const RUST_LIB: &str = include_str!("templates/rust/lib.rs");
const C_OPERATOR: &str = include_str!("templates/c/operator.c");
const JS_OPERATOR: &str = include_str!("templates/js/operator.js");
const PY_APP: &str = include_str!("templates/python/app.py");

/// A TOML basic string holding `s` (quotes and escapes included).
fn toml_string(s: &str) -> String {
    toml::Value::String(s.into()).to_string()
}

/// Every file of a new project for `name` in `language` against the SDK at `sdk`, as
/// (path relative to the project, contents).
pub fn files(name: &str, language: Language, sdk: &Path) -> Vec<(PathBuf, String)> {
    let guest_sdk = sdk.join("guest-sdk");
    let guide = sdk.join(language.guide());
    let fill = |t: &str| {
        t.replace("{{name}}", name)
            .replace("{{language}}", language.name())
            .replace("{{guide}}", &guide.display().to_string())
            .replace("{{sdk_guest_sdk}}", &toml_string(&guest_sdk.display().to_string()))
    };
    let manifest = Manifest { name: name.into(), language, sdk: Some(sdk.into()) };
    let mut out: Vec<(PathBuf, String)> = vec![
        ("operator.toml".into(), manifest.to_toml()),
        ("job.toml".into(), fill(JOB)),
        ("input.txt".into(), INPUT.into()),
        ("expected/out.txt".into(), EXPECTED.into()),
        ("test.sh".into(), TEST.into()),
        (".gitignore".into(), GITIGNORE.into()),
        ("README.md".into(), fill(README)),
    ];
    match language {
        Language::Rust => {
            out.push(("Cargo.toml".into(), fill(RUST_CARGO)));
            out.push((".cargo/config.toml".into(), RUST_CONFIG.into()));
            out.push(("src/lib.rs".into(), fill(RUST_LIB)));
        }
        Language::C => out.push(("operator.c".into(), fill(C_OPERATOR))),
        Language::Js => out.push(("operator.js".into(), fill(JS_OPERATOR))),
        Language::Python => out.push(("app.py".into(), fill(PY_APP))),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_sdk_path_with_quotes_stays_valid_toml() {
        let files = files("x", Language::Rust, Path::new("/a \"b\"\\c"));
        let cargo = &files.iter().find(|(p, _)| p == Path::new("Cargo.toml")).unwrap().1;
        let v: toml::Table = toml::from_str(cargo).unwrap();
        assert_eq!(v["dependencies"]["weir-guest"]["path"].as_str(), Some("/a \"b\"\\c/guest-sdk"));
    }
}
