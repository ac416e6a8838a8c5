//! The `kafka` source and sink options of a job file, validated: every refusal names the
//! source or sink, the option, and what to write instead.

use std::ops::Range;

use toml::Spanned;

use super::{Ctx, JobError};
use crate::graph::logical::{KafkaPartitioner, KafkaSource, KafkaStart, KafkaTarget, KafkaTopics};
use crate::job::spec::{SinkSpec, SourceSpec};

/// Default `transaction.timeout.ms`: the largest a Kafka broker accepts by default
/// (`transaction.max.timeout.ms`, 15 minutes).
pub const DEFAULT_TRANSACTION_TIMEOUT_MS: u64 = 900_000;
/// Longest transactional id prefix.
const MAX_PREFIX: usize = 200;
/// Kafka's longest topic name.
const MAX_TOPIC: usize = 249;

/// The first option of `kafka` sources that `s` sets: (name, where).
pub(super) fn source_only(s: &SourceSpec) -> Option<(&'static str, Range<usize>)> {
    [
        ("bootstrap_servers", s.bootstrap_servers.as_ref().map(|v| v.span())),
        ("topics", s.topics.as_ref().map(|v| v.span())),
        ("topic_pattern", s.topic_pattern.as_ref().map(|v| v.span())),
        ("start", s.start.as_ref().map(|v| v.span())),
        ("start_timestamp_ms", s.start_timestamp_ms.as_ref().map(|v| v.span())),
        ("group", s.group.as_ref().map(|v| v.span())),
        ("bounded", s.bounded.as_ref().map(|v| v.span())),
        ("discovery_interval_ms", s.discovery_interval_ms.as_ref().map(|v| v.span())),
        ("idle_timeout_ms", s.idle_timeout_ms.as_ref().map(|v| v.span())),
        ("isolation", s.isolation.as_ref().map(|v| v.span())),
    ]
    .into_iter()
    .find_map(|(n, span)| span.map(|sp| (n, sp)))
}

/// The first option of `kafka` sinks that `s` sets: (name, where).
pub(super) fn sink_only(s: &SinkSpec) -> Option<(&'static str, Range<usize>)> {
    [
        ("bootstrap_servers", s.bootstrap_servers.as_ref().map(|v| v.span())),
        ("topic", s.topic.as_ref().map(|v| v.span())),
        ("delivery", s.delivery.as_ref().map(|v| v.span())),
        ("transaction_timeout_ms", s.transaction_timeout_ms.as_ref().map(|v| v.span())),
        ("partitioner", s.partitioner.as_ref().map(|v| v.span())),
        ("timestamps", s.timestamps.as_ref().map(|v| v.span())),
    ]
    .into_iter()
    .find_map(|(n, span)| span.map(|sp| (n, sp)))
}

fn bootstrap(cx: &Ctx<'_>, v: &Option<Spanned<String>>, what: &str) -> Result<String, JobError> {
    let Some(b) = v else {
        return cx.err(0..0, format!("{what} needs `bootstrap_servers = \"<host>:<port>\"`"));
    };
    let text = b.get_ref().trim();
    let ok = !text.is_empty()
        && text.len() <= 1024
        && text.split(',').all(|hp| {
            hp.trim().rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0))
        });
    if !ok {
        return cx.err(
            b.span(),
            format!("{what}: bootstrap_servers `{text}` is not a list of host:port; write e.g. \"127.0.0.1:9092\""),
        );
    }
    Ok(text.to_string())
}

fn topic_name(cx: &Ctx<'_>, span: Range<usize>, t: &str, what: &str) -> Result<(), JobError> {
    let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if t.is_empty() || t.len() > MAX_TOPIC || !t.chars().all(legal) || t == "." || t == ".." {
        return cx
            .err(span, format!("{what}: `{t}` is not a Kafka topic name (1 to {MAX_TOPIC} of a-z A-Z 0-9 . _ -)"));
    }
    Ok(())
}

