//! The path of a new user, followed literally: each language guide's first steps (the block
//! after `<!-- newcomer-test -->` in `docs/operators/<lang>.md`) run in a temporary directory
//! outside the repository with `weir` on the PATH: `weir new`, `weir build`, `weir run`, the
//! scaffold's own `test.sh`. The test then compares the output with the scaffold's expected
//! output itself, so neither a broken guide nor a broken `test.sh` can pass.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::{committed_lines, root};

/// The shell block the guide for `lang` marks as its first steps.
fn guide_steps(lang: &str) -> String {
    let path = root().join(format!("docs/operators/{lang}.md"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let after = text
        .split_once("<!-- newcomer-test -->")
        .unwrap_or_else(|| panic!("{} has no `<!-- newcomer-test -->` block", path.display()))
        .1;
    let block = after.split_once("```bash\n").expect("a ```bash block follows the marker").1;
    let block = block.split_once("```").expect("the block is closed").0;
    assert!(
        block.contains("weir new ") && block.contains(&format!("--lang {lang}")),
        "{}: the first steps start from `weir new ... --lang {lang}`:\n{block}",
        path.display()
    );
    block.to_string()
}

/// The project directory a guide's steps created under `dir` (the one with operator.toml).
fn project_in(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("operator.toml").is_file())
        .unwrap_or_else(|| panic!("the guide's steps made no project in {}", dir.display()))
}

fn follows_the_guide(lang: &str) {
    let steps = guide_steps(lang);
    let outside = tempfile::tempdir().unwrap();
    assert!(!outside.path().starts_with(root()), "the project must live outside the repository");
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_weir"));
    let path = format!("{}:{}", bin.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &steps])
        .current_dir(outside.path())
        .env("PATH", path)
        .env("WEIR_HOME", outside.path().join(".weir"))
        .env_remove("WEIR_SDK")
        .output()
        .unwrap();
    let log = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the {lang} guide's steps failed:\n{steps}\n--- output ---\n{log}");
    let project = project_in(outside.path());
    let expected = committed_lines(&project.join("expected"));
    assert_eq!(expected.len(), 6, "the scaffold's expected output: {expected:?}");
    assert_eq!(committed_lines(&project.join("out")), expected, "{lang}: out/ differs from expected/\n{log}");
    assert!(log.contains("ok: out/ matches expected/"), "the scaffold's test.sh ran and passed:\n{log}");
}

#[test]
fn newcomer_rust_guide_scaffolds_builds_and_runs_outside_the_repository() {
    follows_the_guide("rust");
}

#[test]
fn newcomer_c_guide_scaffolds_builds_and_runs_outside_the_repository() {
    follows_the_guide("c");
}

#[test]
fn newcomer_js_guide_scaffolds_builds_and_runs_outside_the_repository() {
    follows_the_guide("js");
}

#[test]
fn newcomer_python_guide_scaffolds_builds_and_runs_outside_the_repository() {
    follows_the_guide("python");
}

#[test]
fn newcomer_build_names_a_missing_manifest_and_new_refuses_a_bad_name() {
    let dir = tempfile::tempdir().unwrap();
    let weir = || Command::new(env!("CARGO_BIN_EXE_weir"));
    let out = weir().arg("build").arg(dir.path()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("operator.toml") && err.contains("weir new"), "{err}");
    let out = weir().args(["new", "My Op", "--lang", "rust"]).current_dir(dir.path()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("cannot name an operator"), "{err}");
    let out = weir().args(["new", "x", "--lang", "go"]).current_dir(dir.path()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("rust, c, js or python"), "{err}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing was written");
}
