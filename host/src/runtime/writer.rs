//! The asynchronous half of a snapshot: serialize, write, fsync, then ack to the
//! coordinator. Subtasks hand their captured state over and go back to processing, so
//! writing never stalls the stream. A snapshot drained in chunks is appended to its file
//! chunk by chunk, so neither the host nor the operator holds all of it at once.
//!
//! Invariants: an ack is sent only after the state file is durable (on disk, and in the
//! object store when the checkpoints are mirrored to one); a file that builds on
//! one whose write failed, or one of whose chunks failed, is declined, never acked (messages
//! are handled in order, on one thread).

use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};

use crate::checkpoint::compaction;
use crate::checkpoint::incremental::ChainLink;
use crate::checkpoint::snapshot::StateFileWriter;
use crate::checkpoint::storage::{AtomicFile, CheckpointStore};
use crate::runtime::control::{Ack, Event, WriteMsg};

/// A state file being appended to.
struct Open {
    file: AtomicFile,
    writer: StateFileWriter<File>,
    started: Instant,
}

/// Bytes a snapshot part or state is about to take on disk (its data; headers aside).
fn state_bytes(groups: &[crate::checkpoint::snapshot::KeyGroupSnapshot]) -> u64 {
    groups.iter().map(|g| g.data.len() as u64 + g.event_timers.data_bytes() + g.processing_timers.data_bytes()).sum()
}

/// Runs the writer until every sender is dropped. With `budget` (a tenant's disk quota under
/// `weir serve`), every state file is charged before it is written; one that does not fit is
/// declined naming the quota.
pub fn run(
    store: CheckpointStore,
    jobs: Receiver<WriteMsg>,
    events: Sender<Event>,
    budget: Option<std::sync::Arc<crate::disk_budget::DiskBudget>>,
) {
    let charge = |bytes: u64| budget.as_ref().map_or(Ok(()), |b| b.charge(bytes));
    // (task, checkpoint) whose file was not written: nothing may build on it.
    let mut lost: HashMap<(usize, u64), String> = HashMap::new();
    let mut open: HashMap<(usize, u64), Open> = HashMap::new();
    let mut warned_upload: Option<u64> = None;
    let begin = |id, file: &str| -> std::io::Result<Open> {
        let f = store.begin_state(id, file)?;
        let writer = StateFileWriter::new(f.file.try_clone()?)?;
        Ok(Open { file: f, writer, started: Instant::now() })
    };
    for msg in jobs {
        let job = match msg {
            WriteMsg::Part { task, id, file, groups } => {
                if lost.contains_key(&(task, id.0)) {
                    continue;
                }
                let o = match charge(state_bytes(&groups)).map_err(std::io::Error::other) {
                    Err(e) => Err(e),
                    Ok(()) => match open.remove(&(task, id.0)) {
                        Some(o) => Ok(o),
                        None => begin(id, &file),
                    },
                };
                let r = o.and_then(|mut o| {
                    groups.iter().try_for_each(|g| o.writer.group(g))?;
                    Ok(o)
                });
                match r {
                    Ok(o) => {
                        open.insert((task, id.0), o);
                    }
                    Err(e) => {
                        lost.insert(
                            (task, id.0),
                            format!("writing {} failed: {e}", store.chk_dir(id).join(&file).display()),
                        );
                    }
                }
                continue;
            }
            WriteMsg::Done(job) => job,
            WriteMsg::Compact { task, links, into, reply } => {
                compact_in_background(&store, &lost, task, links, into, reply, budget.clone());
                continue;
            }
            WriteMsg::Abandon { task, id } => {
                // The partial file goes with it (`AtomicFile`'s drop): the aborted
                // checkpoint's directory has no manifest and is never restored from.
                open.remove(&(task, id.0));
                lost.remove(&(task, id.0));
                continue;
            }
        };
        let started = Instant::now();
        let key = (job.task, job.id.0);
        let failed = lost.get(&key).cloned().or_else(|| {
            job.chain.iter().find(|l| lost.contains_key(&(job.task, l.checkpoint))).map(|l| {
                format!(
                    "{} builds on the state file of checkpoint {}, which was not written; the next checkpoint is full",
                    job.file, l.checkpoint
                )
            })
        });
        if let Some(reason) = failed {
            open.remove(&key);
            lost.insert(key, reason.clone());
            job.base_lost.store(true, Ordering::Relaxed);
            if events.send(Event::Decline { task: job.task, id: job.id, reason }).is_err() {
                return;
            }
            continue;
        }
        let size = state_bytes(&job.state.keyed)
            + job.state.operator_state.len() as u64
            + job.state.backedge_log.iter().map(|b| b.bytes.len() as u64).sum::<u64>();
        let written = match charge(size).map_err(std::io::Error::other) {
            Err(e) => {
                open.remove(&key);
                Err(e)
            }
            Ok(()) => match open.remove(&key) {
                // Appended chunk by chunk: count from the first chunk.
                Some(o) => {
                    let t = o.started;
                    o.writer.finish(&job.state).and_then(|r| o.file.commit().map(|_| (r, t)))
                }
                None => store.write_state(job.id, &job.file, &job.state).map(|r| (r, started)),
            },
        };
        // Mirrored to an object store: acked only once uploaded there too. A store that fails
        // is an outage the operator must see (once per checkpoint), not a routine decline.
        let written = written.and_then(|r| {
            store.upload_state(job.id, &job.file).map(|()| r).inspect_err(|e| {
                if warned_upload != Some(job.id.0) {
                    warned_upload = Some(job.id.0);
                    tracing::warn!(checkpoint = job.id.0, "checkpoint {}: {e}; it will not complete", job.id);
                }
            })
        });
        let event = match written {
            Ok(((bytes, crc32), since)) => {
                let mut timing = job.timing;
                timing.async_ms = since.elapsed().as_secs_f64() * 1e3;
                let logged_records = job.state.backedge_log.iter().map(|b| b.records as u64).sum();
                let logged_bytes = job.state.backedge_log.iter().map(|b| b.bytes.len() as u64).sum();
                Event::Ack {
                    task: job.task,
                    id: job.id,
                    ack: Ack { file: job.file, bytes, crc32, timing, chain: job.chain, logged_records, logged_bytes },
                }
            }
            Err(e) => {
                let reason = format!("writing {} failed: {e}", store.chk_dir(job.id).join(&job.file).display());
                lost.insert(key, reason.clone());
                job.base_lost.store(true, Ordering::Relaxed);
                Event::Decline { task: job.task, id: job.id, reason }
            }
        };
        if events.send(event).is_err() {
            return;
        }
    }
}

