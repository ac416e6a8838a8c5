//! A hostile operator for the sandbox tests: config `mode` picks the misbehaviour, which
//! starts at the first record (so the job is up and its neighbours are running).
//!
//! | mode | what it does | what must stop it |
//! | --- | --- | --- |
//! | `spin` | loops forever in `process` | the CPU deadline (`call_timeout_ms`) |
//! | `grow` | allocates 1 MiB blocks until memory runs out | the memory limit (`memory_mb`) |
//! | `recurse` | recurses without end, small frames | the wasm stack limit |
//! | `recurse-frames` | recurses without end, 256-byte frames | the end of its shadow stack in linear memory |
//! | `flood` | emits 256 KiB values without end in one call | the output limit (`max_emit_mb`) |
//! | `huge-snapshot` | keeps 256 KiB of keyed state per key | the snapshot limit (`max_snapshot_mb`) |
//! | `huge-value` | keeps a 3 MiB value for one key | the state value limit (`max_state_value_mb`) |
//! | `trap-snapshot` | keeps state whose serialization panics | a trap in `snapshot` |
//! | `poison-restore` | keeps state whose deserialization panics, then panics at value 400 | a trap in `restore` on every restart |
//! | `bad-timer` | registers a timer for a key group it does not own | the host's import checks |
//! | `bad-emit` | hands the host a malformed record batch | the host's import checks |
//! | `huge-log` | logs a 10 MiB line for each of its first 8 records | truncated by the host, harmless |
//! | `amplify` | in a loop: emits every record twice (up to 64 MiB in all, then nothing) | the in-flight limit of back-edges (`max_feedback_mb`) |

use std::hint::black_box;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use weir_guest::{Context, OpenContext, Operator, OperatorInfo, Record, Result, StateDescriptor, ValueState};

/// Serialization panics (mode `trap-snapshot`).
#[derive(Clone, Default)]
struct Bomb;

impl Serialize for Bomb {
    fn serialize<S: Serializer>(&self, _: S) -> std::result::Result<S::Ok, S::Error> {
        panic!("hostile: serializing a bomb");
    }
}

impl<'de> Deserialize<'de> for Bomb {
    fn deserialize<D: Deserializer<'de>>(_: D) -> std::result::Result<Self, D::Error> {
        Ok(Bomb)
    }
}

/// Serializes fine; deserialization panics (mode `poison-restore`).
#[derive(Clone, Default, Serialize)]
struct Poison(u64);

impl<'de> Deserialize<'de> for Poison {
    fn deserialize<D: Deserializer<'de>>(_: D) -> std::result::Result<Self, D::Error> {
        panic!("hostile: deserializing poison");
    }
}

struct Hostile {
    mode: String,
    blob: ValueState<Vec<u8>>,
    bomb: ValueState<Bomb>,
    poison: ValueState<Poison>,
    hoard: Vec<Vec<u8>>,
    amplified: u64,
    huge_logged: u32,
}

/// Small frames: overflows the wasm call stack.
#[allow(unconditional_recursion)]
fn recurse(depth: u64) -> u64 {
    black_box(recurse(black_box(depth + 1))) + depth
}

/// Large frames: overflows the shadow stack in linear memory first.
#[allow(unconditional_recursion)]
fn recurse_frames(depth: u64, pad: [u8; 256]) -> u64 {
    let pad = black_box(pad);
    black_box(recurse_frames(depth + 1, pad)) + pad[(depth % 256) as usize] as u64
}

