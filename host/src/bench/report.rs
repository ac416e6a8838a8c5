//! What `weir run --report FILE` writes: one run's numbers as JSON, for `weir bench` (which
//! runs every configuration in a fresh process, so peak memory is per configuration).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::checkpoint::metadata::CheckpointMetrics;
use crate::job::bind::BoundJob;
use crate::runtime::executor::RunSummary;
use crate::runtime::latency::LatencySummary;

/// One node's counters.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeReport {
    /// Node uid.
    pub id: String,
    /// Records received.
    pub records_in: u64,
    /// Records emitted.
    pub records_out: u64,
    /// Latency-measuring sinks.
    pub latency: Option<LatencySummary>,
}

/// One run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunReport {
    /// Job name.
    pub job: String,
    /// Wall time of the run (the components were compiled before).
    pub elapsed_ms: f64,
    /// Attempts.
    pub attempts: u32,
    /// Per node, in job file order.
    pub nodes: Vec<NodeReport>,
    /// Completed checkpoints of this run (from the job's `history.json`).
    pub checkpoints: Vec<CheckpointMetrics>,
    /// Peak resident set size of the process.
    pub peak_rss_bytes: u64,
    /// CPU time (user + system) the process spent in the run, ms.
    #[serde(default)]
    pub cpu_ms: f64,
}

impl RunReport {
    /// The report of `summary`, a run of `job` started at `started_unix_ms`.
    pub fn new(job: &BoundJob, summary: &RunSummary, started_unix_ms: u64) -> Self {
        let checkpoints = job
            .graph
            .checkpoint
            .as_ref()
            .map(|c| c.dir.join(&job.graph.name).join("history.json"))
            .and_then(|p| std::fs::read(p).ok())
            .and_then(|b| serde_json::from_slice::<Vec<CheckpointMetrics>>(&b).ok())
            .unwrap_or_default()
            .into_iter()
            .filter(|m| m.trigger_unix_ms >= started_unix_ms)
            .collect();
        RunReport {
            job: job.graph.name.clone(),
            elapsed_ms: summary.elapsed.as_secs_f64() * 1e3,
            attempts: summary.attempts,
            nodes: summary
                .nodes
                .iter()
                .map(|n| NodeReport {
                    id: n.id.as_str().to_string(),
                    records_in: n.records_in,
                    records_out: n.records_out,
                    latency: n.latency,
                })
                .collect(),
            checkpoints,
            peak_rss_bytes: peak_rss_bytes(),
            cpu_ms: 0.0,
        }
    }

    /// Writes the report as JSON.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, serde_json::to_vec_pretty(self).expect("a report always serializes"))
    }
}

/// CPU time (user + system) of this process so far, ms.
pub fn cpu_ms() -> f64 {
    // SAFETY: as in `peak_rss_bytes`.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    ms(ru.ru_utime) + ms(ru.ru_stime)
}

/// Peak resident set size of this process (`getrusage`, `ru_maxrss`).
pub fn peak_rss_bytes() -> u64 {
    // SAFETY: getrusage writes into the zeroed struct we pass and reads nothing else.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0;
    }
    ru.ru_maxrss.max(0) as u64 * 1024
}
