//! The input side of a subtask: several channels (one per upstream subtask and edge), read
//! with a select over the channels still open, and the subtask's watermark as the minimum
//! over its inputs.
//!
//! Invariant: a channel is read in FIFO order; a finished channel counts as watermark +inf.
//!
//! With unaligned checkpoints, barriers come on a priority inbox ahead of the channels
//! ([`Priority`]). Each one is read before any further message of any channel, and it moves
//! its channel's messages up to the barrier's position off the channel into the input's
//! **front** queue, followed by what the sender carried along; a front is read before its
//! channel. So every input still yields its messages in the order they were produced, and
//! at the moment a barrier is delivered, its front holds exactly the input's records in
//! flight across the sender's snapshot.

use std::collections::VecDeque;
use std::time::Duration;

use crossbeam_channel::{Receiver, Select};

use crate::graph::logical::Side;
use crate::ids::CheckpointId;
use crate::record::Batch;
use crate::runtime::control::Control;
use crate::runtime::message::{Message, Priority};

/// One input channel.
pub struct InputChannel {
    /// Messages from one upstream subtask.
    pub rx: Receiver<Message>,
    /// Which input of a two-input operator it feeds.
    pub side: Side,
    /// A back-edge of a loop (unbounded, never parked).
    pub feedback: bool,
    /// Where its records come from (to name a record an operator fails on).
    pub origin: Option<std::sync::Arc<crate::runtime::failed_record::Origin>>,
    /// A back-edge's share of the job's in-flight budget (bytes taken off are given back).
    budget: Option<std::sync::Arc<crate::runtime::feedback_budget::FeedbackBudget>>,
    /// Fed from another worker: told each time a message is taken off, so the network side
    /// waiting on a full channel goes on at once.
    space: Option<std::sync::Arc<tokio::sync::Notify>>,
    watermark: i64,
    done: bool,
    /// Messages taken off the channel so far.
    received: u64,
    /// Messages to read before the channel (unaligned checkpoints), each with whether it
    /// holds one of the channel's tokens (it came through the channel; carried ones did not).
    front: VecDeque<(Message, bool)>,
    /// Unaligned checkpoints: the channel's tokens, one given back per message handed on
    /// (`runtime/output.rs`); none on back-edges.
    tokens: Option<Receiver<()>>,
    /// How many of `front` were in flight at the barrier last delivered.
    in_flight: usize,
}

impl InputChannel {
    /// Wraps a receiver.
    pub fn new(rx: Receiver<Message>, side: Side) -> Self {
        InputChannel {
            rx,
            side,
            feedback: false,
            origin: None,
            budget: None,
            space: None,
            watermark: i64::MIN,
            done: false,
            received: 0,
            front: VecDeque::new(),
            in_flight: 0,
            tokens: None,
        }
    }

    /// Unaligned checkpoints: the channel's tokens.
    pub fn tokens(mut self, tokens: Option<Receiver<()>>) -> Self {
        self.tokens = tokens;
        self
    }

    /// A message that came through the channel is handed on: its token goes back.
    fn release(&self) {
        if let Some(t) = &self.tokens {
            let _ = t.try_recv();
        }
    }

    /// Bookkeeping of a message just taken off the channel.
    fn took(&mut self, m: &Message) {
        self.received += 1;
        if let Some(s) = &self.space {
            s.notify_one();
        }
        if let (Some(b), Message::Data(batch)) = (&self.budget, m) {
            b.sub(batch.as_bytes().len() as u64);
        }
    }

    /// Notifies `space` each time a message is taken off (a channel fed by the network).
    pub fn space(mut self, space: Option<std::sync::Arc<tokio::sync::Notify>>) -> Self {
        self.space = space;
        self
    }

    /// Gives the bytes of every batch taken off it back to `budget` (back-edges).
    pub fn budget(mut self, budget: Option<std::sync::Arc<crate::runtime::feedback_budget::FeedbackBudget>>) -> Self {
        self.budget = budget;
        self
    }

    /// Says where its records come from.
    pub fn from(mut self, origin: crate::runtime::failed_record::Origin) -> Self {
        self.origin = Some(std::sync::Arc::new(origin));
        self
    }

