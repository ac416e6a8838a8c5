//! `/metrics`: the caller's jobs in the Prometheus text exposition format (version 0.0.4), for
//! `weir run` (its one job) and `weir serve` (a tenant's jobs; scrape with its bearer token).
//!
//! Pure: rendered from job statuses and checkpoint histories. Conventions: `weir_` prefix,
//! `_total` counters, base units (seconds, bytes), labels `tenant`, `job` (the job id),
//! `node` and `subtask` (the subtask index, as Flink's `subtask_index`: sum or min over it in
//! PromQL for a node's figure). Record counters count the current attempt (a restart resets them, which Prometheus'
//! `rate()` treats as a counter reset).

use std::fmt::Write;

use crate::checkpoint::metadata::CheckpointMetrics;
use crate::runtime::handle::{JobState, JobStatus, SubtaskStatus};

/// One job to render.
pub struct JobMetrics<'a> {
    /// Its tenant.
    pub tenant: &'a str,
    /// Its id.
    pub id: &'a str,
    /// Its status now.
    pub status: JobStatus,
    /// Its completed checkpoints, oldest first (the newest is rendered).
    pub checkpoints: Vec<CheckpointMetrics>,
}

/// The state names of `weir_job_state`.
const STATES: [&str; 7] = ["CREATED", "RUNNING", "RESTARTING", "FINISHED", "STOPPED", "CANCELLED", "FAILED"];

