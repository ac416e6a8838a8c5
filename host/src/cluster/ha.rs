//! High availability of `weir coordinator` on etcd: coordinators of one cluster campaign in
//! etcd's election service under a lease; the one elected leads, the others wait. The leader
//! keeps the jobs it runs and the path of each job's newest complete checkpoint in etcd, so
//! whichever coordinator is elected next resumes every job from there.
//!
//! Keys, under `/weir/<cluster>/`: `leader` (the election; the leader's value is the address
//! workers reach it at, which `weir worker --etcd` reads: `discovery.rs`), and per job (by its
//! name) `jobs/<job>` (the job file: name, path and text, JSON), `checkpoint/<job>` (its newest
//! complete checkpoint's path or `s3://` URL), `finished/<job>` (present once it has run to
//! its end). A leader first moves the single job an earlier Weir kept under `job`,
//! `checkpoint` and `finished` to those keys (`adopt_single_job_keys`).
//!
//! Invariants: the leader's **epoch** is the create revision of its election key, so a later
//! leader always has a higher one (attempt numbers and workers' fences build on it). Every
//! write of a leader is a transaction conditional on that key still existing with that
//! revision: a deposed leader's writes fail. A leader whose lease could have expired (etcd
//! answered no renewal within the lease's time to live, measured from when the renewal was
//! sent) stops acting at once: a watchdog thread that needs no answer from etcd ends the
//! process at that deadline, so it can neither publish nor tell subtasks to commit anything.
//! Recording a published checkpoint either succeeds or ends the process (it is retried until
//! the lease's deadline): a published checkpoint is never aborted, since a later restore could
//! pick it while its sinks' transactions were rolled back.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};

use crate::cluster::lease::{self, RecordResult, RecordStep};
use crate::io_runtime::io_runtime;

/// The exit status of a coordinator that lost its leadership.
pub const EXIT_DEPOSED: i32 = 3;

/// How a coordinator reaches etcd.
#[derive(Debug, Clone)]
pub struct HaConfig {
    /// etcd endpoints (`http://host:port`).
    pub endpoints: Vec<String>,
    /// The cluster's name: its keys live under `/weir/<cluster>/`.
    pub cluster: String,
    /// The leader's lease: a leader that stops renewing it is replaced after this long.
    pub lease_ttl: Duration,
}

/// Why etcd could not be used.
#[derive(Debug, thiserror::Error)]
pub enum HaError {
    /// etcd did not answer or refused.
    #[error("etcd at {endpoints}: {what} failed: {message}; check that etcd runs and --etcd names it")]
    Etcd {
        /// The endpoints.
        endpoints: String,
        /// The operation.
        what: String,
        /// etcd's error.
        message: String,
    },
    /// Another coordinator leads now.
    #[error(
        "this coordinator is no longer the leader of cluster `{cluster}` (epoch {epoch}); a newer leader took over"
    )]
    Deposed {
        /// The cluster.
        cluster: String,
        /// Our epoch.
        epoch: u64,
    },
    /// A value in etcd does not parse.
    #[error("etcd key {key} holds a value this weir cannot read: {message}")]
    Corrupt {
        /// The key.
        key: String,
        /// Why.
        message: String,
    },
    /// Bad configuration.
    #[error("{0}")]
    Config(String),
}

/// A job a cluster runs, as stored in etcd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredJob {
    /// The job's name (its key).
    pub name: String,
    /// The job file's path.
    pub path: PathBuf,
    /// Its text.
    pub text: String,
}

/// This coordinator's leadership of its cluster.
pub struct Leadership {
    cfg: HaConfig,
    client: Client,
    leader_key: Vec<u8>,
    epoch: u64,
    /// Until when the lease is surely alive ([`now_ms`]).
    valid_until: Arc<AtomicU64>,
}

/// The etcd election of `cluster`; its leader's value is the address workers reach the
/// leading coordinator at.
pub fn election_key(cluster: &str) -> String {
    format!("/weir/{cluster}/leader")
}

