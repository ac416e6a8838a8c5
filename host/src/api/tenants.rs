//! Server mode's tenants (`weir serve --config server.toml`): who may call the API (a bearer
//! token per tenant), what each may use (quotas), and where its files live.
//!
//! ```toml
//! listen = "127.0.0.1:8080"
//! data_dir = "weir-data"        # <data_dir>/<tenant>/{components,files}
//!
//! [[tenant]]
//! name = "acme"
//! token = "a-long-random-secret"
//! max_jobs = 4                  # running at once
//! max_memory_mb = 2048          # sum of memory_mb x operator subtasks over running jobs
//! max_parallelism = 8           # of any node
//! max_subtasks = 64             # threads (sources, operators, sinks) over running jobs
//! max_requests = 8              # API requests in flight at once (more: 429)
//! max_disk_mb = 4096            # its directory: uploads, outputs, checkpoints (more: 507)
//! cpu_weight = 100              # its share of contended CPU, relative to other tenants'
//! max_cpu_cores = 2.0           # optional hard cap, cores per 100 ms window (needs the cgroup)
//! ```
//!
//! The API's front door takes its bounds from the top level (defaults shown):
//!
//! ```toml
//! header_timeout_ms = 10000       # the request head must arrive within this
//! body_timeout_ms = 60000         # the body must arrive within this after the head
//! max_connections = 1024          # open at once, in all
//! max_connections_per_ip = 64     # open at once from one peer address
//! cpu_fairness = "auto"           # CPU shares: "auto" | "cgroup" | "priorities" | "off"
//! cpu_cgroup = "/sys/fs/cgroup/cpu" # the cgroup v1 `cpu` hierarchy ("": none)
//! ```
//!
//! Invariants: a tenant's jobs only read and write under `<data_dir>/<tenant>/` (every path
//! of a submitted job is checked after parsing, before anything runs); a tenant sees only its
//! own jobs — another tenant's job id is answered like a job that does not exist.

use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

/// One tenant.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tenant {
    /// Name (a directory name: letters, digits, `-`, `_`).
    pub name: String,
    /// Bearer token.
    pub token: String,
    /// Jobs running at once.
    #[serde(default = "default_max_jobs")]
    pub max_jobs: u32,
    /// Guest memory over its running jobs: `memory_mb` x operator subtasks, summed.
    #[serde(default = "default_max_memory_mb")]
    pub max_memory_mb: u64,
    /// Parallelism of any node.
    #[serde(default = "default_max_parallelism")]
    pub max_parallelism: u32,
    /// Subtasks (threads: sources, operators, sinks) over its running jobs.
    #[serde(default = "default_max_subtasks")]
    pub max_subtasks: u32,
    /// API requests in flight at once.
    #[serde(default = "default_max_requests")]
    pub max_requests: u32,
    /// Bytes its directory may hold (uploads, job outputs, checkpoints, savepoints), MiB;
    /// uploads and submissions beyond it are refused.
    #[serde(default = "default_max_disk_mb")]
    pub max_disk_mb: u64,
    /// Its share of contended CPU relative to other tenants' (1..=10000, cgroup v2 style).
    #[serde(default = "default_cpu_weight")]
    pub cpu_weight: u32,
    /// A hard cap on its CPU, in cores, per 100 ms window, whatever its guests do (none by
    /// default: a tenant may use idle cores).
    #[serde(default)]
    pub max_cpu_cores: Option<f64>,
}

fn default_max_jobs() -> u32 {
    4
}
fn default_max_memory_mb() -> u64 {
    4096
}
fn default_max_parallelism() -> u32 {
    8
}
fn default_max_subtasks() -> u32 {
    64
}
fn default_max_requests() -> u32 {
    8
}
fn default_max_disk_mb() -> u64 {
    4096
}
fn default_cpu_weight() -> u32 {
    crate::runtime::cpu_shares::DEFAULT_WEIGHT
}