    /// Marks it a back-edge.
    pub fn feedback(mut self, feedback: bool) -> Self {
        self.feedback = feedback;
        self
    }
}

/// What reading the inputs produced.
pub enum Received {
    /// A message from input `index`.
    Message(usize, Message),
    /// An upstream dropped its channel without end of stream: it failed.
    Disconnected,
    /// A message from the checkpoint coordinator.
    Control(Control),
    /// Nothing arrived within the timeout.
    Idle,
    /// Every input has ended.
    AllDone,
    /// A barrier that overtakes records was delivered on input `index`: its front now holds
    /// the input's records in flight across the sender's snapshot. With it, when its
    /// checkpoint was triggered.
    Marker(usize, CheckpointId, std::time::Instant),
}

/// All inputs of a subtask.
pub struct Inputs {
    channels: Vec<InputChannel>,
    watermark: i64,
    /// Unaligned checkpoints: where barriers arrive ahead of the channels.
    priority: Option<Receiver<Priority>>,
    /// The front to look at first next time.
    next_front: usize,
    /// How long a checkpoint aligns before it switches to unaligned (barriers overtaking).
    aligned_for: Duration,
}

impl Inputs {
    /// Reads `channels`.
    pub fn new(channels: Vec<InputChannel>) -> Self {
        Inputs { channels, watermark: i64::MIN, priority: None, next_front: 0, aligned_for: Duration::ZERO }
    }

    /// Barriers overtaking records arrive on `inbox`; each checkpoint aligns for up to
    /// `aligned_for`, then switches to unaligned (`checkpoint/alignment_timeout.rs`).
    pub fn with_priority(mut self, inbox: Option<Receiver<Priority>>, aligned_for: Duration) -> Self {
        self.priority = inbox;
        self.aligned_for = aligned_for;
        self
    }

    /// How long a checkpoint aligns before it switches to unaligned.
    pub fn aligned_for(&self) -> Duration {
        self.aligned_for
    }

    /// How many of input `index`'s messages before the barrier last delivered there are
    /// still to be read.
    pub fn in_flight(&self, index: usize) -> usize {
        self.channels[index].in_flight
    }

    /// The priority inbox (unaligned checkpoints), for a subtask waiting on its output.
    pub fn priority(&self) -> Option<Receiver<Priority>> {
        self.priority.clone()
    }

    /// A message just taken off channel `i`. A barrier sent before it was is visible now: if
    /// one came, it goes first, and the message waits in the (empty) front behind it — it
    /// may lie beyond that barrier's position (`accept` sorts that out).
    fn taken(&mut self, i: usize, m: Message) -> Received {
        self.channels[i].took(&m);
        if let Some(p) = self.priority.as_ref().and_then(|r| r.try_recv().ok()) {
            self.channels[i].front.push_back((m, true));
            return self.accept(p);
        }
        self.channels[i].release();
        Received::Message(i, m)
    }

    /// Every input ended (or the subtask stops reading): barriers are no longer taken, so
    /// the subtasks upstream stop sending them.
    pub fn close_priority(&mut self) {
        self.priority = None;
    }

    /// Delivers an unaligned barrier: input `p.input`'s messages up to the barrier move off
    /// the channel into its front, then what the sender carried.
    pub fn accept(&mut self, p: Priority) -> Received {
        let Some(c) = self.channels.get_mut(p.input) else { return Received::Disconnected };
        // A message already taken off beyond the barrier's position (it raced the barrier
        // into this subtask: see `recv`) waits at the back of the front; it goes after what
        // the barrier carried, and is not in flight.
        let beyond = c.received.saturating_sub(p.sent) as usize;
        let keep = c.front.len().saturating_sub(beyond);
        let after: Vec<(Message, bool)> = c.front.drain(keep..).collect();
        while c.received < p.sent {
            // The sender put these in before it sent the barrier: they are there.
            let Ok(m) = c.rx.try_recv() else { return Received::Disconnected };
            c.took(&m);
            c.front.push_back((m, true));
        }
        c.front.extend(p.carried.into_iter().map(|m| (m, false)));
        c.in_flight = c.front.len();
        c.front.extend(after);
        Received::Marker(p.input, p.id, p.started)
    }

