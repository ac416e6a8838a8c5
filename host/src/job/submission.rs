//! A tenant's submission of a job file to `weir serve` (or `weir coordinator --serve`), as it
//! arrived: what the server checks and starts, and what a cluster's leader keeps so that the
//! leader elected next starts it again under the same id.
//!
//! Kept in two parts: a small record (JSON in etcd: ids, options and the text's digest) and
//! the text itself in the tenant's directory, `<tenant>/jobs/<number>.toml`, out of reach of
//! the tenant's uploads (which land in `files/`). So what a tenant makes the cluster store in
//! etcd is bounded and small whatever its job files hold, and a text changed on disk since is
//! refused by its digest.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::sandbox::instance::sha256_hex;

/// A tenant's job as it was submitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Submission {
    /// The tenant that submitted it.
    pub tenant: String,
    /// Its id, `<job name>-<number>` (empty until the job file is parsed).
    pub id: String,
    /// The number in its id (unique per server, or per cluster when its leader keeps them).
    pub number: u64,
    /// `?restore=` as the tenant gave it (`latest`, or a savepoint in its files).
    pub restore: Option<String>,
    /// `?allow_non_restored_state=true`.
    pub allow_non_restored_state: bool,
    /// The SHA-256 of `text`.
    pub sha256: String,
    /// The job file as the tenant sent it (kept in [`Submission::text_file`], not in the record).
    #[serde(skip)]
    pub text: String,
    /// The tenant's directory on the server.
    #[serde(skip)]
    pub dir: PathBuf,
}

impl Submission {
    /// A job file `text` the tenant whose directory is `dir` submits, numbered `number`.
    pub fn new(tenant: &str, dir: &Path, number: u64, text: &str) -> Submission {
        Submission {
            tenant: tenant.to_string(),
            id: String::new(),
            number,
            restore: None,
            allow_non_restored_state: false,
            sha256: sha256_hex(text.as_bytes()),
            text: text.to_string(),
            dir: dir.to_path_buf(),
        }
    }

    /// Where its text is kept while it runs.
    pub fn text_file(&self) -> PathBuf {
        self.dir.join("jobs").join(format!("{}.toml", self.number))
    }

    /// Keeps its text in [`Submission::text_file`].
    pub fn keep_text(&self) -> std::io::Result<()> {
        let file = self.text_file();
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        crate::checkpoint::storage::write_atomic(&file, self.text.as_bytes())
    }

    /// Reads its text back (a record loaded from etcd has none), for the tenant whose
    /// directory is `dir`: refused if the file is missing, not UTF-8 or not the text submitted.
    pub fn load_text(&mut self, dir: &Path) -> Result<(), String> {
        self.dir = dir.to_path_buf();
        let file = self.text_file();
        let bytes = std::fs::read(&file).map_err(|e| format!("its job file {}: {e}", file.display()))?;
        if sha256_hex(&bytes) != self.sha256 {
            return Err(format!("its job file {} is not the one submitted (its SHA-256 differs)", file.display()));
        }
        self.text = String::from_utf8(bytes).map_err(|_| format!("its job file {} is not UTF-8", file.display()))?;
        Ok(())
    }

    /// Removes its kept text.
    pub fn drop_text(&self) {
        let _ = std::fs::remove_file(self.text_file());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_text_loads_back_only_while_unchanged() {
        let d = tempfile::tempdir().unwrap();
        let s = Submission::new("t", d.path(), 7, "[job]\nname = \"x\"\n");
        s.keep_text().unwrap();
        let record: Submission = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert!(record.text.is_empty(), "the record holds no text");
        let mut loaded = record.clone();
        loaded.load_text(d.path()).unwrap();
        assert_eq!(loaded, s);
        std::fs::write(s.text_file(), "[job]\nname = \"y\"\n").unwrap();
        let mut changed = record.clone();
        assert!(changed.load_text(d.path()).unwrap_err().contains("not the one submitted"));
        s.drop_text();
        let mut gone = record;
        assert!(gone.load_text(d.path()).unwrap_err().contains("jobs/7.toml"));
    }
}
