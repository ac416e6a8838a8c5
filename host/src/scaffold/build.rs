//! `weir build`: a project's source into `build/<name>.wasm`, with the toolchain of its
//! language (each installs itself on first use, like the repository's own tests), then loaded
//! and described by the host so a project that builds is one Weir will run.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{Language, Manifest, ScaffoldError, resolve_sdk};
use crate::sandbox::instance::LoadedComponent;

/// What `weir build` made.
pub struct Built {
    /// The component.
    pub path: PathBuf,
    /// What it declares (`describe`), as the host read it.
    pub component: LoadedComponent,
}

/// Builds the project in `dir` against `sdk` (or the SDK its manifest records; see
/// [`resolve_sdk`]).
pub fn build(dir: &Path, sdk: Option<&Path>) -> Result<Built, ScaffoldError> {
    let m = Manifest::read(dir)?;
    let sdk = resolve_sdk(sdk, m.sdk.as_deref())?;
    let dir = std::fs::canonicalize(dir).map_err(|source| ScaffoldError::Io { path: dir.into(), source })?;
    let out_dir = dir.join("build");
    std::fs::create_dir_all(&out_dir).map_err(|source| ScaffoldError::Io { path: out_dir.clone(), source })?;
    let out = out_dir.join(format!("{}.wasm", m.name));
    let fail = |reason: String| ScaffoldError::Build { name: m.name.clone(), language: m.language, reason };
    match m.language {
        Language::Rust => rust(&dir, &out).map_err(fail)?,
        Language::C => script(&sdk.join("guest-sdk/c/build.sh"), &[&dir.join("operator.c"), &out]).map_err(fail)?,
        Language::Js => {
            let stage = stage_js(&dir, &sdk).map_err(fail)?;
            script(&sdk.join("guest-sdk/js/build.sh"), &[&stage.join("operator.js"), &out, &stage]).map_err(fail)?
        }
        Language::Python => {
            script(&sdk.join("guest-sdk/python/build.sh"), &[&dir.join("app.py"), &out]).map_err(fail)?
        }
    }
    let engine = crate::sandbox::engine::new_engine().map_err(|e| fail(format!("{e:#}")))?;
    let component = LoadedComponent::load(&engine, &m.name, &out).map_err(|e| fail(e.to_string()))?;
    Ok(Built { path: out, component })
}

/// Runs a build script of the SDK with `args`; its messages go to our stderr.
fn script(script: &Path, args: &[&Path]) -> Result<(), String> {
    if let Some(src) = args.first().filter(|a| !a.exists()) {
        return Err(format!("{} not found (weir new writes it; did it move?)", src.display()));
    }
    let status = Command::new("bash")
        .arg(script)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .map_err(|e| format!("cannot run bash {}: {e}", script.display()))?;
    if status.success() { Ok(()) } else { Err(format!("{} {status} (its messages are above)", script.display())) }
}

/// The JavaScript componentizer resolves imports inside one module root: the project's
/// top-level `.js` files and the SDK's `weir.js` are staged into `build/.js/` together.
fn stage_js(dir: &Path, sdk: &Path) -> Result<PathBuf, String> {
    let stage = dir.join("build/.js");
    let _ = std::fs::remove_dir_all(&stage);
    std::fs::create_dir_all(&stage).map_err(|e| format!("{}: {e}", stage.display()))?;
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for e in entries.flatten() {
        let p = e.path();
        if p.is_file() && p.extension().is_some_and(|x| x == "js") {
            std::fs::copy(&p, stage.join(e.file_name())).map_err(|e| format!("{}: {e}", p.display()))?;
        }
    }
    let weir_js = sdk.join("guest-sdk/js/weir.js");
    std::fs::copy(&weir_js, stage.join("weir.js")).map_err(|e| format!("{}: {e}", weir_js.display()))?;
    Ok(stage)
}

/// `cargo build --release --target wasm32-unknown-unknown`, then the artifact copied to `out`.
fn rust(dir: &Path, out: &Path) -> Result<(), String> {
    // Installs the target when rustup manages the toolchain (a no-op when it is there).
    let _ = Command::new("rustup")
        .args(["target", "add", "wasm32-unknown-unknown"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(&cargo)
        .args(["build", "--release", "--target", "wasm32-unknown-unknown", "--message-format=json-render-diagnostics"])
        .arg("--manifest-path")
        .arg(dir.join("Cargo.toml"))
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo: {e} (install Rust with rustup)"))?;
    if !output.status.success() {
        return Err(format!("cargo build {} (its messages are above)", output.status));
    }
    let artifact = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact")
        .flat_map(|v| v["filenames"].as_array().cloned().unwrap_or_default())
        .filter_map(|f| f.as_str().map(PathBuf::from))
        .rfind(|f| f.extension().is_some_and(|x| x == "wasm"))
        .ok_or("cargo built no .wasm: is the crate a `cdylib` ([lib] crate-type = [\"cdylib\"])?")?;
    std::fs::copy(&artifact, out).map_err(|e| format!("{} -> {}: {e}", artifact.display(), out.display()))?;
    Ok(())
}
