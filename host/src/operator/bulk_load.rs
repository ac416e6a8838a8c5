//! A restore into a store that was never written, as one bulk load: runs of entries in
//! ascending key order go to fjall's ingestion (sorted runs written straight into segments)
//! on a thread of their own, instead of through the journal, memtables, flushes and
//! compactions of ordinary writes.
//!
//! Invariants: every key handed over is greater than the one before (a run that is not, the
//! caller writes the ordinary way once the load is finished); the load is finished —
//! every run in the store, or the error — before anything else reads or writes the store;
//! dropped unfinished, it still waits for its thread, so the thread never outlives the store.

use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use fjall::PartitionHandle;

/// Runs in flight to the loading thread, each of at most [`RUN_BYTES`] (about).
const RUNS_IN_FLIGHT: usize = 4;

/// Bytes of a run handed over at once: a key group's entries are sent in slices of this, so
/// what waits for the loading thread is bounded in bytes whatever a group holds.
pub const RUN_BYTES: usize = 4 << 20;

/// Entries of one run: (store key, value), keys ascending and unique.
pub type Run = Vec<(Vec<u8>, Vec<u8>)>;

/// A bulk load in progress.
pub struct BulkLoad {
    tx: Option<SyncSender<Run>>,
    thread: Option<JoinHandle<Result<(), String>>>,
    last: Option<Vec<u8>>,
    /// Why it failed: every later call says so (a failed load never looks finished).
    failed: Option<String>,
}

impl BulkLoad {
    /// Starts loading into `data`, which must be empty (no write ever).
    pub fn start(data: PartitionHandle) -> std::io::Result<BulkLoad> {
        let (tx, rx): (SyncSender<Run>, Receiver<Run>) = sync_channel(RUNS_IN_FLIGHT);
        let thread = std::thread::Builder::new()
            .name("weir-bulk-load".into())
            .spawn(move || data.ingest(rx.into_iter().flatten()).map_err(|e| e.to_string()))?;
        Ok(BulkLoad { tx: Some(tx), thread: Some(thread), last: None, failed: None })
    }

    /// A load that failed for `why` (every call says so).
    pub fn failed(why: String) -> BulkLoad {
        BulkLoad { tx: None, thread: None, last: None, failed: Some(why) }
    }

    /// Whether `run` (sorted, unique keys) can follow what was handed over so far.
    pub fn follows(&self, run: &Run) -> bool {
        match (&self.last, run.first()) {
            (Some(last), Some((first, _))) => first > last,
            _ => true,
        }
    }

    /// Hands `run` over in slices of about [`RUN_BYTES`]; it must
    /// [`follow`](Self::follows). An error is the load's: it stopped.
    pub fn push(&mut self, mut run: Run) -> Result<(), String> {
        debug_assert!(self.follows(&run));
        while !run.is_empty() {
            let mut bytes = 0;
            let take = run
                .iter()
                .take_while(|(k, v)| {
                    bytes += k.len() + v.len();
                    bytes <= RUN_BYTES
                })
                .count()
                .max(1);
            let rest = run.split_off(take);
            let last = run.last().map(|(k, _)| k.clone());
            let sent = self.tx.as_ref().map(|tx| tx.send(run));
            if !matches!(sent, Some(Ok(()))) {
                let why = self.finish().err().unwrap_or_else(|| "the bulk load stopped".into());
                self.failed = Some(why.clone());
                return Err(why);
            }
            (self.last, run) = (last, rest);
        }
        Ok(())
    }

    /// Waits until every run handed over is in the store. Once it failed, it fails again.
    pub fn finish(&mut self) -> Result<(), String> {
        if let Some(why) = &self.failed {
            return Err(why.clone());
        }
        drop(self.tx.take());
        let result = match self.thread.take().map(JoinHandle::join) {
            None | Some(Ok(Ok(()))) => Ok(()),
            Some(Ok(Err(e))) => Err(e),
            Some(Err(_)) => Err("the bulk load's thread panicked".into()),
        };
        self.failed = result.as_ref().err().cloned();
        result
    }
}

impl Drop for BulkLoad {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// `entries` as a run: sorted by key, the last of equal keys kept.
pub fn sorted_run(mut entries: Run) -> Run {
    // Stable: of equal keys, the later one stays later; keep it.
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out: Run = Vec::with_capacity(entries.len());
    for e in entries {
        match out.last_mut() {
            Some(last) if last.0 == e.0 => *last = e,
            _ => out.push(e),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_load_stays_failed() {
        let mut b = BulkLoad::failed("disk full".into());
        assert_eq!(b.finish().unwrap_err(), "disk full");
        assert_eq!(b.push(vec![(vec![1], vec![2])]).unwrap_err(), "disk full");
        assert_eq!(b.finish().unwrap_err(), "disk full");
    }

    #[test]
    fn a_run_is_sorted_and_keeps_the_last_of_equal_keys() {
        let e = |k: &[u8], v: &[u8]| (k.to_vec(), v.to_vec());
        let run = sorted_run(vec![e(b"b", b"1"), e(b"a", b"2"), e(b"b", b"3"), e(b"c", b"4"), e(b"a", b"5")]);
        assert_eq!(run, vec![e(b"a", b"5"), e(b"b", b"3"), e(b"c", b"4")]);
    }
}
