//! [`Bytes`]: a byte string as a state value, encoded in one piece.
//!
//! Invariant: the encoding is exactly that of a `Vec<u8>` under bincode 1.x (u64 length,
//! then the bytes), so switching a state between `Vec<u8>` and `Bytes` needs no migration;
//! only the speed differs (one copy instead of a call per byte).

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A byte string state value (`ValueState<Bytes>`): serialized with one copy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Bytes(pub Vec<u8>);

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

struct BytesVisitor;

impl<'de> Visitor<'de> for BytesVisitor {
    type Value = Bytes;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a byte string")
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Bytes, E> {
        Ok(Bytes(v.to_vec()))
    }

    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Bytes, E> {
        Ok(Bytes(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Bytes, A::Error> {
        let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
        while let Some(b) = seq.next_element()? {
            v.push(b);
        }
        Ok(Bytes(v))
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        d.deserialize_byte_buf(BytesVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_like_a_vec_of_bytes() {
        let v: Vec<u8> = (0..=255).collect();
        let a = bincode::serialize(&Bytes(v.clone())).unwrap();
        assert_eq!(a, bincode::serialize(&v).unwrap());
        assert_eq!(bincode::deserialize::<Bytes>(&a).unwrap(), Bytes(v.clone()));
        assert_eq!(bincode::deserialize::<Vec<u8>>(&a).unwrap(), v);
    }
}