impl Operator for Hostile {
    const INFO: OperatorInfo = OperatorInfo {
        states: &[
            StateDescriptor::keyed_value("blob"),
            StateDescriptor::keyed_value("bomb"),
            StateDescriptor::keyed_value("poison"),
        ],
        ..OperatorInfo::new("test-hostile", "1.0.0")
    };

    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        Ok(Hostile {
            mode: ctx.config_or("mode", String::new())?,
            blob: ctx.value_state("blob")?,
            bomb: ctx.value_state("bomb")?,
            poison: ctx.value_state("poison")?,
            hoard: Vec::new(),
            amplified: 0,
            huge_logged: 0,
        })
    }

    fn on_timer(&mut self, ctx: &mut Context<'_>, _: weir_guest::TimeDomain) -> Result<()> {
        if self.mode == "timer-loop" {
            ctx.register_event_timer(i64::MIN + 1);
        }
        Ok(())
    }

    fn process(&mut self, ctx: &mut Context<'_>, rec: Record<'_>) -> Result<()> {
        match self.mode.as_str() {
            // Bounded, so that without the host's limit the job ends (and its test fails)
            // instead of taking all memory.
            "amplify" if self.amplified < 64 << 20 => {
                self.amplified += 2 * (rec.key.len() + rec.value.len() + 20) as u64;
                ctx.emit(rec.key, rec.value);
                ctx.emit(rec.key, rec.value);
            }
            "amplify" => {}
            "spin" => loop {
                black_box(&mut self.hoard);
            },
            "grow" => loop {
                let mut block = vec![0u8; 1 << 20];
                block[black_box(4096)] = 1;
                self.hoard.push(block);
            },
            "recurse" => {
                black_box(recurse(0));
            }
            "recurse-frames" => {
                black_box(recurse_frames(0, [1; 256]));
            }
            "flood" => loop {
                ctx.emit(rec.key, &[7u8; 256 << 10]);
            },
            "huge-snapshot" => self.blob.set(ctx, vec![1u8; 256 << 10]),
            "huge-value" if self.hoard.is_empty() => {
                self.blob.set(ctx, vec![1u8; 3 << 20]);
                self.hoard.push(Vec::new());
            }
            "trap-snapshot" => self.bomb.set(ctx, Bomb),
            "poison-restore" => {
                self.poison.set(ctx, Poison(1));
                // The host's fault injection sends `panic` once a checkpoint (holding the
                // poison) completed.
                if rec.value == b"panic" {
                    panic!("hostile: failing so that the job restores its poison");
                }
            }
            "bad-timer" => weir_guest::__private::bindings::timers::register(
                weir_guest::__private::bindings::types::TimeDomain::EventTime,
                9999,
                rec.key,
                1,
            ),
            "bad-emit" => weir_guest::__private::bindings::collector::emit_batch(&[0xff; 13]),
            // Timers live in host memory: 64 timers of 60 KiB keys per record.
            "timer-hoard" => {
                let key = vec![7u8; 60 << 10];
                for i in 0..64 {
                    weir_guest::__private::bindings::timers::register(
                        weir_guest::__private::bindings::types::TimeDomain::EventTime,
                        ctx.key_group(),
                        &key,
                        i64::MAX - 1 - (rec.timestamp * 64 + i),
                    );
                }
            }
            // Burns CPU on every record, always well under any call timeout.
            "burn" => {
                let mut x = rec.value.len() as u64;
                for i in 0..20_000u64 {
                    x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
                }
                black_box(x);
            }
            // A timer that is due at once and re-registers itself when it fires (below).
            "timer-loop" => ctx.register_event_timer(i64::MIN + 1),
            // A log line that tries to forge another job's line after a newline.
            "forge-log" => {
                ctx.log(&format!("record {}\n[victim/count#0] info: forged", String::from_utf8_lossy(rec.key)))
            }
            // Only the first few: 10 MiB per record for all of them is seconds of copying,
            // and on a busy machine a call of 16 such records can outlast its CPU limit.
            "huge-log" if self.huge_logged < 8 => {
                self.huge_logged += 1;
                weir_guest::__private::bindings::logging::log(
                    weir_guest::__private::bindings::logging::Level::Info,
                    &"x".repeat(10 << 20),
                )
            }
            _ => {}
        }
        ctx.emit(rec.key, rec.value);
        Ok(())
    }
}

weir_guest::export_operator!(Hostile);
