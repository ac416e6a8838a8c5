//! Loading and validating a job file into a [`JobGraph`].
//!
//! Every error names the file, the line and the field, and says what to do.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::{Path, PathBuf};

use thiserror::Error;
use toml::Spanned;

use crate::graph::limits::{CEILING, Limits};
use crate::graph::logical::CheckpointSettings;
use crate::graph::logical::{
    CheckpointConfig, Edge, EventTimeColumn, GeneratorConfig, Guarantee, JobGraph, Node, NodeKind, OnError,
    OperatorNode, PostgresTarget, Side, SinkFormat, SinkKind, SourceKind, StateBackend, ValueFormat,
};
use crate::graph::partition::Partition;
use crate::graph::restart::RestartStrategy;
use crate::ids::NodeId;
use crate::job::spec::{InputSpec, JobSpec, SinkSpec};

mod kafka;
mod nexmark;

/// Host ceiling of `[job] batch_size` (records per batch): a batch is buffered per edge and
/// channel slot, so the two ceilings bound what a job's channels can hold.
pub const MAX_BATCH_SIZE: u32 = 16_384;
/// Host ceiling of `[job] channel_capacity` (batches queued per channel).
pub const MAX_CHANNEL_CAPACITY: u32 = 256;

/// Largest supported `max_parallelism` (key groups).
pub const MAX_KEY_GROUPS: u32 = 32_768;

/// A job file that cannot run.
#[derive(Debug, Error)]
#[error("{}{}: {message}", file.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct JobError {
    /// The job file.
    pub file: PathBuf,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// What is wrong and what to do.
    pub message: String,
}

struct Ctx<'a> {
    file: &'a Path,
    dir: &'a Path,
    src: &'a str,
    /// Where each operator's component is, by uid, instead of the job file's path (a job
    /// shipped to a worker with its components).
    components: Option<&'a BTreeMap<String, PathBuf>>,
}

impl Ctx<'_> {
    fn line(&self, span: Range<usize>) -> Option<usize> {
        if span.start == 0 && span.end == 0 {
            return None;
        }
        Some(self.src[..span.start.min(self.src.len())].matches('\n').count() + 1)
    }

    fn err<T>(&self, span: Range<usize>, message: impl Into<String>) -> Result<T, JobError> {
        Err(JobError { file: self.file.to_path_buf(), line: self.line(span), message: message.into() })
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.join(p)
    }
}

/// Reads and validates the job file at `path`.
pub fn load(path: &Path) -> Result<JobGraph, JobError> {
    let src = std::fs::read_to_string(path).map_err(|e| JobError {
        file: path.to_path_buf(),
        line: None,
        message: format!("cannot read the job file: {e}"),
    })?;
    parse(path, &src)
}

/// Validates job file text `src` as if read from `path` (paths resolve against its directory).
pub fn parse(path: &Path, src: &str) -> Result<JobGraph, JobError> {
    parse_with(path, src, None)
}

/// [`parse`], with each operator's component at `components[uid]` instead of the job file's
/// path (a worker runs the components the coordinator shipped).
pub fn parse_shipped(path: &Path, src: &str, components: &BTreeMap<String, PathBuf>) -> Result<JobGraph, JobError> {
    parse_with(path, src, Some(components))
}

fn parse_with(path: &Path, src: &str, components: Option<&BTreeMap<String, PathBuf>>) -> Result<JobGraph, JobError> {
    let dir = path.parent().map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p });
    let dir = dir.unwrap_or(Path::new("."));
    let cx = Ctx { file: path, dir, src, components };
    let spec: JobSpec = toml::from_str(src).map_err(|e| {
        let line = e.span().map(|s| src[..s.start.min(src.len())].matches('\n').count() + 1);
        let hint = line.and_then(|l| src.lines().nth(l - 1)).and_then(syntax_hint);
        JobError {
            file: path.to_path_buf(),
            line,
            message: format!(
                "{}\n  {}(see the job file reference in README.md)",
                e.message().trim_end(),
                hint.map(|h| format!("hint: {h}\n  ")).unwrap_or_default()
            ),
        }
    })?;
    build(&cx, spec)
}

/// A hint in a user's words for a TOML syntax error on `line`: the common slip is text
/// without quotes (`name = wordcount`), which TOML reports as a malformed number or boolean.
fn syntax_hint(line: &str) -> Option<String> {
    let (key, value) = line.split_once('=')?;
    let (key, value) = (key.trim(), value.trim());
    let bare = value.split('#').next().unwrap_or("").trim();
    let starts_like_text = bare.chars().next().is_some_and(|c| c.is_alphabetic() || c == '.' || c == '/');
    let keyword = matches!(bare, "true" | "false" | "inf" | "nan");
    (starts_like_text && !keyword && !key.is_empty())
        .then(|| format!("text needs quotes in TOML: write `{key} = \"{bare}\"`"))
}

fn parallelism(cx: &Ctx, p: &Option<Spanned<u32>>, default: u32, max: u32, id: &str) -> Result<u32, JobError> {
    let Some(p) = p else { return Ok(default) };
    let v = *p.get_ref();
    if v == 0 {
        return cx.err(p.span(), format!("`{id}`: parallelism must be at least 1"));
    }
    if v > max {
        return cx.err(
            p.span(),
            format!(
                "`{id}`: parallelism {v} is greater than the job's max_parallelism {max}; \
                 lower it or raise [job] max_parallelism (the number of key groups)"
            ),
        );
    }
    Ok(v)
}

