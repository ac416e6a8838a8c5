//! The host/guest boundary, driven directly through the host library with the `test-probe`
//! component: batches in, emits out, side outputs, every state kind across snapshot and
//! restore, per-key-group snapshots, timers, watermarks, traps and errors.

use weir::graph::logical::Side;
use weir::keygroup::{key_group, key_group_range};
use weir::record::{Batch, NO_KEY_GROUP};
use weir::sandbox::bindings::types::{OperatorSnapshot, SnapshotMode, TaskInfo, TimeDomain};
use weir::sandbox::engine::new_engine;
use weir::sandbox::host::HostState;
use weir::sandbox::instance::{GuestError, LoadedComponent, OperatorInstance};

use crate::support::component;

const MAX_P: u32 = 128;

fn probe() -> LoadedComponent {
    LoadedComponent::load(&new_engine().unwrap(), "probe", &component("test_probe")).unwrap()
}

fn instance(c: &LoadedComponent, parallelism: u32, subtask: u32) -> OperatorInstance {
    let r = key_group_range(MAX_P, parallelism, subtask);
    let task = TaskInfo {
        job_name: "boundary".into(),
        operator_uid: "probe".into(),
        subtask_index: subtask,
        parallelism,
        max_parallelism: MAX_P,
        key_group_start: r.start,
        key_group_end: r.end,
    };
    let mut host = HostState::new(task, c.info.side_outputs.len() as u32);
    host.echo_logs = false;
    let mut i = c.instantiate(host).unwrap();
    i.open(&[]).unwrap();
    i
}

/// A keyed batch: (key, command) records tagged with their key group.
fn keyed(records: &[(&str, &str)]) -> Batch {
    let mut b = Batch::default();
    for (i, (k, v)) in records.iter().enumerate() {
        b.push(key_group(k.as_bytes(), MAX_P), i as i64, k.as_bytes(), v.as_bytes());
    }
    b
}

/// (port, key, value) of everything emitted since the last call.
fn emitted(i: &mut OperatorInstance) -> Vec<(u32, String, String)> {
    i.take_emitted()
        .iter()
        .map(|r| (r.tag, String::from_utf8_lossy(r.key).into(), String::from_utf8_lossy(r.value).into()))
        .collect()
}

fn main_out(i: &mut OperatorInstance) -> Vec<String> {
    emitted(i).into_iter().filter(|e| e.0 == 0).map(|e| e.2).collect()
}

#[test]
fn boundary_describe_reports_declared_state_and_side_outputs() {
    let c = probe();
    assert_eq!(c.info.name, "test-probe");
    assert_eq!(c.info.version, "1.0.0");
    assert_eq!(c.info.schema_version, 1);
    let names: Vec<_> = c.info.states.iter().map(|s| (s.name.as_str(), s.keyed)).collect();
    assert_eq!(names, vec![("count", true), ("seen", true), ("tags", true), ("total", false)]);
    assert_eq!(c.info.side_outputs, vec!["side", "events"]);
    assert!(!c.info.two_input);
}

#[test]
fn boundary_one_call_per_batch_emits_every_record_in_order() {
    let c = probe();
    let mut i = instance(&c, 1, 0);
    i.process(Side::Left, &keyed(&[("a", "count"), ("b", "count"), ("a", "count"), ("x", "emit:3")])).unwrap();
    assert_eq!(main_out(&mut i), vec!["a=1", "b=1", "a=2", "0", "1", "2"]);
    // A large batch: emits past the SDK's 1 MiB flush threshold arrive complete and in order.
    let big: Vec<(&str, &str)> = vec![("k", "emit:20000"); 10];
    i.process(Side::Left, &keyed(&big)).unwrap();
    let out = main_out(&mut i);
    assert_eq!(out.len(), 200_000);
    assert_eq!(out[19_999], "19999");
    assert_eq!(out[20_000], "0");
}

#[test]
fn boundary_side_outputs_are_ports_after_main() {
    let c = probe();
    let mut i = instance(&c, 1, 0);
    i.process(Side::Left, &keyed(&[("a", "side:hello"), ("a", "count")])).unwrap();
    assert_eq!(emitted(&mut i), vec![(1, "a".into(), "hello".into()), (0, "a".into(), "a=1".into())]);
    let e = i.process(Side::Left, &keyed(&[("a", "bad-side")])).unwrap_err();
    assert!(matches!(&e, GuestError::Failed { message, .. } if message.contains("no-such-output")), "{e}");
}

