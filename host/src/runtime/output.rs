//! The output side of a subtask: partitions records into per-channel batch builders and
//! sends full batches downstream, blocking when a channel is full (backpressure).
//!
//! Invariants: records keep their order per (edge, target); control messages (watermarks,
//! end of stream) are sent only after every pending batch is flushed, so they never
//! overtake data. Time spent blocked on a full channel is added to the node's backpressure
//! counter; a send that does not block reads no clock.
//!
//! With unaligned checkpoints a full channel does not block the sender inside `emit`: what
//! does not fit waits in the target's overflow queue (in order, behind which nothing goes
//! into the channel), the subtask reads no more input until [`Output::drain`] has emptied
//! it, and a barrier that comes meanwhile takes the overflow and the pending batch with it
//! ([`Output::unaligned_barrier`]). A target's overflow holds at most its channel's capacity
//! in messages: beyond that the sender blocks as with aligned checkpoints (a guest that emits
//! that much from one call waits, it does not grow host memory). The receiver moves records
//! off a channel when a barrier overtakes them, so room in the channel is not room in the
//! receiver: a message also takes one of the channel's **tokens** (a second bounded channel
//! of the same capacity), which the receiver gives back only when it hands the message on.
//! So a channel's records, wherever they wait on the receiving side, never exceed its
//! capacity.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Select, Sender, TrySendError};

use crate::connectors::Emit;
use crate::graph::partition::{Partition, Selector, Target};
use crate::ids::CheckpointId;
use crate::record::{Batch, RecordRef};
use crate::runtime::control::Control;
use crate::runtime::feedback_budget::FeedbackBudget;
use crate::runtime::message::{Message, Priority};
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
    /// Unaligned checkpoints: per target, where its barriers go (the receiver's priority
    /// inbox and input index); empty with aligned checkpoints.
    priority: Vec<(Sender<Priority>, usize)>,
    /// Per target: messages put into the channel so far (unaligned checkpoints).
    sent: Vec<u64>,
    /// Per target: messages waiting for room in the channel (unaligned checkpoints).
    overflow: Vec<VecDeque<Message>>,
    /// Per target: the channel's tokens (unaligned checkpoints; none on unbounded back-edges).
    tokens: Vec<Option<Sender<()>>>,
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
        let (sent, overflow) = (vec![0; targets.len()], (0..targets.len()).map(|_| VecDeque::new()).collect());
        EdgeOutput {
            port,
            selector,
            targets,
            pending,
            in_loop: false,
            ended: false,
            back,
            budget: None,
            priority: Vec::new(),
            sent,
            overflow,
            tokens: Vec::new(),
        }
    }

    /// Unaligned checkpoints: target `i`'s barriers go to `priority[i]` (the receiver's
    /// priority inbox, and its input index there); full channels no longer block.
    pub fn unaligned(mut self, priority: Vec<(Sender<Priority>, usize)>, tokens: Vec<Option<Sender<()>>>) -> Self {
        assert_eq!(priority.len(), self.targets.len(), "one priority inbox per target");
        assert_eq!(tokens.len(), self.targets.len(), "tokens per target");
        self.priority = priority;
        self.tokens = tokens;
        self
    }

    /// Puts `m` on target `index`'s channel: blocking while it is full (aligned), or behind
    /// its overflow (unaligned; blocking only while the overflow is at its bound).
    fn put(&mut self, index: usize, m: Message, counter: &Option<Arc<SubtaskMetrics>>) -> Result<(), Disconnected> {
        if self.priority.is_empty() {
            return send(&self.targets[index], m, counter);
        }
        if self.overflow[index].is_empty() {
            match self.offer(index, m)? {
                None => return Ok(()),
                Some(m) => self.overflow[index].push_back(m),
            }
        } else {
            self.overflow[index].push_back(m);
        }
        let bound = self.targets[index].capacity().unwrap_or(usize::MAX);
        while self.overflow[index].len() > bound {
            self.force_one(index, counter)?;
        }
        Ok(())
    }

    /// Puts `m` into target `t`'s channel if it and its tokens have room now; else hands it
    /// back.
    fn offer(&mut self, t: usize, m: Message) -> Result<Option<Message>, Disconnected> {
        if let Some(tokens) = &self.tokens[t] {
            match tokens.try_send(()) {
                Ok(()) => {}
                Err(TrySendError::Full(())) => return Ok(Some(m)),
                Err(TrySendError::Disconnected(())) => return Err(Disconnected),
            }
            // With a token, the channel has room (it holds no more than the tokens given out).
            send(&self.targets[t], m, &None)?;
            self.sent[t] += 1;
            return Ok(None);
        }
        match self.targets[t].try_send(m) {
            Ok(()) => {
                self.sent[t] += 1;
                Ok(None)
            }
            Err(TrySendError::Full(m)) => Ok(Some(m)),
            Err(TrySendError::Disconnected(_)) => Err(Disconnected),
        }
    }

    /// Moves the first waiting message of target `t` into its channel, blocking for a token.
    fn force_one(&mut self, t: usize, counter: &Option<Arc<SubtaskMetrics>>) -> Result<(), Disconnected> {
        let Some(m) = self.overflow[t].pop_front() else { return Ok(()) };
        let started = std::time::Instant::now();
        if let Some(tokens) = &self.tokens[t] {
            tokens.send(()).map_err(|_| Disconnected)?;
        }
        send(&self.targets[t], m, &None)?;
        self.sent[t] += 1;
        if let Some(c) = counter {
            c.add_backpressured(started.elapsed());
        }
        Ok(())
    }

    /// Moves overflow into channels with room; returns whether anything moved.
    fn try_drain(&mut self) -> Result<bool, Disconnected> {
        let mut moved = false;
        for t in 0..self.overflow.len() {
            while let Some(m) = self.overflow[t].pop_front() {
                if let Some(m) = self.offer(t, m)? {
                    self.overflow[t].push_front(m);
                    break;
                }
                moved = true;
            }
        }
        Ok(moved)
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
        self.put(index, Message::Data(batch), counter)
    }

    /// Marks an edge that stays inside a loop (its target reaches its source again).
    pub fn in_loop(mut self, in_loop: bool) -> Self {
        self.in_loop = in_loop;
        self
    }
}

