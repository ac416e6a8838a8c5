//! A real PostgreSQL server for a test: Debian's package (installed on first use), `initdb` into
//! a temporary directory, started on a free loopback port with prepared transactions on, and
//! stopped when dropped. As root, the server runs as the `postgres` user (it refuses root).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The directory of PostgreSQL's programs (`initdb`, `postgres`), installing the package once.
fn bin_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let script = "ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1 || { export DEBIAN_FRONTEND=noninteractive; \
             apt-get install -y -q --no-install-recommends postgresql >/dev/null 2>&1 || \
             { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends postgresql >/dev/null; }; }; \
             ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1";
        let out = Command::new("bash").args(["-c", script]).output().expect("running bash");
        assert!(
            out.status.success() && !out.stdout.is_empty(),
            "installing PostgreSQL failed (apt-get install postgresql, as root):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
    .clone()
}

/// (uid, gid) to run the server as: `postgres` when we are root, else ourselves.
fn server_user() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let id = |flag: &str| {
        let out = Command::new("id").args([flag, "postgres"]).output().expect("running id");
        assert!(out.status.success(), "no `postgres` user (the postgresql package creates it)");
        String::from_utf8_lossy(&out.stdout).trim().parse::<u32>().unwrap()
    };
    Some((id("-u"), id("-g")))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A running server.
pub struct PgServer {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
    user: Option<(u32, u32)>,
}

impl PgServer {
    /// A fresh cluster, running (`settings`: extra `-c name=value` pairs).
    pub fn start(settings: &[&str]) -> PgServer {
        let mut s = Self::init();
        s.run(settings, true);
        s
    }

    /// A fresh cluster that accepts only TLS connections, with this certificate and key.
    pub fn start_tls(cert_pem: &str, key_pem: &str) -> PgServer {
        let mut s = Self::init();
        let data = s.dir.path().join("data");
        for (name, text) in [("server.crt", cert_pem), ("server.key", key_pem)] {
            let p = data.join(name);
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
            if let Some((uid, gid)) = s.user {
                std::os::unix::fs::chown(&p, Some(uid), Some(gid)).unwrap();
            }
        }
        // TCP only over TLS (the local socket stays open for nobody but the tests' own checks).
        std::fs::write(data.join("pg_hba.conf"), "local all all trust\nhostssl all all 127.0.0.1/32 trust\n").unwrap();
        s.run(&["ssl=on"], true);
        s
    }

    fn init() -> PgServer {
        let bin = bin_dir();
        let dir = tempfile::Builder::new().prefix("weir-pg").tempdir_in("/tmp").unwrap();
        let user = server_user();
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
        }
        let mut initdb = Command::new(bin.join("initdb"));
        initdb.arg("-D").arg(dir.path().join("data")).args([
            "--auth=trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ]);
        let out = as_user(&mut initdb, user).output().expect("running initdb");
        assert!(out.status.success(), "initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        PgServer { dir, port: free_port(), child: None, user }
    }

    /// Starts the server; when `may_move`, on another free port if its port was taken meanwhile
    /// (the port is picked before the server binds it).
    fn run(&mut self, settings: &[&str], may_move: bool) {
        for _ in 0..5 {
            if self.spawn(settings) {
                return;
            }
            let log = std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
            assert!(may_move, "PostgreSQL exited at start: {log}");
            self.port = free_port();
        }
        panic!("PostgreSQL did not start on any of 5 free ports");
    }

    /// Starts the server on its port; false if it exited before accepting connections.
    fn spawn(&mut self, settings: &[&str]) -> bool {
        let mut cmd = Command::new(bin_dir().join("postgres"));
        cmd.arg("-D").arg(self.dir.path().join("data")).args([
            "-c",
            "listen_addresses=127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-k",
        ]);
        cmd.arg(self.dir.path()).args([
            "-c",
            "max_prepared_transactions=32",
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
        ]);
        for s in settings {
            cmd.args(["-c", s]);
        }
        cmd.stdout(Stdio::null()).stderr(std::fs::File::create(self.dir.path().join("server.log")).unwrap());
        let mut child = as_user(&mut cmd, self.user).spawn().expect("starting postgres");
        let t0 = Instant::now();
        while self.try_client().is_err() {
            if let Ok(Some(_)) = child.try_wait() {
                return false;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "PostgreSQL did not accept connections: {}",
                std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.child = Some(child);
        true
    }

    /// A libpq connection string to database `postgres`.
    pub fn url(&self) -> String {
        format!("host=127.0.0.1 port={} user=postgres dbname=postgres", self.port)
    }

    /// Over the local socket, which every server here accepts without TLS.
    fn try_client(&self) -> Result<postgres::Client, postgres::Error> {
        let url = format!("host={} port={} user=postgres dbname=postgres", self.dir.path().display(), self.port);
        postgres::Client::connect(&url, postgres::NoTls)
    }

    /// A client.
    pub fn client(&self) -> postgres::Client {
        self.try_client().expect("connecting to the test server")
    }

    /// Runs `sql`.
    pub fn exec(&self, sql: &str) {
        self.client().batch_execute(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Stops the server as a crash would (SIGQUIT: immediate shutdown, no checkpoint), then
    /// waits for it to be gone.
    pub fn crash(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling our own child process.
            unsafe { libc::kill(c.id() as i32, libc::SIGQUIT) };
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same data and port.
    pub fn restart(&mut self, settings: &[&str]) {
        self.crash();
        // The same port: jobs name it in their `url`.
        self.run(settings, false);
    }
}

fn as_user(cmd: &mut Command, user: Option<(u32, u32)>) -> &mut Command {
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
        // Its own HOME and no inherited groups' leftovers.
        cmd.env("HOME", "/tmp");
    }
    cmd
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling our own child process.
            unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
