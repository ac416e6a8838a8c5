//! How a worker finds the coordinator to register with: a fixed list of addresses tried in
//! turn (`--coordinator`), or the leader etcd names (`--etcd`): the address the elected
//! coordinator campaigned with (its `--advertise`, else its `--listen`), read again before
//! every try, so a worker follows a new leader as soon as it is elected, wherever it runs.
//!
//! Invariant: discovery only proposes an address; whether the worker follows it is decided by
//! the connection's handshake and the follower's epoch fence (a deposed leader etcd still
//! names until its lease lapses is refused or silent, never followed over a newer one).

use std::time::{Duration, Instant};

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
            Coordinators::Etcd { endpoints, cluster } => {
                for e in endpoints {
                    let rest = e.strip_prefix("http://").or_else(|| e.strip_prefix("https://"));
                    if rest.is_none_or(|r| check_address(r).is_err()) {
                        return Err(format!("--etcd `{e}`: give endpoints as http://HOST:PORT, comma-separated"));
                    }
                }
                ha::check_cluster_name(cluster)
            }
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
    /// The address that last refused this worker (wrong secret, other version), and since when.
    refused: Option<(String, Instant)>,
}

/// How long a refusing address etcd names is retried (it may be a gone leader's, whose lease
/// has not lapsed yet, and something else listening there now) before the worker gives up.
pub const REFUSED_GRACE: Duration = Duration::from_secs(30);

/// How often a worker that keeps waiting for the same reason says so again.
pub const WAITING_REPEAT: Duration = Duration::from_secs(30);

/// Why a worker waits, as last logged (pure).
#[derive(Debug, Default)]
pub struct Waiting {
    last: Option<(String, Instant)>,
}

impl Waiting {
    /// Whether to log `why` at `now`: `Some(false)` for a new reason, `Some(true)` for the same
    /// one again after [`WAITING_REPEAT`], `None` to keep quiet.
    pub fn says(&mut self, why: &str, now: Instant) -> Option<bool> {
        let said = match &self.last {
            Some((w, at)) if w == why => (now.duration_since(*at) >= WAITING_REPEAT).then_some(true),
            _ => Some(false),
        };
        if said.is_some() {
            self.last = Some((why.to_string(), now));
        }
        said
    }
}

/// How long one question to etcd may take.
const ASK: Duration = Duration::from_secs(5);

impl Discovery {
    /// Discovery of `how` (already [`Coordinators::check`]ed).
    pub fn new(how: Coordinators) -> Self {
        Discovery { how, next: 0, client: None, refused: None }
    }

    /// `address` refused this worker at `now`: whether to give up. A listed coordinator that
    /// refuses is believed at once; an address read from etcd after [`REFUSED_GRACE`] of
    /// refusals (before that, etcd may still name a leader that is gone).
    pub fn refused(&mut self, address: &str, now: Instant) -> bool {
        if matches!(self.how, Coordinators::List(_)) {
            return true;
        }
        match &self.refused {
            Some((a, since)) if a == address => now.duration_since(*since) >= REFUSED_GRACE,
            _ => {
                self.refused = Some((address.to_string(), now));
                false
            }
        }
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
                self.ask_etcd(&endpoints, &cluster)
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
        let answer = rt.block_on(async { tokio::time::timeout(ASK, client.leader(election)).await });
        match answer {
            Ok(Ok(r)) => leader_address(r.kv().map(|kv| kv.value()), cluster),
            // etcd answers an election without a leader with an error of its own.
            Ok(Err(e)) if e.to_string().contains("no leader") => {
                Err(format!("cluster `{cluster}` has no leader in etcd yet"))
            }
            // Connected afresh next time: the endpoint may have moved or restarted.
            Ok(Err(e)) => {
                self.client = None;
                Err(format!("etcd at {}: {e}", endpoints.join(",")))
            }
            Err(_) => {
                self.client = None;
                Err(format!("etcd at {} did not answer", endpoints.join(",")))
            }
        }
    }
}

