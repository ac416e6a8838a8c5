//! The input side of a subtask: several channels (one per upstream subtask and edge), read
//! with a select over the channels still open, and the subtask's watermark as the minimum
//! over its inputs.
//!
//! Invariant: a channel is read in FIFO order; a finished channel counts as watermark +inf.

use std::time::Duration;

use crossbeam_channel::{Receiver, Select};

use crate::graph::logical::Side;
use crate::runtime::control::Control;
use crate::runtime::message::Message;

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
}

/// All inputs of a subtask.
pub struct Inputs {
    channels: Vec<InputChannel>,
    watermark: i64,
}

impl Inputs {
    /// Reads `channels`.
    pub fn new(channels: Vec<InputChannel>) -> Self {
        Inputs { channels, watermark: i64::MIN }
    }

    /// Where the records of input `index` come from.
    pub fn origin(&self, index: usize) -> Option<&crate::runtime::failed_record::Origin> {
        self.channels[index].origin.as_deref()
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
        let op = match wait {
            None => sel.try_select().ok(),
            Some(t) => sel.select_timeout(t).ok(),
        };
        let Some(op) = op else { return Received::Idle };
        if op.index() == readable.len() {
            return match op.recv(control.unwrap()) {
                Ok(c) => Received::Control(c),
                // The coordinator is gone: the job is being torn down.
                Err(_) => Received::Disconnected,
            };
        }
        let i = readable[op.index()];
        match op.recv(&self.channels[i].rx) {
            Ok(m) => {
                if let Some(s) = &self.channels[i].space {
                    s.notify_one();
                }
                if let (Some(b), Message::Data(batch)) = (&self.channels[i].budget, &m) {
                    b.sub(batch.as_bytes().len() as u64);
                }
                Received::Message(i, m)
            }
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
