//! [`Key`]: the key of an entry of keyed state, compared without a `memcmp` call.
//!
//! A slice comparison compiles to a call of `memcmp`, which in WebAssembly is a byte loop
//! behind a call; state lookups compare keys of a few bytes on every record. Keys up to 16
//! bytes are compared here with at most two overlapping word loads per side.
//!
//! Invariant: [`Key`] and [`KeyRef`] hash exactly as the `[u8]` they hold, so a table keyed
//! by [`Key`] is looked up by [`KeyRef`], and equality is that of the bytes.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};

/// An owned key.
#[derive(Clone, Debug)]
pub(crate) struct Key(pub(crate) Box<[u8]>);

/// A borrowed key: what a table is looked up with.
#[repr(transparent)]
pub(crate) struct KeyRef([u8]);

impl KeyRef {
    /// `bytes` as a key.
    #[inline(always)]
    pub(crate) fn new(bytes: &[u8]) -> &KeyRef {
        // SAFETY: `KeyRef` is `repr(transparent)` over `[u8]`: same layout and pointer
        // metadata, and the lifetime is carried over.
        unsafe { &*(bytes as *const [u8] as *const KeyRef) }
    }
}

impl From<&[u8]> for Key {
    #[inline]
    fn from(bytes: &[u8]) -> Key {
        Key(bytes.into())
    }
}

impl Borrow<KeyRef> for Key {
    #[inline(always)]
    fn borrow(&self) -> &KeyRef {
        KeyRef::new(&self.0)
    }
}

impl std::ops::Deref for Key {
    type Target = [u8];
    #[inline(always)]
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl Hash for Key {
    #[inline(always)]
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.0.hash(h)
    }
}

impl Hash for KeyRef {
    #[inline(always)]
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.0.hash(h)
    }
}

impl PartialEq for KeyRef {
    #[inline(always)]
    fn eq(&self, other: &KeyRef) -> bool {
        bytes_eq(&self.0, &other.0)
    }
}

impl Eq for KeyRef {}

impl PartialEq for Key {
    #[inline(always)]
    fn eq(&self, other: &Key) -> bool {
        bytes_eq(&self.0, &other.0)
    }
}

impl Eq for Key {}

/// `a == b`, without a call for slices up to 16 bytes.
#[inline(always)]
pub(crate) fn bytes_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let word = |s: &[u8], at: usize| u64::from_le_bytes(s[at..at + 8].try_into().unwrap());
    let half = |s: &[u8], at: usize| u32::from_le_bytes(s[at..at + 4].try_into().unwrap());
    match n {
        0 => true,
        1..=3 => a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1],
        4..=7 => half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4),
        8..=16 => word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8),
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equality_is_that_of_the_bytes_for_every_length() {
        let base: Vec<u8> = (1..=40).collect();
        for n in 0..=40 {
            let a = &base[..n];
            assert!(bytes_eq(a, a));
            assert!(!bytes_eq(a, &base[..(n + 1).min(40)]) || n == 40);
            for i in 0..n {
                let mut b = a.to_vec();
                b[i] ^= 0x80;
                assert!(!bytes_eq(a, &b), "length {n}, byte {i} differs");
            }
        }
    }

    #[test]
    fn a_table_keyed_by_key_is_looked_up_by_bytes() {
        let mut t: std::collections::HashMap<Key, u32, crate::hash::FxBuildHasher> = Default::default();
        for i in 0..1000u32 {
            t.insert(Key::from(i.to_string().as_bytes()), i);
        }
        for i in 0..1000u32 {
            assert_eq!(t.get(KeyRef::new(i.to_string().as_bytes())), Some(&i));
        }
        assert_eq!(t.get(KeyRef::new(b"1000")), None);
    }
}