/// The address a leader's election value names (pure): HOST:PORT ([`check_address`]).
fn leader_address(value: Option<&[u8]>, cluster: &str) -> Result<String, String> {
    let value = value.ok_or_else(|| format!("cluster `{cluster}` has no leader in etcd yet"))?;
    let text = std::str::from_utf8(value)
        .ok()
        .filter(|t| check_address(t).is_ok())
        .ok_or_else(|| format!("the leader of cluster `{cluster}` in etcd names no address a worker can use"))?;
    Ok(text.to_string())
}

/// Checks a HOST:PORT a coordinator advertises (pure): at most 256 bytes of host-name and IP
/// characters (`[A-Za-z0-9.-_]`, or `[...]` for IPv6), then a port from 1 to 65535.
pub fn check_address(text: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("`{}`: {why}; give HOST:PORT", text.escape_debug()));
    if text.is_empty() || text.len() > 256 {
        return bad("empty or longer than 256 bytes");
    }
    let Some((host, port)) = text.rsplit_once(':') else { return bad("no port") };
    if !port.parse::<u16>().is_ok_and(|p| p > 0) {
        return bad("the port is not 1..65535");
    }
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '[' | ']');
    if host.is_empty() || !host.chars().all(ok) {
        return bad("not a host name or IP address");
    }
    Ok(())
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
        assert_eq!(leader_address(Some(b"[::1]:7070"), "c").unwrap(), "[::1]:7070");
        assert!(leader_address(Some(b"coordinator-0.weir-coordinator.weir.svc:7070"), "c").is_ok());
        assert!(leader_address(None, "c").unwrap_err().contains("no leader"));
        let long = [&[b'a'; 300][..], b":1"].concat();
        for bad in [
            &b""[..],
            b"\xff\xfe",
            b"a b:1",
            &long,
            b"host",
            b"h:0",
            b"h:99999",
            b"\x1b[31mh:1",
            b"h\0:1",
            b"http://h:1",
        ] {
            assert!(leader_address(Some(bad), "c").unwrap_err().contains("names no address"), "{bad:?}");
        }
    }

    #[test]
    fn endpoints_that_are_not_urls_are_refused_at_start() {
        for e in [" http://a:2379", "a:2379", "http://", "http://a b:1"] {
            let c = Coordinators::Etcd { endpoints: vec![e.into()], cluster: "c".into() };
            assert!(c.check().unwrap_err().contains("--etcd"), "{e}");
        }
        let ok = Coordinators::Etcd { endpoints: vec!["https://etcd.etcd.svc:2379".into()], cluster: "c".into() };
        assert!(ok.check().is_ok());
    }

    /// A new reason is said at once, the same one again only every [`WAITING_REPEAT`].
    #[test]
    fn a_waiting_worker_says_each_new_reason_and_repeats_an_old_one_slowly() {
        let (mut w, t0) = (Waiting::default(), Instant::now());
        assert_eq!(w.says("no leader", t0), Some(false));
        assert_eq!(w.says("no leader", t0 + Duration::from_secs(1)), None);
        assert_eq!(w.says("h:1 does not resolve", t0 + Duration::from_secs(2)), Some(false));
        assert_eq!(w.says("h:1 does not resolve", t0 + Duration::from_secs(20)), None);
        assert_eq!(w.says("h:1 does not resolve", t0 + Duration::from_secs(33)), Some(true));
    }

    /// A refusing address from etcd is retried for a while (it may be a gone leader's); a
    /// listed one is believed at once.
    #[test]
    fn a_refusal_ends_the_worker_only_once_it_is_surely_meant() {
        let t0 = Instant::now();
        let mut listed = Discovery::new(Coordinators::List(vec!["a:1".into()]));
        assert!(listed.refused("a:1", t0));
        let mut by_etcd =
            Discovery::new(Coordinators::Etcd { endpoints: vec!["http://127.0.0.1:1".into()], cluster: "c".into() });
        assert!(!by_etcd.refused("a:1", t0));
        assert!(!by_etcd.refused("a:1", t0 + Duration::from_secs(10)));
        assert!(!by_etcd.refused("b:1", t0 + Duration::from_secs(20)), "another address starts afresh");
        assert!(!by_etcd.refused("b:1", t0 + Duration::from_secs(40)));
        assert!(by_etcd.refused("b:1", t0 + Duration::from_secs(51)));
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
