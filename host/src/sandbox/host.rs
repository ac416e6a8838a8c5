//! The host side of the WIT imports: what a guest may call, and the checks on every call.
//!
//! Invariant: a guest-supplied size, key group or output port is validated before any work;
//! a violation traps the guest (a `wasmtime::Error`), never panics the host.

use crate::record;
use crate::sandbox::bindings::{collector, context, logging, timers, types};
use crate::sandbox::guest_text::{LogBudget, tame};
use crate::sandbox::limits::Limits;
use crate::sandbox::timers::TimerQueue;

/// Largest timer key.
pub const MAX_TIMER_KEY: usize = 64 << 10;
/// Most timers one instance may hold.
pub const MAX_TIMERS: usize = 1 << 20;

/// Per-instance host state (the `T` of `Store<T>`).
pub struct HostState {
    /// Who this instance is.
    pub task: types::TaskInfo,
    /// `job/operator#subtask`, for log lines.
    pub label: String,
    /// Current watermark of the subtask.
    pub watermark: i64,
    /// Records emitted during the current export call (framed, tag = output port).
    pub emitted: Vec<u8>,
    /// How many records `emitted` holds.
    pub emitted_records: u32,
    /// Highest valid output port (number of side outputs).
    pub max_port: u32,
    /// Upper bound of bytes emitted per export call.
    pub max_emit_bytes: usize,
    /// Event-time timers.
    pub event_timers: TimerQueue,
    /// Processing-time timers.
    pub processing_timers: TimerQueue,
    /// The last error-level log line (a panicking Rust guest logs its panic message here).
    pub last_error: Option<String>,
    /// Print guest log lines to stderr.
    pub echo_logs: bool,
    /// Lines this instance may still print (rate limit).
    pub log_budget: LogBudget,
    /// Origin of the log budget's clock.
    pub log_epoch: std::time::Instant,
    /// The instance's limits.
    pub limits: Limits,
    /// Memory, table and instance caps (the store's limiter).
    pub store_limits: crate::sandbox::limits::MeteredLimits,
}

impl HostState {
    /// State for the subtask described by `task`.
    pub fn new(task: types::TaskInfo, max_port: u32) -> Self {
        let label = format!("{}/{}#{}", task.job_name, task.operator_uid, task.subtask_index);
        HostState {
            task,
            label,
            watermark: i64::MIN,
            emitted: Vec::new(),
            emitted_records: 0,
            max_port,
            max_emit_bytes: 256 << 20,
            event_timers: TimerQueue::default(),
            processing_timers: TimerQueue::default(),
            last_error: None,
            echo_logs: true,
            log_budget: LogBudget::default(),
            log_epoch: std::time::Instant::now(),
            limits: Limits::default(),
            store_limits: Limits::default().store_limits(),
        }
    }

    /// Applies `limits` (before the instance is created).
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self.store_limits = limits.store_limits();
        // Output is buffered in host memory: never more per call than the guest's own memory.
        self.max_emit_bytes = limits.max_emit_bytes().min((limits.memory_mb << 20) as usize);
        self
    }

    fn check_key_group(&self, key_group: u32) -> wasmtime::Result<()> {
        if key_group < self.task.key_group_start || key_group >= self.task.key_group_end {
            wasmtime::bail!(
                "{}: timer for key group {key_group}, outside this subtask's key groups [{}, {})",
                self.label,
                self.task.key_group_start,
                self.task.key_group_end
            );
        }
        Ok(())
    }
}

impl types::Host for HostState {}

impl context::Host for HostState {
    fn task(&mut self) -> wasmtime::Result<types::TaskInfo> {
        Ok(self.task.clone())
    }

    fn current_watermark(&mut self) -> wasmtime::Result<i64> {
        Ok(self.watermark)
    }

    fn current_processing_time(&mut self) -> wasmtime::Result<i64> {
        Ok(crate::sandbox::timers::now_ms())
    }
}

