//! Unaligned barriers between workers overtake what is queued on the way. A channel to
//! another worker has two queues the in-process channel has not: the sending worker's local
//! queue in front of the network, and at the receiving worker what arrived but is not yet in
//! the receiver's channel (it is full). At each of the two hops, a barrier takes the messages
//! between the hop's position (messages it handed on) and the barrier's position along as
//! carried, ahead of what it already carried, and its position becomes the hop's. The barrier
//! itself travels on the channel's priority stream, never behind the data.
//!
//! Invariant: the channel's messages in order are those up to `sent`, then `carried`, then
//! the ones after — before and after a splice: nothing is lost, doubled or reordered. A
//! barrier whose position the hop already passed (its data raced ahead on the data stream)
//! is left alone: the receiver sorts such messages behind the barrier (`runtime/input.rs`).
//! Pure: no I/O.

use crate::runtime::message::{Message, Priority};

/// The messages before a barrier's position ended before the position was reached: the
/// channel broke (its sender went away), and the barrier with it.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("the channel ended {missing} message(s) before the barrier's position")]
pub struct Broken {
    /// Messages that never came.
    pub missing: u64,
}

/// A hop's position. Positions on its input side count the messages that came in; on its
/// output side only those it handed on (the ones barriers carried are not there).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Hop {
    /// Messages that left the hop (handed on or carried), in input positions.
    pub taken: u64,
    /// Of those, the ones barriers carried.
    pub carried: u64,
}

impl Hop {
    /// A message was handed on.
    pub fn handed(&mut self) {
        self.taken += 1;
    }

