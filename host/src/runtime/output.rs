//! The output side of a subtask: partitions records into per-channel batch builders and
//! sends full batches downstream, blocking when a channel is full (backpressure).
//!
//! Invariants: records keep their order per (edge, target); control messages (watermarks,
//! end of stream) are sent only after every pending batch is flushed, so they never
//! overtake data. Time spent blocked on a full channel is added to the node's backpressure
//! counter; a send that does not block reads no clock.

use std::sync::Arc;

use crossbeam_channel::{Sender, TrySendError};

use crate::connectors::Emit;
use crate::graph::partition::{Partition, Selector, Target};
use crate::record::{Batch, RecordRef};
use crate::runtime::feedback_budget::FeedbackBudget;
use crate::runtime::message::Message;
use crate::runtime::metrics::SubtaskMetrics;

pub use crate::connectors::Disconnected;

/// One outgoing edge of a subtask.
pub struct EdgeOutput {
    port: u32,
    selector: Selector,
    targets: Vec<Sender<Message>>,
    pending: Vec<Batch>,
    in_loop: bool,
    ended: bool,
    /// Per target: a back-edge, whose batches count against the job's in-flight budget.
    back: Vec<bool>,
    budget: Option<Arc<FeedbackBudget>>,
}

impl EdgeOutput {
    /// An edge carrying the records emitted on `port` to `targets`.
    pub fn new(
        port: u32,
        partition: Partition,
        targets: Vec<Sender<Message>>,
        max_parallelism: u32,
        start: usize,
    ) -> Self {
        let pending = (0..targets.len()).map(|_| Batch::with_capacity(16 * 1024)).collect();
        let selector = Selector::new(partition, targets.len(), max_parallelism, start);
        let back = vec![false; targets.len()];
        EdgeOutput { port, selector, targets, pending, in_loop: false, ended: false, back, budget: None }
    }

    /// Marks the targets that are back-edges (`back[i]`), charged to `budget`.
    pub fn back_edges(mut self, back: Vec<bool>, budget: Arc<FeedbackBudget>) -> Self {
        if back.iter().any(|b| *b) {
            self.back = back;
            self.budget = Some(budget);
        }
        self
    }

    /// Sends a batch to target `index`, counting it against the budget on a back-edge.
    fn send_batch(
        &mut self,
        index: usize,
        batch: Batch,
        counter: &Option<Arc<SubtaskMetrics>>,
    ) -> Result<(), Disconnected> {
        if let Some(b) = self.budget.as_ref().filter(|_| self.back[index]) {
            b.add(batch.as_bytes().len() as u64);
        }
        send(&self.targets[index], Message::Data(batch), counter)
    }

    /// Marks an edge that stays inside a loop (its target reaches its source again).
    pub fn in_loop(mut self, in_loop: bool) -> Self {
        self.in_loop = in_loop;
        self
    }
}

/// All outgoing edges of a subtask.
pub struct Output {
    edges: Vec<EdgeOutput>,
    batch_records: u32,
    batch_bytes: usize,
    /// Records emitted (counted per record, not per copy).
    pub records_out: u64,
    /// Record copies pushed towards channels since the last `take_copies` (loop termination
    /// counts records in flight).
    copies: u64,
    /// Records aimed at an edge that has already ended (a loop edge after the loop closed).
    pub dropped_after_end: u64,
    /// The subtask whose backpressure counter blocked time goes to.
    backpressure: Option<Arc<SubtaskMetrics>>,
}

/// Sends `m` on `tx`; if the channel is full, blocks and adds the time blocked to `counter`.
fn send(tx: &Sender<Message>, m: Message, counter: &Option<Arc<SubtaskMetrics>>) -> Result<(), Disconnected> {
    match tx.try_send(m) {
        Ok(()) => Ok(()),
        Err(TrySendError::Disconnected(_)) => Err(Disconnected),
        Err(TrySendError::Full(m)) => {
            let t = std::time::Instant::now();
            tx.send(m).map_err(|_| Disconnected)?;
            if let Some(c) = counter {
                c.add_backpressured(t.elapsed());
            }
            Ok(())
        }
    }
}