/// Folds `links` into `into` on a thread of its own (it reads and writes the whole state, which
/// must not hold up the checkpoints behind it), unless a file of the chain was not written or
/// the files are not kept on this disk (a cluster's worker keeps them only in the object store).
fn compact_in_background(
    store: &CheckpointStore,
    lost: &HashMap<(usize, u64), String>,
    task: usize,
    links: Vec<ChainLink>,
    into: ChainLink,
    reply: Sender<Result<u64, String>>,
    budget: Option<std::sync::Arc<crate::disk_budget::DiskBudget>>,
) {
    if let Some(l) = links.iter().find(|l| lost.contains_key(&(task, l.checkpoint))) {
        let _ = reply.send(Err(format!("the state file of checkpoint {} was not written", l.checkpoint)));
        return;
    }
    if !store.keep_local {
        let _ = reply.send(Err("checkpoint files are kept only in the object store here".into()));
        return;
    }
    let store = store.clone();
    let spawned = std::thread::Builder::new().name("weir-compact".into()).spawn(move || {
        let started = Instant::now();
        let charge = |bytes: u64| budget.as_ref().map_or(Ok(()), |b| b.charge(bytes));
        let outcome = compaction::compact(&store, &links, &into, charge).map_err(|e| e.to_string());
        if let Ok(bytes) = &outcome {
            tracing::info!(
                checkpoint = into.checkpoint,
                "folded {} state files into {} ({bytes} bytes of keyed state) in {:.1} s",
                links.len(),
                into.file,
                started.elapsed().as_secs_f64()
            );
        }
        let _ = reply.send(outcome);
    });
    if let Err(e) = spawned {
        tracing::warn!("cannot start a compaction thread: {e}");
    }
}
