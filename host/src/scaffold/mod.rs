//! Operator projects outside the Weir repository: `weir new` writes one ([`new`]), `weir
//! build` turns it into a component ([`build`]).
//!
//! A project is a directory with an `operator.toml` ([`manifest::Manifest`]: name, language,
//! the Weir checkout whose SDK it uses), the operator's source, a job file running it on a
//! sample input, the expected output and a `test.sh` that builds, runs and compares. Every
//! language builds to the same place, `build/<name>.wasm`, which the job file names.
//!
//! Invariant: `weir new` never overwrites a file; what it writes builds and passes its own
//! test with nothing but `weir` and the SDK checkout (the `newcomer_` tests check all four
//! languages in a directory outside the repository).

pub mod build;
pub mod manifest;
pub mod template;

use std::path::{Path, PathBuf};

pub use manifest::{Language, Manifest};

/// Why a project could not be created or built.
#[derive(Debug, thiserror::Error)]
pub enum ScaffoldError {
    /// The operator name is not usable as a directory, crate and module name.
    #[error(
        "`{0}` cannot name an operator: use 1 to 64 lower-case letters, digits, `-` or `_`, starting with a letter (e.g. `my-counter`)"
    )]
    BadName(String),
    /// The target directory exists and is not empty.
    #[error("{0} already exists and is not empty: pick another name or directory (weir new never overwrites files)")]
    NotEmpty(PathBuf),
    /// No Weir SDK where one was expected.
    #[error("no Weir SDK at {0} (it needs guest-sdk/ and wit/): pass --sdk DIR with a Weir checkout, or set WEIR_SDK")]
    NoSdk(PathBuf),
    /// `operator.toml` is missing or malformed.
    #[error("{path}: {reason}")]
    Manifest {
        /// The manifest.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The language's toolchain failed.
    #[error("building {name} ({language}) failed: {reason}")]
    Build {
        /// Operator name.
        name: String,
        /// Its language.
        language: Language,
        /// What went wrong, with the toolchain's own output.
        reason: String,
    },
}

/// The Weir checkout this binary was built from (its SDKs and WIT contract), unless moved.
pub fn built_in_sdk() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

/// The SDK to use: `explicit` (`--sdk`), else `$WEIR_SDK`, else `recorded` (the project's
/// manifest), else [`built_in_sdk`]; checked to hold `guest-sdk/` and `wit/`, made absolute.
pub fn resolve_sdk(explicit: Option<&Path>, recorded: Option<&Path>) -> Result<PathBuf, ScaffoldError> {
    let from_env = std::env::var_os("WEIR_SDK").map(PathBuf::from);
    let dir =
        explicit.map(Path::to_path_buf).or(from_env).or(recorded.map(Path::to_path_buf)).unwrap_or_else(built_in_sdk);
    if !dir.join("guest-sdk").is_dir() || !dir.join("wit").is_dir() {
        return Err(ScaffoldError::NoSdk(dir));
    }
    std::fs::canonicalize(&dir).map_err(|source| ScaffoldError::Io { path: dir, source })
}

/// Checks an operator name: `[a-z][a-z0-9_-]{0,63}`.
pub fn check_name(name: &str) -> Result<(), ScaffoldError> {
    let ok = name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if ok { Ok(()) } else { Err(ScaffoldError::BadName(name.into())) }
}

/// Creates the project for operator `name` in `language` at `dir` (which must not exist or
/// be empty), using the SDK at `sdk`; returns the files written, relative to `dir`.
pub fn new(dir: &Path, name: &str, language: Language, sdk: &Path) -> Result<Vec<PathBuf>, ScaffoldError> {
    check_name(name)?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ScaffoldError::Io { path, source }
    };
    if dir.exists() {
        let mut entries = std::fs::read_dir(dir).map_err(io(dir))?;
        if entries.next().is_some() {
            return Err(ScaffoldError::NotEmpty(dir.into()));
        }
    }
    let files = template::files(name, language, sdk);
    for (rel, text) in &files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::write(&path, text).map_err(io(&path))?;
        if rel.extension().is_some_and(|e| e == "sh") {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).map_err(io(&path))?;
        }
    }
    Ok(files.into_iter().map(|(p, _)| p).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for ok in ["a", "my-counter", "count_2", &"a".repeat(64)] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "2x", "My", "a b", "a/b", "../x", "-a", &"a".repeat(65), "é"] {
            assert!(matches!(check_name(bad), Err(ScaffoldError::BadName(_))), "{bad}");
        }
    }

    #[test]
    fn new_refuses_a_non_empty_directory_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("keep.txt"), "mine").unwrap();
        let err = new(dir.path(), "x", Language::Python, &built_in_sdk()).unwrap_err();
        assert!(matches!(err, ScaffoldError::NotEmpty(_)), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn every_language_gets_a_manifest_a_job_an_input_and_a_test() {
        for lang in Language::ALL {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("op");
            let files = new(&p, "my-op", lang, Path::new("/sdk")).unwrap();
            for f in ["operator.toml", "job.toml", "input.txt", "expected/out.txt", "test.sh", ".gitignore"] {
                assert!(files.contains(&PathBuf::from(f)), "{lang}: {f} in {files:?}");
            }
            let m = Manifest::read(&p).unwrap();
            assert_eq!((m.name.as_str(), m.language, m.sdk.as_deref()), ("my-op", lang, Some(Path::new("/sdk"))));
            let job = std::fs::read_to_string(p.join("job.toml")).unwrap();
            assert!(job.contains("component = \"build/my-op.wasm\""), "{job}");
            assert!(!files.iter().any(|f| std::fs::read_to_string(p.join(f)).unwrap().contains("{{")), "{lang}");
        }
    }
}
