//! The leader's knowledge of its own lease, as pure rules: until when it surely leads, and
//! what to do when recording a published checkpoint fails. Time is milliseconds on any
//! monotonic clock; `ha.rs` (with etcd) and the `cluster_sim_` tests (with a simulated etcd)
//! apply them.
//!
//! Invariants: the lease is counted from when a renewal was *sent*, never from when its answer
//! arrived, so the leader's deadline is never later than etcd's own expiry of the lease (etcd
//! extends it only after receiving the renewal); past the deadline the leader acts no more; a
//! published checkpoint's record is retried until it is stored or the deadline passes, and is
//! never given up while the lease lasts.

/// The deadline after a renewal sent at `sent_at` that etcd answered with `granted_ttl_s`
/// seconds; `None` if etcd says the lease has expired (then stop at once).
pub fn renewed_until(sent_at: u64, granted_ttl_s: i64) -> Option<u64> {
    (granted_ttl_s > 0).then(|| sent_at + granted_ttl_s as u64 * 1000)
}

/// Whether a leader whose lease is valid until `valid_until` may still act at `now`.
pub fn leads(now: u64, valid_until: u64) -> bool {
    now < valid_until
}

/// How recording a published checkpoint went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordResult {
    /// Stored.
    Stored,
    /// The conditional write was refused: another coordinator leads.
    Refused,
    /// etcd did not answer or failed.
    Failed(String),
}

/// What the leader does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordStep {
    /// Go on: announce the checkpoint complete.
    Done,
    /// Try again.
    Retry,
    /// Stop acting at once (exit): the reason.
    Stop(String),
}

/// The step after recording a published checkpoint ended as `r` at `now`.
pub fn after_record(r: RecordResult, now: u64, valid_until: u64) -> RecordStep {
    match r {
        RecordResult::Stored => RecordStep::Done,
        RecordResult::Refused => RecordStep::Stop("etcd refused the write: another coordinator leads".into()),
        RecordResult::Failed(e) if !leads(now, valid_until) => {
            RecordStep::Stop(format!("recording the checkpoint failed until the lease ran out: {e}"))
        }
        RecordResult::Failed(_) => RecordStep::Retry,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_lease_counts_from_the_renewal_sent_and_stops_on_expiry() {
        assert_eq!(renewed_until(1_000, 2), Some(3_000));
        assert_eq!(renewed_until(1_000, 0), None);
        assert!(leads(2_999, 3_000) && !leads(3_000, 3_000));
    }

    #[test]
    fn cluster_lease_a_published_checkpoint_is_retried_until_the_deadline_never_given_up_before() {
        assert_eq!(after_record(RecordResult::Stored, 0, 10), RecordStep::Done);
        assert_eq!(after_record(RecordResult::Failed("timeout".into()), 9, 10), RecordStep::Retry);
        assert!(
            matches!(after_record(RecordResult::Failed("timeout".into()), 10, 10), RecordStep::Stop(w) if w.contains("timeout"))
        );
        assert!(matches!(after_record(RecordResult::Refused, 0, 10), RecordStep::Stop(_)));
    }
}
