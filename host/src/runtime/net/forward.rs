//! The sending end of a channel to another worker: a thread that forwards the sending
//! subtask's local queue to the network and, with unaligned checkpoints, the subtask's
//! barriers for that channel on its priority stream, taking the messages still queued here
//! before a barrier's position along as carried (`splice.rs`).
//!
//! Invariants: messages leave in queue order, each once (to the network or carried by a
//! barrier); a barrier leaves with every message before its position gone ahead of it or
//! carried by it. The subtask puts a barrier in after the messages before its position, so
//! a barrier is looked for after each message is taken and before it is handed on: a message
//! queued after the barrier is never handed on ahead of it. The thread ends when the subtask
//! drops its end, the peer goes, or the attempt is cancelled (a blocked send gives up then).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crossbeam_channel::{Receiver, select};

use crate::runtime::feedback_budget::FeedbackBudget;
use crate::runtime::message::{Message, Priority};
use crate::runtime::net::link::{BarrierSender, RemoteSender};
use crate::runtime::net::splice::splice;

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
        // Messages that left the local queue so far: this hop's position in the channel.
        let mut handed = 0u64;
        loop {
            let next = match &self.barriers {
                None => self.rx.recv().map_or(Next::End, Next::Message),
                Some((barriers, _)) => select! {
                    recv(barriers) -> p => p.map_or(Next::BarriersClosed, Next::Barrier),
                    recv(self.rx) -> m => m.map_or(Next::End, Next::Message),
                },
            };
            let m = match next {
                Next::Message(m) => m,
                Next::Barrier(p) => {
                    if self.send_barrier(p, &mut handed, &mut None).is_err() {
                        return;
                    }
                    continue;
                }
                Next::BarriersClosed => {
                    self.barriers = None;
                    continue;
                }
                Next::End => return,
            };
            self.give_back(&m);
            let mut held = Some(m);
            while held.is_some() {
                if let Some((barriers, _)) = &self.barriers {
                    let waiting: Vec<Priority> = barriers.try_iter().collect();
                    for p in waiting {
                        if self.send_barrier(p, &mut handed, &mut held).is_err() {
                            return;
                        }
                    }
                }
                let Some(m) = held.take() else { break };
                if self.cancel.load(Ordering::Relaxed) {
                    return;
                }
                match self.data.send_within(m, LOOK_EVERY) {
                    Ok(None) => handed += 1,
                    Ok(Some(back)) => held = Some(back),
                    Err(_) => return,
                }
            }
        }
    }

    /// Sends barrier `p`, taking `held` (the next message, already off the queue) and what
    /// is queued up to its position along.
    fn send_barrier(&self, mut p: Priority, handed: &mut u64, held: &mut Option<Message>) -> Result<(), ()> {
        let moved = splice(&mut p, *handed, || {
            held.take().or_else(|| {
                let m = self.rx.try_recv().ok()?;
                self.give_back(&m);
                Some(m)
            })
        })
        .map_err(|_| ())?;
        *handed += moved as u64;
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
