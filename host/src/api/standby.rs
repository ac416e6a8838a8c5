//! The tenants' API of a standby `weir coordinator --serve --etcd`: until it leads, every
//! authenticated request is answered 503 naming where the leader serves the API (read from
//! etcd, where the leader announces it), as a standby Flink JobManager points at its leader.
//! A caller without a valid token gets 401, as from the leader.

use std::sync::Arc;

use crate::api::http::{Request, Response};
use crate::api::listener::{Caller, Routes};
use crate::api::server::Api;
use crate::cluster::ha::LeaderApi;

/// A standby's answers.
pub struct Standby {
    api: Arc<Api>,
    leader: LeaderApi,
}

impl Standby {
    /// Answers for `api`'s tenants, pointing them at the leader `leader` finds.
    pub fn new(api: Arc<Api>, leader: LeaderApi) -> Standby {
        Standby { api, leader }
    }
}

impl Routes for Standby {
    fn caller(&self, token: Option<&str>) -> Option<Caller> {
        Routes::caller(&*self.api, token)
    }

    fn handle(&self, _req: &Request) -> Response {
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
