//! Which keys the guest's cache holds (the disk backend), and which to evict.
//!
//! The host knows the keys of a batch before the guest sees it: every key a call touches is
//! resident once the call starts (paged in if it was not). The cache's size is a byte
//! budget; a key's size is estimated from what pages in and out carry (an average over
//! recent pages), since values grow inside the guest where the host cannot see them.
//!
//! Invariants: a key is resident from its first use until it is evicted; eviction takes the
//! least recently used quarter (whole calls' keys: the keys of the call in progress are the
//! newest, never evicted by it); the estimate never falls below the key's own bytes plus
//! the guest's per-entry overhead.

use rustc_hash::FxHashMap;

/// What a cached entry costs the guest beyond its key and value bytes (hash-table slot,
/// boxed key, allocator headers), per declared keyed state.
pub const ENTRY_OVERHEAD: usize = 64;

/// The resident set of one subtask's guest cache.
#[derive(Debug)]
pub struct Residency {
    /// Key group (LE) ‖ key → the tick of its last use.
    keys: FxHashMap<Box<[u8]>, u64>,
    tick: u64,
    budget: usize,
    /// Declared keyed states: a key holds up to one entry in each.
    states: usize,
    /// Average bytes per resident key's values, from pages (starts at 64).
    value_bytes: f64,
    key_bytes: usize,
}

/// A key the guest holds: its key group and key.
pub type ResidentKey = (u32, Box<[u8]>);

impl Residency {
    /// An empty cache of `budget` bytes for an operator with `states` keyed states.
    pub fn new(budget: usize, states: usize) -> Residency {
        Residency {
            keys: FxHashMap::default(),
            tick: 0,
            budget,
            states: states.max(1),
            value_bytes: 64.0,
            key_bytes: 0,
        }
    }

    /// A new call begins: its keys are the newest.
    pub fn next_call(&mut self) {
        self.tick += 1;
    }

    /// Marks `key` of `group` used by the current call; whether it was resident before.
    #[inline]
    pub fn touch(&mut self, group: u32, key: &[u8]) -> bool {
        let mut k = Vec::with_capacity(4 + key.len());
        k.extend_from_slice(&group.to_le_bytes());
        k.extend_from_slice(key);
        match self.keys.get_mut(&k[..]) {
            Some(t) => {
                *t = self.tick;
                true
            }
            None => {
                self.key_bytes += key.len();
                self.keys.insert(k.into_boxed_slice(), self.tick);
                false
            }
        }
    }

    /// Pages carried `entries` entries of `bytes` value bytes: the estimate becomes their
    /// average (a large page) or moves toward it.
    pub fn observe(&mut self, entries: usize, bytes: usize) {
        if entries > 0 {
            let avg = bytes as f64 / entries as f64;
            // A large page is a good sample on its own; small ones move the average.
            self.value_bytes = if entries >= 64 { avg } else { 0.75 * self.value_bytes + 0.25 * avg };
        }
    }

    /// Estimated bytes the cache holds (a key counted with an entry in every keyed state:
    /// an overestimate when it has fewer).
    pub fn estimated_bytes(&self) -> usize {
        let per_key = self.states * (self.value_bytes as usize + ENTRY_OVERHEAD);
        self.key_bytes * self.states + self.keys.len() * per_key
    }

    /// Drops `key` of `group` (its page-in failed: it is not in the guest).
    pub fn forget(&mut self, group: u32, key: &[u8]) {
        let mut k = Vec::with_capacity(4 + key.len());
        k.extend_from_slice(&group.to_le_bytes());
        k.extend_from_slice(key);
        if self.keys.remove(&k[..]).is_some() {
            self.key_bytes -= key.len();
        }
    }

    /// Resident keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Holds no key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Over its budget: time to evict.
    pub fn over_budget(&self) -> bool {
        self.estimated_bytes() > self.budget
    }

    /// Removes and returns the least recently used quarter of the keys (at least one), never
    /// one used by the current call.
    pub fn evict_coldest(&mut self) -> Vec<ResidentKey> {
        let mut ticks: Vec<u64> = self.keys.values().copied().filter(|&t| t < self.tick).collect();
        if ticks.is_empty() {
            return Vec::new();
        }
        let want = (self.keys.len() / 4).clamp(1, ticks.len());
        let (_, &mut cut, _) = ticks.select_nth_unstable(want - 1);
        let mut out = Vec::with_capacity(want);
        self.keys.retain(|k, &mut t| {
            if t <= cut && out.len() < want {
                out.push((u32::from_le_bytes(k[..4].try_into().expect("4 bytes")), k[4..].into()));
                false
            } else {
                true
            }
        });
        self.key_bytes -= out.iter().map(|(_, k): &ResidentKey| k.len()).sum::<usize>();
        out
    }

    /// Forgets every key (the guest dropped them all).
    pub fn clear(&mut self) {
        self.keys.clear();
        self.key_bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used_quarter_never_the_current_call() {
        let mut r = Residency::new(1, 1);
        for i in 0..8u32 {
            r.next_call();
            assert!(!r.touch(i % 2, &i.to_le_bytes()));
        }
        r.next_call();
        assert!(r.touch(0, &0u32.to_le_bytes()), "key 0 is resident and now the newest");
        let mut out = r.evict_coldest();
        out.sort();
        assert_eq!(out, vec![(0, 2u32.to_le_bytes().into()), (1, 1u32.to_le_bytes().into())]);
        assert_eq!(r.len(), 6);
        assert!(!r.touch(1, &1u32.to_le_bytes()), "evicted keys page in again");
        // Only keys of the current call left: nothing to evict.
        let mut only = Residency::new(1, 1);
        only.next_call();
        only.touch(0, b"a");
        assert!(only.evict_coldest().is_empty());
    }

    #[test]
    fn the_budget_follows_what_pages_carry() {
        let mut r = Residency::new(10_000, 1);
        r.next_call();
        for i in 0..50u32 {
            r.touch(0, &i.to_le_bytes());
        }
        assert!(!r.over_budget(), "{} bytes", r.estimated_bytes());
        for _ in 0..20 {
            r.observe(10, 10_000);
        }
        assert!(r.over_budget(), "values of ~1000 bytes: {} bytes", r.estimated_bytes());
        r.forget(0, &0u32.to_le_bytes());
        assert_eq!(r.len(), 49);
        r.clear();
        assert!(r.is_empty() && r.estimated_bytes() == 0);
    }
}
