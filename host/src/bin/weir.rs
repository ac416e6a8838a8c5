//! The `weir` command line: the binary edge (anyhow lives here only).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use weir::checkpoint::storage::{self, CheckpointStore};
use weir::job;
use weir::runtime::executor::{self, RestoreFrom, RunOptions, human};
use weir::sandbox::engine::new_engine;

/// Weir runs stream processing jobs whose operators are sandboxed WebAssembly components.
///
/// A job file (TOML) names sources, WASM operators and sinks and how records flow between
/// them. Start with the wordcount example:
///
///   cargo build --profile guest --target wasm32-unknown-unknown -p wordcount-tokenizer -p wordcount-counter
///   weir run examples/wordcount/job.toml
///
/// See README.md for the job file reference and how to write operators.
#[derive(Parser)]
#[command(name = "weir", version, verbatim_doc_comment)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a job until its sources are exhausted, printing throughput per node.
    Run {
        /// The job file.
        job: PathBuf,
        /// Seconds between progress lines (0 = none).
        #[arg(long, default_value_t = 1.0)]
        progress: f64,
        /// Do not echo operators' log lines.
        #[arg(long)]
        quiet_guests: bool,
        /// Resume from a checkpoint: `latest` (newest complete one in the job's checkpoint
        /// directory; torn or corrupt ones are skipped with a warning) or a `chk-<id>` directory.
        #[arg(long, value_name = "latest|CHK_DIR")]
        restore: Option<String>,
        /// Drop checkpointed state of operators the job no longer has (otherwise an error).
        #[arg(long)]
        allow_non_restored_state: bool,
    },
    /// List or inspect checkpoints.
    Checkpoints {
        #[command(subcommand)]
        command: CheckpointsCommand,
    },
    /// Check a job file and its components without running it.
    Validate {
        /// The job file.
        job: PathBuf,
    },
}