fn config_string(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn build(cx: &Ctx, spec: JobSpec) -> Result<JobGraph, JobError> {
    let name = spec.job.name.get_ref().trim().to_string();
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return cx.err(
            spec.job.name.span(),
            format!("[job] name `{name}` must be non-empty ASCII letters, digits, `-` or `_` (it names directories)"),
        );
    }
    let max_p = *spec.job.max_parallelism.get_ref();
    if max_p == 0 || max_p > MAX_KEY_GROUPS {
        return cx.err(
            spec.job.max_parallelism.span(),
            format!("[job] max_parallelism must be in 1..={MAX_KEY_GROUPS}, got {max_p}"),
        );
    }
    let default_p = parallelism(cx, &spec.job.parallelism, 1, max_p, "[job]")?;
    let batch_size = match &spec.job.batch_size {
        Some(b) if *b.get_ref() == 0 || *b.get_ref() > MAX_BATCH_SIZE => {
            return cx.err(
                b.span(),
                format!("[job] batch_size must be in 1..={MAX_BATCH_SIZE} (this host's ceiling), got {}", b.get_ref()),
            );
        }
        Some(b) => *b.get_ref(),
        None => 1024,
    };
    let channel_capacity = match &spec.job.channel_capacity {
        Some(c) if *c.get_ref() == 0 || *c.get_ref() > MAX_CHANNEL_CAPACITY => {
            return cx.err(
                c.span(),
                format!(
                    "[job] channel_capacity must be in 1..={MAX_CHANNEL_CAPACITY} batches (this host's ceiling), got {}",
                    c.get_ref()
                ),
            );
        }
        Some(c) => *c.get_ref() as usize,
        None => 8,
    };

    let mut nodes: Vec<Node> = Vec::new();
    let mut seen: HashMap<String, Range<usize>> = HashMap::new();
    let mut add_id = |cx: &Ctx, id: &Spanned<String>| -> Result<NodeId, JobError> {
        let s = id.get_ref();
        if s.is_empty() || !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return cx.err(id.span(), format!("id `{s}` must be ASCII letters, digits, `-` or `_`"));
        }
        if let Some(prev) = seen.get(s) {
            let prev_line = cx.line(prev.clone()).map(|l| format!(" (first defined on line {l})")).unwrap_or_default();
            return cx.err(
                id.span(),
                format!("duplicate id `{s}`{prev_line}; every source, operator and sink needs its own id"),
            );
        }
        seen.insert(s.clone(), id.span());
        Ok(NodeId::new(s))
    };

    let mut kafka_deliveries = Vec::new();
    for s in &spec.source {
        let id = add_id(cx, &s.id)?;
        if s.kind.get_ref() != "kafka"
            && let Some((option, span)) = kafka::source_only(s)
        {
            return cx.err(span, format!("source `{id}`: `{option}` is an option of `kafka` sources only"));
        }
        let kind_name = s.kind.get_ref().as_str();
        if let Some(c) = s.timestamp_column.as_ref().filter(|_| kind_name != "file") {
            return cx.err(c.span(), format!("source `{id}`: `timestamp_column` is an option of `file` sources only"));
        }
        if let Some(d) = s.watermark_delay_ms.as_ref().filter(|_| !matches!(kind_name, "file" | "kafka")) {
            return cx.err(
                d.span(),
                format!("source `{id}`: `watermark_delay_ms` is an option of `file` and `kafka` sources only"),
            );
        }
        let p = parallelism(cx, &s.parallelism, 1, max_p, id.as_str())?;
        let line = cx.line(s.id.span()).unwrap_or(0);
        let kind = match s.kind.get_ref().as_str() {
            "file" => {
                let Some(path) = &s.path else {
                    return cx.err(s.id.span(), format!("file source `{id}` needs `path = \"<input file>\"`"));
                };
                let full = cx.path(path.get_ref());
                if !full.is_file() {
                    return cx
                        .err(path.span(), format!("file source `{id}`: input file {} does not exist", full.display()));
                }
                let event_time = match (&s.timestamp_column, &s.watermark_delay_ms) {
                    (None, Some(d)) => {
                        return cx.err(
                            d.span(),
                            format!(
                                "file source `{id}`: `watermark_delay_ms` needs `timestamp_column = <column>` \
                                 (without it, record times are line numbers and there are no watermarks)"
                            ),
                        );
                    }
                    (None, None) => None,
                    (Some(c), d) => Some(EventTimeColumn {
                        column: *c.get_ref(),
                        watermark_delay_ms: d.as_ref().map_or(0, |d| *d.get_ref()),
                    }),
                };
                SourceKind::File {
                    path: full,
                    key_column: s.key_column.as_ref().map(|k| *k.get_ref()),
                    rate: s.rate.as_ref().map(|v| *v.get_ref()).filter(|&r| r > 0),
                    event_time,
                }
            }
            "stdin" if p > 1 => {
                return cx.err(s.id.span(), format!("stdin source `{id}` can only run with parallelism 1"));
            }
            "stdin" => SourceKind::Stdin,
            "generator" => {
                let Some(count) = &s.count else {
                    return cx.err(s.id.span(), format!("generator source `{id}` needs `count = <records>`"));
                };
                let keys = s.keys.as_ref().map(|k| *k.get_ref()).unwrap_or(1000);
                if keys == 0 {
                    return cx
                        .err(s.keys.as_ref().unwrap().span(), format!("generator `{id}`: keys must be at least 1"));
                }
                if let Some(v) = s.value_bytes.as_ref().filter(|v| *v.get_ref() > 1 << 20) {
                    return cx.err(v.span(), format!("generator `{id}`: value_bytes is at most 1048576 (1 MiB)"));
                }
                SourceKind::Generator(GeneratorConfig {
                    count: *count.get_ref(),
                    keys,
                    value_bytes: s.value_bytes.as_ref().map(|v| *v.get_ref()),
                    rate: s.rate.as_ref().map(|v| *v.get_ref()).filter(|&r| r > 0),
                    seed: s.seed.as_ref().map(|v| *v.get_ref()).unwrap_or(0),
                    ingestion_time: match s.timestamps.as_ref().map(|t| t.get_ref().as_str()) {
                        None | Some("sequence") => false,
                        Some("ingestion") => true,
                        Some(other) => {
                            return cx.err(
                                s.timestamps.as_ref().unwrap().span(),
                                format!(
                                    "generator `{id}`: unknown timestamps `{other}`; use `sequence` (record i has \
                                     time i) or `ingestion` (the wall clock when it is created, for latency)"
                                ),
                            );
                        }
                    },
                })
            }
            "kafka" => SourceKind::Kafka(kafka::source(cx, s, id.as_str(), &name)?),
            "nexmark" => SourceKind::Nexmark(nexmark::source(cx, s, id.as_str())?),
            other => {
                return cx.err(
                    s.kind.span(),
                    format!(
                        "source `{id}`: unknown type `{other}`; use `file`, `generator`, `stdin`, `kafka` or `nexmark`"
                    ),
                );
            }
        };
        nodes.push(Node { id, parallelism: p, kind: NodeKind::Source(kind), line });
    }
    for o in &spec.operator {
        let id = add_id(cx, &o.id)?;
        let p = parallelism(cx, &o.parallelism, default_p, max_p, id.as_str())?;
        let native = o.component.get_ref().starts_with("native:");
        if native && o.component.get_ref() != "native:keyed-count" {
            return cx.err(o.component.span(), format!("operator `{id}`: unknown native operator `{}`; the only one is `native:keyed-count` (for benchmarks)", o.component.get_ref()));
        }
        let shipped = cx.components.and_then(|c| c.get(id.as_str()));
        let component = match shipped {
            _ if native => PathBuf::from(o.component.get_ref()),
            Some(p) => p.clone(),
            None => cx.path(o.component.get_ref()),
        };
        if !native && !component.is_file() {
            return cx.err(
                o.component.span(),
                format!(
                    "operator `{id}`: component {} does not exist; build the guests first \
                     (`cargo build --profile guest --target wasm32-unknown-unknown`) or fix the path \
                     (paths are relative to the job file)",
                    component.display()
                ),
            );
        }
        let config = o.config.iter().map(|(k, v)| (k.clone(), config_string(v))).collect();
        let on_error = match o.on_error.as_ref().map(|s| s.get_ref().as_str()) {
            None | Some("fail") => OnError::Fail,
            Some("dead-letter") => OnError::DeadLetter,
            Some(other) => {
                return cx.err(
                    o.on_error.as_ref().unwrap().span(),
                    format!("operator `{id}`: unknown on_error `{other}`; use \"fail\" or \"dead-letter\""),
                );
            }
        };
        let state_backend = match o.state_backend.as_ref().map(|s| s.get_ref().as_str()) {
            None | Some("memory") => StateBackend::Memory,
            Some("disk") => StateBackend::Disk,
            Some(other) => {
                return cx.err(
                    o.state_backend.as_ref().unwrap().span(),
                    format!("operator `{id}`: unknown state_backend `{other}`; use \"memory\" or \"disk\""),
                );
            }
        };
        let state_cache_mb = match &o.state_cache_mb {
            None => None,
            Some(c) if state_backend != StateBackend::Disk => {
                return cx.err(
                    c.span(),
                    format!(
                        "operator `{id}`: state_cache_mb sizes the disk backend's cache; set state_backend = \"disk\" \
                         or remove it"
                    ),
                );
            }
            Some(c) => Some((*c.get_ref(), cx.line(c.span()).unwrap_or(0))),
        };
        let line = cx.line(o.id.span()).unwrap_or(0);
        nodes.push(Node {
            id,
            parallelism: p,
            kind: NodeKind::Operator(OperatorNode { component, config, on_error, state_backend, state_cache_mb }),
            line,
        });
    }
    for s in &spec.sink {
        let id = add_id(cx, &s.id)?;
        let p = parallelism(cx, &s.parallelism, default_p, max_p, id.as_str())?;
        let postgres = s.kind.get_ref() == "postgres";
        let format = match s.format.as_ref().map(|f| f.get_ref().as_str()) {
            _ if postgres => SinkFormat::Value,
            None | Some("value") => SinkFormat::Value,
            Some("key_value") => SinkFormat::KeyValue,
            Some(other) => {
                return cx.err(
                    s.format.as_ref().unwrap().span(),
                    format!("sink `{id}`: unknown format `{other}`; use `value` or `key_value`"),
                );
            }
        };
        if let Some(l) = s.latency.as_ref().filter(|_| s.kind.get_ref() != "blackhole") {
            return cx.err(l.span(), format!("sink `{id}`: `latency` is an option of `blackhole` sinks only"));
        }
        let is_kafka = s.kind.get_ref() == "kafka";
        if !postgres && let Some((name, span)) = postgres_only(s).filter(|o| !(is_kafka && o.0 == "transaction_prefix"))
        {
            return cx.err(span, format!("sink `{id}`: `{name}` is an option of `postgres` sinks only"));
        }
        if !is_kafka && let Some((name, span)) = kafka::sink_only(s) {
            return cx.err(span, format!("sink `{id}`: `{name}` is an option of `kafka` sinks only"));
        }
        let rate = match &s.rate {
            Some(r) if !matches!(s.kind.get_ref().as_str(), "file" | "blackhole") => {
                return cx
                    .err(r.span(), format!("sink `{id}`: `rate` is an option of `file` and `blackhole` sinks only"));
            }
            Some(r) if *r.get_ref() == 0 => {
                return cx.err(r.span(), format!("sink `{id}`: `rate` must be at least 1 record per second"));
            }
            r => r.as_ref().map(|r| *r.get_ref()),
        };
        let kind = match s.kind.get_ref().as_str() {
            "file" => {
                let Some(path) = &s.path else {
                    return cx.err(s.id.span(), format!("file sink `{id}` needs `path = \"<output directory>\"`"));
                };
                SinkKind::File { path: cx.path(path.get_ref()), format, rate }
            }
            "stdout" => SinkKind::Stdout { format },
            "blackhole" => SinkKind::Blackhole { latency: s.latency.as_ref().is_some_and(|l| *l.get_ref()), rate },
            "postgres" => SinkKind::Postgres(postgres_target(cx, s, id.as_str(), &name)?),
            "kafka" => {
                let (target, delivery) = kafka::sink(cx, s, id.as_str(), &name)?;
                kafka_deliveries.push((nodes.len(), delivery));
                SinkKind::Kafka(target)
            }
            other => {
                return cx.err(
                    s.kind.span(),
                    format!(
                        "sink `{id}`: unknown type `{other}`; use `file`, `stdout`, `blackhole`, `postgres` or `kafka`"
                    ),
                );
            }
        };
        let line = cx.line(s.id.span()).unwrap_or(0);
        nodes.push(Node { id, parallelism: p, kind: NodeKind::Sink(kind), line });
    }

    let index: BTreeMap<String, usize> = nodes.iter().enumerate().map(|(i, n)| (n.id.to_string(), i)).collect();
    let known = || index.keys().cloned().collect::<Vec<_>>().join(", ");
    let mut edges = Vec::new();
    let consumers =
        spec.operator.iter().map(|o| (&o.id, &o.inputs)).chain(spec.sink.iter().map(|s| (&s.id, &s.inputs)));
    for (to_id, inputs) in consumers {
        let to = index[to_id.get_ref()];
        if inputs.is_empty() {
            return cx.err(
                to_id.span(),
                format!("`{}` has no inputs; add `inputs = [{{ from = \"<id>\" }}]`", to_id.get_ref()),
            );
        }
        for input in inputs {
            edges.push(edge(cx, &nodes, &index, to, input, &known)?);
        }
    }
    check_acyclic(cx, &nodes, &edges)?;
    for e in edges.iter().filter(|e| e.feedback) {
        // A feedback edge must close a loop: its source must be reachable from its target
        // without it.
        let mut seen = vec![false; nodes.len()];
        let mut stack = vec![e.to];
        let mut closes = false;
        while let Some(n) = stack.pop() {
            if n == e.from {
                closes = true;
                break;
            }
            if std::mem::replace(&mut seen[n], true) {
                continue;
            }
            stack.extend(edges.iter().filter(|x| x.from == n && !x.feedback).map(|x| x.to));
        }
        if !closes {
            return Err(JobError {
                file: cx.file.to_path_buf(),
                line: Some(e.line),
                message: format!(
                    "the input of `{}` from `{}` is marked feedback but closes no loop (`{}` is not downstream of `{}`); remove `feedback = true`",
                    nodes[e.to].id, nodes[e.from].id, nodes[e.from].id, nodes[e.to].id
                ),
            });
        }
    }
    for (i, n) in nodes.iter().enumerate() {
        if matches!(n.kind, NodeKind::Source(_)) && !edges.iter().any(|e| e.from == i) {
            return Err(JobError {
                file: cx.file.to_path_buf(),
                line: Some(n.line),
                message: format!(
                    "source `{}` is not read by any operator or sink; remove it or add it to an `inputs` list",
                    n.id
                ),
            });
        }
    }
    // A restore opens every file of a chain.
    const MAX_CHAIN_LINKS: u32 = 1000;
    let checkpoint = match &spec.checkpoint {
        Some(c) if *c.interval_ms.get_ref() > 0 => {
            let d = CheckpointSettings::default();
            let positive = |v: &Option<Spanned<u32>>, name: &str, default: usize| -> Result<usize, JobError> {
                match v {
                    Some(x) if *x.get_ref() == 0 => cx.err(x.span(), format!("[checkpoint] {name} must be at least 1")),
                    Some(x) => Ok(*x.get_ref() as usize),
                    None => Ok(default),
                }
            };
            let (dir, remote) = checkpoint_dir(cx, c)?;
            let alignment = alignment(cx, c)?;
            Some(CheckpointConfig {
                dir,
                remote,
                settings: CheckpointSettings {
                    interval_ms: *c.interval_ms.get_ref(),
                    timeout_ms: c.timeout_ms.unwrap_or(d.timeout_ms),
                    min_pause_ms: c.min_pause_ms.unwrap_or(d.min_pause_ms),
                    max_concurrent: positive(&c.max_concurrent, "max_concurrent", d.max_concurrent)?,
                    retained: positive(&c.retained, "retained", d.retained)?,
                },
                incremental: c.incremental,
                max_chain_links: match &c.max_chain_links {
                    Some(n) if *n.get_ref() > MAX_CHAIN_LINKS => {
                        return cx.err(n.span(), format!("[checkpoint] max_chain_links is at most {MAX_CHAIN_LINKS}"));
                    }
                    Some(_) => Some(positive(&c.max_chain_links, "max_chain_links", 0)?),
                    None => None,
                },
                alignment,
            })
        }
        _ => None,
    };
    let restart = match &spec.restart {
        None if checkpoint.is_some() => RestartStrategy::FixedDelay { attempts: 3, delay_ms: 1000 },
        None => RestartStrategy::None,
        Some(r) => match r.strategy.get_ref().as_str() {
            "none" => RestartStrategy::None,
            "fixed-delay" => {
                RestartStrategy::FixedDelay { attempts: r.attempts.unwrap_or(3), delay_ms: r.delay_ms.unwrap_or(1000) }
            }
            "exponential-backoff" => RestartStrategy::ExponentialBackoff {
                attempts: r.attempts.unwrap_or(10),
                initial_ms: r.delay_ms.unwrap_or(100),
                max_ms: r.max_delay_ms.unwrap_or(60_000),
                multiplier: r.multiplier.unwrap_or(2.0).max(1.0),
            },
            other => {
                return cx.err(
                    r.strategy.span(),
                    format!("[restart] unknown strategy `{other}`; use `none`, `fixed-delay` or `exponential-backoff`"),
                );
            }
        },
    };
    let guarantee = match spec.job.guarantee.as_ref().map(|g| (g.get_ref().as_str(), g.span())) {
        None | Some(("exactly-once", _)) => Guarantee::ExactlyOnce,
        Some(("at-least-once", _)) => Guarantee::AtLeastOnce,
        Some((other, span)) => {
            return cx
                .err(span, format!("[job] guarantee `{other}` is unknown; use `exactly-once` or `at-least-once`"));
        }
    };
    for (i, explicit) in kafka_deliveries {
        let n = &mut nodes[i];
        if let NodeKind::Sink(SinkKind::Kafka(t)) = &mut n.kind {
            let interval = checkpoint.as_ref().map(|c| c.settings.interval_ms);
            kafka::delivery(t, explicit, interval, guarantee == Guarantee::ExactlyOnce, n.id.as_str())
                .map_err(|message| JobError { file: cx.file.to_path_buf(), line: Some(n.line), message })?;
        }
    }
    if checkpoint.is_some() && guarantee == Guarantee::ExactlyOnce {
        for n in &nodes {
            if let NodeKind::Source(k) = &n.kind
                && !k.replayable()
            {
                return Err(JobError {
                    file: cx.file.to_path_buf(),
                    line: Some(n.line),
                    message: format!(
                        "source `{}` cannot rewind, so this checkpointed job cannot be exactly-once; use a replayable \
                         source (file, generator), or set [job] guarantee = \"at-least-once\" to accept that records it \
                         delivered after the last checkpoint are not read again after a failure",
                        n.id
                    ),
                });
            }
        }
    }
    let limits = match &spec.limits {
        None => Limits::default(),
        Some(l) => {
            let d = Limits::default();
            let v = l.get_ref();
            let limits = Limits {
                memory_mb: v.memory_mb.unwrap_or(d.memory_mb),
                call_timeout_ms: v.call_timeout_ms.unwrap_or(d.call_timeout_ms),
                max_emit_mb: v.max_emit_mb.unwrap_or(d.max_emit_mb),
                max_snapshot_mb: v.max_snapshot_mb.unwrap_or(d.max_snapshot_mb),
                max_state_value_mb: v.max_state_value_mb.unwrap_or(d.max_state_value_mb),
                max_timer_mb: v.max_timer_mb.unwrap_or(d.max_timer_mb),
                max_feedback_mb: v.max_feedback_mb.unwrap_or(d.max_feedback_mb),
            };
            if let Some((name, value, ceiling)) = limits.above(&CEILING) {
                return cx.err(
                    l.span(),
                    format!(
                        "[limits] {name} = {value} is above this host's ceiling of {ceiling}; ask for at most {ceiling}"
                    ),
                );
            }
            for (name, value) in [
                ("memory_mb", limits.memory_mb),
                ("call_timeout_ms", limits.call_timeout_ms),
                ("max_emit_mb", limits.max_emit_mb),
                ("max_snapshot_mb", limits.max_snapshot_mb),
                ("max_state_value_mb", limits.max_state_value_mb),
                ("max_timer_mb", limits.max_timer_mb),
                ("max_feedback_mb", limits.max_feedback_mb),
            ] {
                if value == 0 {
                    return cx.err(l.span(), format!("[limits] {name} must be at least 1"));
                }
            }
            limits
        }
    };
    for n in &nodes {
        if let NodeKind::Operator(OperatorNode { state_cache_mb: Some((mb, line)), .. }) = &n.kind
            && *mb > limits.memory_mb / 2
        {
            return Err(JobError {
                file: cx.file.to_path_buf(),
                line: Some(*line),
                message: format!(
                    "operator `{}`: state_cache_mb = {mb} leaves too little of [limits] memory_mb = {} for the rest \
                     (batches, pages in flight): use at most half of memory_mb",
                    n.id, limits.memory_mb
                ),
            });
        }
    }
    Ok(JobGraph {
        name,
        file: cx.file.to_path_buf(),
        max_parallelism: max_p,
        batch_size,
        channel_capacity,
        nodes,
        edges,
        checkpoint,
        restart,
        guarantee,
        limits,
    })
}

