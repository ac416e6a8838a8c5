//! Shared helpers: building the guest components once, running jobs, reading sink output.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use weir::job;
use weir::runtime::error::RunError;
use weir::runtime::executor::{self, RunOptions, RunSummary};
use weir::sandbox::engine::new_engine;

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

const GUESTS: &[&str] = &[
    "wordcount-tokenizer",
    "wordcount-counter",
    "wordcount-counter-v2",
    "wordcount-counter-v3",
    "enrich-enricher",
    "test-probe",
    "test-wrong-world",
    "test-oracle",
    "test-oracle-v2",
    "test-lists",
    "test-hostile",
    "test-oracle-join",
    "test-loop-oracle",
    "test-windows",
    "iterate-split",
    "iterate-components",
    "bench-kv-store",
    "nexmark-queries",
    "nexmark-stateless",
    "nexmark-joins",
];

/// Builds every guest component once per test run; returns their directory.
pub fn guests() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "--profile", "guest", "--target", "wasm32-unknown-unknown"]).current_dir(root());
        for g in GUESTS {
            cmd.args(["-p", g]);
        }
        let out = cmd.output().expect("running cargo to build the guest components");
        assert!(
            out.status.success(),
            "building the guest components failed (is the target installed? `rustup target add wasm32-unknown-unknown`):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        root().join("target/wasm32-unknown-unknown/guest")
    })
}

/// The WASI-importing test component (built for wasm32-wasip2, once per test run).
pub fn wasi_component() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Command::new(env!("CARGO"))
            .args(["build", "--profile", "guest", "--target", "wasm32-wasip2", "-p", "test-wasi-fs"])
            .current_dir(root())
            .output()
            .expect("running cargo to build the WASI test component");
        assert!(
            out.status.success(),
            "building test-wasi-fs failed (is the target installed? `rustup target add wasm32-wasip2`):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        root().join("target/wasm32-wasip2/guest/test_wasi_fs.wasm")
    })
    .clone()
}

/// A JavaScript operator (`src`, relative to the repository) built into a component once
/// per test run with `guest-sdk/js/build.sh` (which installs the pinned componentizer).
pub fn js_component(src: &str) -> PathBuf {
    sdk_component("js", src)
}

/// A C operator built with `guest-sdk/c/build.sh` (which installs clang, lld and wasi-libc
/// with apt-get, and wasm-tools with pip), once per test run.
pub fn c_component(src: &str) -> PathBuf {
    sdk_component("c", src)
}

/// A Python operator module built with `guest-sdk/python/build.sh` (which installs the pinned
/// componentize-py), once per test run.
pub fn py_component(src: &str) -> PathBuf {
    sdk_component("python", src)
}

fn sdk_component(lang: &str, src: &str) -> PathBuf {
    static BUILT: OnceLock<std::sync::Mutex<std::collections::BTreeMap<String, PathBuf>>> = OnceLock::new();
    let mut built = BUILT.get_or_init(Default::default).lock().unwrap();
    if let Some(p) = built.get(src) {
        return p.clone();
    }
    let name = Path::new(src).parent().unwrap().file_name().unwrap().to_string_lossy().replace('-', "_");
    let out = root().join("target").join(lang).join(format!("{name}.wasm"));
    let run = Command::new("bash")
        .arg(root().join(format!("guest-sdk/{lang}/build.sh")))
        .arg(root().join(src))
        .arg(&out)
        .output()
        .expect("running guest-sdk/js/build.sh");
    assert!(
        run.status.success(),
        "building {src} failed (JavaScript needs node and npm, Python python3 with venv, C apt-get as root):\n{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    built.insert(src.to_string(), out.clone());
    out
}

/// Path of the component built from crate `name` (e.g. `test_probe`).
pub fn component(name: &str) -> PathBuf {
    guests().join(format!("{name}.wasm"))
}

/// A scratch directory.
pub fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("weir-test-").tempdir().unwrap()
}

/// Sorted lines of every committed file under `dir` (files whose name starts with `.` are
/// in progress and skipped).
pub fn committed_lines(dir: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries {
            let e = e.unwrap();
            let p = e.path();
            if e.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            if p.is_dir() {
                stack.push(p);
            } else {
                let text = std::fs::read_to_string(&p).unwrap();
                lines.extend(text.lines().map(str::to_string));
            }
        }
    }
    lines.sort();
    lines
}

/// Validates, binds and runs the job file text `toml` as if it lived in `dir`.
pub fn run_job_in(dir: &Path, toml: &str) -> Result<RunSummary, RunError> {
    let path = dir.join("job.toml");
    std::fs::write(&path, toml).unwrap();
    let graph = job::parse(&path, toml)?;
    let engine = new_engine().unwrap();
    let bound = job::bind::bind(&engine, graph)?;
    executor::run(&bound, &RunOptions { quiet_guests: true, ..Default::default() })
}

/// The `weir` binary, registering its jobs in a registry private to this test run.
pub fn weir() -> Command {
    static HOME: OnceLock<tempfile::TempDir> = OnceLock::new();
    let home = HOME.get_or_init(|| tempfile::Builder::new().prefix("weir-home-").tempdir().unwrap());
    let mut c = Command::new(env!("CARGO_BIN_EXE_weir"));
    c.env("WEIR_HOME", home.path());
    c
}

/// Path as a TOML string literal.
pub fn toml_path(p: &Path) -> String {
    format!("{:?}", p.display().to_string())
}

/// Debian's Chromium for the dashboard test, installed with apt-get on first use (as root),
/// once per test run; its path.
pub fn chromium() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let script = "command -v chromium >/dev/null || { export DEBIAN_FRONTEND=noninteractive; \
             apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 || \
             { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends chromium >/dev/null; }; }; \
             command -v chromium";
        let out = Command::new("bash").args(["-c", script]).output().expect("running bash");
        assert!(
            out.status.success(),
            "installing Chromium failed (apt-get install chromium, as root):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
    .clone()
}

/// Runs an example's `run.sh` (relative to the repository) with this build's `weir`, the guest
/// components built; fails the test unless it exits 0. Its stdout.
pub fn example_script(script: &str) -> String {
    guests();
    let out =
        Command::new("bash").arg(root().join(script)).env("WEIR_BIN", env!("CARGO_BIN_EXE_weir")).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{script} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}