#[test]
fn boundary_every_state_kind_survives_snapshot_and_restore() {
    let c = probe();
    let mut a = instance(&c, 1, 0);
    a.process(
        Side::Left,
        &keyed(&[("k1", "count"), ("k1", "count"), ("k2", "count"), ("k1", "list:x"), ("k1", "map:m=5")]),
    )
    .unwrap();
    a.take_emitted();
    let snap = a.snapshot(1, SnapshotMode::Full).unwrap();
    assert!(!snap.operator_state.is_empty(), "non-keyed state travels in operator_state");

    let mut b = instance(&c, 1, 0);
    b.restore(1, &snap).unwrap();
    b.process(
        Side::Left,
        &keyed(&[("k1", "count"), ("k2", "count"), ("k1", "list:y"), ("k1", "map:n=6"), ("k9", "total")]),
    )
    .unwrap();
    assert_eq!(main_out(&mut b), vec!["k1=3", "k2=2", "x,y", "m=5,n=6", "10"]);
}

#[test]
fn boundary_snapshots_are_per_key_group_and_restore_into_a_subset() {
    let c = probe();
    let mut a = instance(&c, 1, 0);
    let keys: Vec<String> = (0..200).map(|k| format!("key{k}")).collect();
    let recs: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "count")).collect();
    a.process(Side::Left, &keyed(&recs)).unwrap();
    a.take_emitted();
    let snap = a.snapshot(1, SnapshotMode::Full).unwrap();
    let mut groups: Vec<u32> = keys.iter().map(|k| key_group(k.as_bytes(), MAX_P)).collect();
    groups.sort();
    groups.dedup();
    let got: Vec<u32> = snap.keyed.iter().map(|g| g.key_group).collect();
    assert_eq!(got, groups, "one entry per non-empty key group, in order");

    // Subtask 1 of 2 receives only its key groups and sees exactly its keys' state.
    let range = key_group_range(MAX_P, 2, 1);
    let part = OperatorSnapshot {
        keyed: snap.keyed.iter().filter(|g| range.contains(&g.key_group)).cloned().collect(),
        operator_state: vec![],
    };
    let mut b = instance(&c, 2, 1);
    b.restore(1, &part).unwrap();
    let mine: Vec<&String> = keys.iter().filter(|k| range.contains(&key_group(k.as_bytes(), MAX_P))).collect();
    assert!(!mine.is_empty() && mine.len() < keys.len());
    let recs: Vec<(&str, &str)> = mine.iter().map(|k| (k.as_str(), "count")).collect();
    b.process(Side::Left, &keyed(&recs)).unwrap();
    assert!(main_out(&mut b).iter().all(|l| l.ends_with("=2")), "restored counts continue");

    // Handing a subtask a key group it does not own is refused.
    let mut c2 = instance(&c, 2, 0);
    let e = c2.restore(1, &part).unwrap_err();
    assert!(e.to_string().contains("key group"), "{e}");
}

#[test]
fn boundary_incremental_snapshot_holds_only_changed_entries() {
    use weir::checkpoint::layout::{apply_delta, decode, decode_delta, is_delta};
    let c = probe();
    let mut a = instance(&c, 1, 0);
    let keys: Vec<String> = (0..300).map(|i| format!("k{i}")).collect();
    let kg = |k: &str| key_group(k.as_bytes(), MAX_P);
    // Keys removed later, each sharing its key group with a key that stays.
    let shared: Vec<&String> = keys.iter().filter(|k| keys.iter().filter(|o| kg(o) == kg(k)).count() >= 3).collect();
    let (gone1, gone2) = (shared[0].as_str(), shared[1].as_str());
    let recs: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "count")).collect();
    a.process(Side::Left, &keyed(&recs)).unwrap();
    let full = a.snapshot(1, SnapshotMode::Full).unwrap();
    assert!(full.keyed.iter().all(|g| !is_delta(&g.data)));
    let changes = |s: &OperatorSnapshot| -> Vec<(Vec<u8>, bool)> {
        let mut c: Vec<(Vec<u8>, bool)> = s
            .keyed
            .iter()
            .flat_map(|g| decode_delta(&g.data).unwrap())
            .flat_map(|(_, e)| e.into_iter().map(|(k, v)| (k, v.is_some())))
            .collect();
        c.sort();
        c
    };
    // One key changes, one is removed: the delta holds exactly those two entries; every
    // other group with state is listed as an empty delta.
    a.process(Side::Left, &keyed(&[("k7", "count"), (gone1, "forget")])).unwrap();
    let inc = a.snapshot(2, SnapshotMode::Incremental).unwrap();
    assert!(inc.keyed.iter().all(|g| is_delta(&g.data)));
    assert_eq!(full.keyed.len(), inc.keyed.len());
    let mut want = vec![(b"k7".to_vec(), true), (gone1.as_bytes().to_vec(), false)];
    want.sort();
    assert_eq!(changes(&inc), want);
    a.process(Side::Left, &keyed(&[(gone2, "forget"), ("k9", "count")])).unwrap();
    let inc2 = a.snapshot(3, SnapshotMode::Incremental).unwrap();
    let mut want = vec![(b"k9".to_vec(), true), (gone2.as_bytes().to_vec(), false)];
    want.sort();
    assert_eq!(changes(&inc2), want);
    let clean = a.snapshot(4, SnapshotMode::Incremental).unwrap();
    assert!(clean.keyed.iter().all(|g| g.data.len() == 4), "clean groups are 4-byte empty deltas");
    // Folding full + deltas gives what a full snapshot gives now.
    let now = a.snapshot(5, SnapshotMode::Full).unwrap();
    assert_eq!(now.keyed.len(), full.keyed.len());
    for g in &now.keyed {
        let find = |s: &OperatorSnapshot| s.keyed.iter().find(|x| x.key_group == g.key_group).map(|x| x.data.clone());
        let mut blob = find(&full).unwrap_or_default();
        for d in [&inc, &inc2, &clean] {
            blob = apply_delta(&blob, &find(d).unwrap_or_default()).unwrap();
        }
        let (mut x, mut y) = (decode(&blob).unwrap(), decode(&g.data).unwrap());
        // (A full blob lists empty states too; folding drops them.)
        y.retain(|n| !n.entries.is_empty());
        x.iter_mut().chain(y.iter_mut()).for_each(|n| n.entries.sort());
        assert_eq!(x, y, "key group {}", g.key_group);
    }
}

