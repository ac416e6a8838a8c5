//! Which source subtask reads which partition.
//!
//! Invariant: the owner is a function of the topic name, the partition number and the
//! parallelism alone, so every subtask computes the same split without talking to the others,
//! each partition has exactly one owner, and after a restore at another parallelism each
//! partition (with its checkpointed offset) lands on exactly one new owner. As in Flink's
//! Kafka source, each topic starts at its own subtask (a hash of its name), so several small
//! topics do not all pile onto subtask 0.

/// The subtask of `parallelism` that reads `partition` of `topic`.
pub fn owner(topic: &str, partition: i32, parallelism: u32) -> u32 {
    let p = u64::from(parallelism.max(1));
    let start = u64::from(crc32fast::hash(topic.as_bytes())) % p;
    ((start + u64::from(partition.max(0) as u32)) % p) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_partition_has_one_owner_and_a_topic_spreads_evenly() {
        for p in 1..=7u32 {
            for topic in ["a", "words", "orders.v2"] {
                let mut load = vec![0u32; p as usize];
                for part in 0..23 {
                    let o = owner(topic, part, p);
                    assert!(o < p);
                    assert_eq!(o, owner(topic, part, p), "deterministic");
                    load[o as usize] += 1;
                }
                let (lo, hi) = (load.iter().min().unwrap(), load.iter().max().unwrap());
                assert!(hi - lo <= 1, "{topic} at p={p}: {load:?}");
            }
        }
    }

    #[test]
    fn topics_start_at_different_subtasks() {
        let starts: std::collections::BTreeSet<u32> = (0..16).map(|i| owner(&format!("topic-{i}"), 0, 4)).collect();
        assert!(starts.len() > 1, "every topic's partition 0 went to one subtask");
    }
}