/// What [`Output::drain`] got to.
#[derive(Debug)]
pub enum Drained {
    /// Messages moved (or none wait any more).
    Progress,
    /// A barrier arrived for one of the subtask's inputs.
    Priority(Priority),
    /// A message from the checkpoint coordinator.
    Control(Control),
    /// Nothing within the wait.
    Timeout,
    /// The priority inbox has no senders any more (every upstream subtask exited).
    InboxClosed,
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

/// Sends `m` on `tx`; if the channel is full, waits and adds the time waited to `counter`.
///
/// A full channel is waited on until it has drained to half ([`wait_for_half`]) before
/// the blocking send: a producer ahead of its consumer then sleeps once per half a channel
/// instead of once per batch, and the consumer (the bottleneck, by then) does not pay a
/// thread wake-up for every batch it takes.
fn send(tx: &Sender<Message>, m: Message, counter: &Option<Arc<SubtaskMetrics>>) -> Result<(), Disconnected> {
    match tx.try_send(m) {
        Ok(()) => Ok(()),
        Err(TrySendError::Disconnected(_)) => Err(Disconnected),
        Err(TrySendError::Full(m)) => {
            let t = std::time::Instant::now();
            wait_for_half(tx);
            tx.send(m).map_err(|_| Disconnected)?;
            if let Some(c) = counter {
                c.add_backpressured(t.elapsed());
            }
            Ok(())
        }
    }
}

/// Sleeps, in growing steps, until `tx` holds at most half its capacity or about
/// [`HALF_WAIT`] has passed (a consumer that slow, or gone, is then waited on by the blocking
/// send, which wakes with the first free slot or the disconnection).
fn wait_for_half(tx: &Sender<Message>) {
    let Some(cap) = tx.capacity().filter(|&c| c >= 2) else { return };
    let (mut pause, mut slept) = (Duration::from_micros(20), Duration::ZERO);
    while tx.len() > cap / 2 && slept < HALF_WAIT {
        std::thread::sleep(pause);
        slept += pause;
        pause = (pause * 2).min(Duration::from_micros(320));
    }
}

/// How long a producer at a full channel sleeps waiting for it to drain to half.
const HALF_WAIT: Duration = Duration::from_millis(2);

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