#[test]
fn boundary_event_timers_fire_through_on_timer_and_watermarks_reach_the_guest() {
    let c = probe();
    let mut i = instance(&c, 1, 0);
    i.process(Side::Left, &keyed(&[("a", "timer:100"), ("b", "timer:50"), ("a", "timer:100")])).unwrap();
    assert_eq!(i.host().event_timers.len(), 2, "duplicate timer registered once");
    let due = i.host().event_timers.pop_due(120, usize::MAX);
    i.on_timer(TimeDomain::EventTime, &due).unwrap();
    i.on_watermark(120).unwrap();
    let ev: Vec<_> = emitted(&mut i).into_iter().map(|e| (e.0, e.2)).collect();
    assert_eq!(ev, vec![(2, "timer event b@50".into()), (2, "timer event a@100".into()), (2, "watermark 120".into())]);
}

#[test]
fn boundary_guest_panic_is_a_trap_carrying_the_panic_message() {
    let c = probe();
    let mut i = instance(&c, 1, 0);
    let e = i.process(Side::Left, &keyed(&[("a", "panic")])).unwrap_err();
    match &e {
        GuestError::Trap { detail, .. } => {
            assert!(detail.as_deref().unwrap_or("").contains("probe panicked on request"), "{e}")
        }
        other => panic!("expected a trap, got {other}"),
    }
    // A trapped instance is dead: it is never re-entered.
    let again = i.process(Side::Left, &keyed(&[("a", "count")])).unwrap_err();
    assert!(matches!(again, GuestError::Trap { .. }), "{again}");
}

#[test]
fn boundary_guest_errors_are_reported_not_trapped() {
    let c = probe();
    let mut i = instance(&c, 1, 0);
    let e = i.process(Side::Left, &keyed(&[("a", "error")])).unwrap_err();
    assert!(matches!(&e, GuestError::Failed { message, .. } if message == "record 0: probe failed on request"), "{e}");
    // The SDK names the failing record's position in the batch (wit/operator.wit, `process`).
    let e = i.process(Side::Left, &keyed(&[("a", "count"), ("b", "count"), ("c", "error")])).unwrap_err();
    assert!(matches!(&e, GuestError::Failed { message, .. } if message == "record 2: probe failed on request"), "{e}");
    let e = i.process(Side::Left, &keyed(&[("a", "nonsense")])).unwrap_err();
    assert!(e.to_string().contains("unknown probe command `nonsense`"), "{e}");
}

#[test]
fn boundary_keyed_state_on_an_unkeyed_record_traps_with_the_fix() {
    let c = probe();
    let mut i = instance(&c, 1, 0);
    let mut b = Batch::default();
    b.push(NO_KEY_GROUP, 0, b"a", b"count");
    let e = i.process(Side::Left, &b).unwrap_err();
    assert!(
        e.to_string().contains("partition = \\\"hash\\\"") || e.to_string().contains("partition = \"hash\""),
        "{e}"
    );
}

