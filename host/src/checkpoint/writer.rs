//! The asynchronous half of a snapshot: serialize, write, fsync, then ack to the
//! coordinator. Subtasks hand their captured state over and go back to processing, so
//! writing never stalls the stream.
//!
//! Invariants: an ack is sent only after the state file is durable; a file that builds on
//! one whose write failed is declined, never acked (jobs are written in order, one thread).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};

use crate::checkpoint::control::{Ack, Event, WriteJob};
use crate::checkpoint::storage::CheckpointStore;

/// Runs the writer until every sender is dropped.
pub fn run(store: CheckpointStore, jobs: Receiver<WriteJob>, events: Sender<Event>) {
    // (task, checkpoint) whose file was not written: nothing may build on it.
    let mut lost: HashSet<(usize, u64)> = HashSet::new();
    for job in jobs {
        let started = Instant::now();
        if let Some(l) = job.chain.iter().find(|l| lost.contains(&(job.task, l.checkpoint))) {
            lost.insert((job.task, job.id.0));
            job.base_lost.store(true, Ordering::Relaxed);
            let reason = format!(
                "{} builds on the state file of checkpoint {}, which was not written; the next checkpoint is full",
                job.file, l.checkpoint
            );
            if events.send(Event::Decline { task: job.task, id: job.id, reason }).is_err() {
                return;
            }
            continue;
        }
        let event = match store.write_state(job.id, &job.file, &job.state) {
            Ok((bytes, crc32)) => {
                let mut timing = job.timing;
                timing.async_ms = started.elapsed().as_secs_f64() * 1e3;
                let logged_records = job.state.backedge_log.iter().map(|b| b.records as u64).sum();
                let logged_bytes = job.state.backedge_log.iter().map(|b| b.bytes.len() as u64).sum();
                Event::Ack {
                    task: job.task,
                    id: job.id,
                    ack: Ack { file: job.file, bytes, crc32, timing, chain: job.chain, logged_records, logged_bytes },
                }
            }
            Err(e) => {
                lost.insert((job.task, job.id.0));
                job.base_lost.store(true, Ordering::Relaxed);
                Event::Decline {
                    task: job.task,
                    id: job.id,
                    reason: format!("writing {} failed: {e}", store.chk_dir(job.id).join(&job.file).display()),
                }
            }
        };
        if events.send(event).is_err() {
            return;
        }
    }
}
