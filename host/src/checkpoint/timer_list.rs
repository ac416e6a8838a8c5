//! [`TimerList`]: the timers of one key group in a snapshot, packed into one buffer.
//!
//! A checkpoint copies every timer of a subtask out of its timer queue while records go on.
//! As `Vec<(i64, Vec<u8>)>` that copy costs an allocation and ~64 bytes per timer, more than
//! the queue itself; packed, a timer of an 8-byte key is 20 bytes and a million timers are
//! 12 allocations per key group at most.
//!
//! Invariant: a `TimerList` serializes exactly as the `Vec<(i64, Vec<u8>)>` it replaced (a
//! sequence of (time, key bytes) pairs), so state files written before and after read the
//! same. Deserializing never reserves more than the bytes already read justify.

use std::fmt;

use serde::de::{SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Timers of one key group, (time, key) in the order pushed: `[time i64][key length u32][key]`
/// per timer.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TimerList {
    buf: Vec<u8>,
    len: usize,
}

impl TimerList {
    /// Appends a timer.
    pub fn push(&mut self, time: i64, key: &[u8]) {
        let key_len = u32::try_from(key.len()).expect("timer keys are bounded far below 4 GiB");
        self.buf.extend_from_slice(&time.to_le_bytes());
        self.buf.extend_from_slice(&key_len.to_le_bytes());
        self.buf.extend_from_slice(key);
        self.len += 1;
    }

    /// The timers, in the order pushed.
    pub fn iter(&self) -> Iter<'_> {
        Iter { rest: &self.buf }
    }

    /// Number of timers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No timers.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of the timers' times and keys (what they take in a state file, length fields aside).
    pub fn data_bytes(&self) -> u64 {
        (self.buf.len() - 4 * self.len) as u64
    }
}

impl<K: AsRef<[u8]>> From<Vec<(i64, K)>> for TimerList {
    fn from(timers: Vec<(i64, K)>) -> Self {
        let mut list = TimerList::default();
        for (time, key) in &timers {
            list.push(*time, key.as_ref());
        }
        list
    }
}

impl<'a> IntoIterator for &'a TimerList {
    type Item = (i64, &'a [u8]);
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

/// The timers of a [`TimerList`].
pub struct Iter<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Iter<'a> {
    type Item = (i64, &'a [u8]);
    fn next(&mut self) -> Option<(i64, &'a [u8])> {
        if self.rest.is_empty() {
            return None;
        }
        // Only `push` wrote the buffer: the framing is intact.
        let time = i64::from_le_bytes(self.rest[..8].try_into().expect("8 bytes"));
        let len = u32::from_le_bytes(self.rest[8..12].try_into().expect("4 bytes")) as usize;
        let key = &self.rest[12..12 + len];
        self.rest = &self.rest[12 + len..];
        Some((time, key))
    }
}

impl fmt::Debug for TimerList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for TimerList {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.len))?;
        for timer in self {
            // `&[u8]` serializes as `Vec<u8>` does: a sequence of bytes.
            seq.serialize_element(&timer)?;
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for TimerList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Timers;
        impl<'de> Visitor<'de> for Timers {
            type Value = TimerList;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence of (time, key) timers")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TimerList, A::Error> {
                // No reservation from the claimed length: the buffer grows with what is read.
                let mut list = TimerList::default();
                while let Some((time, key)) = seq.next_element::<(i64, Vec<u8>)>()? {
                    list.push(time, &key);
                }
                Ok(list)
            }
        }
        d.deserialize_seq(Timers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Encoded as the `Vec<(i64, Vec<u8>)>` it replaced, both ways, and iterated back as pushed.
        #[test]
        fn a_timer_list_encodes_as_a_vec_of_pairs(
            timers in proptest::collection::vec((any::<i64>(), proptest::collection::vec(any::<u8>(), 0..40)), 0..50)
        ) {
            let list = TimerList::from(timers.clone());
            prop_assert_eq!(list.len(), timers.len());
            let back: Vec<(i64, Vec<u8>)> = list.iter().map(|(t, k)| (t, k.to_vec())).collect();
            prop_assert_eq!(&back, &timers);
            use bincode::Options as _;
            let opts = || crate::checkpoint::snapshot::bounded(1 << 20);
            let as_vec = opts().serialize(&timers).unwrap();
            prop_assert_eq!(&opts().serialize(&list).unwrap(), &as_vec);
            let decoded: TimerList = crate::checkpoint::snapshot::bounded(1 << 20).deserialize(&as_vec).unwrap();
            prop_assert_eq!(decoded, list);
            let bytes: u64 = timers.iter().map(|(_, k)| k.len() as u64 + 8).sum();
            prop_assert_eq!(TimerList::from(timers).data_bytes(), bytes);
        }
    }

    #[test]
    fn a_length_that_lies_is_an_error_not_an_allocation() {
        use bincode::Options as _;
        // One timer claimed, then a key claiming 2^40 bytes.
        let mut bytes = 1u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(&7i64.to_le_bytes());
        bytes.extend_from_slice(&(1u64 << 40).to_le_bytes());
        let left = bytes.len() as u64;
        assert!(crate::checkpoint::snapshot::bounded(left).deserialize::<TimerList>(&bytes).is_err());
        // A count of 2^60 timers with none behind it.
        let bytes = (1u64 << 60).to_le_bytes();
        assert!(crate::checkpoint::snapshot::bounded(8).deserialize::<TimerList>(&bytes).is_err());
    }
}