fn state_name(s: &JobState) -> &'static str {
    match s {
        JobState::Created => "CREATED",
        JobState::Running => "RUNNING",
        JobState::Restarting { .. } => "RESTARTING",
        JobState::Finished => "FINISHED",
        JobState::Stopped { .. } => "STOPPED",
        JobState::Cancelled => "CANCELLED",
        JobState::Failed { .. } => "FAILED",
    }
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// A per-subtask family: name, type, help, and its value for a subtask (`None`: no sample).
type SubtaskFamily = (&'static str, &'static str, &'static str, Box<dyn Fn(&SubtaskStatus) -> Option<f64>>);

/// The per-subtask families, `now_ms` the time of the scrape (for the watermark's lag).
fn subtask_families(now_ms: f64) -> Vec<SubtaskFamily> {
    let secs = |ms: u64| Some(ms as f64 / 1e3);
    // A watermark worth showing: a time, not the start (MIN) or end of the stream (MAX).
    let time = |s: &SubtaskStatus| s.watermark.filter(|w| *w != i64::MIN && *w != i64::MAX);
    vec![
        (
            "weir_records_in_total",
            "counter",
            "Records the subtask received in this attempt.",
            Box::new(|s| Some(s.counters.records_in as f64)),
        ),
        (
            "weir_records_out_total",
            "counter",
            "Records the subtask emitted in this attempt.",
            Box::new(|s| Some(s.counters.records_out as f64)),
        ),
        (
            "weir_bytes_in_total",
            "counter",
            "Bytes (keys and values) of the records received in this attempt (operators and sinks).",
            Box::new(|s| Some(s.counters.bytes_in as f64)),
        ),
        (
            "weir_bytes_out_total",
            "counter",
            "Bytes (keys and values) of the records operators emitted in this attempt.",
            Box::new(|s| Some(s.counters.bytes_out as f64)),
        ),
        (
            "weir_backpressured_seconds_total",
            "counter",
            "Time the subtask spent blocked on full output channels (rate() of it is Flink's \
             backPressuredTimeMsPerSecond / 1000).",
            Box::new(move |s| secs(s.counters.backpressured_ms)),
        ),
        (
            "weir_busy_seconds_total",
            "counter",
            "Time the subtask spent in guest calls for records, timers and watermarks (rate() of it is Flink's \
             busyTimeMsPerSecond / 1000).",
            Box::new(move |s| secs(s.counters.busy_ms)),
        ),
        (
            "weir_idle_seconds_total",
            "counter",
            "Time the subtask spent waiting for input with nothing to do (rate() of it is Flink's \
             idleTimeMsPerSecond / 1000; operators and sinks).",
            Box::new(move |s| secs(s.counters.idle_ms)),
        ),
        (
            "weir_guest_calls_total",
            "counter",
            "Guest calls for records, timers and watermarks (busy seconds / calls = mean guest time per call).",
            Box::new(|s| Some(s.counters.guest_calls as f64)),
        ),
        (
            "weir_dead_letters_total",
            "counter",
            "Records the operator returned an error for, sent to its dead-letter output (on_error = \"dead-letter\").",
            Box::new(|s| Some(s.counters.dead_letters as f64)),
        ),
        (
            "weir_guest_memory_bytes",
            "gauge",
            "Linear memory the subtask's guest instance holds (operators; capped by memory_mb).",
            Box::new(|s| Some(s.counters.guest_memory_bytes as f64)),
        ),
        (
            "weir_watermark_milliseconds",
            "gauge",
            "The subtask's event-time watermark, ms since the Unix epoch for wall-clock event time (a node's is the \
             least of its subtasks').",
            Box::new(move |s| time(s).map(|w| w as f64)),
        ),
        (
            "weir_watermark_lag_seconds",
            "gauge",
            "Scrape time minus the subtask's watermark (meaningful when event time is wall-clock time).",
            Box::new(move |s| time(s).map(|w| (now_ms - w as f64) / 1e3)),
        ),
    ]
}

/// Renders `jobs`.
pub fn render(jobs: &[JobMetrics<'_>]) -> String {
    let mut out = String::new();
    let family = |out: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    let labels = |j: &JobMetrics<'_>| format!("tenant=\"{}\",job=\"{}\"", escape(j.tenant), escape(j.id));

    family(&mut out, "weir_job_state", "gauge", "1 for the state the job is in, 0 for the others.");
    for j in jobs {
        let now = state_name(&j.status.state);
        for s in STATES {
            let _ = writeln!(out, "weir_job_state{{{},state=\"{s}\"}} {}", labels(j), u8::from(s == now));
        }
    }
    family(&mut out, "weir_job_restarts_total", "counter", "Restarts after failures.");
    for j in jobs {
        let _ = writeln!(out, "weir_job_restarts_total{{{}}} {}", labels(j), j.status.attempts.saturating_sub(1));
    }
    family(&mut out, "weir_job_upgrades_total", "counter", "Live upgrades of operator components.");
    for j in jobs {
        let _ = writeln!(out, "weir_job_upgrades_total{{{}}} {}", labels(j), j.status.upgrades.len());
    }
    let now_ms = crate::runtime::driver::unix_ms() as f64;
    for (name, kind, help, pick) in subtask_families(now_ms) {
        family(&mut out, name, kind, help);
        for j in jobs {
            for n in &j.status.nodes {
                for s in &n.subtasks {
                    if let Some(v) = pick(s) {
                        let (l, node) = (labels(j), escape(&n.uid));
                        let _ = writeln!(out, "{name}{{{l},node=\"{node}\",subtask=\"{}\"}} {v}", s.subtask);
                    }
                }
            }
        }
    }
    family(&mut out, "weir_traps_total", "counter", "Subtask failures by the sandbox limit they ran into.");
    for j in jobs {
        for (limit, n) in &j.status.traps_by_limit {
            let _ = writeln!(out, "weir_traps_total{{{},limit=\"{}\"}} {n}", labels(j), escape(limit));
        }
    }
    family(&mut out, "weir_checkpoints_completed_total", "counter", "Checkpoints completed.");
    for j in jobs {
        let _ = writeln!(out, "weir_checkpoints_completed_total{{{}}} {}", labels(j), j.status.checkpoints);
    }
    family(&mut out, "weir_checkpoints_failed_total", "counter", "Checkpoints that timed out or were declined.");
    for j in jobs {
        let _ = writeln!(out, "weir_checkpoints_failed_total{{{}}} {}", labels(j), j.status.checkpoints_failed);
    }
    type Pick = fn(&CheckpointMetrics) -> f64;
    let last: [(&str, &str, Pick); 5] = [
        ("weir_checkpoint_last_duration_seconds", "Trigger to completion of the newest checkpoint.", |m| {
            m.duration_ms / 1e3
        }),
        (
            "weir_checkpoint_last_sync_seconds",
            "Longest synchronous part (the stream's pause) of the newest checkpoint.",
            |m| m.sync_ms_max / 1e3,
        ),
        ("weir_checkpoint_last_async_seconds", "Longest asynchronous part of the newest checkpoint.", |m| {
            m.async_ms_max / 1e3
        }),
        ("weir_checkpoint_last_alignment_seconds", "Longest barrier alignment of the newest checkpoint.", |m| {
            m.alignment_ms_max / 1e3
        }),
        ("weir_checkpoint_last_size_bytes", "Bytes written by the newest checkpoint.", |m| m.bytes as f64),
    ];
    for (name, help, pick) in last {
        family(&mut out, name, "gauge", help);
        for j in jobs {
            if let Some(m) = j.checkpoints.last() {
                let _ = writeln!(out, "{name}{{{}}} {}", labels(j), pick(m));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::handle::NodeStatus;
    use crate::runtime::metrics::Counters;

    #[test]
    fn renders_families_with_escaped_labels() {
        let counters = Counters {
            records_in: 10,
            records_out: 7,
            bytes_in: 640,
            bytes_out: 448,
            backpressured_ms: 1500,
            busy_ms: 250,
            idle_ms: 3000,
            guest_calls: 4,
            dead_letters: 2,
            guest_memory_bytes: 1 << 20,
        };
        let status = JobStatus {
            name: "wc".into(),
            state: JobState::Running,
            attempts: 2,
            checkpoints: 5,
            last_checkpoint: Some(5),
            checkpoints_failed: 1,
            last_checkpoint_failure: None,
            checkpoint_failures: vec![],
            traps_by_limit: [("cpu_time".to_string(), 1)].into(),
            nodes: vec![NodeStatus {
                uid: "count".into(),
                parallelism: 1,
                component: None,
                records_in: 10,
                records_out: 7,
                backpressured_ms: 1500,
                dead_letters: 2,
                busy_ms: 250,
                kind: "operator".into(),
                inputs: vec![],
                idle_ms: 3000,
                bytes_in: 640,
                bytes_out: 448,
                guest_calls: 4,
                watermark: Some(1_000),
                guest_memory_bytes: 0,
                subtasks: vec![
                    SubtaskStatus { subtask: 0, counters, watermark: Some(1_000) },
                    SubtaskStatus {
                        subtask: 1,
                        counters: Counters { records_in: 1, ..Counters::default() },
                        watermark: Some(i64::MIN),
                    },
                ],
            }],
            upgrades: vec![],
        };
        let m = CheckpointMetrics { id: 5, duration_ms: 250.0, bytes: 4096, ..Default::default() };
        let text = render(&[JobMetrics { tenant: "a\"b", id: "wc-1", status, checkpoints: vec![m] }]);
        assert!(text.contains("# TYPE weir_records_in_total counter\n"), "{text}");
        assert!(
            text.contains("weir_records_in_total{tenant=\"a\\\"b\",job=\"wc-1\",node=\"count\",subtask=\"0\"} 10\n"),
            "{text}"
        );
        assert!(text.contains("weir_job_state{tenant=\"a\\\"b\",job=\"wc-1\",state=\"RUNNING\"} 1\n"));
        assert!(text.contains("weir_job_restarts_total{tenant=\"a\\\"b\",job=\"wc-1\"} 1\n"));
        assert!(text.contains("weir_checkpoint_last_duration_seconds{tenant=\"a\\\"b\",job=\"wc-1\"} 0.25\n"));
        assert!(text.contains(
            "weir_backpressured_seconds_total{tenant=\"a\\\"b\",job=\"wc-1\",node=\"count\",subtask=\"0\"} 1.5\n"
        ));
        assert!(
            text.contains("weir_dead_letters_total{tenant=\"a\\\"b\",job=\"wc-1\",node=\"count\",subtask=\"0\"} 2\n")
        );
        assert!(text.contains("weir_checkpoints_failed_total{tenant=\"a\\\"b\",job=\"wc-1\"} 1\n"));
        assert!(
            text.contains(
                "weir_busy_seconds_total{tenant=\"a\\\"b\",job=\"wc-1\",node=\"count\",subtask=\"0\"} 0.25\n"
            )
        );
        assert!(
            text.contains("weir_idle_seconds_total{tenant=\"a\\\"b\",job=\"wc-1\",node=\"count\",subtask=\"0\"} 3\n")
        );
        assert!(
            text.contains("weir_bytes_in_total{tenant=\"a\\\"b\",job=\"wc-1\",node=\"count\",subtask=\"0\"} 640\n")
        );
        assert!(
            text.contains("weir_guest_calls_total{tenant=\"a\\\"b\",job=\"wc-1\",node=\"count\",subtask=\"0\"} 4\n")
        );
        assert!(text.contains(
            "weir_watermark_milliseconds{tenant=\"a\\\"b\",job=\"wc-1\",node=\"count\",subtask=\"0\"} 1000\n"
        ));
        assert!(
            text.contains("weir_records_in_total{tenant=\"a\\\"b\",job=\"wc-1\",node=\"count\",subtask=\"1\"} 1\n")
        );
        assert!(text.contains(
            "weir_guest_memory_bytes{tenant=\"a\\\"b\",job=\"wc-1\",node=\"count\",subtask=\"0\"} 1048576\n"
        ));
        // The start of the stream is no time to show.
        assert!(
            !text.contains("weir_watermark_milliseconds{tenant=\"a\\\"b\",job=\"wc-1\",node=\"count\",subtask=\"1\"}")
        );
        assert!(text.contains("weir_traps_total{tenant=\"a\\\"b\",job=\"wc-1\",limit=\"cpu_time\"} 1\n"));
    }
}