/// Checks a cluster's name (it prefixes the cluster's keys in etcd).
pub fn check_cluster_name(cluster: &str) -> Result<(), String> {
    if cluster.is_empty() || cluster.contains('/') {
        return Err(format!("--cluster `{cluster}`: give a name without `/` (it prefixes the cluster's keys in etcd)"));
    }
    Ok(())
}

/// Milliseconds on a monotonic clock since the first call.
fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// The leadership in a form the checkpoint driver can call (it runs on its own thread).
pub type SharedLeadership = Arc<Leadership>;

impl Leadership {
    /// Connects to etcd and campaigns until this coordinator leads `cfg.cluster`, announcing
    /// `me` (the address workers reach it at, [`election_key`]) as the leader's value. Keeps the lease alive from the start; if it
    /// lapses (also while waiting), the process exits with [`EXIT_DEPOSED`].
    pub fn campaign(cfg: HaConfig, me: &str) -> Result<Leadership, HaError> {
        check_cluster_name(&cfg.cluster).map_err(HaError::Config)?;
        let ttl = cfg.lease_ttl.as_secs().max(2) as i64;
        let rt = io_runtime();
        let endpoints = cfg.endpoints.clone();
        let ask = Duration::from_secs(5);
        let opts = ConnectOptions::new().with_connect_timeout(ask);
        let mut client = rt
            .block_on(within(ask, Client::connect(endpoints, Some(opts))))
            .map_err(|m| etcd_err(&cfg, "connecting", m))?;
        let asked = now_ms();
        let lease = rt
            .block_on(within(ask, client.lease_grant(ttl, None)))
            .map_err(|m| etcd_err(&cfg, "granting the leader lease", m))?
            .id();
        let ttl = Duration::from_secs(ttl as u64);
        let valid_until = Arc::new(AtomicU64::new(asked + ttl.as_millis() as u64));
        // Renewals on a thread and runtime of their own (never starved by the I/O runtime's
        // traffic); the watchdog needs no runtime and no answer from etcd at all.
        let (c, until, name) = (client.clone(), valid_until.clone(), cfg.cluster.clone());
        std::thread::Builder::new()
            .name("weir-lease".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
                rt.block_on(keep_alive(c, lease, ttl, until, name));
            })
            .expect("starting the lease thread");
        let (until, name) = (valid_until.clone(), cfg.cluster.clone());
        std::thread::Builder::new()
            .name("weir-lease-watchdog".into())
            .spawn(move || watchdog(&until, &name))
            .expect("starting the lease watchdog");
        let election = election_key(&cfg.cluster);
        if let Ok(r) = rt.block_on(within(ask, client.leader(election.clone())))
            && let Some(kv) = r.kv()
        {
            tracing::info!(
                "standby: cluster `{}` is led by the coordinator at {}; waiting to take over",
                cfg.cluster,
                String::from_utf8_lossy(kv.value())
            );
        }
        let won = rt
            .block_on(client.campaign(election, me, lease))
            .map_err(|e| etcd_err(&cfg, "campaigning for leadership", e.to_string()))?;
        let key = won
            .leader()
            .ok_or_else(|| etcd_err(&cfg, "campaigning for leadership", "no leader key in the answer".into()))?;
        let epoch = key.rev().max(1) as u64;
        tracing::info!("leading cluster `{}` (epoch {epoch})", cfg.cluster);
        Ok(Leadership { leader_key: key.key().to_vec(), epoch, client, cfg, valid_until })
    }

    /// The cluster's name.
    pub(super) fn cluster(&self) -> String {
        self.cfg.cluster.clone()
    }

    /// The leader's epoch: higher for every later leader.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub(super) fn key(&self, name: &str) -> String {
        format!("/weir/{}/{name}", self.cfg.cluster)
    }

    pub(super) fn get(&self, name: &str) -> Result<Option<Vec<u8>>, HaError> {
        let mut c = self.client.clone();
        let key = self.key(name);
        let r = io_runtime()
            .block_on(within(Duration::from_secs(10), c.get(key.clone(), None)))
            .map_err(|m| etcd_err(&self.cfg, &format!("reading {key}"), m))?;
        Ok(r.kvs().first().map(|kv| kv.value().to_vec()))
    }

    /// Writes `name` = `value` if this coordinator still leads.
    fn put(&self, name: &str, value: Vec<u8>) -> Result<(), HaError> {
        let key = self.key(name);
        self.commit(vec![TxnOp::put(key.clone(), value, None)], &format!("writing {key}"))
    }

    /// Moves what an earlier Weir stored for the cluster's one job (keys `job`, `checkpoint`,
    /// `finished`) to that job's keys, in one transaction fenced like every write, so the
    /// job resumes from its recorded checkpoint instead of counting as new. `name_of` names
    /// the job from its file. Returns the job's name if there was one to move.
    pub fn adopt_single_job_keys(
        &self,
        name_of: impl FnOnce(&Path, &str) -> Result<String, String>,
    ) -> Result<Option<String>, HaError> {
        #[derive(Deserialize)]
        struct OldJob {
            path: PathBuf,
            text: String,
        }
        let Some(bytes) = self.get("job")? else { return Ok(None) };
        let corrupt = |message: String| HaError::Corrupt { key: self.key("job"), message };
        let old: OldJob = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
        let name = name_of(&old.path, &old.text).map_err(corrupt)?;
        let job = StoredJob { name: name.clone(), path: old.path, text: old.text };
        let mut ops = vec![
            TxnOp::put(self.key(&format!("jobs/{name}")), serde_json::to_vec(&job).expect("serializable"), None),
            TxnOp::delete(self.key("job"), None),
        ];
        for what in ["checkpoint", "finished"] {
            if let Some(v) = self.get(what)? {
                ops.push(TxnOp::put(self.key(&format!("{what}/{name}")), v, None));
                ops.push(TxnOp::delete(self.key(what), None));
            }
        }
        self.commit(ops, "moving the earlier single-job keys")?;
        tracing::info!("moved job `{name}`, stored by an earlier Weir under {}, to the per-job keys", self.key("job"));
        Ok(Some(name))
    }

    /// Applies `ops` if this coordinator still leads.
    pub(super) fn commit(&self, ops: Vec<TxnOp>, what: &str) -> Result<(), HaError> {
        let txn = Txn::new()
            .when([Compare::create_revision(self.leader_key.clone(), CompareOp::Equal, self.epoch as i64)])
            .and_then(ops);
        let mut c = self.client.clone();
        let r = io_runtime()
            .block_on(within(Duration::from_secs(10), c.txn(txn)))
            .map_err(|m| etcd_err(&self.cfg, what, m))?;
        if r.succeeded() {
            Ok(())
        } else {
            Err(HaError::Deposed { cluster: self.cfg.cluster.clone(), epoch: self.epoch })
        }
    }

    /// The jobs stored for the cluster, by name.
    pub fn jobs(&self) -> Result<Vec<StoredJob>, HaError> {
        self.list("jobs/")?
            .into_iter()
            .map(|(key, value)| {
                serde_json::from_slice(&value).map_err(|e| HaError::Corrupt { key, message: e.to_string() })
            })
            .collect()
    }

    /// The keys and values under `prefix`, read a page at a time (a reply stays far below the
    /// client's 4 MiB however many keys there are).
    pub(super) fn list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, HaError> {
        const PAGE: i64 = 64;
        let prefix = self.key(prefix);
        let mut end = prefix.clone().into_bytes();
        *end.last_mut().expect("a key prefix") += 1;
        let (mut from, mut out) = (prefix.clone().into_bytes(), Vec::new());
        loop {
            let mut c = self.client.clone();
            let opts = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
            let r = io_runtime()
                .block_on(within(Duration::from_secs(10), c.get(from.clone(), Some(opts))))
                .map_err(|m| etcd_err(&self.cfg, &format!("reading {prefix}*"), m))?;
            out.extend(r.kvs().iter().map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.value().to_vec())));
            match r.kvs().last() {
                Some(last) if r.more() => from = [last.key(), &[0]].concat(),
                _ => return Ok(out),
            }
        }
    }

    /// Stores one of the cluster's jobs.
    pub fn store_job(&self, job: &StoredJob) -> Result<(), HaError> {
        self.put(&format!("jobs/{}", job.name), serde_json::to_vec(job).expect("serializable"))
    }

    /// The newest complete checkpoint recorded for `job`, if any.
    pub fn checkpoint(&self, job: &str) -> Result<Option<PathBuf>, HaError> {
        self.get_path(&format!("checkpoint/{job}"))
    }

    /// The path (or `s3://` URL) stored under `name`, if any.
    pub(super) fn get_path(&self, name: &str) -> Result<Option<PathBuf>, HaError> {
        let value = self.get(name)?;
        Ok(value.map(|b| PathBuf::from(String::from_utf8_lossy(&b).into_owned())))
    }

    /// Records `path` as `job`'s newest complete checkpoint. Returns only once it is
    /// recorded: a refused write (deposed), or etcd not taking it before the lease's deadline,
    /// ends the process — the checkpoint is published already and must not be aborted.
    pub fn record_checkpoint(&self, job: &str, path: &Path) {
        let value = path.to_string_lossy().as_bytes().to_vec();
        self.record(&format!("checkpoint/{job}"), value, &format!("checkpoint {} of job `{job}`", path.display()));
    }

    /// Stores `value` under `name`, retried while the lease lasts; exits the process if the
    /// write is refused or the lease may have lapsed (`what` names it in the log).
    pub(super) fn record(&self, name: &str, value: Vec<u8>, what: &str) {
        self.record_ops(|| vec![TxnOp::put(self.key(name), value.clone(), None)], what)
    }

    /// Applies the transaction `ops` builds, retried while the lease lasts; exits the process
    /// if it is refused or the lease may have lapsed (`what` names it in the log).
    pub(super) fn record_ops(&self, ops: impl Fn() -> Vec<TxnOp>, what: &str) {
        loop {
            let (r, detail) = match self.commit(ops(), &format!("recording {what}")) {
                Ok(()) => (RecordResult::Stored, String::new()),
                Err(e @ HaError::Deposed { .. }) => (RecordResult::Refused, e.to_string()),
                Err(e) => (RecordResult::Failed(e.to_string()), e.to_string()),
            };
            match lease::after_record(r, now_ms(), self.valid_until.load(Ordering::Relaxed)) {
                RecordStep::Done => return,
                RecordStep::Stop(why) => deposed(&self.cfg.cluster, &format!("{what}: {why} ({detail})")),
                RecordStep::Retry => {
                    tracing::warn!("recording {what} in etcd failed ({detail}); retrying");
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }

    /// Whether `job` has run to its end.
    pub fn finished(&self, job: &str) -> Result<bool, HaError> {
        Ok(self.get(&format!("finished/{job}"))?.is_some())
    }

    /// Records that `job` is over (run to its end, stopped with a savepoint, or cancelled),
    /// retried while the lease lasts: a leader that cannot record it exits, so the next leader
    /// resumes the job rather than a user believing it is over.
    pub fn mark_finished(&self, job: &str) {
        self.record(&format!("finished/{job}"), b"1".to_vec(), &format!("the end of job `{job}`"));
    }
}

impl Leadership {
    /// Announces where this leader serves its API (`weir coordinator --serve`), so standbys
    /// can tell callers where to go ([`LeaderApi`]).
    pub fn announce_api(&self, url: &str) -> Result<(), HaError> {
        self.put("api", url.as_bytes().to_vec())
    }
}

/// Where a cluster's leader serves its API, read from etcd by a standby: at most once a
/// second, however many callers ask (each gets the newest answer read).
pub struct LeaderApi {
    cfg: HaConfig,
    client: std::sync::Mutex<Option<Client>>,
    read: std::sync::Mutex<Option<(Instant, Option<String>)>>,
}

impl LeaderApi {
    /// The leader's API address of `cfg.cluster`.
    pub fn new(cfg: HaConfig) -> LeaderApi {
        LeaderApi { cfg, client: std::sync::Mutex::default(), read: std::sync::Mutex::default() }
    }

    /// The cluster this is about.
    pub fn cluster(&self) -> &str {
        &self.cfg.cluster
    }

    /// The URL the leader announced, if etcd holds one (and answered within a second or so).
    pub fn url(&self) -> Option<String> {
        let mut read = self.read.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, url)) = read.as_ref()
            && at.elapsed() < Duration::from_secs(1)
        {
            return url.clone();
        }
        let url = self.fetch();
        *read = Some((Instant::now(), url.clone()));
        url
    }

    fn fetch(&self) -> Option<String> {
        let ask = Duration::from_secs(2);
        let mut client = self.client.lock().unwrap_or_else(|p| p.into_inner());
        if client.is_none() {
            let opts = ConnectOptions::new().with_connect_timeout(ask);
            *client = io_runtime().block_on(within(ask, Client::connect(self.cfg.endpoints.clone(), Some(opts)))).ok();
        }
        let c = client.as_mut()?;
        let key = format!("/weir/{}/api", self.cfg.cluster);
        match io_runtime().block_on(within(ask, c.get(key, None))) {
            Ok(r) => r.kvs().first().map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
            Err(_) => {
                *client = None;
                None
            }
        }
    }
}

