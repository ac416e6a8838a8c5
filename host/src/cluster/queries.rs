//! Live state queries across the network, on the coordinator's side: the caller's reply
//! channel stays here under a number; the query travels to the worker that runs the subtask
//! owning the key (`WireControl::Query`), and its answer (`ToCoordinator::QueryAnswer`) is
//! matched back to the caller by that number.
//!
//! Invariants: an answer is taken only from the worker the query went to, once; at most
//! [`MAX_IN_FLIGHT`] queries wait at a time (a caller flooding the API gets an error, not a
//! growing table); when an attempt ends every waiting caller is told so at once, never left
//! to time out. Pure: no I/O.

use std::collections::BTreeMap;

use crossbeam_channel::Sender;

use crate::runtime::query::QueryAnswer;

/// Queries waiting for their answer at once, at most.
pub const MAX_IN_FLIGHT: usize = 256;

type Reply = Sender<Result<QueryAnswer, String>>;

/// The queries sent to workers and not answered yet.
#[derive(Debug, Default)]
pub struct PendingQueries {
    next: u64,
    waiting: BTreeMap<u64, (u64, Reply)>,
}

impl PendingQueries {
    /// No query waiting; the first one asked is numbered `base + 1`.
    pub fn numbered_from(base: u64) -> PendingQueries {
        PendingQueries { next: base, waiting: BTreeMap::new() }
    }

    /// Keeps `reply` for a query sent to worker `member`; its number, or `None` (the caller
    /// was told why) when too many are in flight.
    pub fn ask(&mut self, member: u64, reply: Reply) -> Option<u64> {
        if self.waiting.len() >= MAX_IN_FLIGHT {
            let _ = reply.send(Err(format!(
                "{MAX_IN_FLIGHT} state queries are already waiting for their workers; retry when they are answered"
            )));
            return None;
        }
        self.next += 1;
        self.waiting.insert(self.next, (member, reply));
        Some(self.next)
    }

    /// Whether query `query` waits for worker `member`'s answer.
    pub fn awaits(&self, member: u64, query: u64) -> bool {
        self.waiting.get(&query).is_some_and(|(m, _)| *m == member)
    }

    /// Worker `member`'s answer to query `query` (the [`QueryAnswer`] as JSON); an answer
    /// nobody waits for, or from another worker, is dropped.
    pub fn answer(&mut self, member: u64, query: u64, answer: Result<String, String>) {
        if !self.awaits(member, query) {
            return;
        }
        let (_, reply) = self.waiting.remove(&query).expect("checked");
        let answer = answer.and_then(|json| {
            serde_json::from_str::<QueryAnswer>(&json).map_err(|e| format!("the worker's answer does not decode: {e}"))
        });
        let _ = reply.send(answer);
    }

    /// The attempt ended: every waiting caller hears so.
    pub fn fail_all(&mut self, why: &str) {
        for (_, (_, reply)) in std::mem::take(&mut self.waiting) {
            let _ = reply.send(Err(why.to_string()));
        }
    }

    /// Queries waiting.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::bounded;

    fn answer_json(value: u64) -> String {
        let a = QueryAnswer {
            operator: "count".into(),
            subtask: 1,
            state: "n".into(),
            key: "k".into(),
            key_group: 3,
            found: true,
            value: serde_json::json!(value),
        };
        serde_json::to_string(&a).unwrap()
    }

    #[test]
    fn cluster_query_answers_reach_their_caller_once_and_only_from_the_asked_worker() {
        let mut p = PendingQueries::default();
        let (tx, rx) = bounded(1);
        let q = p.ask(7, tx).unwrap();
        // Another worker, or a number nobody asked: dropped.
        p.answer(8, q, Ok(answer_json(1)));
        p.answer(7, q + 1, Ok(answer_json(1)));
        assert!(rx.try_recv().is_err());
        p.answer(7, q, Ok(answer_json(42)));
        assert_eq!(rx.try_recv().unwrap().unwrap().value, serde_json::json!(42));
        // Once.
        p.answer(7, q, Ok(answer_json(43)));
        assert!(rx.try_recv().is_err() && p.is_empty());
        // A refusal and an undecodable answer reach the caller as errors.
        let (tx, rx) = bounded(1);
        let q = p.ask(7, tx).unwrap();
        p.answer(7, q, Err("no such key".into()));
        assert_eq!(rx.try_recv().unwrap().unwrap_err(), "no such key");
        let (tx, rx) = bounded(1);
        let q = p.ask(7, tx).unwrap();
        p.answer(7, q, Ok("{".into()));
        assert!(rx.try_recv().unwrap().unwrap_err().contains("does not decode"));
    }

    #[test]
    fn cluster_query_table_is_bounded_and_an_attempt_end_answers_every_waiting_caller() {
        let mut p = PendingQueries::default();
        let mut waiting = Vec::new();
        for _ in 0..MAX_IN_FLIGHT {
            let (tx, rx) = bounded(1);
            assert!(p.ask(1, tx).is_some());
            waiting.push(rx);
        }
        let (tx, rx) = bounded(1);
        assert!(p.ask(1, tx).is_none());
        assert!(rx.try_recv().unwrap().unwrap_err().contains("already waiting"));
        assert_eq!(p.len(), MAX_IN_FLIGHT);
        p.fail_all("the attempt ended");
        assert!(p.is_empty());
        assert!(waiting.iter().all(|rx| rx.try_recv().unwrap().unwrap_err() == "the attempt ended"));
    }
}