fn edge(
    cx: &Ctx,
    nodes: &[Node],
    index: &BTreeMap<String, usize>,
    to: usize,
    input: &InputSpec,
    known: &dyn Fn() -> String,
) -> Result<Edge, JobError> {
    let to_node = &nodes[to];
    let from_name = input.from.get_ref();
    let Some(&from) = index.get(from_name) else {
        return cx.err(
            input.from.span(),
            format!(
                "`{}` reads from unknown id `{from_name}`; inputs must name a source or operator (known ids: {})",
                to_node.id,
                known()
            ),
        );
    };
    let from_node = &nodes[from];
    if matches!(from_node.kind, NodeKind::Sink(_)) {
        return cx
            .err(input.from.span(), format!("`{}` reads from sink `{from_name}`; sinks have no output", to_node.id));
    }
    let feedback = input.feedback.as_ref().is_some_and(|f| *f.get_ref());
    if from == to && !feedback {
        return cx.err(
            input.from.span(),
            format!("`{}` reads from itself; a self-loop must be marked `feedback = true`", to_node.id),
        );
    }
    if feedback && !matches!(to_node.kind, NodeKind::Operator(_)) {
        return cx.err(input.from.span(), format!("`{}`: only operators can take feedback inputs", to_node.id));
    }
    let partition = match &input.partition {
        None if from_node.parallelism == to_node.parallelism => Partition::Forward,
        None => Partition::Rebalance,
        Some(p) => Partition::parse(p.get_ref()).map_or_else(
            || {
                cx.err(
                    p.span(),
                    format!("unknown partition `{}`; use forward, hash, broadcast or rebalance", p.get_ref()),
                )
            },
            Ok,
        )?,
    };
    if partition == Partition::Forward && from_node.parallelism != to_node.parallelism {
        let span = input.partition.as_ref().map(|p| p.span()).unwrap_or(input.from.span());
        return cx.err(
            span,
            format!(
                "forward edge `{from_name}` (parallelism {}) -> `{}` (parallelism {}) needs equal parallelism; use `rebalance` or `hash`",
                from_node.parallelism, to_node.id, to_node.parallelism
            ),
        );
    }
    let side = match input.side.as_ref().map(|s| s.get_ref().as_str()) {
        None | Some("left") => Side::Left,
        Some("right") => Side::Right,
        Some(other) => {
            return cx
                .err(input.side.as_ref().unwrap().span(), format!("unknown side `{other}`; use `left` or `right`"));
        }
    };
    if let Some(side) = &input.side
        && !matches!(to_node.kind, NodeKind::Operator(_))
    {
        return cx.err(side.span(), format!("`side` applies to two-input operators, not to `{}`", to_node.id));
    }
    let output = input.output.as_ref().map(|o| o.get_ref().clone());
    if let Some(o) = &input.output
        && !matches!(from_node.kind, NodeKind::Operator(_))
    {
        return cx.err(o.span(), format!("`output` names a side output of an operator; `{from_name}` is not one"));
    }
    Ok(Edge {
        from,
        output,
        port: 0,
        to,
        side,
        side_given: input.side.is_some(),
        partition,
        feedback,
        line: cx.line(input.from.span()).unwrap_or(0),
    })
}

