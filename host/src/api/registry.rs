//! Where a running `weir run` can be found: `$WEIR_HOME/jobs/<key>.json` (default
//! `~/.weir`), holding its API address, token and pid, readable by its user only. The key is
//! the job name, or `<job>@<pid>` when another live process already runs a job of that name.
//! Written when the API is up, removed when the job ends; an entry whose process is gone is
//! stale and `weir list` removes it.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One registered job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// What commands call it: the job name, or `<job>@<pid>`.
    #[serde(default)]
    pub key: String,
    /// Job name.
    pub job: String,
    /// `127.0.0.1:<port>`.
    pub addr: String,
    /// Bearer token.
    pub token: String,
    /// Process id.
    pub pid: u32,
}

/// `$WEIR_HOME` or `~/.weir`.
pub fn home() -> PathBuf {
    if let Some(h) = std::env::var_os("WEIR_HOME") {
        return PathBuf::from(h);
    }
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(".")).join(".weir")
}

fn dir() -> PathBuf {
    home().join("jobs")
}

fn file(job: &str) -> PathBuf {
    dir().join(format!("{job}.json"))
}

/// Registers `entry` under its job name, or under `<job>@<pid>` if a live process already
/// runs a job of that name. Returns the entry as registered and its file.
pub fn register(entry: &Entry) -> std::io::Result<(Entry, PathBuf)> {
    fs::create_dir_all(dir())?;
    let mut entry = entry.clone();
    entry.key = entry.job.clone();
    if let Some(old) = read(&file(&entry.key))
        && old.pid != entry.pid
        && alive(old.pid)
    {
        entry.key = format!("{}@{}", entry.job, entry.pid);
    }
    let path = file(&entry.key);
    let tmp = dir().join(format!(".{}.json.tmp", entry.key));
    {
        use std::io::Write;
        #[cfg(unix)]
        let mut f = {
            use std::os::unix::fs::OpenOptionsExt;
            fs::OpenOptions::new().create(true).write(true).truncate(true).mode(0o600).open(&tmp)?
        };
        #[cfg(not(unix))]
        let mut f = fs::File::create(&tmp)?;
        f.write_all(serde_json::to_string_pretty(&entry).unwrap().as_bytes())?;
    }
    fs::rename(&tmp, &path)?;
    Ok((entry, path))
}

/// Removes the entry at `path` if it is still ours.
pub fn unregister(path: &Path, pid: u32) {
    if read(path).is_some_and(|e| e.pid == pid) {
        let _ = fs::remove_file(path);
    }
}

fn read(path: &Path) -> Option<Entry> {
    serde_json::from_slice(&fs::read(path).ok()?).ok()
}

/// Whether process `pid` exists.
pub fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The live entry registered as `key` (a job name or `<job>@<pid>`).
pub fn find(key: &str) -> Option<Entry> {
    read(&file(key)).filter(|e| alive(e.pid))
}

/// Every live entry; stale ones are removed.
pub fn list() -> Vec<Entry> {
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir(dir()) else { return out };
    for e in rd.flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "json")
            && let Some(entry) = read(&p)
        {
            if alive(entry.pid) {
                out.push(entry);
            } else {
                let _ = fs::remove_file(&p);
            }
        }
    }
    out.sort_by(|a, b| a.key.cmp(&b.key));
    out
}

/// A random token (hex) from the OS.
pub fn new_token() -> String {
    let mut b = [0u8; 24];
    if let Ok(mut f) = fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b);
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}