#[derive(Subcommand)]
enum CheckpointsCommand {
    /// List the checkpoints in DIR (a job's checkpoint directory, or the `[checkpoint] dir`
    /// holding one directory per job), marking which are complete.
    List {
        /// The directory.
        dir: PathBuf,
    },
    /// Show a checkpoint's manifest and verify every file's checksum.
    Inspect {
        /// A `chk-<id>` directory.
        chk_dir: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match real_main(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn real_main(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Validate { job } => {
            let graph = job::load(&job)?;
            let engine =
                new_engine().map_err(|e| anyhow::anyhow!("{e:#}")).context("starting the WebAssembly engine")?;
            let bound = job::bind::bind(&engine, graph)?;
            let g = &bound.graph;
            println!(
                "job `{}` is valid: {} nodes, {} edges, max_parallelism {}",
                g.name,
                g.nodes.len(),
                g.edges.len(),
                g.max_parallelism
            );
            for (i, n) in g.nodes.iter().enumerate() {
                match bound.components.get(&i) {
                    Some(c) => println!(
                        "  {} x{}: {} {} (state schema {}, {}-input)",
                        n.id,
                        n.parallelism,
                        c.info().name,
                        c.info().version,
                        c.info().schema_version,
                        if c.info().two_input { "two" } else { "one" }
                    ),
                    None => println!("  {} x{}", n.id, n.parallelism),
                }
            }
            Ok(())
        }
        Command::Checkpoints { command: CheckpointsCommand::List { dir } } => list_checkpoints(&dir),
        Command::Checkpoints { command: CheckpointsCommand::Inspect { chk_dir } } => inspect(&chk_dir),
        Command::Run { job, progress, quiet_guests, restore, allow_non_restored_state } => {
            let graph = job::load(&job)?;
            let engine =
                new_engine().map_err(|e| anyhow::anyhow!("{e:#}")).context("starting the WebAssembly engine")?;
            let bound = job::bind::bind(&engine, graph)?;
            for w in &bound.warnings {
                eprintln!("warning: {w}");
            }
            eprintln!(
                "running job `{}` ({} subtasks)",
                bound.graph.name,
                bound.graph.nodes.iter().map(|n| n.parallelism).sum::<u32>()
            );
            let opts = RunOptions {
                progress: (progress > 0.0).then(|| Duration::from_secs_f64(progress)),
                quiet_guests,
                restore: restore.map(|r| if r == "latest" { RestoreFrom::Latest } else { RestoreFrom::Path(r.into()) }),
                allow_non_restored_state,
                faults: None,
            };
            let summary = executor::run(&bound, &opts)?;
            let secs = summary.elapsed.as_secs_f64().max(1e-9);
            eprintln!(
                "job `{}` finished in {:.2}s ({} attempt(s), {} checkpoint(s){})",
                bound.graph.name,
                secs,
                summary.attempts,
                summary.checkpoints,
                summary.restored_from.map(|c| format!(", restored from checkpoint {c}")).unwrap_or_default()
            );
            for n in &summary.nodes {
                eprintln!(
                    "  {:<16} in {:>12} ({:>8}/s)  out {:>12} ({:>8}/s)",
                    n.id.as_str(),
                    n.records_in,
                    human(n.records_in as f64 / secs),
                    n.records_out,
                    human(n.records_out as f64 / secs)
                );
            }
            Ok(())
        }
    }
}

fn list_checkpoints(dir: &std::path::Path) -> Result<()> {
    anyhow::ensure!(dir.is_dir(), "{} is not a directory", dir.display());
    let has_chk = |d: &std::path::Path| {
        std::fs::read_dir(d)
            .map(|r| r.flatten().any(|e| e.file_name().to_string_lossy().starts_with("chk-")))
            .unwrap_or(false)
    };
    let mut roots = Vec::new();
    if has_chk(dir) {
        roots.push(dir.to_path_buf());
    } else {
        for e in std::fs::read_dir(dir)?.flatten() {
            if e.path().is_dir() && has_chk(&e.path()) {
                roots.push(e.path());
            }
        }
        roots.sort();
    }
    anyhow::ensure!(!roots.is_empty(), "no checkpoints (chk-<id> directories) under {}", dir.display());
    for root in roots {
        println!("{}:", root.display());
        for l in CheckpointStore::at(&root).list() {
            match &l.status {
                Ok(m) => println!(
                    "  chk-{:<6} complete{}  {} operators  {:>10} bytes  {:.1} ms",
                    l.id,
                    if m.finished { " (final)" } else { "" },
                    m.operators.len(),
                    m.metrics.bytes,
                    m.metrics.duration_ms
                ),
                Err(e) => println!("  chk-{:<6} UNUSABLE: {e}", l.id),
            }
        }
    }
    Ok(())
}

fn inspect(dir: &std::path::Path) -> Result<()> {
    let c = storage::load(dir)?;
    let m = &c.manifest;
    println!("checkpoint {} of job `{}` ({})", m.checkpoint_id, m.job, dir.display());
    println!("  format version {}, max_parallelism {}, finished: {}", m.format_version, m.max_parallelism, m.finished);
    println!(
        "  took {:.1} ms: sync max {:.2} ms, async max {:.2} ms, alignment max {:.2} ms, {} bytes",
        m.metrics.duration_ms,
        m.metrics.sync_ms_max,
        m.metrics.async_ms_max,
        m.metrics.alignment_ms_max,
        m.metrics.bytes
    );
    for op in &m.operators {
        let comp = op
            .component
            .as_ref()
            .map(|c| format!(" {} {} (state schema {})", c.name, c.version, c.schema_version))
            .unwrap_or_default();
        println!("  {} `{}` x{}{}", op.kind, op.uid, op.parallelism, comp);
        for s in &op.subtasks {
            let st = &c.states[&(op.uid.clone(), s.index)];
            let mut what = Vec::new();
            if !st.keyed.is_empty() {
                let timers: usize = st.keyed.iter().map(|k| k.event_timers.len() + k.processing_timers.len()).sum();
                what.push(format!("{} key groups, {} timers", st.keyed.len(), timers));
            }
            if !st.operator_state.is_empty() {
                what.push(format!("{} bytes operator state", st.operator_state.len()));
            }
            if let Some(p) = &st.source {
                what.push(format!("position {p:?}"));
            }
            if let Some(k) = &st.sink {
                what.push(format!("next part {}, pending {:?}", k.next_part, k.pending));
            }
            println!(
                "    #{} key groups [{}, {})  {}  {} bytes  crc32 {:08x} ok  {}",
                s.index,
                s.key_groups.0,
                s.key_groups.1,
                s.file,
                s.bytes,
                s.crc32,
                what.join("; ")
            );
        }
    }
    println!("all {} state files verified", c.states.len());
    Ok(())
}
