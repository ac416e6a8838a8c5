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

/// Sorted runs in flight to the loading thread.
const RUNS_IN_FLIGHT: usize = 4;

/// Entries of one run: (store key, value), keys ascending and unique.
pub type Run = Vec<(Vec<u8>, Vec<u8>)>;

/// A bulk load in progress.
pub struct BulkLoad {
    tx: Option<SyncSender<Run>>,
    thread: Option<JoinHandle<Result<(), String>>>,
    last: Option<Vec<u8>>,
}

impl BulkLoad {
    /// Starts loading into `data`, which must be empty (no write ever).
    pub fn start(data: PartitionHandle) -> std::io::Result<BulkLoad> {
        let (tx, rx): (SyncSender<Run>, Receiver<Run>) = sync_channel(RUNS_IN_FLIGHT);
        let thread = std::thread::Builder::new()
            .name("weir-bulk-load".into())
            .spawn(move || data.ingest(rx.into_iter().flatten()).map_err(|e| e.to_string()))?;
        Ok(BulkLoad { tx: Some(tx), thread: Some(thread), last: None })
    }

    /// Whether `run` (sorted, unique keys) can follow what was handed over so far.
    pub fn follows(&self, run: &Run) -> bool {
        match (&self.last, run.first()) {
            (Some(last), Some((first, _))) => first > last,
            _ => true,
        }
    }

    /// Hands `run` over; it must [`follow`](Self::follows). An error is the load's: it
    /// stopped.
    pub fn push(&mut self, run: Run) -> Result<(), String> {
        debug_assert!(self.follows(&run));
        let Some(last) = run.last().map(|(k, _)| k.clone()) else { return Ok(()) };
        let sent = self.tx.as_ref().map(|tx| tx.send(run));
        if !matches!(sent, Some(Ok(()))) {
            return Err(self.finish().err().unwrap_or_else(|| "the bulk load stopped".into()));
        }
        self.last = Some(last);
        Ok(())
    }

    /// Waits until every run handed over is in the store.
    pub fn finish(&mut self) -> Result<(), String> {
        drop(self.tx.take());
        match self.thread.take().map(JoinHandle::join) {
            None | Some(Ok(Ok(()))) => Ok(()),
            Some(Ok(Err(e))) => Err(e),
            Some(Err(_)) => Err("the bulk load's thread panicked".into()),
        }
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
    fn a_run_is_sorted_and_keeps_the_last_of_equal_keys() {
        let e = |k: &[u8], v: &[u8]| (k.to_vec(), v.to_vec());
        let run = sorted_run(vec![e(b"b", b"1"), e(b"a", b"2"), e(b"b", b"3"), e(b"c", b"4"), e(b"a", b"5")]);
        assert_eq!(run, vec![e(b"a", b"5"), e(b"b", b"3"), e(b"c", b"4")]);
    }
}