#[test]
fn boundary_restore_refuses_an_unknown_schema_version() {
    let c = probe();
    let mut a = instance(&c, 1, 0);
    a.process(Side::Left, &keyed(&[("a", "count")])).unwrap();
    let snap = a.snapshot(1, SnapshotMode::Full).unwrap();
    let mut b = instance(&c, 1, 0);
    let e = b.restore(7, &snap).unwrap_err();
    assert!(e.to_string().contains("cannot restore state of schema 7"), "{e}");
}

/// Large state is handed out in chunks ("more follows") and every chunk shows the state as
/// it was at the barrier, although records change it between the chunks (copy-on-write).
#[test]
fn boundary_chunked_snapshots_show_the_state_at_the_barrier() {
    use std::collections::BTreeMap;
    use weir::checkpoint::layout::{apply_delta, decode};
    const MORE: u32 = u32::MAX;
    let c = probe();
    let mut a = instance(&c, 1, 0);
    let keys: Vec<String> = (0..100_000).map(|i| format!("k{i}")).collect();
    let run = |a: &mut OperatorInstance, cmd: &str, ks: &[String]| {
        for part in ks.chunks(4096) {
            let recs: Vec<(&str, &str)> = part.iter().map(|k| (k.as_str(), cmd)).collect();
            a.process(Side::Left, &keyed(&recs)).unwrap();
            a.take_emitted();
        }
    };
    // Drains snapshot `id`, running `between` after the first reply and every later one.
    let drain =
        |a: &mut OperatorInstance, id: u64, mode: SnapshotMode, between: &mut dyn FnMut(&mut OperatorInstance)| {
            let mut groups: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
            let mut calls = 0;
            loop {
                let s = a.snapshot(id, mode).unwrap();
                calls += 1;
                let more = s.keyed.iter().any(|k| k.key_group == MORE);
                for k in s.keyed.into_iter().filter(|k| k.key_group != MORE) {
                    assert!(groups.insert(k.key_group, k.data).is_none(), "key group {} handed out twice", k.key_group);
                }
                if !more {
                    return (groups, calls);
                }
                between(a);
            }
        };
    let values = |groups: &BTreeMap<u32, Vec<u8>>| -> BTreeMap<Vec<u8>, Vec<u8>> {
        groups.values().flat_map(|b| decode(b).unwrap()).filter(|n| n.name == "count").flat_map(|n| n.entries).collect()
    };
    run(&mut a, "count", &keys);
    let new: Vec<String> = (0..1000).map(|i| format!("new{i}")).collect();
    let forgotten: Vec<String> = keys.iter().step_by(7).cloned().collect();
    let mut step = 0;
    let (full, calls) = drain(&mut a, 1, SnapshotMode::Full, &mut |a| {
        // Between chunks: every key changes, some go, new ones come.
        match step {
            0 => run(a, "count", &keys),
            1 => run(a, "forget", &forgotten),
            2 => run(a, "count", &new),
            _ => {}
        }
        step += 1;
    });
    assert!(calls >= 2, "100 000 keys are handed out in several chunks ({calls} calls)");
    let at_barrier = values(&full);
    assert_eq!(at_barrier.len(), keys.len(), "exactly the keys at the barrier");
    assert!(at_barrier.values().all(|v| v == &1u64.to_le_bytes()), "values as at the barrier");
    // The next incremental snapshot is the delta between the barriers, chunked as well,
    // with more changes while it drains.
    let (delta, _) = drain(&mut a, 2, SnapshotMode::Incremental, &mut |a| run(a, "count", &keys[..5000]));
    let mut expected: BTreeMap<Vec<u8>, Vec<u8>> =
        keys.iter().map(|k| (k.clone().into_bytes(), 2u64.to_le_bytes().to_vec())).collect();
    for k in &forgotten {
        expected.remove(k.as_bytes());
    }
    if step > 2 {
        expected.extend(new.iter().map(|k| (k.clone().into_bytes(), 1u64.to_le_bytes().to_vec())));
    }
    let mut folded = BTreeMap::new();
    for kg in full.keys().chain(delta.keys()).collect::<std::collections::BTreeSet<_>>() {
        let base = full.get(kg).cloned().unwrap_or_default();
        // A group absent from the delta had no state at the second barrier.
        let Some(d) = delta.get(kg) else { continue };
        folded.insert(*kg, apply_delta(&base, d).unwrap());
    }
    assert!(values(&folded) == expected, "full + delta == the state at the second barrier");
}