fn check_acyclic(cx: &Ctx, nodes: &[Node], edges: &[Edge]) -> Result<(), JobError> {
    // Iterative DFS with colours; a grey successor closes a cycle.
    let n = nodes.len();
    let mut colour = vec![0u8; n];
    for root in 0..n {
        if colour[root] != 0 {
            continue;
        }
        let mut stack = vec![(root, 0usize)];
        let mut path = vec![root];
        colour[root] = 1;
        while let Some((node, next)) = stack.last_mut() {
            let succ: Vec<&Edge> = edges.iter().filter(|e| e.from == *node && !e.feedback).collect();
            if *next < succ.len() {
                let e = succ[*next];
                *next += 1;
                match colour[e.to] {
                    0 => {
                        colour[e.to] = 1;
                        stack.push((e.to, 0));
                        path.push(e.to);
                    }
                    1 => {
                        let start = path.iter().position(|&x| x == e.to).unwrap();
                        let mut names: Vec<String> = path[start..].iter().map(|&i| nodes[i].id.to_string()).collect();
                        names.push(nodes[e.to].id.to_string());
                        return Err(JobError {
                            file: cx.file.to_path_buf(),
                            line: Some(e.line),
                            message: format!(
                                "the inputs form a loop {} with no edge marked as feedback; mark the input that \
                                 closes the loop with `feedback = true` (e.g. {{ from = \"{}\", feedback = true }})",
                                names.join(" -> "),
                                nodes[*node].id
                            ),
                        });
                    }
                    _ => {}
                }
            } else {
                colour[*node] = 2;
                stack.pop();
                path.pop();
            }
        }
    }
    Ok(())
}