    /// Routes every record of a batch: whole where it may (see [`Output::forward_whole`]),
    /// else record by record.
    pub fn emit_batch(&mut self, batch: Batch) -> Result<(), Disconnected> {
        let Some(batch) = self.forward_whole(batch)? else { return Ok(()) };
        for r in batch.iter() {
            self.emit(r)?;
        }
        Ok(())
    }

    /// Forwards `batch` whole when its records all leave on one port whose edges are all open
    /// and forward, and it fits one batch: retagged in place, moved into an empty pending
    /// batch or else appended (copied for every edge but the last). Returns it back,
    /// unchanged, otherwise. Records keep their order and batches their limits as when routed
    /// record by record; only where a batch is cut may differ (the pending batch goes first if
    /// `batch` would overfill it).
    fn forward_whole(&mut self, mut batch: Batch) -> Result<Option<Batch>, Disconnected> {
        let (limit_n, limit_b) = (self.batch_records, self.batch_bytes);
        let Some(port) = batch.iter().next().map(|r| r.tag) else { return Ok(None) };
        let (on_port, forward) = self
            .edges
            .iter()
            .filter(|e| e.port == port)
            .fold((0, true), |(n, all), e| (n + 1, all && !e.ended && e.selector.is_forward()));
        let fits = batch.len() <= limit_n && batch.byte_len() <= limit_b;
        if on_port == 0 || !fits || !forward || !batch.retag_all(port, crate::record::NO_KEY_GROUP) {
            return Ok(Some(batch));
        }
        let n = batch.len() as u64;
        self.records_out += n;
        let mut left = on_port;
        let mut batch = Some(batch);
        for e in self.edges.iter_mut().filter(|e| e.port == port) {
            self.copies += n;
            left -= 1;
            let b = batch.as_ref().expect("kept until the last edge");
            let pending = &e.pending[0];
            if !pending.is_empty() && (pending.len() + b.len() > limit_n || pending.byte_len() + b.byte_len() > limit_b)
            {
                let full = e.pending[0].take();
                e.send_batch(0, full, &self.backpressure)?;
            }
            if left == 0 && e.pending[0].is_empty() {
                e.pending[0] = batch.take().expect("the last edge");
            } else {
                e.pending[0].append(b);
            }
            let p = &mut e.pending[0];
            if p.len() >= limit_n || p.byte_len() >= limit_b {
                let full = p.take();
                e.send_batch(0, full, &self.backpressure)?;
            }
        }
        Ok(None)
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
        for e in self.edges.iter_mut().filter(|e| !e.ended) {
            for t in 0..e.targets.len() {
                e.put(t, make(), &self.backpressure)?;
            }
        }
        Ok(())
    }

    /// Flushes, then ends every edge that stays inside a loop (end of stream on them); the
    /// edges leaving the loop stay open.
    pub fn end_loop_edges(&mut self) -> Result<(), Disconnected> {
        self.flush()?;
        for e in self.edges.iter_mut().filter(|e| e.in_loop && !e.ended) {
            for t in 0..e.targets.len() {
                e.put(t, Message::EndOfStream, &self.backpressure)?;
            }
            e.ended = true;
        }
        Ok(())
    }

    /// Whether barriers go ahead of queued output (unaligned checkpoints).
    pub fn is_unaligned(&self) -> bool {
        self.edges.iter().any(|e| !e.priority.is_empty())
    }