/// A `kafka` source's options.
pub(super) fn source(cx: &Ctx<'_>, s: &SourceSpec, id: &str, job: &str) -> Result<KafkaSource, JobError> {
    let what = format!("kafka source `{id}`");
    let at = |e: JobError| if e.line.is_none() { JobError { line: cx.line(s.id.span()), ..e } } else { e };
    let bootstrap = bootstrap(cx, &s.bootstrap_servers, &what).map_err(at)?;
    let topics = match (&s.topics, &s.topic_pattern) {
        (Some(_), Some(p)) => {
            return cx.err(p.span(), format!("{what}: set `topics` or `topic_pattern`, not both"));
        }
        (Some(t), None) => {
            if t.get_ref().is_empty() {
                return cx.err(t.span(), format!("{what}: `topics` is empty; name at least one topic"));
            }
            for name in t.get_ref() {
                topic_name(cx, t.span(), name, &what)?;
            }
            KafkaTopics::List(t.get_ref().clone())
        }
        (None, Some(p)) => {
            if let Err(e) = regex::Regex::new(&format!("^(?:{})$", p.get_ref())) {
                return cx.err(p.span(), format!("{what}: topic_pattern is not a regular expression: {e}"));
            }
            KafkaTopics::Pattern(p.get_ref().clone())
        }
        (None, None) => {
            return cx
                .err(s.id.span(), format!("{what} needs `topics = [\"<topic>\"]` or `topic_pattern = \"<regex>\"`"));
        }
    };
    let start = match s.start.as_ref().map(|v| (v.get_ref().as_str(), v.span())) {
        None | Some(("earliest", _)) => KafkaStart::Earliest,
        Some(("latest", _)) => KafkaStart::Latest,
        Some(("group", _)) => KafkaStart::Group,
        Some(("timestamp", span)) => match &s.start_timestamp_ms {
            Some(t) => KafkaStart::Timestamp(*t.get_ref()),
            None => {
                return cx.err(
                    span,
                    format!("{what}: start = \"timestamp\" needs `start_timestamp_ms = <ms since the epoch>`"),
                );
            }
        },
        Some((other, span)) => {
            return cx.err(
                span,
                format!("{what}: unknown start `{other}`; use `earliest`, `latest`, `timestamp` or `group`"),
            );
        }
    };
    if let Some(t) = s.start_timestamp_ms.as_ref().filter(|_| !matches!(start, KafkaStart::Timestamp(_))) {
        return cx.err(t.span(), format!("{what}: start_timestamp_ms needs start = \"timestamp\""));
    }
    let group = match &s.group {
        Some(g) if g.get_ref().is_empty() || g.get_ref().len() > 255 => {
            return cx.err(g.span(), format!("{what}: `group` must be 1 to 255 characters"));
        }
        Some(g) => g.get_ref().clone(),
        None => format!("weir-{job}-{id}"),
    };
    let read_committed = match s.isolation.as_ref().map(|v| (v.get_ref().as_str(), v.span())) {
        None | Some(("read_committed", _)) => true,
        Some(("read_uncommitted", _)) => false,
        Some((other, span)) => {
            return cx
                .err(span, format!("{what}: unknown isolation `{other}`; use `read_committed` or `read_uncommitted`"));
        }
    };
    let ms = |v: &Option<Spanned<u64>>, default: u64| v.as_ref().map_or(default, |v| *v.get_ref());
    Ok(KafkaSource {
        bootstrap,
        topics,
        start,
        group,
        bounded: s.bounded.as_ref().is_some_and(|b| *b.get_ref()),
        discovery_interval_ms: ms(&s.discovery_interval_ms, 10_000),
        idle_timeout_ms: ms(&s.idle_timeout_ms, 0),
        watermark_delay_ms: ms(&s.watermark_delay_ms, 0),
        read_committed,
        rate: s.rate.as_ref().map(|v| *v.get_ref()).filter(|&r| r > 0),
    })
}