/// `[checkpoint] alignment`.
fn alignment(cx: &Ctx<'_>, c: &crate::job::spec::CheckpointSpec) -> Result<crate::graph::logical::Alignment, JobError> {
    use crate::graph::logical::Alignment;
    let mut alignment = match c.alignment.as_ref().map(|a| (a, a.get_ref().as_str())) {
        None | Some((_, "aligned")) => Alignment::Aligned,
        Some((_, "unaligned")) => Alignment::Unaligned { aligned_for: std::time::Duration::ZERO },
        Some((a, other)) => {
            return cx.err(
                a.span(),
                format!("[checkpoint] alignment must be \"aligned\" or \"unaligned\", got \"{other}\""),
            );
        }
    };
    if let Some(t) = &c.alignment_timeout_ms {
        let ms = *t.get_ref();
        let why = if alignment.overtakes() {
            Some(
                "applies to aligned checkpoints (they switch to unaligned after it), and with alignment = \
                 \"unaligned\" every checkpoint is unaligned from the start: remove one of the two"
                    .to_string(),
            )
        } else if ms == 0 {
            Some("must be at least 1 (for unaligned checkpoints from the start, set alignment = \"unaligned\")".into())
        } else {
            let timeout = c.timeout_ms.unwrap_or(CheckpointSettings::default().timeout_ms);
            (ms >= timeout).then(|| {
                format!(
                    "must be below the checkpoint's timeout_ms ({timeout}), or checkpoints time out before they \
                     switch to unaligned"
                )
            })
        };
        if let Some(why) = why {
            return cx.err(t.span(), format!("[checkpoint] alignment_timeout_ms = {ms} {why}"));
        }
        alignment = Alignment::Unaligned { aligned_for: std::time::Duration::from_millis(ms) };
    }
    if let Some(m) = c.max_concurrent.as_ref().filter(|m| *m.get_ref() > 1 && alignment.overtakes()) {
        // A barrier overtakes the previous checkpoint's records: one at a time (as in Flink).
        return cx.err(
            m.span(),
            format!(
                "[checkpoint] max_concurrent = {} with unaligned checkpoints (alignment = \"unaligned\" or \
                 alignment_timeout_ms): they run one at a time; remove max_concurrent",
                m.get_ref()
            ),
        );
    }
    Ok(alignment)
}

