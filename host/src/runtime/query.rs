//! Live state queries: a key's current value in a running operator's keyed state.
//!
//! The job's handle asks the checkpoint coordinator (`Request::Query`), which resolves the
//! state name against the operator's declared states, hashes the key to its key group and
//! hands the query to the one subtask that owns that group (`Control::Query`). The subtask
//! answers between two batches — never during one, so the value is the state after a whole
//! number of batches — by calling the component's `query-state` export (contract 0.3.1),
//! and replies straight to the caller: the coordinator never waits on a subtask.
//!
//! Invariant: a query reads, it never changes the state or the stream (what a guest emits
//! while answering is dropped), and a guest that traps while answering fails its subtask
//! like any other trap (the job restarts from its checkpoint).

use crossbeam_channel::Sender;
use serde::{Deserialize, Serialize};

/// One query on its way to the subtask that owns the key.
#[derive(Debug, Clone)]
pub struct StateQuery {
    /// Operator uid.
    pub operator: String,
    /// The subtask that owns the key's group.
    pub subtask: u32,
    /// The keyed state asked for (declared by the operator).
    pub state: String,
    /// The key's group.
    pub key_group: u32,
    /// The key.
    pub key: Vec<u8>,
    /// Where the answer goes.
    pub reply: Sender<Result<QueryAnswer, String>>,
}

/// The answer to a live (or offline) state query.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueryAnswer {
    /// Operator uid.
    pub operator: String,
    /// The subtask that answered.
    pub subtask: u32,
    /// The keyed state.
    pub state: String,
    /// The key (UTF-8, lossy).
    pub key: String,
    /// The key's group.
    pub key_group: u32,
    /// Whether the key has a value in the state.
    pub found: bool,
    /// The value as the operator's SDK shows it (JSON), `null` when not found.
    pub value: serde_json::Value,
}

impl StateQuery {
    /// Sends the guest's answer (`Ok(None)`: no value for the key) to the caller.
    pub fn answer(self, r: Result<Option<String>, String>) {
        let r = r.and_then(|v| {
            QueryAnswer::from_guest(&self.operator, self.subtask, &self.state, self.key_group, &self.key, v)
        });
        let _ = self.reply.send(r);
    }
}

impl QueryAnswer {
    /// The answer for the guest's `value` (JSON text; `None`: the key has no value).
    pub fn from_guest(
        operator: &str,
        subtask: u32,
        state: &str,
        key_group: u32,
        key: &[u8],
        value: Option<String>,
    ) -> Result<QueryAnswer, String> {
        let json = match &value {
            Some(text) => serde_json::from_str(text)
                .map_err(|e| format!("operator `{operator}` answered a value that is not JSON: {e}"))?,
            None => serde_json::Value::Null,
        };
        Ok(QueryAnswer {
            operator: operator.to_string(),
            subtask,
            state: state.to_string(),
            key: String::from_utf8_lossy(key).into_owned(),
            key_group,
            found: value.is_some(),
            value: json,
        })
    }
}

/// Which declared keyed state a query means: `asked`, or the only keyed state when none is
/// named. `declared` is `(name, keyed)` for every state of the operator.
pub fn resolve_state(uid: &str, declared: &[(String, bool)], asked: Option<&str>) -> Result<String, String> {
    let keyed: Vec<&str> = declared.iter().filter(|(_, k)| *k).map(|(n, _)| n.as_str()).collect();
    match asked {
        Some(s) if keyed.contains(&s) => Ok(s.to_string()),
        Some(s) if declared.iter().any(|(n, _)| n == s) => {
            Err(format!("state `{s}` of operator `{uid}` is not keyed; only keyed state can be queried by key"))
        }
        Some(s) => Err(format!("operator `{uid}` declares no state `{s}` (its keyed states: [{}])", keyed.join(", "))),
        None => match keyed.as_slice() {
            [one] => Ok(one.to_string()),
            [] => Err(format!("operator `{uid}` keeps no keyed state")),
            many => Err(format!(
                "operator `{uid}` keeps several keyed states; name one with state= ([{}])",
                many.join(", ")
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declared() -> Vec<(String, bool)> {
        vec![("count".into(), true), ("seen".into(), true), ("total".into(), false)]
    }

    #[test]
    fn a_state_is_named_or_the_only_keyed_one() {
        assert_eq!(resolve_state("op", &declared(), Some("seen")).unwrap(), "seen");
        assert_eq!(resolve_state("op", &[("count".into(), true)], None).unwrap(), "count");
        let e = resolve_state("op", &declared(), None).unwrap_err();
        assert!(e.contains("several keyed states") && e.contains("count, seen"), "{e}");
        let e = resolve_state("op", &declared(), Some("nope")).unwrap_err();
        assert!(e.contains("declares no state `nope`") && e.contains("[count, seen]"), "{e}");
        assert!(resolve_state("op", &declared(), Some("total")).unwrap_err().contains("not keyed"));
        assert!(resolve_state("op", &[], None).unwrap_err().contains("keeps no keyed state"));
    }

    #[test]
    fn answers_carry_the_value_as_json_and_refuse_what_is_not() {
        let (tx, rx) = crossbeam_channel::bounded(3);
        let q = StateQuery {
            operator: "op".into(),
            subtask: 1,
            state: "count".into(),
            key_group: 7,
            key: b"k".to_vec(),
            reply: tx,
        };
        q.clone().answer(Ok(Some("42".into())));
        let a = rx.recv().unwrap().unwrap();
        assert!(a.found && a.value == serde_json::json!(42) && a.key == "k" && a.subtask == 1);
        q.clone().answer(Ok(None));
        let a = rx.recv().unwrap().unwrap();
        assert!(!a.found && a.value.is_null());
        q.answer(Ok(Some("{not json".into())));
        assert!(rx.recv().unwrap().unwrap_err().contains("not JSON"));
    }
}