impl Output {
    /// Sends batches once they reach `batch_records` records or `batch_bytes` bytes.
    pub fn new(edges: Vec<EdgeOutput>, batch_records: u32, batch_bytes: usize) -> Self {
        Output {
            edges,
            batch_records,
            batch_bytes,
            records_out: 0,
            copies: 0,
            dropped_after_end: 0,
            backpressure: None,
        }
    }

    /// Adds the time blocked on full channels to `counter`'s backpressure time.
    pub fn with_backpressure(mut self, counter: Arc<SubtaskMetrics>) -> Self {
        self.backpressure = Some(counter);
        self
    }

    /// Routes one record emitted on port `rec.tag`.
    #[inline]
    pub fn emit(&mut self, rec: RecordRef<'_>) -> Result<(), Disconnected> {
        self.records_out += 1;
        let (limit_n, limit_b) = (self.batch_records, self.batch_bytes);
        for e in &mut self.edges {
            if e.port != rec.tag {
                continue;
            }
            if e.ended {
                self.dropped_after_end += 1;
                continue;
            }
            match e.selector.select(rec.key) {
                Target::One { index, tag } => {
                    self.copies += 1;
                    let b = &mut e.pending[index];
                    b.push(tag, rec.timestamp, rec.key, rec.value);
                    if b.len() >= limit_n || b.byte_len() >= limit_b {
                        let full = b.take();
                        e.send_batch(index, full, &self.backpressure)?;
                    }
                }
                Target::All => {
                    self.copies += e.pending.len() as u64;
                    for i in 0..e.pending.len() {
                        let b = &mut e.pending[i];
                        b.push(crate::record::NO_KEY_GROUP, rec.timestamp, rec.key, rec.value);
                        if b.len() >= limit_n || b.byte_len() >= limit_b {
                            let full = b.take();
                            e.send_batch(i, full, &self.backpressure)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Routes every record of a batch.
    pub fn emit_batch(&mut self, batch: &Batch) -> Result<(), Disconnected> {
        for r in batch.iter() {
            self.emit(r)?;
        }
        Ok(())
    }

    /// Sends every non-empty pending batch.
    pub fn flush(&mut self) -> Result<(), Disconnected> {
        for e in &mut self.edges {
            for i in 0..e.pending.len() {
                if !e.pending[i].is_empty() {
                    let full = e.pending[i].take();
                    e.send_batch(i, full, &self.backpressure)?;
                }
            }
        }
        Ok(())
    }

    /// Flushes, then sends a copy of `make()` on every channel of every edge not ended.
    pub fn broadcast(&mut self, make: impl Fn() -> Message) -> Result<(), Disconnected> {
        self.flush()?;
        for e in self.edges.iter().filter(|e| !e.ended) {
            for t in &e.targets {
                send(t, make(), &self.backpressure)?;
            }
        }
        Ok(())
    }

    /// Flushes, then ends every edge that stays inside a loop (end of stream on them); the
    /// edges leaving the loop stay open.
    pub fn end_loop_edges(&mut self) -> Result<(), Disconnected> {
        self.flush()?;
        for e in self.edges.iter_mut().filter(|e| e.in_loop && !e.ended) {
            for t in &e.targets {
                send(t, Message::EndOfStream, &self.backpressure)?;
            }
            e.ended = true;
        }
        Ok(())
    }

    /// (held, limit) when the job's back-edges hold more than `max_feedback_mb`.
    pub fn feedback_over(&self) -> Option<(u64, u64)> {
        self.edges.iter().find_map(|e| e.budget.as_ref()).and_then(|b| b.over())
    }

    /// Record copies pushed since the last call.
    pub fn take_copies(&mut self) -> u64 {
        std::mem::take(&mut self.copies)
    }

    /// No outgoing edges (a sink).
    pub fn is_empty(&self) -> bool {
        self.edges.is_empty()
    }
}

impl Emit for Output {
    #[inline]
    fn emit(&mut self, rec: RecordRef<'_>) -> Result<(), Disconnected> {
        Output::emit(self, rec)
    }

    fn flush(&mut self) -> Result<(), Disconnected> {
        Output::flush(self)
    }
}