    /// The batches in flight on input `index` at the barrier [`Inputs::accept`] just
    /// delivered (the front up to the barrier's position).
    pub fn front_batches(&self, index: usize) -> impl Iterator<Item = &Batch> {
        let c = &self.channels[index];
        c.front.iter().take(c.in_flight).filter_map(|(m, _)| match m {
            Message::Data(b) => Some(b),
            _ => None,
        })
    }

    /// Where the records of input `index` come from.
    pub fn origin(&self, index: usize) -> Option<&crate::runtime::failed_record::Origin> {
        self.channels.get(index).and_then(|c| c.origin.as_deref())
    }

    /// The side of input `index`.
    pub fn side(&self, index: usize) -> Side {
        self.channels[index].side
    }

    /// Number of input channels.
    pub fn len(&self) -> usize {
        self.channels.len()
    }

    /// No input channels.
    pub fn is_empty(&self) -> bool {
        self.channels.is_empty()
    }

    /// The next message from an open input that is not `parked`, or from `control`:
    /// without waiting if `wait` is `None`, else up to `wait`. Parked inputs are not read
    /// at all, so their records stay queued behind the barrier (and backpressure their
    /// upstream), as ABS requires.
    pub fn recv(
        &mut self,
        wait: Option<Duration>,
        parked: &dyn Fn(usize) -> bool,
        control: Option<&Receiver<Control>>,
    ) -> Received {
        // Barriers overtake everything; then what they moved ahead of the channels.
        if let Some(p) = self.priority.as_ref().and_then(|r| r.try_recv().ok()) {
            return self.accept(p);
        }
        // Fronts in turn, so no input's front starves another's.
        let n = self.channels.len();
        for k in 0..n {
            let i = (self.next_front + k) % n;
            let c = &mut self.channels[i];
            if !c.done
                && !parked(i)
                && let Some((m, token)) = c.front.pop_front()
            {
                if token {
                    c.release();
                }
                c.in_flight = c.in_flight.saturating_sub(1);
                self.next_front = (i + 1) % n;
                return Received::Message(i, m);
            }
        }
        let open: Vec<usize> = (0..self.channels.len()).filter(|&i| !self.channels[i].done).collect();
        if open.is_empty() {
            return Received::AllDone;
        }
        let readable: Vec<usize> = open.iter().copied().filter(|&i| !parked(i)).collect();
        let mut sel = Select::new();
        for &i in &readable {
            sel.recv(&self.channels[i].rx);
        }
        if let Some(c) = control {
            sel.recv(c);
        }
        let priority = self.priority.clone();
        if let Some(p) = &priority {
            sel.recv(p);
        }
        let op = match match wait {
            None => sel.try_select(),
            Some(t) => sel.select_timeout(t).map_err(|_| crossbeam_channel::TrySelectError),
        } {
            Ok(op) => op,
            Err(_) => return Received::Idle,
        };
        if let Some(control) = control.filter(|_| op.index() == readable.len()) {
            return match op.recv(control) {
                Ok(c) => Received::Control(c),
                // The coordinator is gone: the job is being torn down.
                Err(_) => Received::Disconnected,
            };
        }
        if op.index() >= readable.len() {
            let got = op.recv(priority.as_ref().expect("selected"));
            drop(sel);
            return match got {
                Ok(p) => self.accept(p),
                // Every subtask upstream exited (a stop, or they all finished): no barrier
                // can come any more.
                Err(_) => {
                    self.priority = None;
                    Received::Idle
                }
            };
        }
        let i = readable[op.index()];
        let got = op.recv(&self.channels[i].rx);
        drop(sel);
        match got {
            Ok(m) => self.taken(i, m),
            // An upstream that exits on `Stop` (stop with savepoint) disconnects before this
            // subtask may have read its own `Complete`/`Stop`: those come first.
            Err(_) => match control.map(|c| c.recv_timeout(Duration::from_millis(200))) {
                Some(Ok(c)) => Received::Control(c),
                _ => Received::Disconnected,
            },
        }
    }