    /// Whether messages wait for room in a full channel (unaligned checkpoints): the subtask
    /// must not read more input before [`Output::drain`] has emptied them.
    pub fn blocked(&self) -> bool {
        self.edges.iter().any(|e| e.overflow.iter().any(|q| !q.is_empty()))
    }

    /// Moves waiting messages into channels as room appears; waits up to `wait` for room,
    /// for a barrier on `priority` or for a message on `control`, whichever comes first.
    pub fn drain(
        &mut self,
        priority: Option<&Receiver<Priority>>,
        control: Option<&Receiver<Control>>,
        wait: Duration,
    ) -> Result<Drained, Disconnected> {
        let mut moved = false;
        for e in &mut self.edges {
            moved |= e.try_drain()?;
        }
        if moved || !self.blocked() {
            return Ok(Drained::Progress);
        }
        let started = std::time::Instant::now();
        let mut slots = Vec::new();
        // Room means a token where the channel has tokens, else room in the channel.
        let mut waits: Vec<Result<Sender<()>, Sender<Message>>> = Vec::new();
        for (ei, e) in self.edges.iter().enumerate() {
            for (ti, q) in e.overflow.iter().enumerate() {
                if !q.is_empty() {
                    slots.push((ei, ti));
                    waits.push(e.tokens.get(ti).cloned().flatten().ok_or_else(|| e.targets[ti].clone()));
                }
            }
        }
        let mut sel = Select::new();
        for w in &waits {
            match w {
                Ok(tokens) => sel.send(tokens),
                Err(tx) => sel.send(tx),
            };
        }
        let p_at = priority.map(|p| sel.recv(p));
        let c_at = control.map(|c| sel.recv(c));
        let r = match sel.select_timeout(wait) {
            Err(_) => Drained::Timeout,
            Ok(op) if Some(op.index()) == p_at => match op.recv(priority.expect("selected")) {
                Ok(p) => Drained::Priority(p),
                // Every sender of barriers is gone (the upstream subtasks exited).
                Err(_) => Drained::InboxClosed,
            },
            Ok(op) if Some(op.index()) == c_at => {
                Drained::Control(op.recv(control.expect("selected")).map_err(|_| Disconnected)?)
            }
            Ok(op) => {
                let at = op.index();
                let (ei, ti) = slots[at];
                let e = &mut self.edges[ei];
                let m = e.overflow[ti].pop_front().expect("a waiting message");
                match &waits[at] {
                    Ok(tokens) => {
                        op.send(tokens, ()).map_err(|_| Disconnected)?;
                        send(&e.targets[ti], m, &None)?;
                    }
                    Err(tx) => op.send(tx, m).map_err(|_| Disconnected)?,
                }
                e.sent[ti] += 1;
                Drained::Progress
            }
        };
        if let Some(c) = &self.backpressure {
            c.add_backpressured(started.elapsed());
        }
        Ok(r)
    }