/// A `kafka` sink's options; its delivery is `None` when the job file leaves it to the job
/// (see [`delivery`]).
pub(super) fn sink(cx: &Ctx<'_>, s: &SinkSpec, id: &str, job: &str) -> Result<(KafkaTarget, Option<bool>), JobError> {
    let what = format!("kafka sink `{id}`");
    let at = |e: JobError| if e.line.is_none() { JobError { line: cx.line(s.id.span()), ..e } } else { e };
    let bootstrap = bootstrap(cx, &s.bootstrap_servers, &what).map_err(at)?;
    let Some(topic) = &s.topic else {
        return cx.err(s.id.span(), format!("{what} needs `topic = \"<topic>\"`"));
    };
    topic_name(cx, topic.span(), topic.get_ref(), &what)?;
    let delivery = match s.delivery.as_ref().map(|v| (v.get_ref().as_str(), v.span())) {
        None => None,
        Some(("exactly-once", _)) => Some(true),
        Some(("at-least-once", _)) => Some(false),
        Some((other, span)) => {
            return cx.err(span, format!("{what}: unknown delivery `{other}`; use `exactly-once` or `at-least-once`"));
        }
    };
    let partitioner = match s.partitioner.as_ref().map(|v| (v.get_ref().as_str(), v.span())) {
        None | Some(("key", _)) => KafkaPartitioner::Key,
        Some(("subtask", _)) => KafkaPartitioner::Subtask,
        Some((other, span)) => {
            return cx.err(span, format!("{what}: unknown partitioner `{other}`; use `key` or `subtask`"));
        }
    };
    let event_timestamps = match s.timestamps.as_ref().map(|v| (v.get_ref().as_str(), v.span())) {
        None | Some(("event", _)) => true,
        Some(("now", _)) => false,
        Some((other, span)) => {
            return cx.err(
                span,
                format!("{what}: unknown timestamps `{other}`; use `event` (the record's event time) or `now`"),
            );
        }
    };
    let transaction_prefix = match &s.transaction_prefix {
        Some(p) => {
            let t = p.get_ref();
            if t.is_empty() || t.len() > MAX_PREFIX || !t.is_ascii() {
                return cx
                    .err(p.span(), format!("{what}: `transaction_prefix` must be 1 to {MAX_PREFIX} ASCII characters"));
            }
            t.clone()
        }
        None => format!("weir-{job}-{id}"),
    };
    let transaction_timeout_ms = match &s.transaction_timeout_ms {
        Some(t) if *t.get_ref() == 0 => {
            return cx.err(t.span(), format!("{what}: transaction_timeout_ms must be at least 1"));
        }
        Some(t) => *t.get_ref(),
        None => DEFAULT_TRANSACTION_TIMEOUT_MS,
    };
    let target = KafkaTarget {
        bootstrap,
        topic: topic.get_ref().clone(),
        exactly_once: delivery.unwrap_or(true),
        transaction_prefix,
        transaction_timeout_ms,
        partitioner,
        event_timestamps,
    };
    Ok((target, delivery))
}

/// Settles a Kafka sink's delivery once the job's checkpointing is known: by default
/// exactly-once when the job is checkpointed and exactly-once, else at-least-once. An
/// exactly-once sink needs checkpoints (its transactions commit when they complete) and a
/// transaction timeout longer than their interval.
pub(super) fn delivery(
    target: &mut KafkaTarget,
    explicit: Option<bool>,
    interval_ms: Option<u64>,
    job_exactly_once: bool,
    id: &str,
) -> Result<(), String> {
    target.exactly_once = match (explicit, interval_ms) {
        (Some(true), None) => {
            return Err(format!(
                "kafka sink `{id}`: delivery = \"exactly-once\" commits a Kafka transaction when a checkpoint \
                 completes, and this job has no checkpoints; set [checkpoint] interval_ms, or delivery = \"at-least-once\""
            ));
        }
        (Some(e), _) => e,
        (None, None) => false,
        (None, Some(_)) => job_exactly_once,
    };
    if let (true, Some(interval)) = (target.exactly_once, interval_ms)
        && target.transaction_timeout_ms <= interval
    {
        return Err(format!(
            "kafka sink `{id}`: transaction_timeout_ms = {} is not longer than [checkpoint] interval_ms = {interval}; a \
             transaction stays open for at least one checkpoint interval and the broker aborts it at its timeout, \
             losing its records: raise transaction_timeout_ms (the broker's transaction.max.timeout.ms, 15 minutes by \
             default, caps it) or lower interval_ms",
            target.transaction_timeout_ms
        ));
    }
    Ok(())
}
