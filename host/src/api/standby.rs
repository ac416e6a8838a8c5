//! The tenants' API of a `weir coordinator --serve --etcd`: until it leads, every
//! authenticated request is answered 503 naming where the leader serves the API (read from
//! etcd, where the leader announces it), as a standby Flink JobManager points at its leader;
//! once it leads ([`Standby::lead`]), the same listener serves the API itself, so the address
//! never stops answering. A caller without a valid token gets 401, as from the leader.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::api::http::{Request, Response};
use crate::api::listener::{Caller, Routes};
use crate::api::server::Api;
use crate::cluster::ha::LeaderApi;

/// A standby's answers, until it leads.
pub struct Standby {
    api: Arc<Api>,
    leader: LeaderApi,
    leading: AtomicBool,
}

impl Standby {
    /// Answers for `api`'s tenants, pointing them at the leader `leader` finds.
    pub fn new(api: Arc<Api>, leader: LeaderApi) -> Standby {
        Standby { api, leader, leading: AtomicBool::new(false) }
    }

    /// From now on, requests go to the API (this coordinator leads and took its jobs over).
    pub fn lead(&self) {
        self.leading.store(true, Ordering::Release);
    }
}

impl Routes for Standby {
    fn caller(&self, token: Option<&str>) -> Option<Caller> {
        Routes::caller(&*self.api, token)
    }

    fn handle(&self, req: &Request) -> Response {
        if self.leading.load(Ordering::Acquire) {
            return Routes::handle(&*self.api, req);
        }
        let cluster = self.leader.cluster();
        match self.leader.url() {
            Some(url) => Response::error(
                503,
                format!(
                    "this coordinator is a standby of cluster `{cluster}`; its leader serves the API at {url}: send \
                     requests there (weir --server {url})"
                ),
            ),
            None => Response::error(
                503,
                format!(
                    "this coordinator is a standby of cluster `{cluster}` and no leader serves the API yet; retry in a few seconds"
                ),
            ),
        }
    }
}
