//! Exactly-once, proven with an oracle: generator sources emit per-key sequence numbers, a
//! WASM operator (`test-oracle`, or the two-input `test-oracle-join`) keeps the next
//! expected number per key in keyed state and reports every gap or duplicate on a side
//! output, and a seeded failure injector breaks subtasks (guest trap, host panic, failure
//! during an in-flight checkpoint) after N records and M completed checkpoints.
//!
//! Every seeded run must show zero violations, and its committed output and final state
//! must equal the failure-free run's (golden output), at parallelism 1, > 1, and with a
//! two-input operator. A reader lists the committed parts during every seeded run: a part
//! once visible never disappears or changes. CI runs 20 seeds; run 500 with
//! `WEIR_EXACTLY_ONCE_SEEDS=500 cargo test --release exactly_once_`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use weir::checkpoint::storage::CheckpointStore;
use weir::job;
use weir::runtime::executor::{self, RunOptions, RunSummary};
use weir::runtime::faults::{FaultKind, FaultPlan};
use weir::sandbox::engine::new_engine;

use crate::support::{committed_lines, component, scratch, toml_path};

/// A test topology.
pub(crate) struct Topology {
    pub(crate) name: &'static str,
    /// (id, parallelism, count, keys) of each generator source.
    pub(crate) sources: Vec<(&'static str, u32, u64, u64)>,
    pub(crate) oracle_p: u32,
    pub(crate) sink_p: u32,
    /// `[checkpoint] incremental = true`.
    pub(crate) incremental: bool,
    /// More `config` of the one-input oracle (`remove_every`, `pad`).
    pub(crate) oracle_config: &'static str,
    /// Unaligned checkpoints, with the output sink throttled to this many records per second
    /// per subtask (below the sources' rate: the channels stay full).
    pub(crate) unaligned: Option<u64>,
    /// `[checkpoint] alignment_timeout_ms` (instead of `alignment = "unaligned"`).
    pub(crate) alignment_timeout_ms: Option<u64>,
    /// The oracle on `state_backend = "disk"` with a cache of this many MiB.
    pub(crate) disk_cache_mb: Option<u64>,
    /// `[checkpoint] max_chain_links` (with `incremental`).
    pub(crate) max_chain_links: Option<u32>,
}

fn one() -> Topology {
    Topology {
        name: "p1",
        sources: vec![("gen", 1, 24_000, 40)],
        oracle_p: 1,
        sink_p: 1,
        incremental: false,
        oracle_config: "",
        unaligned: None,
        alignment_timeout_ms: None,
        disk_cache_mb: None,
        max_chain_links: None,
    }
}

pub(crate) fn parallel() -> Topology {
    Topology {
        name: "p3",
        sources: vec![("gen", 2, 30_000, 64)],
        oracle_p: 3,
        sink_p: 2,
        incremental: false,
        oracle_config: "",
        unaligned: None,
        alignment_timeout_ms: None,
        disk_cache_mb: None,
        max_chain_links: None,
    }
}

pub(crate) fn two_input() -> Topology {
    Topology {
        name: "join",
        sources: vec![("left", 2, 20_000, 32), ("right", 1, 12_000, 24)],
        oracle_p: 2,
        sink_p: 2,
        incremental: false,
        oracle_config: "",
        unaligned: None,
        alignment_timeout_ms: None,
        disk_cache_mb: None,
        max_chain_links: None,
    }
}

fn job_toml(t: &Topology) -> String {
    let mut s = format!(
        "[job]\nname = \"eo-{}\"\nmax_parallelism = 16\nbatch_size = 64\nchannel_capacity = 4\n\
         [checkpoint]\ninterval_ms = 15\ndir = \"chk\"\nretained = 2\n\
         [restart]\nstrategy = \"fixed-delay\"\nattempts = 10\ndelay_ms = 5\n",
        t.name
    );
    if t.incremental {
        s = s.replace("retained = 2\n", "retained = 2\nincremental = true\n");
    }
    if let Some(n) = t.max_chain_links {
        s = s.replace("retained = 2\n", &format!("retained = 2\nmax_chain_links = {n}\n"));
    }
    if let Some(ms) = t.alignment_timeout_ms {
        s = s.replace("retained = 2\n", &format!("retained = 2\nalignment_timeout_ms = {ms}\n"));
    } else if t.unaligned.is_some() {
        s = s.replace("retained = 2\n", "retained = 2\nalignment = \"unaligned\"\n");
    }
    for (id, p, count, keys) in &t.sources {
        s += &format!(
            "[[source]]\nid = \"{id}\"\ntype = \"generator\"\ncount = {count}\nkeys = {keys}\nparallelism = {p}\nrate = 25000\n"
        );
    }
    let two = t.sources.len() == 2;
    let (comp, config, inputs) = if two {
        (
            component("test_oracle_join"),
            format!("{{ keys_left = \"{}\", keys_right = \"{}\" }}", t.sources[0].3, t.sources[1].3),
            "[{ from = \"left\", partition = \"hash\", side = \"left\" }, { from = \"right\", partition = \"hash\", side = \"right\" }]"
                .to_string(),
        )
    } else {
        (
            component("test_oracle"),
            format!("{{ keys = \"{}\"{} }}", t.sources[0].3, t.oracle_config),
            "[{ from = \"gen\", partition = \"hash\" }]".into(),
        )
    };
    s += &format!(
        "[[operator]]\nid = \"oracle\"\ncomponent = {}\nparallelism = {}\nconfig = {config}\ninputs = {inputs}\n",
        toml_path(&comp),
        t.oracle_p
    );
    if let Some(mb) = t.disk_cache_mb {
        s += &format!("state_backend = \"disk\"\nstate_cache_mb = {mb}\n");
    }
    s += &format!(
        "[[sink]]\nid = \"out\"\ntype = \"file\"\npath = \"out\"\nparallelism = {}\ninputs = [{{ from = \"oracle\", partition = \"rebalance\" }}]\n{}\
         [[sink]]\nid = \"violations\"\ntype = \"file\"\npath = \"violations\"\ninputs = [{{ from = \"oracle\", output = \"violations\" }}]\n",
        t.sink_p,
        t.unaligned.map_or(String::new(), |rate| format!("rate = {rate}\n")),
    );
    s
}

/// What the oracle must see: every (key, seq) of every source exactly once.
fn golden(t: &Topology) -> Vec<String> {
    let two = t.sources.len() == 2;
    let mut v = Vec::new();
    for (n, (_, _, count, keys)) in t.sources.iter().enumerate() {
        let prefix = if !two {
            ""
        } else if n == 0 {
            "L "
        } else {
            "R "
        };
        v.extend((0..*count).map(|i| format!("{prefix}{} {}", i % keys, i / keys)));
    }
    v.sort();
    v
}

/// Decodes the guest's keyed-state blobs (layout in `wit/operator.wit`) into
/// (state, key) → value bytes.
fn decode_state(blob: &[u8], out: &mut BTreeMap<(String, Vec<u8>), Vec<u8>>) {
    let mut pos = 0;
    let u32_at = |pos: &mut usize| {
        let v = u32::from_le_bytes(blob[*pos..*pos + 4].try_into().unwrap()) as usize;
        *pos += 4;
        v
    };
    let states = u32_at(&mut pos);
    for _ in 0..states {
        let n = u32_at(&mut pos);
        let name = String::from_utf8(blob[pos..pos + n].to_vec()).unwrap();
        pos += n;
        let entries = u32_at(&mut pos);
        for _ in 0..entries {
            let k = u32_at(&mut pos);
            let key = blob[pos..pos + k].to_vec();
            pos += k;
            let v = u32_at(&mut pos);
            out.insert((name.clone(), key), blob[pos..pos + v].to_vec());
            pos += v;
        }
    }
    assert_eq!(pos, blob.len(), "trailing bytes in a state blob");
}

struct Outcome {
    lines: Vec<String>,
    violations: Vec<String>,
    state: BTreeMap<(String, Vec<u8>), Vec<u8>>,
    summary: RunSummary,
}

fn run(t: &Topology, dir: &Path, faults: Option<Arc<FaultPlan>>) -> Outcome {
    let toml = job_toml(t);
    let path = dir.join("job.toml");
    std::fs::write(&path, &toml).unwrap();
    let graph = job::parse(&path, &toml).unwrap();
    let bound = job::bind::bind(&new_engine().unwrap(), graph).unwrap();
    let summary = executor::run(&bound, &RunOptions { quiet_guests: true, faults, ..Default::default() })
        .unwrap_or_else(|e| panic!("{}: run failed: {e}", t.name));
    let store = CheckpointStore::new(&dir.join("chk"), &format!("eo-{}", t.name));
    let last = store
        .latest(|e| panic!("unexpected unusable checkpoint: {e}"))
        .expect("a final checkpoint")
        .materialize()
        .unwrap();
    assert!(last.manifest.finished, "the last checkpoint of a finished job is its final one");
    let mut state = BTreeMap::new();
    for ((uid, _), st) in &last.states {
        if uid == "oracle" {
            for kg in &st.keyed {
                decode_state(&kg.data, &mut state);
            }
        }
    }
    Outcome {
        lines: committed_lines(&dir.join("out")),
        violations: committed_lines(&dir.join("violations")),
        state,
        summary,
    }
}

/// Lists the committed parts in `out` until `stop`, as a reader of the output would: a part
/// once visible must stay, with the same content (a sink that committed at the barrier rather
/// than on the checkpoint's completion would show parts that a restore then removes). Returns
/// how many listings it made.
fn watch_committed_parts(out: &Path, stop: &std::sync::atomic::AtomicBool) -> usize {
    let mut seen: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut listings = 0;
    loop {
        // One more listing after the run ended: the final parts.
        let last = stop.load(std::sync::atomic::Ordering::Relaxed);
        let names: Vec<String> = std::fs::read_dir(out)
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        for name in names.iter().filter(|n| n.starts_with("part-")) {
            // A committed part is complete when it gets its name: its content never changes.
            if let Ok(bytes) = std::fs::read(out.join(name)) {
                let before = seen.entry(name.clone()).or_insert_with(|| bytes.clone());
                assert!(*before == bytes, "committed part {name} changed");
            }
        }
        let gone: Vec<&String> = seen.keys().filter(|n| !names.contains(n)).collect();
        assert!(gone.is_empty(), "committed parts disappeared: {gone:?}");
        listings += 1;
        if last {
            return listings;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

fn seeds() -> u64 {
    std::env::var("WEIR_EXACTLY_ONCE_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20)
}

/// Runs topology `t` failure-free, then once per seed `s` with `s % 3 == share`, each with
/// 1-3 seeded failures; checks the oracle, the golden output and the final state.
pub(crate) fn check_topology(t: Topology, share: u64) {
    let base_dir = scratch();
    let base = run(&t, base_dir.path(), None);
    if t.unaligned.is_some() {
        let logged: u64 = base.summary.nodes.iter().map(|n| n.inflight_logged).sum();
        assert!(logged > 0, "no barrier overtook a record: the test exercises nothing unaligned");
    } else if t.alignment_timeout_ms.is_some() {
        let logged: u64 = base.summary.nodes.iter().map(|n| n.inflight_logged).sum();
        assert_eq!(logged, 0, "a checkpoint switched to unaligned before its alignment timeout");
    }
    if t.disk_cache_mb.is_some() {
        let oracle = base.summary.nodes.iter().find(|n| n.id.to_string() == "oracle").unwrap();
        assert!(
            oracle.keys_evicted > 0 && oracle.keys_paged_in > 0,
            "the state must outgrow the disk backend's cache: {} keys evicted, {} paged in",
            oracle.keys_evicted,
            oracle.keys_paged_in
        );
    }
    assert_eq!(base.summary.attempts, 1);
    assert!(base.violations.is_empty(), "{:?}", base.violations);
    assert_eq!(base.lines, golden(&t), "failure-free output");
    assert!(base.summary.checkpoints >= 3, "the run must be long enough for checkpoints: {}", base.summary.checkpoints);
    assert!(!base.state.is_empty());

    let kinds = [FaultKind::GuestTrap, FaultKind::HostPanic, FaultKind::DuringCheckpoint];
    let per_subtask: u64 = t.sources.iter().map(|s| s.2).sum::<u64>() / t.oracle_p as u64;
    for seed in (0..seeds()).filter(|s| s % 3 == share) {
        let failures = 1 + (seed % 3) as u32;
        // Incremental: fail late, after several checkpoints, so restores fold long chains.
        let (max_records, max_checkpoints) =
            if t.incremental { (per_subtask * 2 / 3, 8) } else { (per_subtask / 5, 1) };
        let plan = Arc::new(FaultPlan::seeded(
            seed,
            failures,
            &[("oracle", t.oracle_p)],
            max_records,
            max_checkpoints,
            &kinds,
        ));
        let dir = scratch();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watcher = {
            let (out, stop) = (dir.path().join("out"), stop.clone());
            std::thread::spawn(move || watch_committed_parts(&out, &stop))
        };
        let got = run(&t, dir.path(), Some(plan.clone()));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let ctx = format!("topology {} seed {seed}, faults {:?}", t.name, plan.faults());
        let listings = watcher.join().unwrap_or_else(|_| panic!("a committed part was retracted ({ctx})"));
        assert!(listings > 0, "the committed parts were never listed ({ctx})");
        assert_eq!(got.summary.attempts, failures + 1, "every planned failure must fire: {ctx}");
        assert!(
            got.violations.is_empty(),
            "oracle violations: {:?} ({ctx})",
            &got.violations[..got.violations.len().min(5)]
        );
        assert!(got.lines == base.lines, "committed output differs from the failure-free run ({ctx})");
        assert!(got.state == base.state, "final state differs from the failure-free run ({ctx})");
    }
}

#[test]
fn exactly_once_with_incremental_checkpoints_under_seeded_failures() {
    // Restores fold a chain of delta files; the oracle sees every gap or duplicate.
    let t = Topology { name: "inc", sources: vec![("gen", 2, 30_000, 2_000)], incremental: true, ..parallel() };
    check_topology(t, 1);
}

/// Keys whose state is removed after every 7th record (tombstones in the checkpoints; keys
/// with 14 records end removed, keys with 15 end present), each value padded to 2 KiB so every
/// snapshot is handed out in many chunks: seeded failures, full checkpoints.
fn removals(incremental: bool) -> Topology {
    Topology {
        name: if incremental { "rm-inc" } else { "rm" },
        sources: vec![("gen", 2, 30_000, 2_100)],
        incremental,
        oracle_config: ", remove_every = \"7\", pad = \"2048\"",
        ..parallel()
    }
}

/// The oracle of `removals` catches lost and replayed removals: its final state holds exactly
/// the keys whose last block is open, and its snapshots came in many chunks.
fn check_removals(incremental: bool) {
    let t = removals(incremental);
    let base = run(&t, scratch().path(), None);
    let present: Vec<u64> = (0..2_100u64).filter(|k| (30_000 - k).div_ceil(2_100) % 7 != 0).collect();
    let keys: Vec<Vec<u8>> = base.state.keys().map(|(_, k)| k.clone()).collect();
    let want: Vec<Vec<u8>> = {
        let mut v: Vec<Vec<u8>> = present.iter().map(|k| k.to_string().into_bytes()).collect();
        v.sort();
        v
    };
    assert!(keys == want, "final state: {} keys, {} expected (removed keys must stay removed)", keys.len(), want.len());
    let oracle = base.summary.nodes.iter().find(|n| n.id.to_string() == "oracle").unwrap();
    assert!(oracle.snapshot_chunks_max >= 3, "snapshots in many chunks: at most {}", oracle.snapshot_chunks_max);
    check_topology(t, 0);
}

#[test]
fn exactly_once_with_removed_keys_and_chunked_snapshots_under_seeded_failures() {
    check_removals(false);
}

#[test]
fn exactly_once_with_removed_keys_in_incremental_chains_under_seeded_failures() {
    check_removals(true);
}

/// Every incremental checkpoint, folded, is exactly the state the source position implies,
/// and in steady state it writes a fraction of a full one.
#[test]
fn exactly_once_incremental_checkpoints_fold_to_the_exact_state_and_write_only_changes() {
    check_exact_incremental(60_000, 12_000, 40_000, None);
}

/// The same with state large enough (~2.8 MB) that the operator hands every snapshot out in
/// chunks while records keep changing it (copy-on-write): any record of after the barrier
/// showing in a checkpoint breaks the equality.
#[test]
fn exactly_once_chunked_copy_on_write_snapshots_fold_to_the_exact_state() {
    check_exact_incremental(600_000, 120_000, 200_000, None);
}

/// Incremental checkpoints of chunked copy-on-write snapshots, five of them aborted in the
/// middle of their drain (declined there, the abort awaited: no clock decides): each later
/// checkpoint still folds to exactly the state at its source position.
#[test]
fn exactly_once_incremental_snapshots_abandoned_mid_drain_still_fold_to_the_exact_state() {
    use weir::runtime::faults::Fault;
    let faults = (1..6)
        .map(|k| Fault {
            attempt: 0,
            node: "oracle".into(),
            subtask: 0,
            after_records: 50_000 * k,
            after_checkpoints: 2 * k,
            kind: FaultKind::DeclineWhileDraining,
        })
        .collect();
    let plan = Arc::new(FaultPlan::new(faults));
    let summary = check_exact_incremental(600_000, 120_000, 200_000, Some(plan.clone()));
    assert!(plan.unfired(0).is_empty(), "every fault fired: {:?}", plan.unfired(0));
    let oracle = summary.nodes.iter().find(|n| n.id.to_string() == "oracle").unwrap();
    assert_eq!(oracle.snapshots_abandoned, 5, "each aborted checkpoint's drain was abandoned");
}

fn check_exact_incremental(count: u64, keys: u64, rate: u64, faults: Option<Arc<FaultPlan>>) -> executor::RunSummary {
    let dir = scratch();
    let toml = format!(
        "[job]\nname = \"inc\"\nmax_parallelism = 16\nbatch_size = 64\n\
         [checkpoint]\ninterval_ms = 50\ndir = \"chk\"\nretained = 1000\nincremental = true\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = {count}\nkeys = {keys}\nrate = {rate}\n\
         [[operator]]\nid = \"oracle\"\ncomponent = {}\nconfig = {{ keys = \"{keys}\" }}\ninputs = [{{ from = \"gen\", partition = \"hash\" }}]\n\
         [[sink]]\nid = \"out\"\ntype = \"blackhole\"\ninputs = [{{ from = \"oracle\" }}]\n",
        toml_path(&component("test_oracle"))
    );
    let path = dir.path().join("job.toml");
    std::fs::write(&path, &toml).unwrap();
    let bound = job::bind::bind(&new_engine().unwrap(), job::parse(&path, &toml).unwrap()).unwrap();
    let s = executor::run(&bound, &RunOptions { quiet_guests: true, faults, ..Default::default() }).unwrap();
    let store = CheckpointStore::new(&dir.path().join("chk"), "inc");
    let (mut full, mut deltas, mut steady, mut chained) = (0u64, 0, Vec::new(), None);
    for c in fold_every_checkpoint_exactly(&store, keys) {
        if c.chain.is_empty() {
            full = full.max(c.bytes);
        } else {
            deltas += 1;
            chained = Some(c.path.clone());
            if c.next >= keys && !c.finished {
                steady.push(c.bytes);
            }
        }
    }
    assert!(deltas >= 5, "the run must take incremental checkpoints: {deltas}");
    // `weir checkpoints inspect` shows (and verifies) what an incremental checkpoint builds on.
    let out = crate::support::weir().args(["checkpoints", "inspect"]).arg(chained.unwrap()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("incremental, builds on chk-"), "{text}");
    steady.sort();
    let median = steady[steady.len() / 2];
    // 50 ms at `rate` changes a sixth of the keys at most.
    assert!(median * 3 < full, "an incremental checkpoint writes {median} bytes, a full one {full}");
    s
}

/// What one checkpoint of the single oracle subtask holds (see [`fold_every_checkpoint_exactly`]).
pub(crate) struct Folded {
    pub(crate) id: u64,
    pub(crate) path: std::path::PathBuf,
    /// The files its keyed state builds on (empty: a full snapshot).
    pub(crate) chain: Vec<weir::checkpoint::incremental::ChainLink>,
    /// Bytes of its own state file.
    pub(crate) bytes: u64,
    /// The generator's position.
    pub(crate) next: u64,
    /// Taken after the input ended.
    pub(crate) finished: bool,
}

/// Loads every checkpoint of a generator → oracle (`keys` keys, parallelism 1) job, folding
/// its chain, and asserts that its state is exactly the one its source position implies.
pub(crate) fn fold_every_checkpoint_exactly(store: &CheckpointStore, keys: u64) -> Vec<Folded> {
    let mut all = Vec::new();
    for l in store.list().into_iter().filter(|l| l.status.is_ok()) {
        let c = weir::checkpoint::storage::load(&l.path)
            .and_then(|c| c.materialize())
            .unwrap_or_else(|e| panic!("checkpoint {}: {e}", l.id));
        let Some(weir::checkpoint::snapshot::SourcePosition::Generator { next }) =
            c.states[&("gen".to_string(), 0)].source
        else {
            panic!("no generator position")
        };
        let mut state = BTreeMap::new();
        for kg in &c.states[&("oracle".to_string(), 0)].keyed {
            decode_state(&kg.data, &mut state);
        }
        let expected: BTreeMap<(String, Vec<u8>), Vec<u8>> = (0..keys.min(next))
            .map(|k| {
                let n = next / keys + u64::from(k < next % keys);
                (("next".to_string(), k.to_string().into_bytes()), n.to_le_bytes().to_vec())
            })
            .collect();
        assert!(state == expected, "checkpoint {}: folded state differs from the state at position {next}", l.id);
        let entry = &c.manifest.operator("oracle").unwrap().subtasks[0];
        all.push(Folded {
            id: l.id,
            path: l.path.clone(),
            chain: entry.chain.clone(),
            bytes: entry.bytes,
            next,
            finished: c.manifest.finished,
        });
    }
    all
}

#[test]
fn exactly_once_at_parallelism_one_under_seeded_failures() {
    check_topology(one(), 0);
}

#[test]
fn exactly_once_at_parallelism_three_under_seeded_failures() {
    check_topology(parallel(), 1);
}

#[test]
fn exactly_once_with_a_two_input_operator_under_seeded_failures() {
    check_topology(two_input(), 2);
}

#[test]
fn exactly_once_job_fails_with_the_cause_after_its_restart_attempts() {
    let t = one();
    let dir = scratch();
    let toml = job_toml(&t).replace("attempts = 10", "attempts = 2");
    let path = dir.path().join("job.toml");
    std::fs::write(&path, &toml).unwrap();
    let bound = job::bind::bind(&new_engine().unwrap(), job::parse(&path, &toml).unwrap()).unwrap();
    // A trap in every attempt: the job gives up after 1 + 2 attempts and names the cause.
    let faults: Vec<_> = (0..3)
        .map(|attempt| weir::runtime::faults::Fault {
            attempt,
            node: "oracle".into(),
            subtask: 0,
            after_records: 10,
            after_checkpoints: 0,
            kind: FaultKind::GuestTrap,
        })
        .collect();
    let opts = RunOptions { quiet_guests: true, faults: Some(Arc::new(FaultPlan::new(faults))), ..Default::default() };
    let e = executor::run(&bound, &opts).unwrap_err().to_string();
    assert!(e.contains("failed after 3 attempt(s)") && e.contains("oracle#0") && e.contains("injected trap"), "{e}");
}

/// An aborted checkpoint stops pulling its snapshot from the guest at once: the abort lands in
/// the middle of a chunked drain (the subtask declines there and waits for it, so no clock
/// decides), the drain is abandoned, the next snapshot is full, and a restore after a later
/// failure gives exactly the failure-free output and state.
#[test]
fn exactly_once_a_checkpoint_aborted_mid_drain_abandons_it_and_later_restores_are_exact() {
    use weir::runtime::faults::Fault;
    let t = Topology {
        name: "abandon",
        sources: vec![("gen", 1, 60_000, 20_000)],
        oracle_p: 1,
        sink_p: 1,
        incremental: true,
        oracle_config: "",
        unaligned: None,
        alignment_timeout_ms: None,
        disk_cache_mb: None,
        max_chain_links: None,
    };
    let base_dir = scratch();
    let base = run(&t, base_dir.path(), None);
    let fault = |after_records, after_checkpoints, kind| Fault {
        attempt: 0,
        node: "oracle".into(),
        subtask: 0,
        after_records,
        after_checkpoints,
        kind,
    };
    // Alone (one attempt, so its counters are this run's), then followed by a failure whose
    // restore folds the checkpoints taken after the abandoned one.
    for with_failure in [false, true] {
        let mut faults = vec![fault(20_000, 1, FaultKind::DeclineWhileDraining)];
        if with_failure {
            faults.push(fault(40_000, 3, FaultKind::HostPanic));
        }
        let plan = Arc::new(FaultPlan::new(faults));
        let dir = scratch();
        let got = run(&t, dir.path(), Some(plan.clone()));
        assert!(plan.unfired(0).is_empty(), "every fault fired: {:?}", plan.unfired(0));
        assert_eq!(got.summary.attempts, if with_failure { 2 } else { 1 });
        if !with_failure {
            let oracle = got.summary.nodes.iter().find(|n| n.id.to_string() == "oracle").unwrap();
            assert_eq!(oracle.snapshots_abandoned, 1, "the aborted checkpoint's drain was abandoned");
        }
        assert!(got.violations.is_empty(), "{:?}", &got.violations[..got.violations.len().min(5)]);
        assert_eq!(got.lines, golden(&t), "with_failure = {with_failure}");
        assert!(
            got.state == base.state,
            "final state differs from the failure-free run (with_failure = {with_failure})"
        );
    }
}