impl Tenant {
    /// A tenant with the default quotas (as `server.toml` gives one that sets none).
    pub fn new(name: &str, token: &str) -> Self {
        Tenant {
            name: name.into(),
            token: token.into(),
            max_jobs: default_max_jobs(),
            max_memory_mb: default_max_memory_mb(),
            max_parallelism: default_max_parallelism(),
            max_subtasks: default_max_subtasks(),
            max_requests: default_max_requests(),
            max_disk_mb: default_max_disk_mb(),
            cpu_weight: default_cpu_weight(),
            max_cpu_cores: None,
        }
    }

    /// The one tenant of a single-job API (`weir run`): no quotas to speak of.
    pub fn local(token: String) -> Self {
        Tenant {
            name: "local".into(),
            token,
            max_jobs: u32::MAX,
            max_memory_mb: u64::MAX,
            max_parallelism: u32::MAX,
            max_subtasks: u32::MAX,
            max_requests: 64,
            max_disk_mb: u64::MAX,
            cpu_weight: default_cpu_weight(),
            max_cpu_cores: None,
        }
    }
}

/// `server.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Root of every tenant's directory.
    pub data_dir: PathBuf,
    /// The tenants.
    #[serde(default)]
    pub tenant: Vec<Tenant>,
    /// The request head must arrive within this, ms.
    #[serde(default)]
    pub header_timeout_ms: Option<u64>,
    /// The body must arrive within this after the head, ms.
    #[serde(default)]
    pub body_timeout_ms: Option<u64>,
    /// Connections open at once, in all.
    #[serde(default)]
    pub max_connections: Option<usize>,
    /// Connections open at once from one peer address.
    #[serde(default)]
    pub max_connections_per_ip: Option<usize>,
    /// How tenants get CPU shares: `auto` (the cgroup below where it can be used, else thread
    /// priorities), `cgroup` (or the server does not start), `priorities`, `off`.
    #[serde(default)]
    pub cpu_fairness: crate::runtime::cpu_shares::Fairness,
    /// Where the cgroup v1 `cpu` hierarchy is mounted (tenants' CPU shares); `""`: none.
    #[serde(default = "default_cpu_cgroup")]
    pub cpu_cgroup: PathBuf,
    /// `[compile]`: bounds of compiling a tenant's component.
    #[serde(default)]
    pub compile: CompileBounds,
    /// `[tls]`: serve the API over TLS with this certificate and key (relative paths against
    /// the file's directory); without it, plain HTTP (keep it on loopback or behind a proxy
    /// that terminates TLS).
    #[serde(default)]
    pub tls: Option<crate::api::tls::TlsFiles>,
}

/// `[compile]` in `server.toml`: each tenant component is compiled in a child process with
/// these bounds (its CPU charged to the tenant's group).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompileBounds {
    /// Wall-clock deadline of one compilation, ms.
    #[serde(default = "default_compile_timeout_ms")]
    pub timeout_ms: u64,
    /// Data memory of the compiler process, MiB.
    #[serde(default = "default_compile_memory_mb")]
    pub memory_mb: u64,
}

impl Default for CompileBounds {
    fn default() -> Self {
        CompileBounds { timeout_ms: default_compile_timeout_ms(), memory_mb: default_compile_memory_mb() }
    }
}

fn default_compile_timeout_ms() -> u64 {
    120_000
}

fn default_compile_memory_mb() -> u64 {
    4096
}

fn default_cpu_cgroup() -> PathBuf {
    "/sys/fs/cgroup/cpu".into()
}

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}

impl ServerConfig {
    /// A configuration with the default front-door bounds.
    pub fn new(listen: String, data_dir: PathBuf, tenant: Vec<Tenant>) -> Self {
        ServerConfig {
            listen,
            data_dir,
            tenant,
            header_timeout_ms: None,
            body_timeout_ms: None,
            max_connections: None,
            max_connections_per_ip: None,
            cpu_fairness: Default::default(),
            cpu_cgroup: default_cpu_cgroup(),
            compile: CompileBounds::default(),
            tls: None,
        }
    }

