//! The `weir` command line: the binary edge (anyhow lives here only).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use weir::job;
use weir::runtime::executor::{self, RunOptions, human};
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
    },
    /// Check a job file and its components without running it.
    Validate {
        /// The job file.
        job: PathBuf,
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
            let engine = new_engine()
                .map_err(|e| anyhow::anyhow!("{e:#}"))
                .context("starting the WebAssembly engine")?;
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
                        c.info.name,
                        c.info.version,
                        c.info.schema_version,
                        if c.info.two_input { "two" } else { "one" }
                    ),
                    None => println!("  {} x{}", n.id, n.parallelism),
                }
            }
            Ok(())
        }
        Command::Run {
            job,
            progress,
            quiet_guests,
        } => {
            let graph = job::load(&job)?;
            let engine = new_engine()
                .map_err(|e| anyhow::anyhow!("{e:#}"))
                .context("starting the WebAssembly engine")?;
            let bound = job::bind::bind(&engine, graph)?;
            eprintln!(
                "running job `{}` ({} subtasks)",
                bound.graph.name,
                bound.graph.nodes.iter().map(|n| n.parallelism).sum::<u32>()
            );
            let opts = RunOptions {
                progress: (progress > 0.0).then(|| Duration::from_secs_f64(progress)),
                quiet_guests,
            };
            let summary = executor::run(&bound, &opts)?;
            let secs = summary.elapsed.as_secs_f64().max(1e-9);
            eprintln!("job `{}` finished in {:.2}s", bound.graph.name, secs);
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
