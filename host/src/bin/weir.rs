//! The `weir` command line: the binary edge (anyhow lives here only).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use weir::api::client::Client;
use weir::api::registry;
use weir::api::server::{Api, ServedJob};
use weir::checkpoint::storage::{self, CheckpointStore};
use weir::cluster::discovery::Coordinators;
use weir::job;
use weir::logging::LogFormat;
use weir::runtime::executor::{self, RestoreFrom, RunOptions, human};
use weir::runtime::handle::JobHandle;
use weir::sandbox::engine::new_engine;
use weir::scaffold;

/// Weir runs stream processing jobs whose operators are sandboxed WebAssembly components.
///
/// A job file (TOML) names sources, WASM operators and sinks and how records flow between
/// them. Start with an operator of your own, in rust, c, js or python:
///
///   weir new my-counter --lang python
///   cd my-counter && weir build && weir run job.toml    # or: bash test.sh
///
/// See README.md for the job file reference and docs/operators/ for each language.
#[derive(Parser)]
#[command(name = "weir", version, verbatim_doc_comment)]
struct Cli {
    /// Talk to this Weir API (`http://host:port` or `https://host:port`) instead of finding
    /// the job's own API in the local registry ($WEIR_HOME/jobs, default ~/.weir/jobs).
    #[arg(long, global = true, requires = "token")]
    server: Option<String>,
    /// Bearer token for --server.
    #[arg(long, global = true)]
    token: Option<String>,
    /// Trust only this CA (PEM) for an `https://` --server: a private CA or the server's
    /// self-signed certificate. Without it, the usual web roots.
    #[arg(long, global = true, requires = "server")]
    ca_cert: Option<PathBuf>,
    /// The log's format on stderr: `text` for people, `json` (one object per line, with job,
    /// operator and subtask fields) for machines. `WEIR_LOG` filters it (default `info`).
    #[arg(long, global = true, value_parser = ["text", "json"], default_value = "text")]
    log_format: String,
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
        /// Start from a savepoint directory (taken with `weir savepoint` or `weir stop`);
        /// it may have been moved or copied from elsewhere, and the job may have other
        /// parallelism or newer components that migrate the state.
        #[arg(long, value_name = "DIR", conflicts_with = "restore")]
        from_savepoint: Option<PathBuf>,
        /// Drop restored state that no operator claims: of operators the job no longer has,
        /// or states an upgraded component no longer declares (otherwise an error).
        #[arg(long)]
        allow_non_restored_state: bool,
        /// Address of the job's control API (loopback only).
        #[arg(long, default_value = "127.0.0.1:0")]
        api: String,
        /// Write the run's numbers (records, checkpoints, latency, peak memory) to this JSON
        /// file when it finishes (used by `weir bench`).
        #[arg(long, value_name = "FILE")]
        report: Option<PathBuf>,
    },
    /// Run the reference benchmarks (J1 keyed count, J3 large state, end-to-end latency)
    /// from the job files in `examples/bench/`, each configuration in a fresh process, and
    /// print the tables (see docs/benchmarks.md).
    Bench {
        /// `j1`, `j3`, `latency`, `all` (those three), `nexmark` (the queries of
        /// examples/nexmark), `startup` (job start with and without the compile cache,
        /// from fresh `weir new` projects), `backpressure` (checkpoint durations aligned vs
        /// unaligned) or `disk` (J1 and J3 on the disk state backend vs memory).
        #[arg(default_value = "all")]
        scenario: String,
        /// `startup`: the languages (comma-separated: rust, c, js, python).
        #[arg(long, value_delimiter = ',', default_value = "python")]
        lang: Vec<scaffold::Language>,
        /// Directory of j1.toml, j3.toml and latency.toml.
        #[arg(long, default_value = "examples/bench")]
        dir: PathBuf,
        /// Rounds per configuration (the median is reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// J1 records per run (default: the job file's count).
        #[arg(long)]
        records: Option<u64>,
        /// Seconds per latency run.
        #[arg(long, default_value_t = 10)]
        latency_secs: u64,
        /// `nexmark`: events per run.
        #[arg(long, default_value_t = 10_000_000)]
        events: u64,
        /// `nexmark`: only these queries (comma-separated, e.g. q0,q5).
        #[arg(long, value_delimiter = ',')]
        queries: Vec<String>,
        /// `nexmark`: directory of the query job files.
        #[arg(long, default_value = "examples/nexmark")]
        nexmark_dir: PathBuf,
    },
    /// Take a savepoint of a running job.
    Savepoint {
        /// Job name.
        job: String,
        /// Target directory (default: `<checkpoint dir>/<job>/savepoints/sp-<id>`).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// A key's current value in a running job's operator state, read between batches on the
    /// subtask that owns the key (JSON, as the operator's SDK shows it); with --checkpoint,
    /// its value in a checkpoint or savepoint directory instead.
    Query {
        /// Job name (or id, with --server); not with --checkpoint.
        #[arg(required_unless_present = "checkpoint", conflicts_with = "checkpoint")]
        job: Option<String>,
        /// Ask a checkpoint (`chk-N`) or savepoint directory instead of a running job.
        #[arg(long, value_name = "DIR")]
        checkpoint: Option<PathBuf>,
        /// With --checkpoint: the component to ask (default: the one stored with it).
        #[arg(long, requires = "checkpoint")]
        component: Option<PathBuf>,
        /// With --checkpoint: the operator's config, as in its job file (repeatable).
        #[arg(long = "config", value_name = "KEY=VALUE", requires = "checkpoint")]
        config: Vec<String>,
        /// Operator uid.
        #[arg(long)]
        operator: String,
        /// The key (text).
        #[arg(long)]
        key: String,
        /// The keyed state (default: the operator's only keyed state).
        #[arg(long)]
        state: Option<String>,
    },
    /// Take a savepoint, commit the output up to it, and stop the job.
    Stop {
        /// Job name.
        job: String,
        /// Target directory for the savepoint.
        #[arg(long, value_name = "DIR")]
        savepoint: Option<PathBuf>,
    },
    /// Replace an operator's component in a running job, at the next checkpoint barrier,
    /// migrating its state; rolled back if any subtask fails.
    Upgrade {
        /// Job name.
        job: String,
        /// Operator uid.
        #[arg(long)]
        operator: String,
        /// The new component (.wasm).
        #[arg(long)]
        component: PathBuf,
    },
    /// Cancel a running job (nothing more is committed).
    Cancel {
        /// Job name.
        job: String,
    },
    /// Show a running job's status.
    Status {
        /// Job name.
        job: String,
    },
    /// List running jobs.
    List,
    /// Host many tenants' jobs behind one HTTP API (see README, "Server mode").
    Serve {
        /// The server configuration (listen address, data directory, tenants and quotas).
        #[arg(long)]
        config: PathBuf,
    },
    /// Run a job over a cluster of workers (`weir worker`): place its subtasks into their
    /// slots, checkpoint it, and restart it from its newest checkpoint when a worker is lost
    /// (see README, "Cluster").
    Coordinator {
        /// The job files: every job runs on the same workers, each placed into the workers
        /// free for it (a worker runs one job's part at a time) and restarting on its own.
        #[arg(required_unless_present = "serve", num_args = 1..)]
        jobs: Vec<PathBuf>,
        /// Serve tenants instead of running job files: the API `weir serve --config CONFIG`
        /// would serve (tenants, tokens, quotas, uploads, `weir submit`), whose jobs run on
        /// this coordinator's workers. With --etcd, only the leader serves, and the tenants'
        /// jobs are kept in etcd: a standby elected next takes them over under the same ids.
        #[arg(long, value_name = "CONFIG", conflicts_with_all = ["jobs", "restore", "api"])]
        serve: Option<PathBuf>,
        /// Address workers connect to (printed as `listening on ADDR`).
        #[arg(long, default_value = "127.0.0.1:7070")]
        listen: String,
        /// With --etcd: the HOST:PORT workers reach this coordinator at once it leads (what
        /// `weir worker --etcd` reads from etcd); default: --listen, which must then name an
        /// address and port workers can reach (not `0.0.0.0`, not port 0).
        #[arg(long, requires = "etcd")]
        advertise: Option<String>,
        /// File holding the cluster secret (else `WEIR_CLUSTER_SECRET`).
        #[arg(long)]
        secret_file: Option<PathBuf>,
        /// A worker silent this long is lost (its subtasks restart elsewhere).
        #[arg(long, default_value_t = 5000)]
        heartbeat_timeout_ms: u64,
        /// How long an attempt waits for enough slots before the job fails.
        #[arg(long, default_value_t = 300)]
        slot_wait_secs: u64,
        /// Workers that have not built their part of an attempt this long after the
        /// deployment are dropped and the attempt is redeployed (raise it for slow restores).
        #[arg(long, default_value_t = 300)]
        deploy_timeout_secs: u64,
        /// The job first starts once this many workers have registered.
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// Resume from `latest` or a `chk-<id>` / savepoint directory.
        #[arg(long, value_name = "latest|DIR")]
        restore: Option<String>,
        /// Drop restored state that no operator claims.
        #[arg(long)]
        allow_non_restored_state: bool,
        /// High availability: etcd endpoints (`http://HOST:PORT`, comma-separated). The
        /// coordinators of one `--cluster` elect a leader; the others wait as standbys and take
        /// over the job from its newest checkpoint when the leader is gone.
        #[arg(long, value_delimiter = ',')]
        etcd: Vec<String>,
        /// The cluster's name in etcd (with --etcd).
        #[arg(long, default_value = "weir")]
        cluster: String,
        /// With --etcd: a leader that stops renewing its lease is replaced after this long.
        #[arg(long, default_value_t = 10)]
        lease_ttl_secs: u64,
        /// Address of the job's control API (savepoints, stop, cancel, upgrades, state
        /// queries, metrics, dashboard), served by the leader: plain HTTP behind a token kept
        /// in `$WEIR_HOME/jobs/<job>.json`, so keep it on loopback or behind a TLS proxy.
        #[arg(long, default_value = "127.0.0.1:0")]
        api: String,
        #[command(flatten)]
        tls: TlsArgs,
    },
    /// Run subtasks for a coordinator (`weir coordinator`) in a number of slots.
    Worker {
        /// The coordinators' addresses (HOST:PORT), comma-separated (it follows whichever
        /// leads). Or --etcd.
        #[arg(long, required_unless_present = "etcd", conflicts_with = "etcd")]
        coordinator: Option<String>,
        /// Find the leading coordinator in etcd instead (`http://HOST:PORT`, comma-separated):
        /// the address the leader of --cluster advertised, read again whenever it is lost.
        #[arg(long, value_delimiter = ',')]
        etcd: Vec<String>,
        /// The cluster's name in etcd (with --etcd).
        #[arg(long, default_value = "weir", requires = "etcd")]
        cluster: String,
        /// The IP:port peers open channels to, when --listen is `0.0.0.0:PORT`.
        #[arg(long)]
        advertise: Option<String>,
        /// Slices of a job this worker runs.
        #[arg(long, default_value_t = 1)]
        slots: u32,
        /// Address other workers open channels to (port 0: any).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// File holding the cluster secret (else `WEIR_CLUSTER_SECRET`).
        #[arg(long)]
        secret_file: Option<PathBuf>,
        /// Name in logs (default: host and process id).
        #[arg(long)]
        name: Option<String>,
        /// Where shipped components are kept (default: under WEIR_HOME).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Shipped components kept beyond those of the job it runs, at most (MiB; the least
        /// recently used are removed first).
        #[arg(long, default_value_t = 2048)]
        components_max_mb: u64,
        #[command(flatten)]
        tls: TlsArgs,
    },
    /// Submit a job to a server (`--server URL --token T`): uploads its components and input
    /// files, then starts it; prints the job id.
    Submit {
        /// The job file.
        job: PathBuf,
        /// Resume from `latest` (the job's newest checkpoint on the server) or a savepoint
        /// directory (relative to your files on the server).
        #[arg(long, value_name = "latest|DIR")]
        restore: Option<String>,
        /// Drop restored state that no operator claims.
        #[arg(long)]
        allow_non_restored_state: bool,
    },
    /// List or inspect checkpoints.
    Checkpoints {
        #[command(subcommand)]
        command: CheckpointsCommand,
    },
    /// Create an operator project in a new directory NAME (anywhere): a keyed counter in
    /// LANG, a job file running it on a sample input, the expected output and test.sh.
    New {
        /// Operator name, also the directory: lower-case letters, digits, `-`, `_`.
        name: String,
        /// rust, c, js or python.
        #[arg(long, value_name = "LANG")]
        lang: scaffold::Language,
        /// Create the project here instead of ./NAME.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// The Weir checkout whose SDKs to use (default: $WEIR_SDK, else the checkout this
        /// binary was built from).
        #[arg(long, value_name = "DIR")]
        sdk: Option<PathBuf>,
    },
    /// Build the operator project in DIR (default: .) into build/<name>.wasm, installing the
    /// language's toolchain on first use, and check that Weir can load it.
    Build {
        /// The project directory (with operator.toml).
        #[arg(default_value = ".")]
        dir: PathBuf,
        /// The Weir checkout whose SDKs to use (default: $WEIR_SDK, else the one operator.toml names).
        #[arg(long, value_name = "DIR")]
        sdk: Option<PathBuf>,
    },
    /// (Internal) compile a component from stdin into a wasmtime artifact on stdout: the
    /// child process `weir serve` compiles tenants' components in.
    #[command(name = "__compile-component", hide = true)]
    CompileComponent {
        /// The server's engine uses the pooling allocator.
        #[arg(long)]
        pooling: bool,
        /// The server's engine runs without epoch interruption.
        #[arg(long)]
        no_epoch: bool,
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

fn new_project(name: &str, lang: scaffold::Language, dir: Option<PathBuf>, sdk: Option<PathBuf>) -> Result<()> {
    let sdk = scaffold::resolve_sdk(sdk.as_deref(), None)?;
    let dir = dir.unwrap_or_else(|| PathBuf::from(name));
    let files = scaffold::new(&dir, name, lang, &sdk)?;
    println!("created {} ({lang} operator `{name}`, SDK {}):", dir.display(), sdk.display());
    for f in files {
        println!("  {}", f.display());
    }
    println!("next:\n  cd {} && weir build && weir run job.toml    # or: bash test.sh", dir.display());
    println!("guide: {}", sdk.join(lang.guide()).display());
    Ok(())
}

/// `--log-format json`: what the CLI reports goes through the log as events, not as text.
static JSON_LOG: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn json_log() -> bool {
    JSON_LOG.load(std::sync::atomic::Ordering::Relaxed)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let format = if cli.log_format == "json" { LogFormat::Json } else { LogFormat::Text };
    weir::logging::init(format);
    JSON_LOG.store(format == LogFormat::Json, std::sync::atomic::Ordering::Relaxed);
    match real_main(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if json_log() => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn real_main(cli: Cli) -> Result<()> {
    let cli_server = cli.server.clone().zip(cli.token.clone()).map(|(url, token)| Remote {
        url,
        token,
        ca_cert: cli.ca_cert.clone(),
    });
    // Compiled components persist across runs (a job starts in milliseconds the second
    // time); `weir serve` keeps its own cache in its data directory instead.
    if !matches!(cli.command, Command::Serve { .. } | Command::CompileComponent { .. })
        && let Some(cache) = weir::sandbox::disk_cache::from_env(&registry::home())
    {
        weir::sandbox::disk_cache::install(cache);
    }
    match cli.command {
        Command::New { name, lang, dir, sdk } => new_project(&name, lang, dir, sdk),
        Command::CompileComponent { pooling, no_epoch } => {
            let opts = weir::sandbox::engine::EngineOptions { pooling, epoch_interruption: !no_epoch };
            weir::sandbox::isolated_compile::child_main(opts).map_err(anyhow::Error::msg)
        }
        Command::Build { dir, sdk } => {
            let built = scaffold::build::build(&dir, sdk.as_deref())?;
            let info = &built.component.info;
            let states: Vec<&str> = info.states.iter().map(|s| s.name.as_str()).collect();
            println!(
                "built {} ({} {}, states: {})",
                built.path.display(),
                info.name,
                info.version,
                if states.is_empty() { "none".into() } else { states.join(", ") }
            );
            Ok(())
        }
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
        Command::Coordinator {
            jobs,
            serve,
            listen,
            advertise,
            secret_file,
            heartbeat_timeout_ms,
            slot_wait_secs,
            deploy_timeout_secs,
            workers,
            restore,
            allow_non_restored_state,
            etcd,
            cluster,
            lease_ttl_secs,
            api,
            tls,
        } => {
            let cfg = weir::cluster::coordinator::CoordinatorConfig {
                listen: listen.parse().with_context(|| format!("--listen {listen}: not an address"))?,
                secret: cluster_secret(secret_file.as_deref())?,
                tls: cluster_tls(tls)?,
                heartbeat: Duration::from_millis((heartbeat_timeout_ms / 5).clamp(10, 1000)),
                heartbeat_timeout: Duration::from_millis(heartbeat_timeout_ms),
                slot_wait: Duration::from_secs(slot_wait_secs),
                deploy_timeout: Duration::from_secs(deploy_timeout_secs.max(1)),
                min_workers: workers,
                epoch: 0,
            };
            let ha = (!etcd.is_empty()).then(|| weir::cluster::ha::HaConfig {
                endpoints: etcd,
                cluster,
                lease_ttl: Duration::from_secs(lease_ttl_secs),
            });
            let advertise = match (&ha, advertise) {
                (None, _) => None,
                (Some(_), Some(a)) => {
                    weir::cluster::discovery::check_address(&a).map_err(|e| anyhow::anyhow!("--advertise {e}"))?;
                    Some(a)
                }
                (Some(_), None) => Some(advertised(cfg.listen)?),
            };
            if let (Some(h), Some(a)) = (&ha, &advertise) {
                let local = |s: &str| ["127.", "localhost", "[::1]"].iter().any(|l| s.contains(l));
                if local(a) && !h.endpoints.iter().all(|e| local(e)) {
                    tracing::warn!(
                        "this coordinator advertises {a} to workers through etcd: only workers on this machine \
                         can reach a loopback address; give --advertise HOST:PORT"
                    );
                }
            }
            if let Some(config) = serve {
                return serve_on_cluster(&config, cfg, ha.zip(advertise));
            }
            run_coordinator(&jobs, cfg, ha.zip(advertise), restore, allow_non_restored_state, &api)
        }
        Command::Worker {
            coordinator,
            etcd,
            cluster,
            advertise,
            slots,
            listen,
            secret_file,
            name,
            dir,
            components_max_mb,
            tls,
        } => {
            let name = name.unwrap_or_else(|| format!("worker-{}", std::process::id()));
            let engine =
                new_engine().map_err(|e| anyhow::anyhow!("{e:#}")).context("starting the WebAssembly engine")?;
            let cfg = weir::cluster::worker::WorkerConfig {
                coordinators: match coordinator {
                    Some(list) => Coordinators::List(
                        list.split(',').map(|a| a.trim().to_string()).filter(|a| !a.is_empty()).collect(),
                    ),
                    None => Coordinators::Etcd { endpoints: etcd, cluster },
                },
                advertise: advertise
                    .map(|a| a.parse().with_context(|| format!("--advertise {a}: not an IP:port")))
                    .transpose()?,
                secret: cluster_secret(secret_file.as_deref())?,
                tls: cluster_tls(tls)?,
                slots,
                data_listen: listen.parse().with_context(|| format!("--listen {listen}: not an address"))?,
                dir: dir.unwrap_or_else(|| registry::home().join("workers").join(&name)),
                components_max_bytes: components_max_mb.saturating_mul(1 << 20),
                name,
            };
            weir::cluster::worker::run(cfg, engine)?;
            Ok(())
        }
        Command::Checkpoints { command: CheckpointsCommand::List { dir } } => list_checkpoints(&dir),
        Command::Checkpoints { command: CheckpointsCommand::Inspect { chk_dir } } => inspect(&chk_dir),
        Command::Savepoint { job, dir } => {
            let (c, job) = client(&cli_server, &job)?;
            let body = serde_json::json!({ "dir": dir.map(absolute).transpose()? });
            let v = c.call("POST", &format!("/v1/jobs/{job}/savepoints"), body.to_string().as_bytes())?;
            println!("savepoint {} (checkpoint {})", v["path"].as_str().unwrap_or("?"), v["checkpoint_id"]);
            Ok(())
        }
        Command::Query { job, checkpoint: Some(dir), component, config, operator, key, state } => {
            let _ = job;
            let config = config
                .iter()
                .map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
                .collect::<Option<Vec<_>>>()
                .context("--config takes KEY=VALUE")?;
            let engine =
                new_engine().map_err(|e| anyhow::anyhow!("{e:#}")).context("starting the WebAssembly engine")?;
            let q = weir::runtime::offline_query::OfflineQuery {
                dir: &dir,
                operator: &operator,
                key: key.as_bytes(),
                state: state.as_deref(),
                component,
                config,
            };
            let a = weir::runtime::offline_query::query_checkpoint(&engine, &q).map_err(anyhow::Error::msg)?;
            if !a.found {
                anyhow::bail!(
                    "key `{key}` has no value in state `{}` of operator `{operator}` in {} (subtask {}, key group {})",
                    a.state,
                    dir.display(),
                    a.subtask,
                    a.key_group
                );
            }
            println!("{}", serde_json::to_string_pretty(&a)?);
            Ok(())
        }
        Command::Query { job, operator, key, state, .. } => {
            let job = job.context("name the job (or --checkpoint DIR)")?;
            let (c, job) = client(&cli_server, &job)?;
            let enc = weir::api::http::encode;
            let mut path = format!("/v1/jobs/{job}/operators/{}/state?key={}", enc(&operator), enc(&key));
            if let Some(s) = state {
                path.push_str(&format!("&state={}", enc(&s)));
            }
            let v = c.call("GET", &path, b"")?;
            println!("{}", serde_json::to_string_pretty(&v)?);
            Ok(())
        }
        Command::Stop { job, savepoint } => {
            let (c, job) = client(&cli_server, &job)?;
            let body = serde_json::json!({ "dir": savepoint.map(absolute).transpose()? });
            let v = c.call("POST", &format!("/v1/jobs/{job}/stop"), body.to_string().as_bytes())?;
            println!(
                "job `{job}` stopped with savepoint {} (checkpoint {})",
                v["path"].as_str().unwrap_or("?"),
                v["checkpoint_id"]
            );
            Ok(())
        }
        Command::Upgrade { job, operator, component } => {
            let bytes =
                std::fs::read(&component).with_context(|| format!("cannot read component {}", component.display()))?;
            let (c, job) = client(&cli_server, &job)?;
            let name = weir::api::http::encode(&component.display().to_string());
            let v = c.call("POST", &format!("/v1/jobs/{job}/operators/{operator}/upgrade?name={name}"), &bytes)?;
            println!(
                "operator `{operator}` of job `{job}` upgraded from {} to {} at checkpoint {} (paused {:.2} ms)",
                v["from"].as_str().unwrap_or("?"),
                v["to"].as_str().unwrap_or("?"),
                v["checkpoint_id"],
                v["pause_ms_max"].as_f64().unwrap_or(0.0)
            );
            Ok(())
        }
        Command::Cancel { job } => {
            let (c, job) = client(&cli_server, &job)?;
            c.call("POST", &format!("/v1/jobs/{job}/cancel"), b"")?;
            println!("job `{job}` cancelled");
            Ok(())
        }
        Command::Status { job } => {
            let (c, job) = client(&cli_server, &job)?;
            let v = c.call("GET", &format!("/v1/jobs/{job}"), b"")?;
            println!("{}", serde_json::to_string_pretty(&v)?);
            Ok(())
        }
        Command::Serve { config } => {
            let (cfg, api) = hosting_api(&config)?;
            let server = api.serve(&cfg.listen).with_context(|| format!("cannot listen on {}", cfg.listen))?;
            match api.cpu_shares_unavailable() {
                None => tracing::info!("tenants get CPU shares by their cpu_weight: {}", api.cpu_shares()),
                Some(why) => {
                    tracing::warn!("tenants do not get CPU shares ({why}); the OS schedules their threads one by one")
                }
            }
            log_serving(&cfg, &api, server.addr, "");
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        Command::Submit { job, restore, allow_non_restored_state } => {
            let Some(remote) = &cli_server else {
                anyhow::bail!("`weir submit` needs --server URL --token T (a `weir serve` to submit to)");
            };
            let c = remote.client()?;
            let text = std::fs::read_to_string(&job).with_context(|| format!("cannot read {}", job.display()))?;
            let mut doc: toml::Table = text.parse().with_context(|| format!("{} is not valid TOML", job.display()))?;
            let dir = job.parent().unwrap_or(std::path::Path::new(".")).to_path_buf();
            if let Some(ops) = doc.get_mut("operator").and_then(|o| o.as_array_mut()) {
                for op in ops {
                    let Some(comp) = op.get("component").and_then(|c| c.as_str()).map(str::to_string) else { continue };
                    let bytes = std::fs::read(dir.join(&comp))
                        .with_context(|| format!("cannot read component {}", dir.join(&comp).display()))?;
                    let v = c.call("POST", "/v1/components", &bytes)?;
                    let id = v["component"].as_str().unwrap_or_default().to_string();
                    op.as_table_mut().unwrap().insert("component".into(), toml::Value::String(id));
                }
            }
            if let Some(srcs) = doc.get("source").and_then(|s| s.as_array()) {
                for s in srcs {
                    if s.get("type").and_then(|t| t.as_str()) == Some("file")
                        && let Some(p) = s.get("path").and_then(|p| p.as_str())
                    {
                        let bytes = std::fs::read(dir.join(p))
                            .with_context(|| format!("cannot read input {}", dir.join(p).display()))?;
                        c.call("POST", &format!("/v1/files?name={}", weir::api::http::encode(p)), &bytes)?;
                    }
                }
            }
            let mut query = Vec::new();
            if let Some(r) = &restore {
                query.push(format!("restore={}", weir::api::http::encode(r)));
            }
            if allow_non_restored_state {
                query.push("allow_non_restored_state=true".to_string());
            }
            let path = if query.is_empty() { "/v1/jobs".to_string() } else { format!("/v1/jobs?{}", query.join("&")) };
            let v = c.call("POST", &path, toml::to_string(&doc)?.as_bytes())?;
            println!("{}", v["id"].as_str().unwrap_or("?"));
            Ok(())
        }
        Command::List => {
            let mut rows = Vec::new();
            match &cli_server {
                Some(remote) => {
                    let v = remote.client()?.call("GET", "/v1/jobs", b"")?;
                    rows.extend(v.as_array().cloned().unwrap_or_default());
                }
                None => {
                    for e in registry::list() {
                        if let Ok(mut v) =
                            Client::new(&e.addr, &e.token).call("GET", &format!("/v1/jobs/{}", e.job), b"")
                        {
                            v["name"] = serde_json::Value::String(e.key.clone());
                            rows.push(v);
                        }
                    }
                }
            }
            if rows.is_empty() {
                println!("no running jobs");
            }
            for v in rows {
                let comps: Vec<String> = v["nodes"]
                    .as_array()
                    .map(|ns| {
                        ns.iter()
                            .filter_map(|n| {
                                n["component"].as_str().map(|c| format!("{}={c}", n["uid"].as_str().unwrap_or("?")))
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                println!(
                    "{:<20} {:<10} attempts {}  checkpoints {}  {}",
                    v["id"].as_str().or(v["name"].as_str()).unwrap_or("?"),
                    v["state"].as_str().unwrap_or("?"),
                    v["attempts"],
                    v["checkpoints"],
                    comps.join(" ")
                );
            }
            Ok(())
        }
        Command::Bench { scenario, dir, runs, records, latency_secs, lang, events, queries, nexmark_dir } => {
            let opts = weir::bench::BenchOptions {
                exe: std::env::current_exe().context("locating the weir executable")?,
                dir,
                runs: runs.max(1),
                j1_records: records,
                latency_secs: latency_secs.max(2),
            };
            if scenario == "nexmark" {
                weir::bench::nexmark::check_components(&nexmark_dir)?;
                println!(
                    "# weir bench nexmark: {} cores, {}",
                    std::thread::available_parallelism().map_or(1, |p| p.get()),
                    std::env::consts::ARCH
                );
                let opts = weir::bench::BenchOptions { dir: nexmark_dir, ..opts };
                return Ok(weir::bench::nexmark::nexmark(&opts, events, &queries)?);
            }
            if scenario == "backpressure" {
                weir::bench::check_components(&opts.dir)?;
                println!(
                    "# weir bench backpressure: {} cores",
                    std::thread::available_parallelism().map_or(1, |p| p.get())
                );
                return Ok(weir::bench::backpressure::backpressure(&opts)?);
            }
            if scenario == "disk" {
                weir::bench::check_components(&opts.dir)?;
                println!("# weir bench disk: {} cores", std::thread::available_parallelism().map_or(1, |p| p.get()));
                return Ok(weir::bench::disk::disk(&opts)?);
            }
            if scenario == "startup" {
                println!("# weir bench startup: {} cores", std::thread::available_parallelism().map_or(1, |p| p.get()));
                return Ok(weir::bench::startup::startup(&opts, &lang)?);
            }
            weir::bench::check_components(&opts.dir)?;
            println!(
                "# weir bench {scenario}: {} cores, {}",
                std::thread::available_parallelism().map_or(1, |p| p.get()),
                std::env::consts::ARCH
            );
            let max = match scenario.as_str() {
                "j1" | "all" => Some(weir::bench::j1(&opts)?),
                "j3" | "latency" => None,
                other => anyhow::bail!(
                    "unknown benchmark `{other}`; use j1, j3, latency, all, nexmark, startup, backpressure or disk"
                ),
            };
            if matches!(scenario.as_str(), "j3" | "all") {
                weir::bench::j3(&opts)?;
            }
            if matches!(scenario.as_str(), "latency" | "all") {
                let max = match max {
                    Some(m) => m,
                    None => {
                        // The maximum first: J1 at p = 1 without checkpoints.
                        let v = weir::bench::variant::Variant {
                            interval_ms: Some(0),
                            parallelism: Some(1),
                            ..Default::default()
                        };
                        let r = weir::bench::run_variant(&opts, "j1.toml", &v)?;
                        let n = r.nodes.first().map_or(0, |s| s.records_out);
                        n as f64 / (r.elapsed_ms / 1e3)
                    }
                };
                weir::bench::latency(&opts, max, 0.5)?;
            }
            Ok(())
        }
        Command::Run {
            job,
            progress,
            quiet_guests,
            restore,
            from_savepoint,
            allow_non_restored_state,
            api,
            report,
        } => {
            let graph = job::load(&job)?;
            let engine =
                new_engine().map_err(|e| anyhow::anyhow!("{e:#}")).context("starting the WebAssembly engine")?;
            let bound = job::bind::bind(&engine, graph)?;
            let (api, endpoint) = JobApi::start(&bound, &engine, &api)?;
            let result = run_job(
                &bound,
                progress,
                quiet_guests,
                restore,
                from_savepoint,
                allow_non_restored_state,
                Some(endpoint),
                report,
                None,
            );
            drop(api);
            result
        }
    }
}

/// `p` from the current directory (an `s3://` URL as it is).
fn absolute(p: PathBuf) -> Result<PathBuf> {
    let url = weir::checkpoint::remote_savepoint::is_url(&p);
    Ok(if p.is_absolute() || url { p } else { std::env::current_dir()?.join(p) })
}

/// `--server`, `--token` and `--ca-cert`.
struct Remote {
    url: String,
    token: String,
    ca_cert: Option<PathBuf>,
}

impl Remote {
    fn client(&self) -> Result<Client> {
        Ok(match &self.ca_cert {
            Some(ca) => Client::with_ca(&self.url, &self.token, ca)?,
            None => Client::new(&self.url, &self.token),
        })
    }
}

/// The API client for `job` and the job's name in the API: `--server`, or the job's own API
/// from the registry (where `job` may be `<job>@<pid>`).
fn client(server: &Option<Remote>, job: &str) -> Result<(Client, String)> {
    if let Some(remote) = server {
        return Ok((remote.client()?, job.to_string()));
    }
    let e = registry::find(job).with_context(|| {
        format!(
            "no running job `{job}` is registered in {} (is it running on this machine as this user? `weir list` \
             shows the running jobs)",
            registry::home().join("jobs").display()
        )
    })?;
    Ok((Client::new(&e.addr, &e.token), e.job))
}

/// The control API of this process's jobs, each registered so `weir list`/`savepoint`/`stop`/...
/// find it by the job's name; unregistered when dropped.
struct JobApi {
    server: weir::api::server::ApiServer,
    registered: Vec<PathBuf>,
}

impl JobApi {
    /// Serves `bound`'s API on `addr`; the job's end of it goes into its run options.
    fn start(
        bound: &job::bind::BoundJob,
        engine: &wasmtime::Engine,
        addr: &str,
    ) -> Result<(JobApi, weir::runtime::handle::Endpoint)> {
        let (api, mut endpoints) = JobApi::start_many(&[bound], engine, addr)?;
        Ok((api, endpoints.pop().expect("one job")))
    }

    /// Serves the API of every job of `bound` on `addr` (one server, one token); each job's
    /// end of it, in the same order.
    fn start_many(
        bound: &[&job::bind::BoundJob],
        engine: &wasmtime::Engine,
        addr: &str,
    ) -> Result<(JobApi, Vec<weir::runtime::handle::Endpoint>)> {
        let token = registry::new_token();
        let api_state = Api::new(token.clone(), engine.clone());
        let mut endpoints = Vec::new();
        for b in bound {
            let name = b.graph.name.clone();
            let (handle, endpoint) = JobHandle::new(&name);
            let checkpoint_root = b.graph.checkpoint.as_ref().map(|c| c.dir.join(&name));
            api_state.add_job(&name, ServedJob { handle, checkpoint_root });
            endpoints.push(endpoint);
        }
        let server = api_state.serve(addr).with_context(|| format!("cannot listen on {addr} for the control API"))?;
        let mut api = JobApi { server, registered: Vec::new() };
        for b in bound {
            api.register(&b.graph.name, &token)?;
        }
        Ok((api, endpoints))
    }

    fn register(&mut self, name: &str, token: &str) -> Result<()> {
        let pid = std::process::id();
        let addr = self.server.addr;
        let entry = registry::Entry {
            key: String::new(),
            job: name.to_string(),
            addr: addr.to_string(),
            token: token.to_string(),
            pid,
        };
        let (entry, registered) = registry::register(&entry)
            .with_context(|| format!("registering job `{name}` in {}", registry::home().display()))?;
        self.registered.push(registered.clone());
        if entry.key != name {
            tracing::warn!(
                job = %name,
                "another process runs a job named `{name}`; address this one as `{}` (weir stop {} ...)",
                entry.key,
                entry.key
            );
        }
        tracing::info!(job = %entry.key, "control API for job `{}` at http://{addr} (see {})", entry.key, registered.display());
        if json_log() {
            // A log may be shipped anywhere: no secret in it (the token is in the registry file).
            tracing::info!(job = %entry.key, "dashboard: http://{addr}/ui/ (token in {})", registered.display());
        } else {
            // The token is in the fragment, which the browser never sends; the page drops it
            // from the address bar. (Loopback, the user's own terminal: as Jupyter does.)
            eprintln!("dashboard: http://{addr}/ui/#token={}", entry.token);
        }
        Ok(())
    }
}

impl Drop for JobApi {
    fn drop(&mut self) {
        for r in &self.registered {
            registry::unregister(r, std::process::id());
        }
        tracing::debug!("control API at {} closed", self.server.addr);
    }
}

/// The address a coordinator listening on `listen` advertises in etcd, or why it cannot.
fn advertised(listen: std::net::SocketAddr) -> Result<String> {
    if listen.ip().is_unspecified() || listen.port() == 0 {
        anyhow::bail!(
            "--listen {listen} is not an address workers can reach: with --etcd, give a fixed port and \
             --advertise HOST:PORT (the address workers that read the leader from etcd connect to)"
        );
    }
    Ok(listen.to_string())
}

/// A job file given to `weir coordinator`, or stored in etcd.
struct ClusterJob {
    source: weir::cluster::coordinator::JobSource,
    name: String,
    restore: Option<String>,
}

/// Reads and parses the job files given to `weir coordinator` (names must differ).
fn given_jobs(jobs: &[PathBuf], restore: &Option<String>) -> Result<Vec<ClusterJob>> {
    let mut given: Vec<ClusterJob> = Vec::new();
    for path in jobs {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let name = job::parse(path, &text)?.name;
        if let Some(other) = given.iter().find(|g| g.name == name) {
            anyhow::bail!(
                "{} and {} both name their job `{name}`; a cluster runs one job of a name (rename one)",
                other.source.path.display(),
                path.display()
            );
        }
        let source = weir::cluster::coordinator::JobSource { path: path.clone(), text };
        given.push(ClusterJob { source, name, restore: restore.clone() });
    }
    if given.len() > 1 && restore.as_deref().is_some_and(|r| r != "latest") {
        anyhow::bail!(
            "--restore {} names one checkpoint but {} jobs are given; give --restore latest (each job resumes from its \
             own newest checkpoint) or run that job alone",
            restore.as_deref().unwrap_or_default(),
            given.len()
        );
    }
    Ok(given)
}

/// With a leader: the cluster's jobs are those stored in etcd that have not run to their end
/// (each resuming from its newest recorded checkpoint), and the given ones etcd does not know
/// yet (stored now). A given job etcd knows is run as stored.
fn leader_jobs(l: &weir::cluster::ha::Leadership, given: Vec<ClusterJob>) -> Result<Vec<ClusterJob>> {
    use weir::cluster::ha::StoredJob;
    l.adopt_single_job_keys(|path, text| job::parse(path, text).map(|g| g.name).map_err(|e| e.to_string()))?;
    let stored = l.jobs()?;
    let mut runs = Vec::new();
    for s in &stored {
        let g = given.iter().find(|g| g.name == s.name);
        if let Some(g) = g
            && g.source.text != s.text
        {
            tracing::warn!(
                "the cluster already runs job `{}` of {} (stored in etcd); {} is ignored",
                s.name,
                s.path.display(),
                g.source.path.display()
            );
        }
        if l.finished(&s.name)? {
            println!("job `{}` has already run to its end; nothing to do for it", s.name);
            continue;
        }
        let restore = g.and_then(|g| g.restore.clone());
        let source = weir::cluster::coordinator::JobSource { path: s.path.clone(), text: s.text.clone() };
        runs.push(ClusterJob { source, name: s.name.clone(), restore });
    }
    for g in given {
        if stored.iter().any(|s| s.name == g.name) {
            continue;
        }
        // etcd knows no such job: it is new, or etcd lost its data. Checked before the job
        // is stored, so a refusal stays a refusal on restart.
        if g.restore.is_none() {
            refuse_checkpoints_etcd_does_not_know(&job::parse(&g.source.path, &g.source.text)?)?;
        }
        l.store_job(&StoredJob { name: g.name.clone(), path: g.source.path.clone(), text: g.source.text.clone() })?;
        runs.push(g);
    }
    for r in &mut runs {
        if let Some(chk) = l.checkpoint(&r.name)? {
            tracing::info!(job = %r.name, "job `{}`: taking over from checkpoint {}", r.name, chk.display());
            r.restore = Some(chk.to_string_lossy().into_owned());
        }
    }
    Ok(runs)
}

/// `weir coordinator`: with `ha` (and the address it advertises), first becomes its cluster's
/// leader and takes the cluster's jobs and their newest checkpoints from etcd (storing the
/// job files given here that etcd does not know). Runs every job on the same workers, each
/// restarting on its own; fails if one of them fails.
fn run_coordinator(
    jobs: &[PathBuf],
    mut cfg: weir::cluster::coordinator::CoordinatorConfig,
    ha: Option<(weir::cluster::ha::HaConfig, String)>,
    restore: Option<String>,
    allow_non_restored_state: bool,
    api: &str,
) -> Result<()> {
    use weir::cluster::ha::Leadership;
    let given = given_jobs(jobs, &restore)?;
    let leader = match ha {
        Some((h, advertise)) => Some(std::sync::Arc::new(Leadership::campaign(h, &advertise)?)),
        None => None,
    };
    let runs = match &leader {
        Some(l) => {
            cfg.epoch = l.epoch();
            leader_jobs(l, given)?
        }
        None => given,
    };
    if runs.is_empty() {
        println!("every job of the cluster has already run to its end; nothing to do");
        return Ok(());
    }
    let engine = new_engine().map_err(|e| anyhow::anyhow!("{e:#}")).context("starting the WebAssembly engine")?;
    let mut bound = Vec::new();
    for r in &runs {
        bound.push(job::bind::bind(&engine, job::parse(&r.source.path, &r.source.text)?)?);
    }
    // The jobs' API is registered before the readiness line below, so whoever waits for that
    // line finds each job with `weir query`/`stop`/... at once.
    let (api, endpoints) = JobApi::start_many(&bound.iter().collect::<Vec<_>>(), &engine, api)?;
    let listen = cfg.listen;
    let hub = weir::cluster::hub::Hub::start(cfg).with_context(|| format!("cannot listen on {listen} for workers"))?;
    println!("listening on {}", hub.addr());
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let threads: Vec<_> = runs
            .iter()
            .zip(&bound)
            .zip(endpoints)
            .map(|((r, b), endpoint)| {
                let (hub, leader, many) = (&hub, leader.clone(), runs.len() > 1);
                scope.spawn(move || {
                    let ran = run_on_cluster(hub, leader, b, r, allow_non_restored_state, endpoint);
                    // Said at once: the coordinator's other jobs may run on for days.
                    if let (Err(e), true) = (&ran, many) {
                        tracing::error!(job = %r.name, "job `{}` failed: {e:#}", r.name);
                    }
                    ran
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|_| Err(anyhow::anyhow!("the job's thread panicked"))))
            .collect()
    });
    drop(api);
    let mut failed: Vec<(String, anyhow::Error)> =
        runs.iter().zip(results).filter_map(|(r, res)| res.err().map(|e| (r.name.clone(), e))).collect();
    match failed.len() {
        0 => Ok(()),
        1 if runs.len() == 1 => Err(failed.pop().expect("one").1),
        n => {
            let names: Vec<String> = failed.iter().map(|(n, _)| format!("`{n}`")).collect();
            anyhow::bail!("{n} of {} jobs failed: {} (their errors are above)", runs.len(), names.join(", "))
        }
    }
}

/// The API of `weir serve --config CONFIG`: its tenants, their compile cache and a child
/// process that compiles their components within bounds.
fn hosting_api(config: &Path) -> Result<(weir::api::tenants::ServerConfig, std::sync::Arc<Api>)> {
    let cfg = weir::api::tenants::ServerConfig::load(config).map_err(anyhow::Error::msg)?;
    // Outside every tenant's directory (tenant names cannot start with a dot).
    let cache_dir = cfg.data_dir.join(".compile-cache");
    if std::env::var_os("WEIR_COMPILE_CACHE").is_none_or(|v| v != "off")
        && let Some(cache) =
            weir::sandbox::disk_cache::DiskCache::open(cache_dir, weir::sandbox::disk_cache::DEFAULT_MAX_BYTES)
    {
        weir::sandbox::disk_cache::install(cache);
    }
    let opts = weir::sandbox::engine::EngineOptions { pooling: true, ..Default::default() };
    // Tenants' components compile in a child process, bounded by [compile].
    weir::sandbox::isolated_compile::install(weir::sandbox::isolated_compile::Isolation {
        exe: std::env::current_exe().context("locating the weir executable")?,
        engine: opts,
        memory_mb: cfg.compile.memory_mb,
        timeout_ms: cfg.compile.timeout_ms,
    });
    let engine = weir::sandbox::engine::engine_with(opts)
        .map_err(|e| anyhow::anyhow!("{e:#}"))
        .context("starting the WebAssembly engine")?;
    let api = Api::hosting(&cfg, engine)
        .with_context(|| format!("starting the server (data directory {})", cfg.data_dir.display()))?;
    Ok((cfg, api))
}

/// The line that says where the tenants' API is (tests and scripts wait for it).
fn log_serving(cfg: &weir::api::tenants::ServerConfig, api: &Api, addr: std::net::SocketAddr, more: &str) {
    tracing::info!(
        "weir serving {} tenant(s) at {}://{addr} (data in {}; dashboard at /ui/){more}",
        cfg.tenant.len(),
        if api.speaks_tls() { "https" } else { "http" },
        cfg.data_dir.display()
    );
}

/// `weir coordinator --serve CONFIG`: the tenants' API of `weir serve`, with every job
/// submitted to it run on this coordinator's workers (each placed into the workers free for
/// it, as the coordinator's jobs are). Quotas are checked here as `weir serve` checks them.
/// With `ha`, first becomes the cluster's leader and takes back the tenants' jobs etcd holds
/// (each from its newest checkpoint) before it serves the API; jobs submitted then are
/// stored in etcd before their tenant hears of them.
fn serve_on_cluster(
    config: &Path,
    mut cluster: weir::cluster::coordinator::CoordinatorConfig,
    ha: Option<(weir::cluster::ha::HaConfig, String)>,
) -> Result<()> {
    use weir::api::on_cluster::{OnCluster, resume_all};
    let (cfg, api) = hosting_api(config)?;
    let advertised_host = ha.as_ref().and_then(|(_, a)| a.rsplit_once(':').map(|(host, _)| host.to_string()));
    let (leader, standing) = match ha {
        Some((h, advertise)) => {
            // Until it leads, its API port points callers at the leader's.
            let standby = std::sync::Arc::new(weir::api::standby::Standby::new(
                api.clone(),
                weir::cluster::ha::LeaderApi::new(h.clone()),
            ));
            let listening = api
                .serve_other(standby.clone(), &cfg.listen)
                .with_context(|| format!("cannot listen on {}", cfg.listen))?;
            tracing::info!("standby: answering tenants at {} with the leader's address", listening.addr);
            let l = weir::cluster::ha::Leadership::campaign(h, &advertise)?;
            (Some(std::sync::Arc::new(l)), Some((standby, listening)))
        }
        None => (None, None),
    };
    if let Some(l) = &leader {
        cluster.epoch = l.epoch();
    }
    let listen = cluster.listen;
    let hub =
        weir::cluster::hub::Hub::start(cluster).with_context(|| format!("cannot listen on {listen} for workers"))?;
    let launcher = std::sync::Arc::new(OnCluster::new(hub.clone(), leader.clone()));
    api.launch_with(launcher.clone());
    if let Some(l) = &leader {
        let n = resume_all(&api, &launcher, l)?;
        tracing::info!("took over {n} tenants' job(s) stored in etcd");
    }
    // Leading (its jobs taken over), the standby's listener serves the API from now on.
    let mut server = None;
    let serving = match &standing {
        Some((standby, listening)) => {
            standby.lead();
            listening.addr
        }
        None => server.insert(api.serve(&cfg.listen).with_context(|| format!("cannot listen on {}", cfg.listen))?).addr,
    };
    if let Some(l) = &leader {
        let scheme = if api.speaks_tls() { "https" } else { "http" };
        // Listening on every interface: reachable where workers reach this coordinator.
        let addr = match (serving.ip().is_unspecified(), advertised_host) {
            (true, Some(h)) => format!("{h}:{}", serving.port()),
            _ => serving.to_string(),
        };
        if let Err(e) = l.announce_api(&format!("{scheme}://{addr}")) {
            tracing::warn!("standbys cannot point tenants here: {e}");
        }
    }
    println!("listening on {}", hub.addr());
    tracing::info!(
        "tenants' components compile here within [compile] before any worker gets them; a worker runs one job at a \
         time, so tenants' cpu_weight does not apply on the workers; a tenant's files and checkpoints must be on \
         storage the workers share at {}",
        cfg.data_dir.display()
    );
    log_serving(&cfg, &api, serving, &format!("; jobs run on the workers of {}", hub.addr()));
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Runs one job of the coordinator on the workers of `hub`.
fn run_on_cluster(
    hub: &std::sync::Arc<weir::cluster::hub::Hub>,
    leader: Option<std::sync::Arc<weir::cluster::ha::Leadership>>,
    bound: &job::bind::BoundJob,
    r: &ClusterJob,
    allow_non_restored_state: bool,
    endpoint: weir::runtime::handle::Endpoint,
) -> Result<()> {
    let gate = leader.clone().map(|l| {
        let (ended, name, end_name) = (l.clone(), r.name.clone(), r.name.clone());
        weir::runtime::driver::PublishGate::recording(
            move |path| l.record_checkpoint(&name, path),
            move || ended.mark_finished(&end_name),
        )
    });
    let mut cluster = weir::cluster::coordinator::Cluster::on(hub);
    let mut run = |b: &job::bind::BoundJob, o: &RunOptions| {
        let o = RunOptions { gate: gate.clone(), ..o.clone() };
        cluster.run(b, &r.source, &o)
    };
    let restore = r.restore.clone();
    let ran = run_job(bound, 0.0, false, restore, None, allow_non_restored_state, Some(endpoint), None, Some(&mut run));
    // Finished, stopped with a savepoint or cancelled: a coordinator elected later must not
    // run it again (a stopped job resumes from its savepoint as a new job).
    let cancelled = ran.as_ref().err().and_then(|e| e.downcast_ref::<weir::runtime::error::RunError>());
    let cancelled = matches!(cancelled, Some(weir::runtime::error::RunError::Cancelled { .. }));
    if let Some(l) = &leader
        && (ran.is_ok() || cancelled)
    {
        l.mark_finished(&r.name);
    }
    ran
}

/// A leader given a job etcd does not hold yet (and no `--restore`) would start it from the
/// beginning, clearing its committed output. If the job's checkpoint store holds a
/// complete checkpoint, etcd lost what it knew (reset, wiped, a new etcd) or another cluster
/// wrote there: the leader stops, naming the checkpoint and how to go on, instead. (A leader
/// that dies between publishing its first checkpoint and recording it in etcd leaves the job
/// stored there: its successor starts over, as no output of that checkpoint was committed.)
fn refuse_checkpoints_etcd_does_not_know(graph: &weir::graph::logical::JobGraph) -> Result<()> {
    let Some(store) = CheckpointStore::of(graph)? else { return Ok(()) };
    let Some((id, place, finished)) = store.newest_complete().map_err(|e| anyhow::anyhow!("{e}"))? else {
        return Ok(());
    };
    let ended = if finished { " (the job had run to its end there)" } else { "" };
    anyhow::bail!(
        "etcd holds no checkpoint of job `{}`, but its checkpoint store holds complete checkpoint {id} at \
         {place}{ended}: etcd was reset or replaced, or another cluster wrote there. Starting from the \
         beginning would clear the job's committed output, so this coordinator stops. To resume from it, start \
         the coordinators with --restore {place} (with several job files: --restore latest, each job from its \
         newest checkpoint); to start over, remove the job's checkpoints or give it \
         another checkpoint directory",
        graph.name
    )
}

/// Runs a job on a cluster instead of in this process.
type ClusterRun<'a> =
    dyn FnMut(&job::bind::BoundJob, &RunOptions) -> Result<executor::RunSummary, weir::runtime::error::RunError> + 'a;

/// Mutual TLS between the members of a cluster.
#[derive(clap::Args, Debug)]
struct TlsArgs {
    /// Mutual TLS between members: this member's certificate (PEM), issued for the name
    /// `weir-cluster` (one self-signed certificate shared by every member will do).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The CA the members' certificates chain to (default: --tls-cert itself).
    #[arg(long, requires = "tls_cert")]
    tls_ca: Option<PathBuf>,
}

/// The cluster's TLS settings, when given.
fn cluster_tls(a: TlsArgs) -> Result<Option<weir::runtime::net::tls::ClusterTls>> {
    match (a.tls_cert, a.tls_key) {
        (Some(cert), Some(key)) => {
            Ok(Some(weir::runtime::net::tls::ClusterTls::load(&cert, &key, a.tls_ca.as_deref())?))
        }
        _ => Ok(None),
    }
}

/// The cluster secret, from `file` or `WEIR_CLUSTER_SECRET`.
fn cluster_secret(file: Option<&std::path::Path>) -> Result<String> {
    let secret = match file {
        Some(f) => std::fs::read_to_string(f).with_context(|| format!("reading the cluster secret {}", f.display()))?,
        None => std::env::var("WEIR_CLUSTER_SECRET").map_err(|_| {
            anyhow::anyhow!(
                "give the cluster secret: --secret-file FILE or WEIR_CLUSTER_SECRET (the same on every member)"
            )
        })?,
    };
    let secret = secret.trim().to_string();
    if secret.len() < 16 {
        anyhow::bail!(
            "the cluster secret is {} characters; use at least 16 (e.g. `openssl rand -hex 32`)",
            secret.len()
        );
    }
    Ok(secret)
}

#[allow(clippy::too_many_arguments)]
fn run_job(
    bound: &job::bind::BoundJob,
    progress: f64,
    quiet_guests: bool,
    restore: Option<String>,
    from_savepoint: Option<PathBuf>,
    allow_non_restored_state: bool,
    endpoint: Option<weir::runtime::handle::Endpoint>,
    report: Option<PathBuf>,
    deploy: Option<&mut ClusterRun<'_>>,
) -> Result<()> {
    {
        for w in &bound.warnings {
            tracing::warn!(job = %bound.graph.name, "{w}");
        }
        tracing::info!(
            job = %bound.graph.name,
            "running job `{}` ({} subtasks)",
            bound.graph.name,
            bound.graph.nodes.iter().map(|n| n.parallelism).sum::<u32>()
        );
        let opts = RunOptions {
            progress: (progress > 0.0).then(|| Duration::from_secs_f64(progress)),
            quiet_guests,
            restore: match (restore, from_savepoint) {
                (_, Some(sp)) => Some(RestoreFrom::Path(sp)),
                (Some(r), None) if r == "latest" => Some(RestoreFrom::Latest),
                (Some(r), None) => Some(RestoreFrom::Path(r.into())),
                (None, None) => None,
            },
            allow_non_restored_state,
            faults: None,
            endpoint,
            cpu_group: None,
            hold_input: None,
            disk_budget: None,
            state_dir: None,
            gate: None,
        };
        let started_unix_ms =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let cpu_before = weir::bench::report::cpu_ms();
        let summary = match deploy {
            Some(run) => run(bound, &opts)?,
            None => executor::run(bound, &opts)?,
        };
        if let Some(path) = &report {
            let mut r = weir::bench::report::RunReport::new(bound, &summary, started_unix_ms);
            r.cpu_ms = weir::bench::report::cpu_ms() - cpu_before;
            r.write(path).with_context(|| format!("writing the run report {}", path.display()))?;
        }
        if let Some(sp) = &summary.stopped_with {
            tracing::info!(
                "job `{}` stopped with savepoint {} (checkpoint {}); resume with `weir run <job.toml> --from-savepoint {}`",
                bound.graph.name,
                sp.path.display(),
                sp.checkpoint_id,
                sp.path.display()
            );
            return Ok(());
        }
        let secs = summary.elapsed.as_secs_f64().max(1e-9);
        if json_log() {
            tracing::info!(
                job = %bound.graph.name,
                seconds = secs,
                attempts = summary.attempts,
                checkpoints = summary.checkpoints,
                "job `{}` finished",
                bound.graph.name
            );
            for n in &summary.nodes {
                tracing::info!(
                    job = %bound.graph.name,
                    node = %n.id,
                    records_in = n.records_in,
                    records_out = n.records_out,
                    "node `{}`: {} in, {} out",
                    n.id,
                    n.records_in,
                    n.records_out
                );
            }
            return Ok(());
        }
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
            if let Some(l) = &n.latency {
                eprintln!(
                    "  {:<16} latency p50 {:.1} ms, p99 {:.1} ms, p99.9 {:.1} ms, max {:.1} ms ({} records after a 1 s warm-up)",
                    "", l.p50_ms, l.p99_ms, l.p999_ms, l.max_ms, l.samples
                );
            }
        }
        eprintln!("  peak memory (RSS) {:.1} MB", weir::bench::report::peak_rss_bytes() as f64 / 1e6);
        Ok(())
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
    let kind = match m.kind {
        weir::checkpoint::metadata::SnapshotKind::Savepoint => "savepoint",
        weir::checkpoint::metadata::SnapshotKind::Checkpoint => "checkpoint",
    };
    println!("{kind} of job `{}`, checkpoint {} ({})", m.job, m.checkpoint_id, dir.display());
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
        if let Some(c) = &op.component {
            for st in &c.states {
                let how = if st.keyed { "keyed".to_string() } else { format!("per subtask, {}", st.redistribution) };
                println!("    state `{}`: {} ({how})", st.name, st.kind);
            }
            if let Some(stored) = &c.stored {
                println!("    live-upgraded component stored at {stored} (replaces {})", c.replaces.join(", "));
            }
        }
        for s in &op.subtasks {
            let st = &c.states[&(op.uid.clone(), s.index)];
            let mut what = Vec::new();
            // Key groups still in the files are read one at a time, not held.
            let (mut groups, mut timers) = (0usize, 0usize);
            let mut count = |k: &weir::checkpoint::snapshot::KeyGroupSnapshot| {
                groups += 1;
                timers += k.event_timers.len() + k.processing_timers.len();
            };
            st.keyed.iter().for_each(&mut count);
            if let Some(streamed) = &st.streamed
                && let Err(weir::checkpoint::keyed_files::StreamError::Chain(e)) = streamed.read(|k| {
                    count(&k);
                    Ok::<_, std::convert::Infallible>(())
                })
            {
                anyhow::bail!("`{}` subtask {}: {e}", op.uid, s.index);
            }
            if groups > 0 {
                what.push(format!("{groups} key groups, {timers} timers"));
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
            if !s.chain.is_empty() {
                let links: Vec<String> = s.chain.iter().map(|l| format!("chk-{}/{}", l.checkpoint, l.file)).collect();
                what.push(format!("incremental, builds on {} (folded, verified)", links.join(", ")));
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