    /// The API front door's bounds: the defaults, overridden by what the file sets.
    pub fn front_door(&self) -> crate::api::listener::FrontDoor {
        let mut d = crate::api::listener::FrontDoor::default();
        if let Some(ms) = self.header_timeout_ms {
            d.header_timeout = std::time::Duration::from_millis(ms);
        }
        if let Some(ms) = self.body_timeout_ms {
            d.body_deadline = std::time::Duration::from_millis(ms);
        }
        d.max_connections = self.max_connections.unwrap_or(d.max_connections);
        d.max_connections_per_ip = self.max_connections_per_ip.unwrap_or(d.max_connections_per_ip);
        d
    }

    /// Parses and checks `server.toml` (relative `data_dir` against the file's directory, made
    /// absolute).
    pub fn load(path: &Path) -> Result<ServerConfig, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let mut c: ServerConfig = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        if c.data_dir.is_relative() {
            // Absolute, as job files under it are sent to a cluster's workers, whose working
            // directory is their own.
            c.data_dir = std::path::absolute(dir.join(&c.data_dir))
                .map_err(|e| format!("{}: data_dir {}: {e}", path.display(), c.data_dir.display()))?;
        }
        c.tls = c.tls.map(|t| t.relative_to(dir));
        c.check().map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(c)
    }

    /// Names are directory names and unique, tokens long and unique.
    pub fn check(&self) -> Result<(), String> {
        if self.tenant.is_empty() {
            return Err("no [[tenant]]: nobody could use this server".into());
        }
        if self.compile.timeout_ms == 0 || self.compile.memory_mb < 64 {
            return Err("[compile]: timeout_ms must be > 0 and memory_mb >= 64".into());
        }
        for (i, t) in self.tenant.iter().enumerate() {
            if t.name.is_empty() || !t.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                return Err(format!("tenant name `{}` must be letters, digits, `-` or `_`", t.name));
            }
            if let Some(c) = t.max_cpu_cores.filter(|c| !(0.01..=1024.0).contains(c)) {
                return Err(format!("tenant `{}`: max_cpu_cores must be in 0.01..=1024, got {c}", t.name));
            }
            if !(1..=10_000).contains(&t.cpu_weight) {
                return Err(format!("tenant `{}`: cpu_weight must be in 1..=10000, got {}", t.name, t.cpu_weight));
            }
            if t.token.len() < 16 {
                return Err(format!("tenant `{}`: the token must be at least 16 characters", t.name));
            }
            if let Some(o) = self.tenant[..i].iter().find(|o| o.name == t.name || o.token == t.token) {
                return Err(format!("tenants `{}` and `{}` share a name or a token", o.name, t.name));
            }
        }
        Ok(())
    }
}

/// Whether `p` lies inside `root`, judged lexically (a `..` anywhere is refused outright, so
/// no symlink-free normalization is needed to be sure).
pub fn confined(root: &Path, p: &Path) -> bool {
    !p.components().any(|c| matches!(c, Component::ParentDir)) && p.starts_with(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside_the_tenant_directory() {
        let root = Path::new("/data/acme/files");
        assert!(confined(root, Path::new("/data/acme/files/out")));
        assert!(!confined(root, Path::new("/data/acme/files/../../other/files/out")));
        assert!(!confined(root, Path::new("/data/other/files/out")));
        assert!(!confined(root, Path::new("/etc/passwd")));
    }

    #[test]
    fn config_checks_names_and_tokens() {
        let t = |name: &str, token: &str| Tenant {
            name: name.into(),
            token: token.into(),
            max_jobs: 1,
            max_memory_mb: 1,
            max_parallelism: 1,
            max_subtasks: 1,
            max_requests: 1,
            max_disk_mb: 1,
            cpu_weight: 100,
            max_cpu_cores: None,
        };
        let c = |name: &str, token: &str| {
            ServerConfig::new(default_listen(), "/d".into(), vec![t("a", "0123456789abcdef"), t(name, token)])
        };
        assert!(c("b", "fedcba9876543210").check().is_ok());
        assert!(c("a", "fedcba9876543210").check().unwrap_err().contains("share a name or a token"));
        assert!(c("b", "short").check().unwrap_err().contains("at least 16"));
        assert!(c("../b", "fedcba9876543210").check().unwrap_err().contains("letters, digits"));
    }
}
