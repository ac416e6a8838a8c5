//! A real etcd for a test: Debian's `etcd-server` (installed on first use), a one-member
//! cluster on free loopback ports with its data in a temporary directory, killed when dropped.

use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The `etcd` program, installing the package once per machine.
fn etcd_bin() -> &'static str {
    static BIN: OnceLock<()> = OnceLock::new();
    BIN.get_or_init(|| {
        let script = "command -v etcd >/dev/null || { export DEBIAN_FRONTEND=noninteractive; \
             apt-get install -y -q --no-install-recommends etcd-server >/dev/null 2>&1 || \
             { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends etcd-server >/dev/null; }; }; \
             command -v etcd";
        let out = Command::new("bash").args(["-c", script]).output().expect("running bash");
        assert!(
            out.status.success(),
            "installing etcd failed (apt-get install etcd-server, as root):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    "etcd"
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A running etcd.
pub struct Etcd {
    _dir: tempfile::TempDir,
    child: Child,
    endpoint: String,
}

impl Etcd {
    /// A fresh one-member cluster, answering requests.
    pub fn start() -> Etcd {
        let dir = tempfile::tempdir().unwrap();
        let (client, peer) = (free_port(), free_port());
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new(etcd_bin())
            .args(["--name", "test", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &endpoint, "--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("test={peer_url}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting etcd");
        let mut e = Etcd { _dir: dir, child, endpoint };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let health = ureq::get(&format!("{}/health", e.endpoint))
                .call()
                .ok()
                .and_then(|mut r| r.body_mut().read_to_string().ok());
            if health.is_some_and(|h| h.contains("true")) {
                return e;
            }
            assert!(e.child.try_wait().unwrap().is_none(), "etcd exited at start");
            assert!(Instant::now() < deadline, "etcd did not become healthy within 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The value of `key`, read through etcd's JSON gateway (`/v3/kv/range`).
    pub fn get(&self, key: &str) -> Option<String> {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let body = serde_json::json!({ "key": b64.encode(key) }).to_string();
        let mut r = ureq::post(&format!("{}/v3/kv/range", self.endpoint)).send(body.as_bytes()).ok()?;
        let v: serde_json::Value = serde_json::from_str(&r.body_mut().read_to_string().ok()?).ok()?;
        let value = v["kvs"].get(0)?["value"].as_str()?;
        String::from_utf8(b64.decode(value).ok()?).ok()
    }

    /// Sets `key` to `value` through etcd's JSON gateway (`/v3/kv/put`).
    pub fn put(&self, key: &str, value: &str) {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let body = serde_json::json!({ "key": b64.encode(key), "value": b64.encode(value) }).to_string();
        ureq::post(&format!("{}/v3/kv/put", self.endpoint)).send(body.as_bytes()).expect("etcd put");
    }

    /// The server's process id (to pause it).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its client URL.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