/// The first option of `postgres` sinks that `s` sets: (name, where).
/// `[checkpoint] dir` as (local directory, object store URL): a path relative to the job
/// file, or `s3://bucket/prefix` with `staging_dir` (default `checkpoints`) as the local copy.
fn checkpoint_dir(cx: &Ctx<'_>, c: &crate::job::spec::CheckpointSpec) -> Result<(PathBuf, Option<String>), JobError> {
    let staging = c.staging_dir.as_ref().map(|d| d.get_ref().as_str());
    match &c.dir {
        Some(d) if d.get_ref().contains("://") => {
            if let Err(why) = crate::checkpoint::remote::parse_url(d.get_ref()) {
                return cx.err(d.span(), format!("[checkpoint] dir `{}`: {why}", d.get_ref()));
            }
            Ok((cx.path(staging.unwrap_or("checkpoints")), Some(d.get_ref().clone())))
        }
        _ if staging.is_some() => {
            let span = c.staging_dir.as_ref().map(|d| d.span()).unwrap_or_default();
            cx.err(span, "[checkpoint] staging_dir is the local copy of an object store; set dir = \"s3://bucket/prefix\" or remove it")
        }
        d => Ok((cx.path(d.as_ref().map(|d| d.get_ref().as_str()).unwrap_or("checkpoints")), None)),
    }
}

