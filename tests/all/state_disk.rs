//! The disk state backend (`state_backend = "disk"`): keyed state in a store on local disk,
//! the guest's memory a bounded cache of the keys in use. Every job here holds more state
//! than its cache, and each test asserts that keys really were evicted and paged in again
//! (else it would prove nothing about paging).

use std::path::Path;

use weir::checkpoint::storage;
use weir::job;
use weir::runtime::executor::{self, RunOptions, RunSummary};
use weir::sandbox::engine::new_engine;

use crate::exactly_once::{Topology, check_topology, parallel};
use crate::savepoints::{start, wait_records};
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

const KEYS: u64 = 3_000;
const COUNT: u64 = 30_000;

/// Generator → oracle (padded values: ~3 MB of state) → file sinks; `backend` is the oracle's
/// `state_backend` (with a 1 MiB cache on disk).
fn oracle_job(p: u32, backend: &str, rate: u64) -> String {
    let cache = if backend == "disk" { "state_cache_mb = 1\n" } else { "" };
    format!(
        "[job]\nname = \"disk-sp\"\nmax_parallelism = 32\nbatch_size = 64\nchannel_capacity = 4\n\
         [checkpoint]\ninterval_ms = 100\ndir = \"chk\"\nincremental = true\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = {COUNT}\nkeys = {KEYS}\nrate = {rate}\n\
         [[operator]]\nid = \"oracle\"\ncomponent = {}\nparallelism = {p}\n\
         config = {{ keys = \"{KEYS}\", pad = \"1000\" }}\nstate_backend = \"{backend}\"\n{cache}\
         inputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\ntype = \"file\"\npath = \"out\"\nparallelism = {p}\ninputs = [{{ from = \"oracle\" }}]\n\
         [[sink]]\nid = \"violations\"\ntype = \"file\"\npath = \"violations\"\n\
         inputs = [{{ from = \"oracle\", output = \"violations\" }}]\n",
        toml_path(&component("test_oracle"))
    )
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
