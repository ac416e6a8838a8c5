//! The disk state backend (`state_backend = "disk"`): keyed state in a store on local disk,
//! the guest's memory a bounded cache of the keys in use. Every job here holds more state
//! than its cache, and each test asserts that keys really were evicted and paged in again
//! (else it would prove nothing about paging).

use std::path::Path;
use std::time::Duration;

use weir::checkpoint::metadata::Manifest;
use weir::checkpoint::storage;
use weir::ids::CheckpointId;
use weir::job;
use weir::runtime::executor::{self, RestoreFrom, RunOptions, RunSummary};
use weir::sandbox::engine::new_engine;

use crate::exactly_once::{Topology, check_topology, parallel};
use crate::savepoints::{load_factory, start, wait_records};
use crate::support::{committed_lines, component, scratch, toml_path};

/// Keys whose state is removed after every 7th record, values padded to 2 KiB (~4 MB of
/// state over three subtasks, snapshots in many chunks), on the disk backend with a 1 MiB
/// cache per subtask: seeded failures, full or incremental checkpoints.
fn removals(incremental: bool) -> Topology {
    Topology {
        name: if incremental { "disk-rm-inc" } else { "disk-rm" },
        sources: vec![("gen", 2, 30_000, 2_100)],
        incremental,
        oracle_config: ", remove_every = \"7\", pad = \"2048\"",
        disk_cache_mb: Some(1),
        // Chains are folded in the background (restores fold chains that build on folded files).
        max_chain_links: incremental.then_some(3),
        ..parallel()
    }
}

#[test]
fn state_disk_exactly_once_with_removed_keys_and_chunked_snapshots_under_seeded_failures() {
    check_topology(removals(false), 0);
}

#[test]
fn state_disk_exactly_once_with_removed_keys_in_incremental_chains_under_seeded_failures() {
    check_topology(removals(true), 1);
}

/// A disk operator's long chain is folded into one file in the background instead of being
/// restarted by a full snapshot (which scans the whole store: with state far beyond memory it
/// outlasts the checkpoint timeout): at `max_chain_links = 3` by length.
#[test]
fn state_disk_long_chains_are_folded_in_the_background_and_every_checkpoint_is_exact() {
    check_folds(3);
}

/// The same by size: with `max_chain_links = 1000` a chain is folded once its deltas outweigh
/// its base (the keys cycle, so each delta holds as many entries as records since the previous
/// checkpoint, and the deltas pass the base after at most twice the keys' count of records),
/// which the host must weigh by every byte the disk operator hands out.
#[test]
fn state_disk_chains_whose_deltas_outweigh_their_base_are_folded() {
    let all = check_folds(1000);
    let first = all.iter().find_map(|c| c.chain.first().filter(|l| l.file.ends_with(".base"))).unwrap();
    let prefix = all.iter().filter(|c| c.id <= first.checkpoint).count();
    assert!(prefix < 1000, "folded by size, not at 1000 links: {prefix} checkpoints in the folded chain");
}

/// Generator → oracle on the disk backend (1 MiB cache) → blackhole, checkpoints every 30 ms
/// kept; held running until every record was processed and a checkpoint builds on a folded
/// file. Asserts that only the first checkpoint is full and that every one folds to exactly
/// the state its source position implies.
fn check_folds(max_links: u32) -> Vec<crate::exactly_once::Folded> {
    let d = scratch();
    let (keys, count) = (40_000u64, 300_000u64);
    let toml = fold_job(keys, count, max_links);
    // The input's end is held back until a checkpoint after the last record completed and
    // one builds on a folded file: the job keeps checkpointing however slow the machine.
    let mut r = start(d.path(), &toml, None, false);
    wait_records(&r, "oracle", count);
    let store = storage::CheckpointStore::new(&d.path().join("chk"), "fold");
    let seen = store.max_id();
    let on_folded = |l: &storage::Listed| {
        l.status.as_ref().is_ok_and(|m| {
            m.operator("oracle").is_some_and(|o| o.subtasks[0].chain.first().is_some_and(|c| c.file.ends_with(".base")))
        })
    };
    wait_checkpoints(&r, &store, |listed| {
        listed.iter().any(on_folded) && listed.iter().any(|l| l.id > seen + 1 && l.status.is_ok())
    });
    let s = r.join().unwrap();
    assert_eq!(s.attempts, 1);
    assert!(oracle(&s).keys_paged_in > 0, "the state must outgrow the cache");
    let all = crate::exactly_once::fold_every_checkpoint_exactly(&store, keys);
    let fulls: Vec<u64> = all.iter().filter(|c| c.chain.is_empty()).map(|c| c.id).collect();
    assert_eq!(fulls, vec![all[0].id], "only the first checkpoint is a full snapshot");
    assert!(all.iter().any(|c| c.next == count && !c.chain.is_empty()), "a delta after the whole input");
    all
}

