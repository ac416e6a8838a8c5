//! The sending end of a channel to another worker: a thread that forwards the sending
//! subtask's local queue to the network and, with unaligned checkpoints, the subtask's
//! barriers for that channel on its priority stream, taking the messages still queued here
//! before a barrier's position along as carried (`splice.rs`).
//!
//! Invariants: messages leave in queue order, each once (to the network or carried by a
//! barrier); a barrier leaves with every message before its position gone ahead of it or
//! carried by it, and its marker goes into the data stream right after the messages handed on
//! before it (the receiving worker holds back what follows the marker until it has the
//! barrier: the two streams are not ordered with each other). The subtask puts a barrier in
//! after the messages before its position, so barriers are looked for after each message is
//! taken and before it is handed on: a message queued after a barrier never goes ahead of it. The thread ends when the subtask
//! drops its end, the peer goes, or the attempt is cancelled (a blocked send gives up then).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crossbeam_channel::{Receiver, select};

use crate::runtime::feedback_budget::FeedbackBudget;
use crate::runtime::message::{Message, Priority};
use crate::runtime::net::frame::Item;
use crate::runtime::net::link::{BarrierSender, RemoteSender};
use crate::runtime::net::splice::Hop;

/// How long a blocked send waits before it looks for barriers and cancellation again.
const LOOK_EVERY: Duration = Duration::from_millis(20);

/// What the queues brought.
enum Next {
    Message(Message),
    Barrier(Priority),
    BarriersClosed,
    End,
}

/// One outgoing channel's forwarding.
pub struct Forward {
    /// The sending subtask's local queue.
    pub rx: Receiver<Message>,
    /// The channel's stream.
    pub data: RemoteSender,
    /// Unaligned checkpoints: the subtask's barriers for this channel, and its priority stream.
    pub barriers: Option<(Receiver<Priority>, BarrierSender)>,
    /// A back-edge: this worker's in-flight budget, given back as batches leave.
    pub budget: Option<Arc<FeedbackBudget>>,
    /// The attempt's cancellation.
    pub cancel: Arc<AtomicBool>,
}

impl Forward {
    /// Forwards until the channel ends (see the module doc).
    pub fn run(mut self) {
        let mut hop = Hop::default();
        // For the data stream, in order: markers of barriers sent, then at most one message
        // taken off the queue (always last).
        let mut pending: VecDeque<Item> = VecDeque::new();
        let mut ended = false;
        loop {
            // Every barrier the subtask put in before the next message is handled before it.
            if self.take_barriers(&mut hop, &mut pending).is_err() {
                return;
            }
            if let Some(item) = pending.pop_front() {
                if self.cancel.load(Ordering::Relaxed) {
                    return;
                }
                let message = matches!(item, Item::Message(_));
                match self.data.send_within(item, LOOK_EVERY) {
                    Ok(None) if message => hop.handed(),
                    Ok(None) => {}
                    Ok(Some(back)) => pending.push_front(back),
                    Err(_) => return,
                }
                continue;
            }
            if ended {
                return;
            }
            let next = match &self.barriers {
                None => self.rx.recv().map_or(Next::End, Next::Message),
                Some((barriers, _)) => select! {
                    recv(barriers) -> p => p.map_or(Next::BarriersClosed, Next::Barrier),
                    recv(self.rx) -> m => m.map_or(Next::End, Next::Message),
                },
            };
            match next {
                Next::Message(m) => {
                    self.give_back(&m);
                    pending.push_back(Item::Message(m));
                }
                Next::Barrier(p) => {
                    if self.send_barrier(p, &mut hop, &mut pending).is_err() {
                        return;
                    }
                }
                Next::BarriersClosed => self.barriers = None,
                // What is pending (and any barrier still queued) goes first.
                Next::End => ended = true,
            }
        }
    }

    /// Sends every barrier queued now.
    fn take_barriers(&self, hop: &mut Hop, pending: &mut VecDeque<Item>) -> Result<(), ()> {
        let Some((barriers, _)) = &self.barriers else { return Ok(()) };
        let queued: Vec<Priority> = barriers.try_iter().collect();
        for p in queued {
            self.send_barrier(p, hop, pending)?;
        }
        Ok(())
    }

    /// Sends barrier `p` on the priority stream, taking the pending message and what is
    /// queued up to its position along, and puts its marker where it sits in the data stream:
    /// after every message handed on, before a pending message it did not take.
    fn send_barrier(&self, mut p: Priority, hop: &mut Hop, pending: &mut VecDeque<Item>) -> Result<(), ()> {
        hop.splice(&mut p, || {
            if matches!(pending.back(), Some(Item::Message(_))) {
                let Some(Item::Message(m)) = pending.pop_back() else { unreachable!("checked") };
                return Some(m);
            }
            let m = self.rx.try_recv().ok()?;
            self.give_back(&m);
            Some(m)
        })
        .map_err(|_| ())?;
        let marker = Item::Marker(p.id);
        match pending.back() {
            Some(Item::Message(_)) => pending.insert(pending.len() - 1, marker),
            _ => pending.push_back(marker),
        }
        let (_, to) = self.barriers.as_ref().expect("a barrier came from them");
        to.send(p).map_err(|_| ())
    }

    /// Off this worker's back-edge backlog: the receiving worker counts it now.
    fn give_back(&self, m: &Message) {
        if let (Some(b), Message::Data(batch)) = (&self.budget, m) {
            b.sub(batch.as_bytes().len() as u64);
        }
    }
}
