//! Which record an operator failed on, in words a user can act on.
//!
//! The SDKs of every language start the error a failing `process` call returns with
//! `record <i>: ` (the record's 0-based position in the batch; see `wit/operator.wit`). The
//! host holds the batch, so it names the record: key, timestamp, the start of its value, and
//! where it came from (the upstream node and subtask; for a file source, the file and line,
//! which the source gave the record as its timestamp).
//!
//! Invariant: the guest's index is evidence, not truth: an index outside the batch, or a
//! message without the prefix, names no record (the error is reported as the guest wrote it).

use std::path::PathBuf;

use crate::record::{Batch, RecordRef};
use crate::sandbox::guest_text::tame;

/// Where the records of one input channel come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The upstream node's id.
    pub node: String,
    /// The upstream subtask.
    pub subtask: u32,
    /// The file a file source reads (its records' timestamps are line numbers).
    pub file: Option<PathBuf>,
}

/// The record a guest's `process` error names, and the message without the prefix.
pub fn failing_record<'b>(message: &str, batch: &'b Batch) -> Option<(u32, RecordRef<'b>, String)> {
    let rest = message.strip_prefix("record ")?;
    let (n, msg) = rest.split_once(": ")?;
    let n: u32 = n.parse().ok()?;
    let rec = batch.iter().nth(n as usize)?;
    Some((n, rec, msg.to_string()))
}

/// Bytes shown of a key or value.
const SHOWN: usize = 64;

fn show(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(SHOWN)]);
    let more = if bytes.len() > SHOWN { format!("... ({} bytes)", bytes.len()) } else { String::new() };
    format!("`{}`{more}", tame(&text))
}

/// "record 3 of a batch from source `input` subtask 0, input.txt line 5: key `bob`,
/// timestamp 4, value `bob,view`".
pub fn describe(index: u32, rec: &RecordRef<'_>, origin: Option<&Origin>) -> String {
    let from = match origin {
        Some(Origin { node, subtask, file: Some(f) }) => {
            format!(" from source `{node}` subtask {subtask}, {} line {}", f.display(), rec.timestamp.saturating_add(1))
        }
        Some(Origin { node, subtask, file: None }) => format!(" from `{node}` subtask {subtask}"),
        None => String::new(),
    };
    format!(
        "record {index} of a batch{from}: key {}, timestamp {}, value {}",
        show(rec.key),
        rec.timestamp,
        show(rec.value)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch() -> Batch {
        let mut b = Batch::default();
        b.push(7, 0, b"alice", b"alice,login");
        b.push(9, 4, b"bob", b"bob,view");
        b
    }

    #[test]
    fn the_prefix_names_a_record_of_the_batch() {
        let b = batch();
        let (i, rec, msg) = failing_record("record 1: bad input", &b).unwrap();
        assert_eq!((i, rec.key, msg.as_str()), (1, &b"bob"[..], "bad input"));
        let origin = Origin { node: "input".into(), subtask: 0, file: Some("input.txt".into()) };
        assert_eq!(
            describe(i, &rec, Some(&origin)),
            "record 1 of a batch from source `input` subtask 0, input.txt line 5: key `bob`, timestamp 4, value `bob,view`"
        );
        let origin = Origin { node: "tokenize".into(), subtask: 1, file: None };
        assert!(describe(i, &rec, Some(&origin)).contains("from `tokenize` subtask 1: key `bob`"));
    }

    #[test]
    fn a_lying_or_missing_index_names_nothing() {
        let b = batch();
        for m in ["record 2: x", "record -1: x", "record 99999999999: x", "record 1 x", "bad input", "record : x"] {
            assert!(failing_record(m, &b).is_none(), "{m}");
        }
    }

    #[test]
    fn keys_and_values_are_escaped_and_cut() {
        let mut b = Batch::default();
        let long = vec![b'x'; 1000];
        b.push(0, 0, b"a\nforged line", &long);
        let (i, rec, _) = failing_record("record 0: x", &b).unwrap();
        let d = describe(i, &rec, None);
        assert!(!d.contains('\n') && d.contains("(1000 bytes)") && d.len() < 300, "{d}");
    }
}