    /// Moves the messages after the hop's position up to barrier `p`'s (an input position),
    /// taken in order from `next`, in front of `p.carried`, and turns `p.sent` into an output
    /// position. Returns how many moved (none if the hop is already at or past the barrier:
    /// those messages were all handed on, since barriers come in order).
    pub fn splice(&mut self, p: &mut Priority, mut next: impl FnMut() -> Option<Message>) -> Result<usize, Broken> {
        let at = p.sent;
        let mut moved = Vec::new();
        if at > self.taken {
            let want = at - self.taken;
            moved.reserve(want.min(1024) as usize);
            for taken in 0..want {
                match next() {
                    Some(m) => moved.push(m),
                    None => return Err(Broken { missing: want - taken }),
                }
            }
            self.taken = at;
            self.carried += want;
        }
        let n = moved.len();
        moved.append(&mut p.carried);
        p.carried = moved;
        p.sent = at - self.carried;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::time::Instant;

    use proptest::prelude::*;

    use super::*;
    use crate::ids::CheckpointId;

    fn wm(i: i64) -> Message {
        Message::Watermark(i)
    }

    fn marks(ms: &[Message]) -> Vec<i64> {
        ms.iter()
            .map(|m| match m {
                Message::Watermark(w) => *w,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    fn barrier(id: u64, sent: u64, carried: Vec<Message>) -> Priority {
        Priority { input: 0, id: CheckpointId(id), sent, carried, started: Instant::now() }
    }

    #[test]
    fn the_messages_between_the_hop_and_the_barrier_go_ahead_of_what_it_carried() {
        let mut queue: VecDeque<Message> = (3..8).map(wm).collect();
        let mut hop = Hop { taken: 2, carried: 0 };
        let mut p = barrier(1, 5, vec![wm(100)]);
        assert_eq!(hop.splice(&mut p, || queue.pop_front()), Ok(3));
        assert_eq!(p.sent, 2);
        assert_eq!(marks(&p.carried), vec![3, 4, 5, 100]);
        assert_eq!(marks(&queue.into_iter().collect::<Vec<_>>()), vec![6, 7], "after the barrier: untouched");
        assert_eq!(hop, Hop { taken: 5, carried: 3 });
    }

    /// Output positions leave out what earlier barriers carried.
    #[test]
    fn a_later_barriers_position_leaves_out_what_earlier_ones_carried() {
        let mut hop = Hop { taken: 4, carried: 0 };
        let mut queue: VecDeque<Message> = (4..10).map(wm).collect();
        let mut first = barrier(1, 10, vec![]);
        hop.splice(&mut first, || queue.pop_front()).unwrap();
        assert_eq!((first.sent, first.carried.len()), (4, 6));
        for _ in 10..20 {
            hop.handed();
        }
        let mut second = barrier(2, 20, vec![]);
        assert_eq!(hop.splice(&mut second, || panic!("nothing is taken")), Ok(0));
        assert_eq!(second.sent, 14, "the output stream holds 4 + 10 messages before it");
    }

    #[test]
    fn a_barrier_the_hop_already_passed_is_left_alone() {
        let mut hop = Hop { taken: 6, carried: 0 };
        let mut p = barrier(1, 4, vec![wm(100)]);
        assert_eq!(hop.splice(&mut p, || panic!("nothing is taken")), Ok(0));
        assert_eq!((p.sent, marks(&p.carried)), (4, vec![100]));
    }

    #[test]
    fn a_channel_that_ends_before_the_barriers_position_is_broken() {
        let mut queue: VecDeque<Message> = (1..3).map(wm).collect();
        let mut p = barrier(1, 5, vec![]);
        assert_eq!(Hop::default().splice(&mut p, || queue.pop_front()), Err(Broken { missing: 3 }));
    }

    /// What a receiver reads: per barrier, the output stream up to its position, then what it
    /// carried; then the rest of the stream.
    fn read(stream: &[i64], barriers: &[Priority]) -> Vec<i64> {
        let (mut out, mut at) = (Vec::new(), 0usize);
        for p in barriers {
            out.extend(&stream[at..p.sent as usize]);
            at = p.sent as usize;
            out.extend(marks(&p.carried));
        }
        out.extend(&stream[at..]);
        out
    }

    /// One hop between a producer and a consumer: messages 0..n with barriers at positions
    /// `cuts` (each carrying one marker of its own), the hop handing on between barriers as
    /// `handed` says. The reader sees every message once, in order, each barrier's marker
    /// right after the messages before it.
    fn one_hop(n: u64, mut cuts: Vec<u64>, handed: Vec<u64>) -> (Vec<i64>, Vec<i64>) {
        cuts.iter_mut().for_each(|c| *c %= n + 1);
        cuts.sort_unstable();
        let mut want = Vec::new();
        let mut at = 0;
        for (k, c) in cuts.iter().enumerate() {
            want.extend(at as i64..*c as i64);
            want.push(1000 + k as i64);
            at = *c;
        }
        want.extend(at as i64..n as i64);
        let (mut hop, mut queue) = (Hop::default(), (0..n as i64).map(wm).collect::<VecDeque<_>>());
        let (mut stream, mut out) = (Vec::new(), Vec::new());
        for (k, c) in cuts.iter().enumerate() {
            // Before barrier k is seen, the hop hands on up to the barrier's position at most.
            let go = handed.get(k).copied().unwrap_or(0) % (c - hop.taken.min(*c) + 1);
            for _ in 0..go {
                stream.push(marks(&[queue.pop_front().unwrap()])[0]);
                hop.handed();
            }
            let mut p = barrier(k as u64 + 1, *c, vec![wm(1000 + k as i64)]);
            hop.splice(&mut p, || queue.pop_front()).unwrap();
            out.push(p);
        }
        stream.extend(queue.iter().map(|m| marks(std::slice::from_ref(m))[0]));
        (read(&stream, &out), want)
    }

    proptest! {
        #[test]
        fn any_sequence_of_barriers_keeps_the_channels_order(
            n in 0u64..40,
            cuts in proptest::collection::vec(0u64..40, 0..6),
            handed in proptest::collection::vec(0u64..40, 0..6),
        ) {
            let (got, want) = one_hop(n, cuts, handed);
            prop_assert_eq!(got, want);
        }
    }
}
