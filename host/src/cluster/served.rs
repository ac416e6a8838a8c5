//! Tenants' jobs of `weir coordinator --serve` in etcd, so that the coordinator elected next
//! takes them over: the leader stores each submitted job (its tenant, id and the request as
//! the tenant sent it) before it answers the submission, records each published checkpoint
//! of it, and removes both once the job is over (finished, stopped, cancelled or failed: a
//! tenant resubmits a failed job, the cluster does not run it again on its own).
//!
//! Keys, under `/weir/<cluster>/`: `served/<tenant>/<id>` (the [`Submission`]'s record,
//! JSON: a few hundred bytes, its text stays in the tenant's directory),
//! `served-checkpoint/<tenant>/<id>` (its newest complete checkpoint), `served-next` (the
//! next job number, so ids are not handed out twice across leaders). Tenant names and job
//! ids contain no `/` (both are checked where they are made).
//!
//! Invariant: every write is fenced by the leader's epoch (`ha.rs`); a job's end removes its
//! keys in one transaction, and a published checkpoint is recorded before it counts as
//! complete, so a new leader resumes each job from a checkpoint its sinks committed or that
//! is about to be committed, never from one older than its committed output.

use std::path::{Path, PathBuf};

use crate::cluster::ha::{HaError, Leadership};
use crate::job::submission::Submission;
use etcd_client::TxnOp;

fn job_key(tenant: &str, id: &str) -> String {
    format!("served/{tenant}/{id}")
}

fn checkpoint_key(tenant: &str, id: &str) -> String {
    format!("served-checkpoint/{tenant}/{id}")
}

const NEXT: &str = "served-next";

impl Leadership {
    /// Stores a submitted job's record and moves the next job number to `next`, if this
    /// coordinator still leads; a deposed one stops at once. (The caller keeps `next` from
    /// going backwards and the job's text in the tenant's directory.)
    pub fn store_served(&self, job: &Submission, next: u64) -> Result<(), HaError> {
        let ops = vec![
            TxnOp::put(self.key(&job_key(&job.tenant, &job.id)), serde_json::to_vec(job).expect("serializable"), None),
            TxnOp::put(self.key(NEXT), next.to_string(), None),
        ];
        match self.commit(ops, &format!("storing tenant `{}`'s job `{}`", job.tenant, job.id)) {
            Err(e @ HaError::Deposed { .. }) => super::ha::deposed(&self.cluster(), &e.to_string()),
            r => r,
        }
    }

    /// The tenants' jobs stored for the cluster; a record this Weir cannot read is logged and
    /// skipped (it stays stored), so it never keeps a leader from taking over the others.
    pub fn served(&self) -> Result<Vec<Submission>, HaError> {
        let mut jobs = Vec::new();
        for (key, value) in self.list("served/")? {
            match serde_json::from_slice(&value) {
                Ok(job) => jobs.push(job),
                Err(e) => tracing::error!("etcd key {key} holds no job this Weir can read ({e}); skipped"),
            }
        }
        Ok(jobs)
    }

    /// The number the next submitted job gets: past every number handed out before.
    pub fn served_next(&self) -> Result<u64, HaError> {
        let Some(v) = self.get(NEXT)? else { return Ok(0) };
        String::from_utf8_lossy(&v)
            .parse()
            .map_err(|e| HaError::Corrupt { key: self.key(NEXT), message: format!("not a number: {e}") })
    }

    /// The newest complete checkpoint recorded for a tenant's job, if any.
    pub fn served_checkpoint(&self, tenant: &str, id: &str) -> Result<Option<PathBuf>, HaError> {
        self.get_path(&checkpoint_key(tenant, id))
    }

    /// Records `path` as the tenant's job's newest complete checkpoint; returns only once it
    /// is recorded (else the process ends, as [`Leadership::record_checkpoint`]).
    pub fn record_served_checkpoint(&self, tenant: &str, id: &str, path: &Path) {
        let value = path.to_string_lossy().as_bytes().to_vec();
        let what = format!("checkpoint {} of tenant `{tenant}`'s job `{id}`", path.display());
        self.record(&checkpoint_key(tenant, id), value, &what);
    }

    /// Removes a tenant's job that is over (or was never started), so no later leader runs
    /// it; returns only once it is removed (else the process ends and the next leader
    /// resumes the job).
    pub fn forget_served(&self, tenant: &str, id: &str) {
        let keys = [self.key(&job_key(tenant, id)), self.key(&checkpoint_key(tenant, id))];
        self.record_ops(
            || keys.iter().map(|k| TxnOp::delete(k.clone(), None)).collect(),
            &format!("the end of tenant `{tenant}`'s job `{id}`"),
        );
    }
}
