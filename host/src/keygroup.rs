//! Key-group math: which key group a key belongs to, which subtask owns a key group.
//!
//! Invariants (property-tested): every key group in `0..max_parallelism` is owned by
//! exactly one subtask; subtask `i`'s range is contiguous; [`operator_index`] and
//! [`key_group_range`] agree; the hash is stable across runs, platforms and versions
//! (murmur3_x86_32, seed 0), since snapshots store state by key group.

use std::ops::Range;

/// murmur3_x86_32 of `data`.
pub fn murmur3_32(data: &[u8], seed: u32) -> u32 {
    const C1: u32 = 0xcc9e_2d51;
    const C2: u32 = 0x1b87_3593;
    let mut h = seed;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes(c.try_into().unwrap());
        k = k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
        h ^= k;
        h = h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    let tail = chunks.remainder();
    let mut k = 0u32;
    for (i, &b) in tail.iter().enumerate() {
        k |= (b as u32) << (8 * i);
    }
    if !tail.is_empty() {
        k = k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
        h ^= k;
    }
    h ^= data.len() as u32;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

/// The key group of `key`.
#[inline]
pub fn key_group(key: &[u8], max_parallelism: u32) -> u32 {
    murmur3_32(key, 0) % max_parallelism
}

/// The subtask (of `parallelism`) that owns `key_group`.
#[inline]
pub fn operator_index(key_group: u32, max_parallelism: u32, parallelism: u32) -> u32 {
    ((key_group as u64 * parallelism as u64) / max_parallelism as u64) as u32
}

/// [`key_group`] and [`operator_index`] for one `max_parallelism` and `parallelism`, with
/// the two divisions replaced by multiplications by precomputed reciprocals (Lemire's
/// fastmod/fastdiv, exact for every 32-bit operand): what a partitioner runs per record.
#[derive(Clone, Copy, Debug)]
pub struct KeyGroupMath {
    max_parallelism: u32,
    parallelism: u32,
    /// `ceil(2^64 / max_parallelism)`, wrapping to 0 for 1 (where every result is 0).
    reciprocal: u64,
}

impl KeyGroupMath {
    /// The math for `parallelism` subtasks over `max_parallelism` key groups (both >= 1,
    /// `parallelism <= max_parallelism`, as the job loader checks).
    pub fn new(max_parallelism: u32, parallelism: u32) -> Self {
        let max_parallelism = max_parallelism.max(1);
        let reciprocal = (u64::MAX / max_parallelism as u64).wrapping_add(1);
        KeyGroupMath { max_parallelism, parallelism: parallelism.clamp(1, max_parallelism), reciprocal }
    }

    /// `a % max_parallelism`.
    #[inline]
    fn rem(&self, a: u32) -> u32 {
        let low = self.reciprocal.wrapping_mul(a as u64);
        ((low as u128 * self.max_parallelism as u128) >> 64) as u32
    }

    /// `a / max_parallelism`.
    #[inline]
    fn quot(&self, a: u32) -> u32 {
        ((self.reciprocal as u128 * a as u128) >> 64) as u32
    }

    /// [`key_group`] of `key`.
    #[inline]
    pub fn key_group(&self, key: &[u8]) -> u32 {
        self.rem(murmur3_32(key, 0))
    }

    /// [`operator_index`] of `key_group` (< `max_parallelism`, so the product fits 32 bits).
    #[inline]
    pub fn operator_index(&self, key_group: u32) -> u32 {
        if self.max_parallelism == 1 {
            return 0;
        }
        self.quot(key_group * self.parallelism)
    }
}

/// The key groups owned by `subtask`: `[start, end)`.
pub fn key_group_range(max_parallelism: u32, parallelism: u32, subtask: u32) -> Range<u32> {
    let (m, p, i) = (max_parallelism as u64, parallelism as u64, subtask as u64);
    let start = (i * m).div_ceil(p);
    let end = ((i + 1) * m).div_ceil(p);
    start as u32..end as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn murmur3_matches_reference_vectors() {
        // Reference values of murmur3_x86_32 (Appleby's smhasher).
        assert_eq!(murmur3_32(b"", 0), 0);
        assert_eq!(murmur3_32(b"", 1), 0x514E_28B7);
        assert_eq!(murmur3_32(b"hello", 0), 0x248B_FA47);
        assert_eq!(murmur3_32(b"Hello, world!", 1234), 0xFAF6_CDB3);
        assert_eq!(murmur3_32(b"The quick brown fox jumps over the lazy dog", 0), 0x2E4F_F723);
    }

    proptest! {
        #[test]
        fn key_group_math_equals_the_divisions(max_p in 1u32..=32768, p_seed in any::<u32>(), keys in proptest::collection::vec(any::<u64>(), 64)) {
            let p = 1 + p_seed % max_p;
            let m = KeyGroupMath::new(max_p, p);
            for k in &keys {
                let kg = key_group(&k.to_le_bytes(), max_p);
                prop_assert_eq!(m.key_group(&k.to_le_bytes()), kg);
                prop_assert_eq!(m.operator_index(kg), operator_index(kg, max_p, p));
            }
            for kg in [0, max_p - 1, max_p / 2] {
                prop_assert_eq!(m.operator_index(kg), operator_index(kg, max_p, p));
            }
            for a in [0u32, 1, u32::MAX, u32::MAX - 1, max_p, max_p.wrapping_mul(3)] {
                prop_assert_eq!(m.rem(a), a % max_p);
            }
        }

        #[test]
        fn ranges_partition_all_key_groups(max_p in 1u32..4096, p_seed in any::<u32>()) {
            let p = 1 + p_seed % max_p;
            let mut next = 0;
            for i in 0..p {
                let r = key_group_range(max_p, p, i);
                prop_assert_eq!(r.start, next, "ranges must be contiguous");
                prop_assert!(!r.is_empty(), "each subtask owns at least one key group");
                for kg in r.clone() {
                    prop_assert_eq!(operator_index(kg, max_p, p), i);
                }
                next = r.end;
            }
            prop_assert_eq!(next, max_p);
        }

        #[test]
        fn key_groups_are_in_range_and_balanced(keys in proptest::collection::vec(any::<u64>(), 2000..2001)) {
            let max_p = 16;
            let mut counts = [0u32; 16];
            for k in &keys {
                let kg = key_group(&k.to_le_bytes(), max_p);
                prop_assert!(kg < max_p);
                counts[kg as usize] += 1;
            }
            // 2000 keys over 16 groups: 125 expected; murmur3 keeps every group within 2x.
            prop_assert!(counts.iter().all(|&c| c > 60 && c < 250), "{:?}", counts);
        }
    }
}