fn postgres_only(s: &SinkSpec) -> Option<(&'static str, Range<usize>)> {
    let text = |o: &Option<Spanned<String>>| o.as_ref().map(|v| v.span());
    let list = |o: &Option<Spanned<Vec<String>>>| o.as_ref().map(|v| v.span());
    [
        ("url", text(&s.url)),
        ("table", text(&s.table)),
        ("mode", text(&s.mode)),
        ("key", list(&s.key)),
        ("columns", list(&s.columns)),
        ("delimiter", text(&s.delimiter)),
        ("transaction_prefix", text(&s.transaction_prefix)),
        ("ca_cert", text(&s.ca_cert)),
    ]
    .into_iter()
    .find_map(|(n, span)| span.map(|sp| (n, sp)))
}

/// A `postgres` sink's target: `url`, `table`, `format` (`json` or `csv` with `columns` and
/// `delimiter`), `mode` (`append` or `upsert` with `key`), `transaction_prefix`.
fn postgres_target(cx: &Ctx<'_>, s: &SinkSpec, id: &str, job: &str) -> Result<PostgresTarget, JobError> {
    let need = |o: &Option<Spanned<String>>, what: &str, example: &str| match o {
        Some(v) if !v.get_ref().trim().is_empty() => Ok(v.get_ref().trim().to_string()),
        _ => cx.err(s.id.span(), format!("postgres sink `{id}` needs `{what} = \"{example}\"`")),
    };
    let url = need(&s.url, "url", "host=127.0.0.1 port=5432 user=weir dbname=weir")?;
    if let Err(e) = url.parse::<postgres::Config>() {
        return cx.err(
            s.url.as_ref().unwrap().span(),
            format!("sink `{id}`: `url` is not a PostgreSQL connection string: {e}"),
        );
    }
    let table = need(&s.table, "table", "public.counts")?;
    let ident_ok = |n: &str| !n.is_empty() && n.len() <= 63 && !n.contains('\0');
    if !table.split('.').all(ident_ok) || table.split('.').count() > 2 {
        return cx
            .err(s.table.as_ref().unwrap().span(), format!("sink `{id}`: `table` must be `table` or `schema.table`"));
    }
    let columns = s.columns.as_ref().map(|c| c.get_ref().clone()).unwrap_or_default();
    let key = s.key.as_ref().map(|c| c.get_ref().clone()).unwrap_or_default();
    for c in columns.iter().chain(&key) {
        if !ident_ok(c) {
            return cx.err(s.id.span(), format!("sink `{id}`: column name `{c}` must be 1 to 63 bytes"));
        }
    }
    let format = match s.format.as_ref().map(|f| f.get_ref().as_str()) {
        None | Some("json") => ValueFormat::Json,
        Some("csv") => {
            let delimiter = match s.delimiter.as_ref().map(|d| d.get_ref().as_bytes()) {
                None => b',',
                Some([d]) if *d != b'"' && *d != b'\n' => *d,
                Some(_) => {
                    return cx.err(
                        s.delimiter.as_ref().unwrap().span(),
                        format!("sink `{id}`: `delimiter` must be one ASCII character other than a quote or newline"),
                    );
                }
            };
            if columns.is_empty() {
                return cx.err(
                    s.id.span(),
                    format!("postgres sink `{id}` with format = \"csv\" needs `columns = [...]` in field order"),
                );
            }
            ValueFormat::Csv { delimiter }
        }
        Some(other) => {
            return cx.err(
                s.format.as_ref().unwrap().span(),
                format!("sink `{id}`: unknown format `{other}` for a postgres sink; use `json` or `csv`"),
            );
        }
    };
    if let (ValueFormat::Json, Some(d)) = (format, &s.delimiter) {
        return cx.err(d.span(), format!("sink `{id}`: `delimiter` is an option of format = \"csv\""));
    }
    let upsert_key = match s.mode.as_ref().map(|m| m.get_ref().as_str()) {
        None | Some("append") if key.is_empty() => Vec::new(),
        None | Some("append") => {
            return cx.err(s.key.as_ref().unwrap().span(), format!("sink `{id}`: `key` needs mode = \"upsert\""));
        }
        Some("upsert") if key.is_empty() => {
            return cx.err(s.id.span(), format!("sink `{id}`: mode = \"upsert\" needs `key = [\"<column>\", ...]`"));
        }
        Some("upsert") => key,
        Some(other) => {
            return cx.err(
                s.mode.as_ref().unwrap().span(),
                format!("sink `{id}`: unknown mode `{other}`; use `append` or `upsert`"),
            );
        }
    };
    if !columns.is_empty()
        && let Some(k) = upsert_key.iter().find(|k| !columns.contains(k))
    {
        return cx.err(s.id.span(), format!("sink `{id}`: key column `{k}` is not among `columns`"));
    }
    let transaction_prefix = match &s.transaction_prefix {
        None if format!("weir/{job}/{id}").len() > crate::connectors::postgres_sink::MAX_PREFIX => {
            return cx.err(
                s.id.span(),
                format!("sink `{id}`: the job and sink names are too long for transaction ids; set a shorter `transaction_prefix`"),
            );
        }
        None => format!("weir/{job}/{id}"),
        Some(p) => {
            let p2 = p.get_ref();
            if p2.is_empty() || p2.len() > crate::connectors::postgres_sink::MAX_PREFIX || !p2.is_ascii() {
                return cx.err(
                    p.span(),
                    format!(
                        "sink `{id}`: `transaction_prefix` must be 1 to {} ASCII characters",
                        crate::connectors::postgres_sink::MAX_PREFIX
                    ),
                );
            }
            p2.clone()
        }
    };
    let ca_cert = s.ca_cert.as_ref().map(|c| cx.path(c.get_ref()));
    Ok(PostgresTarget { url, table, upsert_key, columns, format, transaction_prefix, ca_cert })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unquoted_text_gets_a_hint_in_plain_words() {
        assert_eq!(syntax_hint("name = wordcount").unwrap(), "text needs quotes in TOML: write `name = \"wordcount\"`");
        assert_eq!(
            syntax_hint("path = ./in.txt  # input").unwrap(),
            "text needs quotes in TOML: write `path = \"./in.txt\"`"
        );
        assert_eq!(syntax_hint("count = 12x"), None);
        assert_eq!(syntax_hint("flag = true"), None);
        assert_eq!(syntax_hint("[[source]"), None);
    }
}
