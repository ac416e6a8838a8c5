//! A real S3-protocol server for tests: moto's server (PyPI `moto[s3]`, its own process on
//! loopback, objects in memory), installed once per target directory into a virtualenv. It
//! implements conditional creates (`If-None-Match: *`), which checkpoint publishing needs.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const MOTO: &str = "5.2.5";

/// The virtualenv's python, with moto installed (once).
fn python() -> PathBuf {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("moto-{MOTO}"));
        let py = venv.join("bin/python");
        if !py.exists() || !venv.join("installed").exists() {
            // Under a lock: examples/cluster/run.sh (run by a test, in its own process)
            // installs the same one.
            let script = format!(
                "mkdir -p {d} && flock {v}.lock bash -c '[ -f {v}/installed ] || {{ python3 -m venv {v} && \
                 {v}/bin/pip install --quiet --disable-pip-version-check \"moto[s3]=={MOTO}\" flask flask-cors \
                 && touch {v}/installed; }}'",
                d = venv.parent().unwrap().display(),
                v = venv.display()
            );
            let out = Command::new("bash").args(["-c", &script]).output().expect("running bash");
            assert!(
                out.status.success(),
                "installing moto (pip, python3 with venv) failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        py
    })
    .clone()
}

/// A running moto server with one bucket, `weir`.
pub struct S3Server {
    child: Child,
    port: u16,
}

impl S3Server {
    /// Starts a server on a free loopback port and creates the bucket.
    pub fn start() -> S3Server {
        let py = python();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(py)
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting moto");
        let server = S3Server { child, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        // Creating the bucket is the readiness probe (moto accepts it unsigned).
        loop {
            let r = ureq::put(&format!("{}/weir", server.endpoint())).send_empty();
            if r.is_ok() {
                break;
            }
            assert!(Instant::now() < deadline, "moto did not start on port {port}: {r:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The environment a `weir` process reads the store's settings from.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        env_for(&self.endpoint())
    }

    /// An independent client of the bucket, and a runtime to drive it.
    fn client(&self) -> (object_store::aws::AmazonS3, tokio::runtime::Runtime) {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let s3 = object_store::aws::AmazonS3Builder::new()
            .with_endpoint(self.endpoint())
            .with_allow_http(true)
            .with_bucket_name("weir")
            .with_access_key_id("test")
            .with_secret_access_key("test")
            .with_region("us-east-1")
            .build()
            .unwrap();
        (s3, tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap())
    }

    /// The bytes of `key`.
    pub fn get(&self, key: &str) -> Vec<u8> {
        use object_store::ObjectStoreExt;
        let (s3, rt) = self.client();
        rt.block_on(async {
            let got = s3.get(&object_store::path::Path::from(key)).await.expect("reading from the bucket");
            got.bytes().await.unwrap().to_vec()
        })
    }

    /// Keys under `prefix`, listed through the S3 API by an independent client.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        use futures_util::StreamExt;
        use object_store::ObjectStore;
        let (s3, rt) = self.client();
        rt.block_on(async {
            let prefix = object_store::path::Path::from(prefix);
            let mut listed = s3.list(Some(&prefix));
            let mut keys = Vec::new();
            while let Some(m) = listed.next().await {
                keys.push(m.expect("listing the bucket").location.to_string());
            }
            keys.sort();
            keys
        })
    }
}

/// The S3 settings for an endpoint (test credentials; moto accepts any).
pub fn env_for(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", endpoint.to_string()),
        ("AWS_ALLOW_HTTP", "true".into()),
        ("AWS_ACCESS_KEY_ID", "test".into()),
        ("AWS_SECRET_ACCESS_KEY", "test".into()),
        ("AWS_REGION", "us-east-1".into()),
    ]
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
