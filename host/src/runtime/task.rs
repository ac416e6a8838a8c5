//! The operator subtask loop: read a batch, call the guest once, route what it emitted.
//!
//! Invariants: the guest is called from this thread only, one call at a time; pending
//! output is flushed whenever the inputs are idle (a latency bound without timers) and
//! before any control message is forwarded; end of stream goes downstream only after
//! `close` and the final flush.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::ids::TaskId;
use crate::runtime::error::TaskFailure;
use crate::runtime::input::{Inputs, Received};
use crate::runtime::message::Message;
use crate::runtime::metrics::NodeMetrics;
use crate::runtime::output::{Disconnected, Output};
use crate::sandbox::bindings::types::TimeDomain;
use crate::sandbox::instance::{GuestError, OperatorInstance};

/// Everything an operator subtask needs.
pub struct OperatorTask {
    /// Who.
    pub id: TaskId,
    /// The guest.
    pub instance: OperatorInstance,
    /// Its `config` table.
    pub config: Vec<(String, String)>,
    /// Input channels.
    pub inputs: Inputs,
    /// Output edges.
    pub output: Output,
    /// Counters of the node.
    pub metrics: Arc<NodeMetrics>,
    /// Set when the job is being torn down.
    pub cancel: Arc<AtomicBool>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl OperatorTask {
    fn guest(&self, e: GuestError) -> TaskFailure {
        TaskFailure::Guest {
            task: self.id.clone(),
            source: e,
        }
    }

    fn disconnected(&self, _: Disconnected) -> TaskFailure {
        TaskFailure::Disconnected {
            task: self.id.clone(),
        }
    }

    /// Routes what the guest emitted in its last call.
    fn route_emitted(&mut self) -> Result<(), TaskFailure> {
        let out = self.instance.take_emitted();
        if !out.is_empty() {
            self.metrics.add_out(out.len() as u64);
            self.output
                .emit_batch(&out)
                .map_err(|d| self.disconnected(d))?;
        }
        Ok(())
    }

    /// Fires due timers of `domain` at `now`, repeatedly (a timer may register another due one).
    fn fire_timers(&mut self, domain: TimeDomain, now: i64) -> Result<(), TaskFailure> {
        loop {
            let host = self.instance.host();
            let due = match domain {
                TimeDomain::EventTime => host.event_timers.pop_due(now),
                TimeDomain::ProcessingTime => host.processing_timers.pop_due(now),
            };
            if due.is_empty() {
                return Ok(());
            }
            self.instance
                .on_timer(domain, &due)
                .map_err(|e| self.guest(e))?;
            self.route_emitted()?;
        }
    }

    fn advance_watermark(&mut self, wm: i64) -> Result<(), TaskFailure> {
        self.instance.host().watermark = wm;
        self.fire_timers(TimeDomain::EventTime, wm)?;
        self.instance.on_watermark(wm).map_err(|e| self.guest(e))?;
        self.route_emitted()?;
        if wm != i64::MAX {
            self.output
                .broadcast(|| Message::Watermark(wm))
                .map_err(|d| self.disconnected(d))?;
        }
        Ok(())
    }

    /// Runs the subtask to the end of its inputs.
    pub fn run(mut self) -> Result<(), TaskFailure> {
        self.instance
            .open(&self.config)
            .map_err(|e| self.guest(e))?;
        loop {
            let mut received = self.inputs.recv(None);
            if matches!(received, Received::Idle) {
                self.output.flush().map_err(|d| self.disconnected(d))?;
                if !self.instance.host().processing_timers.is_empty() {
                    self.fire_timers(TimeDomain::ProcessingTime, now_ms())?;
                }
                received = self.inputs.recv(Some(Duration::from_millis(50)));
            }
            match received {
                Received::Idle => {
                    if self.cancel.load(Ordering::Relaxed) {
                        return Err(TaskFailure::Cancelled {
                            task: self.id.clone(),
                        });
                    }
                }
                Received::Disconnected => {
                    return Err(TaskFailure::Disconnected {
                        task: self.id.clone(),
                    });
                }
                Received::AllDone => break,
                Received::Message(i, Message::Data(batch)) => {
                    self.metrics.add_in(batch.len() as u64);
                    let side = self.inputs.side(i);
                    self.instance
                        .process(side, &batch)
                        .map_err(|e| self.guest(e))?;
                    self.route_emitted()?;
                }
                Received::Message(i, Message::Watermark(wm)) => {
                    if let Some(wm) = self.inputs.on_watermark(i, wm) {
                        self.advance_watermark(wm)?;
                    }
                }
                Received::Message(i, Message::EndOfStream) => {
                    self.inputs.finish(i);
                    if let Some(wm) = self.inputs.advance() {
                        self.advance_watermark(wm)?;
                    }
                }
            }
        }
        self.instance.close().map_err(|e| self.guest(e))?;
        self.route_emitted()?;
        self.output
            .broadcast(|| Message::EndOfStream)
            .map_err(|d| self.disconnected(d))?;
        Ok(())
    }
}