fn etcd_err(cfg: &HaConfig, what: &str, message: String) -> HaError {
    HaError::Etcd { endpoints: cfg.endpoints.join(","), what: what.to_string(), message }
}

/// Ends the process once the lease may have lapsed, whatever etcd (or the runtime) does.
fn watchdog(valid_until: &AtomicU64, cluster: &str) {
    loop {
        let (now, until) = (now_ms(), valid_until.load(Ordering::Relaxed));
        if !lease::leads(now, until) {
            deposed(cluster, "etcd renewed none of its lease within the lease's time to live");
        }
        std::thread::sleep(Duration::from_millis((until - now).min(100)));
    }
}

/// Runs `f` for at most `d`.
async fn within<T>(d: Duration, f: impl Future<Output = Result<T, etcd_client::Error>>) -> Result<T, String> {
    match tokio::time::timeout(d, f).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer within {} s", d.as_secs())),
    }
}

/// Renews `lease` every third of its time to live, moving `valid_until` to the renewal's
/// request time plus the time to live etcd granted; if etcd says the lease has expired, the
/// process exits (the watchdog ends it when renewals stop coming back).
async fn keep_alive(mut client: Client, lease: i64, ttl: Duration, valid_until: Arc<AtomicU64>, cluster: String) {
    let mut keeper = None;
    loop {
        tokio::time::sleep(ttl / 3).await;
        if keeper.is_none() {
            keeper = tokio::time::timeout(ttl / 3, client.lease_keep_alive(lease)).await.ok().and_then(|r| r.ok());
        }
        let sent = now_ms();
        let answer = match keeper.as_mut() {
            Some((k, stream)) => {
                tokio::time::timeout(ttl / 3, async {
                    k.keep_alive().await.ok()?;
                    stream.message().await.ok().flatten()
                })
                .await
            }
            None => Ok(None),
        };
        match answer {
            Ok(Some(r)) => match lease::renewed_until(sent, r.ttl()) {
                Some(until) => valid_until.store(until, Ordering::Relaxed),
                None => deposed(&cluster, "etcd says its lease expired"),
            },
            _ => keeper = None,
        }
    }
}

pub(super) fn deposed(cluster: &str, why: &str) -> ! {
    tracing::error!(
        "coordinator of cluster `{cluster}`: {why}; another coordinator may lead by now, so this one stops at once (exit {EXIT_DEPOSED})"
    );
    std::process::exit(EXIT_DEPOSED)
}