    /// Whether input `index` is a back-edge.
    pub fn is_feedback(&self, index: usize) -> bool {
        self.channels[index].feedback
    }

    /// Which inputs are back-edges.
    pub fn feedback_flags(&self) -> Vec<bool> {
        self.channels.iter().map(|c| c.feedback).collect()
    }

    /// The job's in-flight budget its back-edges count against, if it has any.
    pub fn feedback_budget(&self) -> Option<std::sync::Arc<crate::runtime::feedback_budget::FeedbackBudget>> {
        self.channels.iter().find_map(|c| c.budget.clone())
    }

    /// Largest number of batches queued on any open back-edge right now.
    pub fn feedback_backlog(&self) -> usize {
        self.channels.iter().filter(|c| c.feedback && !c.done).map(|c| c.rx.len()).max().unwrap_or(0)
    }

    /// Records end of stream on input `index`.
    pub fn finish(&mut self, index: usize) {
        self.channels[index].done = true;
    }

    /// Records a watermark on input `index`; returns the subtask's new watermark if it
    /// advanced.
    pub fn on_watermark(&mut self, index: usize, watermark: i64) -> Option<i64> {
        let c = &mut self.channels[index];
        c.watermark = c.watermark.max(watermark);
        self.advance()
    }

    /// Recomputes the subtask watermark (after a watermark or an end of stream).
    pub fn advance(&mut self) -> Option<i64> {
        let wm = self.channels.iter().map(|c| if c.done { i64::MAX } else { c.watermark }).min().unwrap_or(i64::MAX);
        (wm > self.watermark).then(|| {
            self.watermark = wm;
            wm
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watermark_is_the_minimum_and_finished_inputs_do_not_hold_it_back() {
        let (_t1, r1) = crossbeam_channel::bounded(1);
        let (_t2, r2) = crossbeam_channel::bounded(1);
        let mut inputs = Inputs::new(vec![InputChannel::new(r1, Side::Left), InputChannel::new(r2, Side::Left)]);
        assert_eq!(inputs.on_watermark(0, 10), None, "input 1 is still at -inf");
        assert_eq!(inputs.on_watermark(1, 5), Some(5));
        assert_eq!(inputs.on_watermark(1, 20), Some(10));
        assert_eq!(inputs.on_watermark(1, 3), None, "watermarks never go back");
        inputs.finish(0);
        assert_eq!(inputs.advance(), Some(20));
        inputs.finish(1);
        assert_eq!(inputs.advance(), Some(i64::MAX));
    }

    fn data(v: u8) -> Message {
        let mut b = Batch::default();
        b.push(0, 0, b"k", &[v]);
        Message::Data(b)
    }

    fn value(r: Received) -> u8 {
        match r {
            Received::Message(0, Message::Data(b)) => b.iter().next().unwrap().value[0],
            _ => panic!("not a data message of input 0"),
        }
    }

    /// Unaligned: a barrier moves its channel's messages up to its position ahead (they are
    /// what was in flight), then what the sender carried; the input still yields every
    /// message in the order it was produced.
    #[test]
    fn unaligned_a_barrier_moves_the_messages_before_it_ahead_and_keeps_the_order() {
        let (tx, rx) = crossbeam_channel::bounded(8);
        let (inbox, prio) = crossbeam_channel::unbounded();
        let mut inputs = Inputs::new(vec![InputChannel::new(rx, Side::Left)]).with_priority(Some(prio), Duration::ZERO);
        for v in 1..=4 {
            tx.send(data(v)).unwrap();
        }
        assert_eq!(value(inputs.recv(None, &|_| false, None)), 1);
        // The sender put 3 messages in before its snapshot and held record 9 back.
        inbox
            .send(Priority {
                input: 0,
                id: CheckpointId(5),
                sent: 3,
                carried: vec![data(9)],
                started: std::time::Instant::now(),
            })
            .unwrap();
        assert!(matches!(inputs.recv(None, &|_| false, None), Received::Marker(0, CheckpointId(5), _)));
        let in_flight: Vec<u8> = inputs.front_batches(0).map(|b| b.iter().next().unwrap().value[0]).collect();
        assert_eq!(in_flight, vec![2, 3, 9], "the records in flight across the sender's snapshot");
        let rest: Vec<u8> = (0..4).map(|_| value(inputs.recv(None, &|_| false, None))).collect();
        assert_eq!(rest, vec![2, 3, 9, 4]);
    }

    /// The race: a message sent after the barrier is taken off the channel before the
    /// barrier is seen. It must come after what the barrier carried, and it is not in flight
    /// (logging it would replay it after a restore although its sender sends it again).
    #[test]
    fn unaligned_a_message_that_raced_past_its_barrier_goes_after_it_and_is_not_in_flight() {
        let (tx, rx) = crossbeam_channel::bounded(8);
        let (inbox, prio) = crossbeam_channel::unbounded();
        let mut inputs = Inputs::new(vec![InputChannel::new(rx, Side::Left)]).with_priority(Some(prio), Duration::ZERO);
        tx.send(data(1)).unwrap();
        assert_eq!(value(inputs.recv(None, &|_| false, None)), 1);
        // The sender snapshots after 1 message, holding record 9 back, then sends record 2.
        inbox
            .send(Priority {
                input: 0,
                id: CheckpointId(3),
                sent: 1,
                carried: vec![data(9)],
                started: std::time::Instant::now(),
            })
            .unwrap();
        tx.send(data(2)).unwrap();
        let m = inputs.channels[0].rx.try_recv().unwrap();
        assert!(matches!(inputs.taken(0, m), Received::Marker(0, CheckpointId(3), _)));
        let in_flight: Vec<u8> = inputs.front_batches(0).map(|b| b.iter().next().unwrap().value[0]).collect();
        assert_eq!(in_flight, vec![9], "record 2 was sent after the barrier");
        let rest: Vec<u8> = (0..2).map(|_| value(inputs.recv(None, &|_| false, None))).collect();
        assert_eq!(rest, vec![9, 2]);
    }

    /// A barrier naming more messages than the channel ever held is a broken sender: the
    /// input reports it rather than waiting forever.
    #[test]
    fn unaligned_a_barrier_beyond_the_channel_is_refused() {
        let (_tx, rx) = crossbeam_channel::bounded::<Message>(8);
        let mut inputs = Inputs::new(vec![InputChannel::new(rx, Side::Left)]);
        let p =
            Priority { input: 0, id: CheckpointId(1), sent: 1, carried: vec![], started: std::time::Instant::now() };
        assert!(matches!(inputs.accept(p), Received::Disconnected));
        let p =
            Priority { input: 7, id: CheckpointId(1), sent: 0, carried: vec![], started: std::time::Instant::now() };
        assert!(matches!(inputs.accept(p), Received::Disconnected), "no such input");
    }

    /// Taking a message off a network-fed channel tells the network side at once (a permit is
    /// left for a hand-off that waits on it); other channels carry no notification.
    #[test]
    fn a_message_taken_off_a_network_fed_channel_notifies_its_stream() {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let (local_tx, local_rx) = crossbeam_channel::bounded(1);
        let space = std::sync::Arc::new(tokio::sync::Notify::new());
        let mut inputs = Inputs::new(vec![
            InputChannel::new(rx, Side::Left).space(Some(space.clone())),
            InputChannel::new(local_rx, Side::Left),
        ]);
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        let notified = |space: &tokio::sync::Notify| {
            rt.block_on(async { tokio::time::timeout(Duration::from_secs(1), space.notified()).await.is_ok() })
        };
        local_tx.send(Message::Watermark(1)).unwrap();
        assert!(matches!(inputs.recv(None, &|_| false, None), Received::Message(1, _)));
        assert!(!notified(&space), "a local channel's message notifies nothing");
        tx.send(Message::Watermark(2)).unwrap();
        assert!(matches!(inputs.recv(None, &|_| false, None), Received::Message(0, _)));
        assert!(notified(&space), "taking a network-fed message off notifies its stream");
    }
}
