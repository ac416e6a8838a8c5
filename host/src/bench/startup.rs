//! `weir bench startup`: how long a job takes to start, with and without compiled components
//! on disk. For each language, a fresh `weir new` project is built, then its job (six records)
//! runs in fresh processes: *cold* with an empty compile cache (the component is compiled),
//! *warm* with the cache the previous run filled. Each figure is the whole process, start to
//! exit, so it bounds the time before the first record from above.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use super::{BenchError, BenchOptions, median};
use crate::scaffold::{self, Language};

/// Runs the startup benchmark for `langs`; prints one row per language.
pub fn startup(opts: &BenchOptions, langs: &[Language]) -> Result<(), BenchError> {
    let io = |what: String| move |source| BenchError::Io { what, source };
    let tmp = tempdir()?;
    println!("\n## Job start: `weir run` of a six-record job, process start to exit (median of {})\n", opts.runs);
    println!("| language | component | cold (compiles) | warm (compile cache) | cold / warm |");
    println!("|---|---:|---:|---:|---:|");
    for &lang in langs {
        let dir = tmp.join(lang.name());
        let sdk = scaffold::resolve_sdk(None, None).map_err(|e| check(lang, e.to_string()))?;
        scaffold::new(&dir, "startup", lang, &sdk).map_err(|e| check(lang, e.to_string()))?;
        let built = Command::new(&opts.exe)
            .arg("build")
            .arg(&dir)
            .env("WEIR_COMPILE_CACHE", "off")
            .output()
            .map_err(io(format!("running {} build", opts.exe.display())))?;
        if !built.status.success() {
            return Err(check(lang, format!("weir build failed:\n{}", String::from_utf8_lossy(&built.stderr))));
        }
        let size = std::fs::metadata(dir.join("build/startup.wasm")).map_or(0, |m| m.len());
        let (mut cold, mut warm) = (Vec::new(), Vec::new());
        for round in 0..opts.runs {
            let cache = tmp.join(format!("cache-{}-{round}", lang.name()));
            cold.push(run_once(opts, &dir, &cache, lang)?);
            warm.push(run_once(opts, &dir, &cache, lang)?);
        }
        let (c, w) = (median(cold), median(warm));
        println!("| {lang} | {:.1} MB | {c:.0} ms | {w:.0} ms | {:.0}x |", size as f64 / 1e6, c / w.max(1e-9));
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

fn check(lang: Language, what: String) -> BenchError {
    BenchError::Check { job: format!("startup ({lang})"), what }
}

fn tempdir() -> Result<std::path::PathBuf, BenchError> {
    let tmp = std::env::temp_dir().join(format!("weir-bench-startup-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)
        .map_err(|source| BenchError::Io { what: format!("creating {}", tmp.display()), source })?;
    Ok(tmp)
}

/// One `weir run` of the project's job with the compile cache at `cache`; milliseconds.
fn run_once(opts: &BenchOptions, dir: &Path, cache: &Path, lang: Language) -> Result<f64, BenchError> {
    let _ = std::fs::remove_dir_all(dir.join("out"));
    let _ = std::fs::remove_dir_all(dir.join("checkpoints"));
    let t = Instant::now();
    let out = Command::new(&opts.exe)
        .args(["run", "job.toml", "--progress", "0", "--quiet-guests"])
        .current_dir(dir)
        .env("WEIR_COMPILE_CACHE", cache)
        .output()
        .map_err(|source| BenchError::Io { what: format!("running {}", opts.exe.display()), source })?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    if !out.status.success() {
        return Err(check(lang, format!("weir run failed:\n{}", String::from_utf8_lossy(&out.stderr))));
    }
    Ok(ms)
}
