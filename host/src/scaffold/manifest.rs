//! `operator.toml`: what `weir build` needs to know about a project.
//!
//! ```toml
//! [operator]
//! name = "my-counter"       # the component lands in build/<name>.wasm
//! language = "rust"         # rust | c | js | python
//! sdk = "/path/to/weir"     # the Weir checkout whose SDK and WIT it builds against
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::ScaffoldError;

/// The languages Weir has an SDK for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// `weir-guest` (guest-sdk/), built with cargo for wasm32-unknown-unknown.
    Rust,
    /// guest-sdk/c, built with clang for wasm32-wasi and `wasm-tools component new`.
    C,
    /// guest-sdk/js, built with componentize-qjs (QuickJS).
    Js,
    /// guest-sdk/python, built with componentize-py.
    Python,
}

impl Language {
    /// Every language, in the order the docs list them.
    pub const ALL: [Language; 4] = [Language::Rust, Language::C, Language::Js, Language::Python];

    /// The name used in `operator.toml` and `--lang`.
    pub fn name(self) -> &'static str {
        match self {
            Language::Rust => "rust",
            Language::C => "c",
            Language::Js => "js",
            Language::Python => "python",
        }
    }

    /// The guide in the SDK checkout.
    pub fn guide(self) -> &'static str {
        match self {
            Language::Rust => "docs/operators/rust.md",
            Language::C => "docs/operators/c.md",
            Language::Js => "docs/operators/js.md",
            Language::Python => "docs/operators/python.md",
        }
    }
}

impl fmt::Display for Language {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Language {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "rust" | "rs" => Ok(Language::Rust),
            "c" => Ok(Language::C),
            "js" | "javascript" => Ok(Language::Js),
            "python" | "py" => Ok(Language::Python),
            other => Err(format!("no SDK for `{other}`: use rust, c, js or python")),
        }
    }
}

/// A project's `operator.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Operator name (also the component's file name).
    pub name: String,
    /// Its language.
    pub language: Language,
    /// The Weir checkout it builds against (`--sdk` and `$WEIR_SDK` override it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sdk: Option<PathBuf>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    operator: Manifest,
}

/// The manifest's file name.
pub const FILE: &str = "operator.toml";

/// Bigger than any manifest (it is three lines).
const MAX_BYTES: u64 = 64 << 10;

impl Manifest {
    /// Reads `<dir>/operator.toml`.
    pub fn read(dir: &Path) -> Result<Manifest, ScaffoldError> {
        let path = dir.join(FILE);
        let bad = |reason: String| ScaffoldError::Manifest { path: path.clone(), reason };
        let meta = std::fs::metadata(&path).map_err(|e| {
            bad(if e.kind() == std::io::ErrorKind::NotFound {
                "not found: run `weir build` in a project made by `weir new` (or pass its directory)".into()
            } else {
                e.to_string()
            })
        })?;
        if meta.len() > MAX_BYTES {
            return Err(bad(format!("{} bytes; a manifest is at most {MAX_BYTES}", meta.len())));
        }
        let text = std::fs::read_to_string(&path).map_err(|e| bad(e.to_string()))?;
        let f: File = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
        super::check_name(&f.operator.name).map_err(|e| bad(e.to_string()))?;
        Ok(f.operator)
    }

    /// The file's text, with a comment saying what it is.
    pub fn to_toml(&self) -> String {
        let body = toml::to_string(&File { operator: self.clone() }).expect("a manifest always serializes");
        format!("# How `weir build` builds this operator (written by `weir new`).\n{body}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_round_trips_and_unknown_fields_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let m = Manifest { name: "a-b".into(), language: Language::Js, sdk: Some("/x y/\"q\"".into()) };
        std::fs::write(dir.path().join(FILE), m.to_toml()).unwrap();
        assert_eq!(Manifest::read(dir.path()).unwrap(), m);
        std::fs::write(dir.path().join(FILE), "[operator]\nname = \"a\"\nlanguage = \"go\"\n").unwrap();
        let e = Manifest::read(dir.path()).unwrap_err().to_string();
        assert!(e.contains("operator.toml") && e.contains("go"), "{e}");
        let e = Manifest::read(&dir.path().join("nowhere")).unwrap_err().to_string();
        assert!(e.contains("weir new"), "{e}");
    }

    #[test]
    fn languages_parse_by_their_usual_names() {
        for (s, l) in
            [("rust", Language::Rust), ("C", Language::C), ("javascript", Language::Js), ("py", Language::Python)]
        {
            assert_eq!(s.parse::<Language>().unwrap(), l);
        }
        assert!("go".parse::<Language>().unwrap_err().contains("rust, c, js or python"));
    }
}
