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

/// Moves the messages after position `handed` up to `p.sent`, taken in order from `next`,
/// in front of `p.carried`, and sets `p.sent` to `handed`. Returns how many moved (none if
/// the hop is already at or past the barrier's position).
pub fn splice(p: &mut Priority, handed: u64, mut next: impl FnMut() -> Option<Message>) -> Result<usize, Broken> {
    if p.sent <= handed {
        return Ok(0);
    }
    let want = p.sent - handed;
    let mut moved = Vec::with_capacity(want.min(1024) as usize);
    for taken in 0..want {
        match next() {
            Some(m) => moved.push(m),
            None => return Err(Broken { missing: want - taken }),
        }
    }
    let n = moved.len();
    moved.append(&mut p.carried);
    p.carried = moved;
    p.sent = handed;
    Ok(n)
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

    fn barrier(sent: u64, carried: Vec<Message>) -> Priority {
        Priority { input: 0, id: CheckpointId(1), sent, carried, started: Instant::now() }
    }

    #[test]
    fn the_messages_between_the_hop_and_the_barrier_go_ahead_of_what_it_carried() {
        let mut queue: VecDeque<Message> = (3..8).map(wm).collect();
        let mut p = barrier(5, vec![wm(100)]);
        assert_eq!(splice(&mut p, 2, || queue.pop_front()), Ok(3));
        assert_eq!(p.sent, 2);
        assert_eq!(marks(&p.carried), vec![3, 4, 5, 100]);
        assert_eq!(marks(&queue.into_iter().collect::<Vec<_>>()), vec![6, 7], "after the barrier: untouched");
    }

    #[test]
    fn a_barrier_the_hop_already_passed_is_left_alone() {
        let mut p = barrier(4, vec![wm(100)]);
        assert_eq!(splice(&mut p, 6, || panic!("nothing is taken")), Ok(0));
        assert_eq!((p.sent, marks(&p.carried)), (4, vec![100]));
        assert_eq!(splice(&mut p, 4, || panic!("nothing is taken")), Ok(0));
    }

    #[test]
    fn a_channel_that_ends_before_the_barriers_position_is_broken() {
        let mut queue: VecDeque<Message> = (1..3).map(wm).collect();
        let mut p = barrier(5, vec![]);
        assert_eq!(splice(&mut p, 0, || queue.pop_front()), Err(Broken { missing: 3 }));
    }

    proptest! {
        /// Two hops (sender's queue, then the receiver's arrivals), at any positions: the
        /// channel's order is the same as without the splices.
        #[test]
        fn two_hops_keep_the_channels_order(
            total in 0u64..40,
            sent in 0u64..40,
            sender_at in 0u64..40,
            receiver_at in 0u64..40,
            carried in 0i64..5,
        ) {
            let sent = sent.min(total);
            let (sender_at, receiver_at) = (sender_at.min(sent), receiver_at.min(total));
            let order = |p: &Priority, rest: &[i64]| {
                let mut v: Vec<i64> = (0..p.sent as i64).collect();
                v.extend(marks(&p.carried));
                v.extend(rest);
                v
            };
            let mut p = barrier(sent, (0..carried).map(|c| wm(1000 + c)).collect());
            let after: Vec<i64> = (sent as i64..total as i64).collect();
            let want = order(&p, &after);
            // The sender's queue holds what it has not handed to the network.
            let mut queue: VecDeque<Message> = (sender_at as i64..sent as i64).map(wm).collect();
            splice(&mut p, sender_at, || queue.pop_front()).unwrap();
            prop_assert_eq!(order(&p, &after), want.clone());
            // The receiver delivered `receiver_at` of the stream (maybe past the barrier).
            let mut arrived: VecDeque<Message> = (receiver_at as i64..p.sent as i64).map(wm).collect();
            splice(&mut p, receiver_at, || arrived.pop_front()).unwrap();
            if receiver_at <= sender_at {
                prop_assert_eq!(p.sent, receiver_at);
            }
            prop_assert_eq!(order(&p, &after), want);
        }
    }
}
