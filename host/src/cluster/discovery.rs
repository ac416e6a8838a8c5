//! How a worker finds the coordinator to register with: a fixed list of addresses tried in
//! turn (`--coordinator`), or the leader etcd names (`--etcd`): the address the elected
//! coordinator campaigned with (its `--advertise`, else its `--listen`), read again before
//! every try, so a worker follows a new leader as soon as it is elected, wherever it runs.
//!
//! Invariant: discovery only proposes an address; whether the worker follows it is decided by
//! the connection's handshake and the follower's epoch fence (a deposed leader etcd still
//! names until its lease lapses is refused or silent, never followed over a newer one).

use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

use crate::cluster::ha;
use crate::io_runtime::io_runtime;

/// Where the coordinators are to be found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Coordinators {
    /// These addresses (HOST:PORT), tried in turn.
    List(Vec<String>),
    /// The leader of cluster `cluster` in the etcd at `endpoints`.
    Etcd {
        /// etcd endpoints (`http://HOST:PORT`).
        endpoints: Vec<String>,
        /// The cluster's name (its keys are under `/weir/<cluster>/`).
        cluster: String,
    },
}

impl Coordinators {
    /// What a log line calls them.
    pub fn describe(&self) -> String {
        match self {
            Coordinators::List(addrs) => addrs.join(","),
            Coordinators::Etcd { endpoints, cluster } => {
                format!("the leader of cluster `{cluster}` in etcd at {}", endpoints.join(","))
            }
        }
    }

    /// Checks the configuration: an error says what to give.
    pub fn check(&self) -> Result<(), String> {
        match self {
            Coordinators::List(a) if a.is_empty() => Err(
                "give the coordinators' addresses (--coordinator HOST:PORT[,HOST:PORT]) or etcd (--etcd URL --cluster NAME)"
                    .into(),
            ),
            Coordinators::Etcd { endpoints, .. } if endpoints.is_empty() => {
                Err("--etcd: give at least one endpoint (http://HOST:PORT)".into())
            }
            Coordinators::Etcd { cluster, .. } => ha::check_cluster_name(cluster),
            Coordinators::List(_) => Ok(()),
        }
    }
}

/// The addresses to try, one at a time.
pub struct Discovery {
    how: Coordinators,
    /// The next address of a list to try.
    next: usize,
    /// The etcd connection, kept while it works.
    client: Option<Client>,
}

/// How long one question to etcd may take.
const ASK: Duration = Duration::from_secs(5);

impl Discovery {
    /// Discovery of `how` (already [`Coordinators::check`]ed).
    pub fn new(how: Coordinators) -> Self {
        Discovery { how, next: 0, client: None }
    }

    /// The next address to try, or why there is none now (try again a little later).
    pub fn next_address(&mut self) -> Result<String, String> {
        match &self.how {
            Coordinators::List(addrs) => {
                let a = addrs.get(self.next % addrs.len().max(1)).cloned().ok_or("no coordinator addresses")?;
                self.next = (self.next + 1) % addrs.len().max(1);
                Ok(a)
            }
            Coordinators::Etcd { endpoints, cluster } => {
                let (endpoints, cluster) = (endpoints.clone(), cluster.clone());
                let asked = self.ask_etcd(&endpoints, &cluster);
                if asked.is_err() {
                    // Connected afresh next time: the endpoint may have moved or restarted.
                    self.client = None;
                }
                asked
            }
        }
    }

    fn ask_etcd(&mut self, endpoints: &[String], cluster: &str) -> Result<String, String> {
        let rt = io_runtime();
        if self.client.is_none() {
            let opts = ConnectOptions::new().with_connect_timeout(ASK).with_timeout(ASK);
            let client = rt
                .block_on(async { tokio::time::timeout(ASK, Client::connect(endpoints, Some(opts))).await })
                .map_err(|_| format!("etcd at {} did not answer", endpoints.join(",")))?
                .map_err(|e| format!("etcd at {}: {e}", endpoints.join(",")))?;
            self.client = Some(client);
        }
        let mut client = self.client.clone().ok_or("no etcd connection")?;
        let election = ha::election_key(cluster);
        let answer = rt
            .block_on(async { tokio::time::timeout(ASK, client.leader(election)).await })
            .map_err(|_| format!("etcd at {} did not answer", endpoints.join(",")))?;
        match answer {
            Ok(r) => leader_address(r.kv().map(|kv| kv.value()), cluster),
            // etcd answers an election without a leader with an error of its own.
            Err(e) if e.to_string().contains("no leader") => {
                Err(format!("cluster `{cluster}` has no leader in etcd yet"))
            }
            Err(e) => Err(format!("etcd at {}: {e}", endpoints.join(","))),
        }
    }
}

/// The address a leader's election value names (pure): UTF-8 HOST:PORT, bounded.
fn leader_address(value: Option<&[u8]>, cluster: &str) -> Result<String, String> {
    let value = value.ok_or_else(|| format!("cluster `{cluster}` has no leader in etcd yet"))?;
    let text = std::str::from_utf8(value)
        .ok()
        .filter(|t| !t.is_empty() && t.len() <= 256 && !t.chars().any(char::is_whitespace))
        .ok_or_else(|| format!("the leader of cluster `{cluster}` in etcd names no address a worker can use"))?;
    Ok(text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_is_tried_in_turn() {
        let mut d = Discovery::new(Coordinators::List(vec!["a:1".into(), "b:2".into()]));
        let tried: Vec<_> = (0..5).map(|_| d.next_address().unwrap()).collect();
        assert_eq!(tried, ["a:1", "b:2", "a:1", "b:2", "a:1"]);
    }

    #[test]
    fn a_configuration_without_coordinators_says_what_to_give() {
        let e = Coordinators::List(vec![]).check().unwrap_err();
        assert!(e.contains("--coordinator") && e.contains("--etcd"), "{e}");
        let e = Coordinators::Etcd { endpoints: vec![], cluster: "c".into() }.check().unwrap_err();
        assert!(e.contains("--etcd"), "{e}");
        let bad = Coordinators::Etcd { endpoints: vec!["http://127.0.0.1:1".into()], cluster: "a/b".into() };
        assert!(bad.check().unwrap_err().contains("--cluster `a/b`"));
    }

    #[test]
    fn a_leaders_value_must_be_an_address() {
        assert_eq!(leader_address(Some(b"10.0.0.7:7070"), "c").unwrap(), "10.0.0.7:7070");
        assert!(leader_address(None, "c").unwrap_err().contains("no leader"));
        for bad in [&b""[..], b"\xff\xfe", b"a b:1", &[b'a'; 300][..]] {
            assert!(leader_address(Some(bad), "c").unwrap_err().contains("names no address"), "{bad:?}");
        }
    }

    /// Nothing listens: a clear error naming etcd, soon, and no panic.
    #[test]
    fn an_unreachable_etcd_is_a_reason_to_wait() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let endpoint = format!("http://127.0.0.1:{port}");
        let mut d = Discovery::new(Coordinators::Etcd { endpoints: vec![endpoint.clone()], cluster: "c".into() });
        let e = d.next_address().unwrap_err();
        assert!(e.contains(&endpoint), "{e}");
    }
}
