//! `cargo bench -p weir --bench net_link`: what a channel between workers costs. Sends the
//! same batches (1 024 records of 16-byte keys and 64-byte values, as J1's) through an
//! in-process crossbeam channel and through an HTTP/2 stream over loopback TCP
//! (`runtime/net/link.rs`), interleaved, and prints records/s of each and their ratio.
//!
//! Environment: `WEIR_BENCH_BATCHES` (default 20 000), `WEIR_BENCH_ROUNDS` (default 3).

use std::time::Instant;

use weir::record::Batch;
use weir::runtime::message::Message;
use weir::runtime::net::link::{ChannelKey, Inbound, Outbound};

const RECORDS: u32 = 1024;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn batch() -> Batch {
    let mut b = Batch::default();
    for i in 0..RECORDS {
        let key = format!("key-{i:012}");
        b.push(0, i as i64, key.as_bytes(), &[b'v'; 64]);
    }
    b
}

/// Records/s through a channel: `send` on one thread, draining `recv` on this one.
fn measure(batches: u64, send: impl FnOnce(Batch, u64) + Send, recv: impl Fn() -> Message) -> f64 {
    let b = batch();
    let started = Instant::now();
    std::thread::scope(|s| {
        s.spawn(move || send(b, batches));
        let mut n = 0u64;
        loop {
            match recv() {
                Message::Data(b) => n += b.len() as u64,
                Message::EndOfStream => break,
                _ => {}
            }
        }
        assert_eq!(n, batches * RECORDS as u64);
    });
    (batches * RECORDS as u64) as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    let batches = env_u64("WEIR_BENCH_BATCHES", 20_000);
    let rounds = env_u64("WEIR_BENCH_ROUNDS", 3);
    let inbound = Inbound::bind("127.0.0.1:0".parse().unwrap(), "bench", None).unwrap();
    let out = Outbound::connect(inbound.addr(), "bench", None).unwrap();
    println!("batches of {RECORDS} records (16 B keys, 64 B values), {batches} per run");
    for round in 0..rounds {
        let (tx, rx) = crossbeam_channel::bounded(64);
        let local = measure(
            batches,
            move |b, n| {
                for _ in 0..n {
                    tx.send(Message::Data(b.clone())).unwrap();
                }
                tx.send(Message::EndOfStream).unwrap();
            },
            || rx.recv().unwrap(),
        );
        let (tx, rx) = crossbeam_channel::bounded(64);
        let key = ChannelKey { attempt: 1, channel: round };
        let space = std::sync::Arc::new(tokio::sync::Notify::new());
        inbound.expect(key, tx, space.clone(), None, None);
        let remote = out.open(key, 64).unwrap();
        let net = measure(
            batches,
            move |b, n| {
                for _ in 0..n {
                    remote.send(Message::Data(b.clone())).unwrap();
                }
                remote.send(Message::EndOfStream).unwrap();
            },
            || {
                let m = rx.recv().unwrap();
                space.notify_one();
                m
            },
        );
        println!(
            "round {round}: in-process {:.2} M records/s, HTTP/2 over loopback {:.2} M records/s ({:.0} %)",
            local / 1e6,
            net / 1e6,
            net / local * 100.0
        );
    }
}