    /// An unaligned checkpoint's barrier, sent now, ahead of everything queued: on each
    /// target's priority inbox, with the count of messages already in the channel and,
    /// carried along, everything produced but not yet in it (the overflow, then the pending
    /// batch). Afterwards nothing waits: the sender is unblocked at once.
    /// A receiver that has ended (its inbox closed) needs no barrier: it is skipped.
    pub fn unaligned_barrier(&mut self, id: CheckpointId, started: std::time::Instant) {
        for e in self.edges.iter_mut().filter(|e| !e.ended) {
            for (t, (inbox, input)) in e.priority.iter().enumerate() {
                let mut carried: Vec<Message> = e.overflow[t].drain(..).collect();
                if !e.pending[t].is_empty() {
                    carried.push(Message::Data(e.pending[t].take()));
                }
                let p = Priority { input: *input, id, sent: e.sent[t], carried, started };
                let _ = inbox.send(p);
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::{bounded, unbounded};

    fn value(m: &Message) -> Vec<u8> {
        match m {
            Message::Data(b) => b.iter().next().expect("one record").value.to_vec(),
            other => panic!("not data: {other:?}"),
        }
    }

    fn emit(out: &mut Output, v: u8) {
        out.emit(RecordRef { tag: 0, timestamp: 0, key: b"k", value: &[v] }).unwrap();
    }

    /// Unaligned: a full channel does not block `emit`; what does not fit waits in order, and
    /// a barrier takes it along (after the channel's count), leaving nothing waiting.
    #[test]
    fn unaligned_a_full_channel_holds_output_back_and_the_barrier_carries_it() {
        let (tx, rx) = bounded(2);
        let (inbox, barriers) = unbounded();
        let edge = EdgeOutput::new(0, Partition::Forward, vec![tx], 16, 0).unaligned(vec![(inbox, 3)], vec![None]);
        let mut out = Output::new(vec![edge], 1, 1 << 20);
        assert!(out.is_unaligned());
        for v in 1..=4 {
            emit(&mut out, v);
        }
        assert!(out.blocked(), "records 3 and 4 wait for room");
        out.unaligned_barrier(CheckpointId(7), std::time::Instant::now());
        let p = barriers.try_recv().expect("the barrier went to the priority inbox");
        assert_eq!((p.input, p.id, p.sent), (3, CheckpointId(7), 2), "two messages were in the channel before it");
        assert_eq!(p.carried.iter().map(value).collect::<Vec<_>>(), vec![vec![3], vec![4]]);
        assert!(!out.blocked());
        assert_eq!(value(&rx.try_recv().unwrap()), vec![1]);
        assert_eq!(value(&rx.try_recv().unwrap()), vec![2]);
        assert!(rx.try_recv().is_err(), "the carried records never enter the channel");
    }

    /// What waits moves into the channel, in order, as room appears; the count the next
    /// barrier carries includes it.
    #[test]
    fn unaligned_waiting_output_drains_in_order_as_room_appears() {
        let (tx, rx) = bounded(1);
        let (inbox, barriers) = unbounded();
        let edge = EdgeOutput::new(0, Partition::Forward, vec![tx], 16, 0).unaligned(vec![(inbox, 0)], vec![None]);
        let mut out = Output::new(vec![edge], 1, 1 << 20);
        for v in 1..=2 {
            emit(&mut out, v);
        }
        let wait = Duration::from_millis(1);
        assert!(matches!(out.drain(None, None, wait).unwrap(), Drained::Timeout), "no room yet");
        let mut got = vec![value(&rx.try_recv().unwrap())];
        while out.blocked() {
            assert!(matches!(out.drain(None, None, wait).unwrap(), Drained::Progress));
            got.push(value(&rx.try_recv().unwrap()));
        }
        assert_eq!(got, vec![vec![1], vec![2]]);
        out.unaligned_barrier(CheckpointId(1), std::time::Instant::now());
        assert_eq!(barriers.try_recv().unwrap().sent, 2);
    }

    /// A channel's tokens bound it, wherever its records wait on the receiving side: room in
    /// the channel alone is not room. And the overflow is bounded too: past it, `emit` waits.
    #[test]
    fn unaligned_a_channel_takes_no_more_than_its_tokens_and_the_overflow_is_bounded() {
        let (tx, rx) = bounded(2);
        let (token_tx, token_rx) = bounded(2);
        let (inbox, _barriers) = unbounded();
        let edge =
            EdgeOutput::new(0, Partition::Forward, vec![tx], 16, 0).unaligned(vec![(inbox, 0)], vec![Some(token_tx)]);
        let mut out = Output::new(vec![edge], 1, 1 << 20);
        for v in 1..=2 {
            emit(&mut out, v);
        }
        // The receiver moved both off the channel (a barrier overtook them) but handed none on.
        let moved: Vec<Message> = (0..2).map(|_| rx.try_recv().unwrap()).collect();
        for v in 3..=4 {
            emit(&mut out, v);
        }
        assert!(rx.is_empty(), "no token left: records 3 and 4 wait although the channel is empty");
        assert!(matches!(out.drain(None, None, Duration::from_millis(1)).unwrap(), Drained::Timeout));
        // The receiver hands record 1 on: one token back, one record in.
        token_rx.try_recv().unwrap();
        assert!(matches!(out.drain(None, None, Duration::from_millis(50)).unwrap(), Drained::Progress));
        assert_eq!(value(&rx.try_recv().unwrap()), vec![3]);
        drop(moved);
        // Past the bound (the channel's capacity) `emit` blocks until a token comes back.
        emit(&mut out, 5);
        let giver = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            token_rx.recv().unwrap();
            token_rx
        });
        emit(&mut out, 6);
        let _token_rx = giver.join().unwrap();
        assert_eq!(value(&rx.try_recv().unwrap()), vec![4], "the oldest waiting record went first");
    }

    /// Aligned (no priority inboxes): nothing ever waits outside the channel.
    #[test]
    fn aligned_output_is_never_blocked_outside_its_channels() {
        let (tx, rx) = bounded(4);
        let mut out = Output::new(vec![EdgeOutput::new(0, Partition::Forward, vec![tx], 16, 0)], 1, 1 << 20);
        emit(&mut out, 1);
        assert!(!out.is_unaligned() && !out.blocked());
        assert_eq!(value(&rx.try_recv().unwrap()), vec![1]);
    }

    fn batch_of(tags_and_values: &[(u32, u8)]) -> Batch {
        let mut b = Batch::default();
        for (t, v) in tags_and_values {
            b.push(*t, *v as i64, b"k", &[*v]);
        }
        b
    }

    fn received(rx: &Receiver<Message>) -> Vec<Batch> {
        rx.try_iter()
            .map(|m| match m {
                Message::Data(b) => b,
                other => panic!("not data: {other:?}"),
            })
            .collect()
    }

    /// A guest's batch on a forward edge goes on whole, retagged, cut at the batch limit as
    /// record by record would be; a batch with records for two ports is routed record by
    /// record, and a port with no edge drops its records either way.
    #[test]
    fn a_batch_on_forward_edges_goes_on_whole_in_order_within_the_limits() {
        let (tx0, rx0) = unbounded();
        let (tx1, rx1) = unbounded();
        let (tx1b, rx1b) = unbounded();
        let edges = vec![
            EdgeOutput::new(0, Partition::Forward, vec![tx0], 16, 0),
            EdgeOutput::new(1, Partition::Forward, vec![tx1], 16, 0),
            EdgeOutput::new(1, Partition::Forward, vec![tx1b], 16, 0),
        ];
        let mut out = Output::new(edges, 4, 1 << 20);
        out.emit_batch(batch_of(&[(0, 1), (0, 2), (0, 3)])).unwrap();
        out.emit_batch(batch_of(&[(0, 4), (0, 5)])).unwrap();
        out.emit_batch(batch_of(&[(1, 6), (0, 7), (1, 8)])).unwrap();
        out.emit_batch(batch_of(&[(0, 9), (0, 10), (0, 11), (0, 12), (0, 13)])).unwrap();
        out.emit_batch(batch_of(&[(0, 15), (0, 16), (0, 17), (0, 18)])).unwrap();
        out.emit_batch(batch_of(&[(2, 14)])).unwrap();
        out.flush().unwrap();
        assert_eq!((out.records_out, out.copies), (18, 19), "record 14 has no edge; 6 and 8 go twice");
        for (rx, want) in
            [(&rx0, vec![1, 2, 3, 4, 5, 7, 9, 10, 11, 12, 13, 15, 16, 17, 18]), (&rx1, vec![6, 8]), (&rx1b, vec![6, 8])]
        {
            let batches = received(rx);
            assert!(batches.iter().all(|b| b.len() <= 4 && !b.is_empty()), "{batches:?}");
            let all: Vec<(u32, i64, Vec<u8>)> =
                batches.iter().flat_map(|b| b.iter().map(|r| (r.tag, r.timestamp, r.value.to_vec()))).collect();
            let want: Vec<_> = want.iter().map(|v| (crate::record::NO_KEY_GROUP, *v as i64, vec![*v as u8])).collect();
            assert_eq!(all, want);
        }
    }
}