impl collector::Host for HostState {
    fn emit_batch(&mut self, batch: Vec<u8>) -> wasmtime::Result<()> {
        if self.emitted.len() + batch.len() > self.max_emit_bytes {
            wasmtime::bail!(
                "{}: emitted more than {} bytes in one call (limit max_emit_mb)",
                self.label,
                self.max_emit_bytes
            );
        }
        // One pass: framing, and every tag is a declared port (0 = main, 1..=max_port).
        let n = record::validate_tags(&batch, self.max_port).map_err(|e| match e {
            record::FramingError::Tag { tag, .. } => wasmtime::format_err!(
                "{}: emitted on output port {tag}, but the operator declares {} side output(s)",
                self.label,
                self.max_port
            ),
            e => wasmtime::format_err!("{}: malformed emit-batch: {e}", self.label),
        })?;
        if self.emitted.is_empty() {
            self.emitted = batch;
        } else {
            self.emitted.extend_from_slice(&batch);
        }
        self.emitted_records += n;
        Ok(())
    }
}

impl HostState {
    /// Whether one more timer of a `key_len`-byte key fits this instance's limits (host
    /// memory the guest makes the host hold): why not, naming the limit, when it does not.
    /// Registered and restored timers alike.
    pub fn admit_timer(&self, key_len: usize) -> Result<(), String> {
        if key_len > MAX_TIMER_KEY {
            return Err(format!("timer key of {key_len} bytes exceeds {MAX_TIMER_KEY}"));
        }
        if self.event_timers.len() + self.processing_timers.len() >= MAX_TIMERS {
            return Err(format!("more than {MAX_TIMERS} timers (the most one subtask may hold)"));
        }
        let held = self.event_timers.bytes() + self.processing_timers.bytes();
        let max = (self.limits.max_timer_mb << 20) as usize;
        if held + TimerQueue::charge(key_len) > max {
            return Err(format!(
                "exceeded its timer limit: {held} bytes of timers held, and max_timer_mb = {} MiB (raise [limits] \
                 max_timer_mb)",
                self.limits.max_timer_mb
            ));
        }
        Ok(())
    }

    /// The timers of `domain`.
    pub fn timers(&mut self, domain: types::TimeDomain) -> &mut TimerQueue {
        match domain {
            types::TimeDomain::EventTime => &mut self.event_timers,
            types::TimeDomain::ProcessingTime => &mut self.processing_timers,
        }
    }
}

impl timers::Host for HostState {
    fn register(&mut self, domain: types::TimeDomain, key_group: u32, key: Vec<u8>, time: i64) -> wasmtime::Result<()> {
        self.check_key_group(key_group)?;
        // Timers live in host memory: bounded like the guest's own.
        if let Err(why) = self.admit_timer(key.len()) {
            wasmtime::bail!("{}: {why}; delete fired or stale timers", self.label);
        }
        self.timers(domain).register(time, key_group, &key);
        Ok(())
    }

    fn delete(&mut self, domain: types::TimeDomain, key_group: u32, key: Vec<u8>, time: i64) -> wasmtime::Result<()> {
        self.check_key_group(key_group)?;
        self.timers(domain).delete(time, key_group, &key);
        Ok(())
    }
}

impl logging::Host for HostState {
    fn log(&mut self, level: logging::Level, message: String) -> wasmtime::Result<()> {
        // Escaped: a newline in a guest's message must not forge another job's line.
        let message = tame(&message);
        if self.echo_logs {
            let now_ms = self.log_epoch.elapsed().as_millis() as u64;
            if let Some(suppressed) = self.log_budget.admit(now_ms) {
                let (t, label) = (&self.task, &self.label);
                let (job, operator, subtask) = (&t.job_name, &t.operator_uid, t.subtask_index);
                if suppressed > 0 {
                    tracing::warn!(
                        job = %job, operator = %operator, subtask, guest = true,
                        "[{label}] {suppressed} log line(s) of this instance suppressed (rate limit)"
                    );
                }
                match level {
                    logging::Level::Trace => {
                        tracing::trace!(job = %job, operator = %operator, subtask, guest = true, "[{label}] {message}")
                    }
                    logging::Level::Debug => {
                        tracing::debug!(job = %job, operator = %operator, subtask, guest = true, "[{label}] {message}")
                    }
                    logging::Level::Info => {
                        tracing::info!(job = %job, operator = %operator, subtask, guest = true, "[{label}] {message}")
                    }
                    logging::Level::Warn => {
                        tracing::warn!(job = %job, operator = %operator, subtask, guest = true, "[{label}] {message}")
                    }
                    logging::Level::Error => {
                        tracing::error!(job = %job, operator = %operator, subtask, guest = true, "[{label}] {message}")
                    }
                }
            }
        }
        if matches!(level, logging::Level::Error) {
            self.last_error = Some(message);
        }
        Ok(())
    }
}
