//! The [`Launcher`] of `weir coordinator --serve`: tenants' jobs run on the coordinator's
//! workers. With a leader (`--etcd`), each job is stored in etcd before its tenant hears its
//! id, each of its published checkpoints is recorded there before the checkpoint counts as
//! complete, and its keys are removed when it ends (`cluster/served.rs`); the coordinator
//! elected next takes every stored job back ([`resume_all`]) under the same id and tenant.

use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::api::server::Api;
use crate::api::submit::{Launcher, Submission};
use crate::cluster::coordinator::{Cluster, JobSource};
use crate::cluster::ha::{HaError, Leadership};
use crate::cluster::hub::Hub;
use crate::job::bind::BoundJob;
use crate::runtime::driver::PublishGate;
use crate::runtime::error::RunError;
use crate::runtime::executor::{RunOptions, RunSummary};

/// Runs tenants' jobs on the workers of a hub, kept in etcd when it leads a cluster.
pub struct OnCluster {
    hub: Arc<Hub>,
    leader: Option<Arc<Leadership>>,
    /// The next job number stored in etcd, raised only (under this lock).
    next: Mutex<u64>,
}

impl OnCluster {
    /// Jobs on `hub`'s workers, stored through `leader` if there is one.
    pub fn new(hub: Arc<Hub>, leader: Option<Arc<Leadership>>) -> OnCluster {
        OnCluster { hub, leader, next: Mutex::new(0) }
    }

    /// Removes a job that is over, or will not run, from etcd and its text from the tenant's
    /// directory.
    fn forget(&self, job: &Submission) {
        if let Some(l) = &self.leader {
            l.forget_served(&job.tenant, &job.id);
            job.drop_text();
        }
    }
}

impl Launcher for OnCluster {
    fn admit(&self, job: &Submission) -> Result<(), String> {
        let Some(l) = &self.leader else { return Ok(()) };
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        let after = (*next).max(job.number + 1);
        job.keep_text().map_err(|e| {
            tracing::error!(job = %job.id, "keeping tenant `{}`'s job `{}`: {e}", job.tenant, job.id);
            "the cluster could not keep its job file".to_string()
        })?;
        if let Err(e) = l.store_served(job, after) {
            tracing::error!(job = %job.id, "storing tenant `{}`'s job `{}`: {e}", job.tenant, job.id);
            // The write may have landed all the same: removed before the tenant hears `no`.
            self.forget(job);
            // The tenant hears that the cluster could not keep it, not where etcd runs.
            return Err("the cluster could not store it (its etcd did not answer)".to_string());
        }
        *next = after;
        Ok(())
    }

    fn abandon(&self, job: &Submission) {
        self.forget(job);
    }

    fn run(
        &self,
        job: &Submission,
        bound: &BoundJob,
        path: &Path,
        text: &str,
        opts: &RunOptions,
    ) -> Result<RunSummary, RunError> {
        let gate = self.leader.clone().map(|l| {
            let (ended, tenant, id) = (l.clone(), job.tenant.clone(), job.id.clone());
            let (end_tenant, end_id) = (tenant.clone(), id.clone());
            PublishGate::recording(
                move |chk| l.record_served_checkpoint(&tenant, &id, chk),
                move || ended.forget_served(&end_tenant, &end_id),
            )
        });
        let opts = RunOptions { gate, ..opts.clone() };
        let source = JobSource { path: path.to_path_buf(), text: text.to_string() };
        let ran = Cluster::on(&self.hub).run(bound, &source, &opts);
        // Over, however it ended: a later leader must not run it again (its tenant resubmits
        // a failed job, with `?restore=latest` to go on from its newest checkpoint).
        self.forget(job);
        ran
    }
}

/// Takes back every tenant's job `leader` finds stored, each from its newest recorded
/// checkpoint. One that no longer passes its checks (its tenant's quotas or files changed) is
/// listed to its tenant as failed, naming why, and removed like any failed job. Numbers the
/// API's later jobs past all of them. Returns how many jobs run again.
pub fn resume_all(api: &Api, launcher: &OnCluster, leader: &Leadership) -> Result<usize, HaError> {
    let next = leader.served_next()?;
    api.number_jobs_from(next);
    *launcher.next.lock().unwrap_or_else(|p| p.into_inner()) = next;
    let mut resumed = 0;
    for s in leader.served()? {
        let checkpoint = leader.served_checkpoint(&s.tenant, &s.id)?;
        let from = match &checkpoint {
            Some(c) => format!("from checkpoint {}", c.display()),
            None => "from its start (no checkpoint of it was recorded)".to_string(),
        };
        match api.resume(s.clone(), checkpoint) {
            Ok(()) => {
                tracing::info!(job = %s.id, "tenant `{}`'s job `{}`: taking over {from}", s.tenant, s.id);
                resumed += 1;
            }
            Err(e) => {
                tracing::error!(job = %s.id, "tenant `{}`: {e}", s.tenant);
                launcher.forget(&Submission { dir: api.tenant_dir(&s.tenant).unwrap_or_default(), ..s });
            }
        }
    }
    Ok(resumed)
}