/// Waits until the store's checkpoints satisfy `done`, the job running meanwhile.
fn wait_checkpoints(
    r: &crate::savepoints::Running,
    store: &storage::CheckpointStore,
    done: impl Fn(&[storage::Listed]) -> bool,
) {
    let t0 = std::time::Instant::now();
    while !done(&store.list()) {
        assert!(!r.handle.status().state.is_terminal(), "the job ended: {:?}", r.handle.status().state);
        assert!(t0.elapsed() < std::time::Duration::from_secs(300), "the checkpoints waited for did not come");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A disk operator restored whole from its job's own checkpoint goes on with that chain: no
/// checkpoint after the restore is a full scan of its store (the first is a delta on the
/// restored files), and every checkpoint of both runs folds to exactly the state its source
/// position implies.
#[test]
fn state_disk_a_restore_goes_on_with_the_restored_chain_and_every_checkpoint_is_exact() {
    let d = scratch();
    let (keys, count) = (40_000u64, 200_000u64);
    let toml = fold_job(keys, count, 1000);
    let store = storage::CheckpointStore::new(&d.path().join("chk"), "fold");
    // Run 1: cancelled once a checkpoint taken after half the input completed.
    let mut r = start(d.path(), &toml, None, false);
    wait_records(&r, "oracle", count / 2);
    let seen = store.max_id();
    wait_checkpoints(&r, &store, |listed| listed.iter().any(|l| l.id > seen + 1 && l.status.is_ok()));
    r.handle.cancel();
    let _ = r.join();
    let restored = store.list().iter().filter(|l| l.status.is_ok()).map(|l| l.id).max().unwrap();
    // Run 2: from that checkpoint to the end of the input, held until a checkpoint after the
    // restore completed.
    let mut r = start(d.path(), &toml, Some(d.path().join(format!("chk/fold/chk-{restored}"))), false);
    wait_checkpoints(&r, &store, |listed| listed.iter().any(|l| l.id > restored && l.status.is_ok()));
    let s = r.join().unwrap();
    assert_eq!(s.restored_from, Some(restored));
    let all = crate::exactly_once::fold_every_checkpoint_exactly(&store, keys);
    let fulls: Vec<u64> = all.iter().filter(|c| c.chain.is_empty()).map(|c| c.id).collect();
    assert_eq!(fulls, vec![all[0].id], "only the first run's first checkpoint is a full snapshot");
    let first_after = all.iter().find(|c| c.id > restored).expect("a checkpoint after the restore");
    assert!(
        first_after.chain.iter().any(|l| l.checkpoint == restored),
        "checkpoint {} builds on the restored checkpoint {restored}: {:?}",
        first_after.id,
        first_after.chain
    );
    assert_eq!(all.last().unwrap().next, count, "the whole input");
}

/// Generator → oracle on the disk backend (1 MiB cache) → blackhole, checkpoints every 30 ms
/// kept, chains of at most `max_links` files.
fn fold_job(keys: u64, count: u64, max_links: u32) -> String {
    format!(
        "[job]\nname = \"fold\"\nmax_parallelism = 16\nbatch_size = 64\n\
         [checkpoint]\ninterval_ms = 30\ndir = \"chk\"\nretained = 1000\nincremental = true\nmax_chain_links = {max_links}\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = {count}\nkeys = {keys}\nrate = 100000\n\
         [[operator]]\nid = \"oracle\"\ncomponent = {}\nconfig = {{ keys = \"{keys}\" }}\n\
         state_backend = \"disk\"\nstate_cache_mb = 1\ninputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\ntype = \"blackhole\"\ninputs = [{{ from = \"oracle\" }}]\n",
        toml_path(&component("test_oracle"))
    )
}

const KEYS: u64 = 3_000;
const COUNT: u64 = 30_000;

/// Generator → oracle (padded values: ~3 MB of state) → file sinks; `backend` is the oracle's
/// `state_backend` (with a 1 MiB cache on disk).
fn oracle_job(p: u32, backend: &str, rate: u64) -> String {
    oracle_job_with(p, backend, rate, 1000, "")
}

/// [`oracle_job`] with values padded to `pad` bytes and `extra` appended to the oracle's
/// config table.
fn oracle_job_with(p: u32, backend: &str, rate: u64, pad: u32, extra: &str) -> String {
    let cache = if backend == "disk" { "state_cache_mb = 1\n" } else { "" };
    format!(
        "[job]\nname = \"disk-sp\"\nmax_parallelism = 32\nbatch_size = 64\nchannel_capacity = 4\n\
         [checkpoint]\ninterval_ms = 100\ndir = \"chk\"\nincremental = true\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = {COUNT}\nkeys = {KEYS}\nrate = {rate}\n\
         [[operator]]\nid = \"oracle\"\ncomponent = {}\nparallelism = {p}\n\
         config = {{ keys = \"{KEYS}\", pad = \"{pad}\"{extra} }}\nstate_backend = \"{backend}\"\n{cache}\
         inputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\ntype = \"file\"\npath = \"out\"\nparallelism = {p}\ninputs = [{{ from = \"oracle\" }}]\n\
         [[sink]]\nid = \"violations\"\ntype = \"file\"\npath = \"violations\"\n\
         inputs = [{{ from = \"oracle\", output = \"violations\" }}]\n",
        toml_path(&component("test_oracle"))
    )
}

/// The manifest of checkpoint `id` of the oracle job run in `dir` (kept: `retained`).
fn manifest_of(dir: &Path, id: u64) -> Manifest {
    let store = storage::CheckpointStore::new(&dir.join("chk"), "disk-sp");
    storage::load(&store.chk_dir(CheckpointId(id))).unwrap_or_else(|e| panic!("checkpoint {id} is kept: {e}")).manifest
}

fn oracle(s: &RunSummary) -> &executor::NodeSummary {
    s.nodes.iter().find(|n| n.id.to_string() == "oracle").expect("an oracle node")
}

/// Runs `toml` from `restore` until `after` records reached the oracle, then stops it with a
/// savepoint into `sp`; returns the run's summary.
fn run_to_savepoint(dir: &Path, toml: &str, restore: Option<&Path>, after: u64, sp: &Path) -> RunSummary {
    let mut r = start(dir, toml, restore.map(Path::to_path_buf), false);
    wait_records(&r, "oracle", after);
    r.handle.savepoint(Some(sp.to_path_buf()), true, std::time::Duration::from_secs(60)).unwrap();
    r.join().unwrap()
}

/// A savepoint of the memory backend restores into the disk backend at another parallelism,
/// whose savepoint (canonical layout) restores into the memory backend at a third: the
/// output is exactly the uninterrupted run's.
#[test]
fn state_disk_savepoints_move_between_backends_and_parallelisms_with_identical_output() {
    let d = scratch();
    let (sp1, sp2) = (d.path().join("sp1"), d.path().join("sp2"));
    run_to_savepoint(d.path(), &oracle_job(2, "memory", 20_000), None, COUNT / 3, &sp1);
    let on_disk = run_to_savepoint(d.path(), &oracle_job(3, "disk", 20_000), Some(&sp1), COUNT / 3, &sp2);
    let o = oracle(&on_disk);
    assert!(o.keys_evicted > 0 && o.keys_paged_in > 0, "no paging: {} evicted, {} in", o.keys_evicted, o.keys_paged_in);
    let m = storage::load(&sp2).unwrap().manifest;
    assert!(m.operators.iter().flat_map(|o| &o.subtasks).all(|s| s.chain.is_empty()), "savepoints are full");
    let mut r = start(d.path(), &oracle_job(1, "memory", 0), Some(sp2), false);
    r.join().unwrap();
    let v = committed_lines(&d.path().join("violations"));
    assert!(v.is_empty(), "oracle violations: {:?}", &v[..v.len().min(5)]);
    let mut golden: Vec<String> = (0..COUNT).map(|i| format!("{} {}", i % KEYS, i / KEYS)).collect();
    golden.sort();
    let lines = committed_lines(&d.path().join("out"));
    assert_eq!(lines.len(), golden.len());
    assert!(lines == golden, "committed output differs from the uninterrupted run");
}

/// Golden output and no oracle violations in `dir`.
fn assert_exact(dir: &Path) {
    let v = committed_lines(&dir.join("violations"));
    assert!(v.is_empty(), "oracle violations: {:?}", &v[..v.len().min(5)]);
    let mut golden: Vec<String> = (0..COUNT).map(|i| format!("{} {}", i % KEYS, i / KEYS)).collect();
    golden.sort();
    let lines = committed_lines(&dir.join("out"));
    assert_eq!(lines.len(), golden.len());
    assert!(lines == golden, "committed output differs from the uninterrupted run");
}

/// A live upgrade of a disk operator: each subtask's store goes, chunk by chunk, through
/// v2's `restore` (migrating schema 1 to 2) into a new store of its own, and the job goes on
/// with v2 reading its state from there (a key it could not find would be a gap for the
/// oracle). Checkpoints after the upgrade hold v2's state: recovery from the newest runs v2
/// although the job file names v1, and the output is exactly the uninterrupted run's.
#[test]
fn state_disk_live_upgrade_migrates_the_store_chunk_by_chunk_exactly_once() {
    let d = scratch();
    let mut r = start(d.path(), &oracle_job(2, "disk", 5_000), None, false);
    wait_records(&r, "oracle", COUNT / 3);
    let info = r.handle.upgrade("oracle", load_factory("test_oracle_v2"), Duration::from_secs(120)).unwrap();
    assert_eq!((info.to.as_str(), info.migrated_from), ("test-oracle 2.0.0 (schema 2)", Some(1)));
    // Every key's padded value moved: far more than one snapshot chunk per subtask.
    assert!(info.state_bytes > 2_000_000, "moved {} bytes", info.state_bytes);
    wait_records(&r, "oracle", 2 * COUNT / 3);
    r.handle.savepoint(Some(d.path().join("sp")), true, Duration::from_secs(120)).unwrap();
    let s = r.join().unwrap();
    let o = oracle(&s);
    assert!(o.keys_evicted > 0 && o.keys_paged_in > 0, "no paging: {} evicted, {} in", o.keys_evicted, o.keys_paged_in);
    let toml = oracle_job(2, "disk", 0);
    let latest = RunOptions { quiet_guests: true, restore: Some(RestoreFrom::Latest), ..Default::default() };
    let s = run_job(d.path(), &toml, latest).unwrap();
    assert!(s.restored_from.is_some());
    assert_exact(d.path());
}

/// A live upgrade of a disk operator that migrates nothing (same schema, same keyed states)
/// hands the running store over to the new guest: no keyed state moves (the pause does not
/// grow with the store), the new guest pages its keys in from that store, and the output is
/// exactly the uninterrupted run's. The state fits the cache here, so every key was resident
/// in the old guest and must be paged in again by the new one.
#[test]
fn state_disk_live_upgrade_without_migration_hands_the_store_over() {
    let d = scratch();
    let toml = oracle_job_with(2, "disk", 5_000, 16, "")
        .replace("incremental = true\n", "incremental = true\nretained = 1000\n");
    let mut r = start(d.path(), &toml, None, false);
    wait_records(&r, "oracle", COUNT / 3);
    let info = r.handle.upgrade("oracle", load_factory("test_oracle"), Duration::from_secs(120)).unwrap();
    assert_eq!(info.migrated_from, None);
    assert!(info.state_bytes < 64 << 10, "keyed state moved: {} bytes", info.state_bytes);
    let s = r.join().unwrap();
    let o = oracle(&s);
    // Each key is paged in at its first record, and once more after the hand-over.
    assert!(o.keys_paged_in > KEYS, "keys paged in: {}", o.keys_paged_in);
    assert_exact(d.path());
    // Nothing was restored from the upgrade's checkpoint: the store's chain went on through it.
    let m = manifest_of(d.path(), info.checkpoint_id);
    assert!(
        m.operator("oracle").unwrap().subtasks.iter().all(|s| !s.chain.is_empty()),
        "checkpoint {}: full",
        m.checkpoint_id
    );
}

/// A live upgrade forces a full snapshot of the upgraded operator only: the disk operator
/// beside it (whose full snapshot would scan its whole store) stays on its incremental chain
/// in the upgrade's checkpoint, and the output is still exact.
#[test]
fn state_disk_a_live_upgrade_of_another_operator_keeps_the_stores_chain_incremental() {
    let d = scratch();
    let toml = oracle_job_with(1, "disk", 5_000, 16, "")
        .replace("incremental = true\n", "incremental = true\nretained = 1000\n")
        + &format!(
            "[[operator]]\nid = \"count\"\ncomponent = {}\ninputs = [{{ from = \"oracle\", partition = \"hash\" }}]\n\
             [[sink]]\nid = \"counts\"\ntype = \"blackhole\"\ninputs = [{{ from = \"count\" }}]\n",
            toml_path(&component("wordcount_counter"))
        );
    let mut r = start(d.path(), &toml, None, false);
    wait_records(&r, "oracle", COUNT / 3);
    let info = r.handle.upgrade("count", load_factory("wordcount_counter"), Duration::from_secs(120)).unwrap();
    r.join().unwrap();
    assert_exact(d.path());
    let m = manifest_of(d.path(), info.checkpoint_id);
    let oracle = &m.operator("oracle").unwrap().subtasks[0];
    assert!(!oracle.chain.is_empty(), "checkpoint {}: the disk operator's snapshot was full", m.checkpoint_id);
    assert!(m.operator("count").unwrap().subtasks.iter().all(|s| s.chain.is_empty()), "the upgraded one's is full");
}

/// A live upgrade of a disk operator that fails on one subtask (v2 traps while migrating
/// there) rolls back on every subtask: the job goes on with v1 and its own stores, exactly
/// once.
#[test]
fn state_disk_live_upgrade_rolls_back_every_subtask_when_one_traps() {
    let d = scratch();
    let toml = oracle_job_with(2, "disk", 5_000, 1000, ", trap_in_restore = \"1\"");
    let mut r = start(d.path(), &toml, None, false);
    wait_records(&r, "oracle", COUNT / 3);
    let e = r.handle.upgrade("oracle", load_factory("test_oracle_v2"), Duration::from_secs(120)).unwrap_err();
    assert!(e.contains("rolled back; every subtask runs test-oracle 1.0.0 (schema 1) again"), "{e}");
    assert!(e.contains("subtask 1: guest trapped in `restore`"), "{e}");
    assert!(!e.contains("subtask 0:"), "{e}");
    let node = r.handle.status().nodes.into_iter().find(|n| n.uid == "oracle").unwrap();
    assert_eq!(node.component.as_deref(), Some("test-oracle 1.0.0 (schema 1)"));
    r.join().unwrap();
    assert_exact(d.path());
    let store = storage::CheckpointStore::new(&d.path().join("chk"), "disk-sp");
    let c = store.latest(|_| {}).unwrap().manifest.operator("oracle").unwrap().component.clone().unwrap();
    assert_eq!(c.version, "1.0.0");
}

/// Keyed state ten times the guest's memory: 64 MiB of linear memory (a trap past it), about
/// 640 MB of state (320,000 keys of 2 KiB), every key visited twice so the second visit pages
/// its state back in from disk; the oracle checks every key's sequence.
#[test]
fn state_disk_keyed_state_ten_times_memory_completes_with_correct_output() {
    let (keys, count) = (320_000u64, 640_000u64);
    let d = scratch();
    let toml = format!(
        "[job]\nname = \"disk-10x\"\nbatch_size = 256\n[limits]\nmemory_mb = 64\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = {count}\nkeys = {keys}\n\
         [[operator]]\nid = \"oracle\"\ncomponent = {}\nconfig = {{ keys = \"{keys}\", pad = \"2048\" }}\n\
         state_backend = \"disk\"\ninputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\ntype = \"file\"\npath = \"out\"\ninputs = [{{ from = \"oracle\" }}]\n\
         [[sink]]\nid = \"violations\"\ntype = \"file\"\npath = \"violations\"\n\
         inputs = [{{ from = \"oracle\", output = \"violations\" }}]\n",
        toml_path(&component("test_oracle"))
    );
    let path = d.path().join("job.toml");
    std::fs::write(&path, &toml).unwrap();
    let bound = job::bind::bind(&new_engine().unwrap(), job::parse(&path, &toml).unwrap()).unwrap();
    let s = executor::run(&bound, &RunOptions { quiet_guests: true, ..Default::default() }).unwrap();
    let o = oracle(&s);
    assert_eq!(s.attempts, 1, "no restart: the guest stayed within its 64 MiB");
    assert!(o.keys_paged_in >= keys * 9 / 10, "the second visits paged in: {}", o.keys_paged_in);
    let v = committed_lines(&d.path().join("violations"));
    assert!(v.is_empty(), "oracle violations: {:?}", &v[..v.len().min(5)]);
    let lines = committed_lines(&d.path().join("out"));
    assert_eq!(lines.len() as u64, count);
    let mut golden: Vec<String> = (0..count).map(|i| format!("{} {}", i % keys, i / keys)).collect();
    golden.sort();
    assert!(lines == golden, "output differs from the expected sequence");
}

/// `max_snapshot_mb` bounds what a guest hands out, not the disk backend's store (the
/// tenant's disk bounds that): ~4 MB of keyed state checkpoints under a 1 MiB limit on disk,
/// with exact output, while the same job on the memory backend is refused by the limit.
#[test]
fn state_disk_keyed_state_beyond_max_snapshot_mb_checkpoints_on_disk_only() {
    let (keys, count) = (2_000u64, 20_000u64);
    let toml = big_state_job("disk-snap", keys, count, 1)
        .replace("[checkpoint]", "[limits]\nmax_snapshot_mb = 1\n[checkpoint]");
    let d = scratch();
    let s = run_job(d.path(), &toml, RunOptions::default()).unwrap();
    assert_eq!(s.attempts, 1, "no restart");
    assert!(s.checkpoints >= 1, "the final checkpoint holds every key");
    let mut golden: Vec<String> = (0..count).map(|i| format!("{} {}", i % keys, i / keys)).collect();
    golden.sort();
    assert!(committed_lines(&d.path().join("out")) == golden, "output differs from the expected sequence");
    let memory = toml.replace("state_backend = \"disk\"\nstate_cache_mb = 1\n", "");
    assert_ne!(memory, toml);
    let d = scratch();
    let e = run_job(d.path(), &memory, RunOptions::default()).unwrap_err();
    assert!(e.contains("exceeded its snapshot size limit"), "{e}");
}

/// A disk-backed oracle job (padded values, many keys) writing checkpoints to `chk`.
fn big_state_job(name: &str, keys: u64, count: u64, attempts: u32) -> String {
    format!(
        "[job]\nname = \"{name}\"\nmax_parallelism = 8\nbatch_size = 64\n\
         [checkpoint]\ninterval_ms = 20\ndir = \"chk\"\n\
         [restart]\nstrategy = \"fixed-delay\"\nattempts = {attempts}\ndelay_ms = 5\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = {count}\nkeys = {keys}\n\
         [[operator]]\nid = \"oracle\"\ncomponent = {}\nconfig = {{ keys = \"{keys}\", pad = \"2048\" }}\n\
         state_backend = \"disk\"\nstate_cache_mb = 1\ninputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\ntype = \"file\"\npath = \"out\"\ninputs = [{{ from = \"oracle\" }}]\n\
         [[sink]]\nid = \"violations\"\ntype = \"file\"\npath = \"violations\"\n\
         inputs = [{{ from = \"oracle\", output = \"violations\" }}]\n",
        toml_path(&component("test_oracle"))
    )
}

fn run_job(dir: &Path, toml: &str, opts: RunOptions) -> Result<RunSummary, String> {
    let path = dir.join("job.toml");
    std::fs::write(&path, toml).unwrap();
    let bound = job::bind::bind(&new_engine().unwrap(), job::parse(&path, toml).unwrap()).unwrap();
    executor::run(&bound, &RunOptions { quiet_guests: true, ..opts }).map_err(|e| e.to_string())
}

/// A tmpfs of `mb` MiB mounted at `dir` (root, as the suite's servers need), unmounted on drop.
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    fn mount(dir: &Path, mb: u64) -> SmallDisk {
        std::fs::create_dir_all(dir).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mb}m"), "tmpfs"])
            .arg(dir)
            .output()
            .expect("running mount");
        assert!(
            out.status.success(),
            "mounting a {mb} MiB tmpfs at {} failed (the test needs root): {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk(dir.to_path_buf())
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The disk backend's store fills its disk (a 12 MiB tmpfs under ~40 MB of state): the job
/// fails naming the store and the cause, after its restarts; what it committed before stays
/// exactly-once (no violation, no line twice, every line expected), and its last complete
/// checkpoint restores on a disk with room into the uninterrupted run's output.
#[test]
fn state_disk_a_full_disk_fails_the_job_not_its_committed_output() {
    let (keys, count) = (20_000u64, 40_000u64);
    let d = scratch();
    let small = SmallDisk::mount(&d.path().join("statefs"), 6);
    // Throttled, so checkpoints complete (and commit output) while the store fills.
    let toml = big_state_job("disk-full", keys, count, 2).replace("keys = 20000\n", "keys = 20000\nrate = 20000\n");
    assert!(toml.contains("rate = 20000"));
    let opts = RunOptions { state_dir: Some(small.0.clone()), ..Default::default() };
    let e = run_job(d.path(), &toml, opts).unwrap_err();
    assert!(e.contains("disk state backend's store at") && e.contains("statefs") && e.contains("disk is full"), "{e}");
    drop(small);
    let v = committed_lines(&d.path().join("violations"));
    assert!(v.is_empty(), "oracle violations: {:?}", &v[..v.len().min(5)]);
    let mut golden: Vec<String> = (0..count).map(|i| format!("{} {}", i % keys, i / keys)).collect();
    golden.sort();
    let before = committed_lines(&d.path().join("out"));
    let mut unique = before.clone();
    unique.dedup();
    assert_eq!(unique.len(), before.len(), "a committed line twice");
    assert!(before.iter().all(|l| golden.binary_search(l).is_ok()), "a committed line not in the input");
    // From the last complete checkpoint (none, if the disk filled before the first: then
    // nothing was committed either, and the job starts over).
    let checkpointed = std::fs::read_dir(d.path().join("chk/disk-full"))
        .is_ok_and(|mut r| r.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("chk-"))));
    assert!(checkpointed || before.is_empty(), "output committed without a checkpoint");
    let restore = checkpointed.then_some(executor::RestoreFrom::Latest);
    run_job(d.path(), &toml, RunOptions { restore, ..Default::default() }).unwrap();
    let lines = committed_lines(&d.path().join("out"));
    assert!(lines == golden, "after the restore: {} lines, {} expected", lines.len(), golden.len());
}

/// A restore of a disk-backed operator from a checkpoint whose state file is corrupt, or
/// missing, fails naming the checkpoint and the file (and runs nothing).
#[test]
fn state_disk_a_corrupt_or_missing_state_file_at_restore_names_the_checkpoint_and_file() {
    let d = scratch();
    let toml = big_state_job("disk-bad", 2_000, 4_000, 1);
    run_job(d.path(), &toml, RunOptions::default()).unwrap();
    let job_dir = d.path().join("chk/disk-bad");
    let mut chks: Vec<_> = std::fs::read_dir(&job_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("chk-"))
        .collect();
    chks.sort_by_key(|p| p.file_name().unwrap().to_string_lossy()[4..].parse::<u64>().unwrap());
    let chk = chks.last().expect("a checkpoint").clone();
    let name = chk.file_name().unwrap().to_string_lossy().into_owned();
    let manifest = storage::load(&chk).unwrap().manifest;
    let entry = &manifest.operators.iter().find(|o| o.uid == "oracle").unwrap().subtasks[0];
    let file = [chk.join(&entry.file), job_dir.join(&entry.file)].into_iter().find(|f| f.exists()).unwrap();
    let file_name = entry.file.clone();
    let mut bytes = std::fs::read(&file).unwrap();
    let mid = (entry.bytes / 2) as usize;
    bytes[mid] ^= 0xff;
    std::fs::write(&file, &bytes).unwrap();
    let restore =
        |p: &Path| RunOptions { restore: Some(executor::RestoreFrom::Path(p.to_path_buf())), ..Default::default() };
    let e = run_job(d.path(), &toml, restore(&chk)).unwrap_err();
    assert!(e.contains(&name) && e.contains(&file_name), "{e}");
    std::fs::remove_file(&file).unwrap();
    let e = run_job(d.path(), &toml, restore(&chk)).unwrap_err();
    assert!(e.contains(&name) && e.contains(&file_name), "{e}");
}
