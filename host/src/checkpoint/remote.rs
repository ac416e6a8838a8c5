//! Checkpoints in S3-compatible object storage (`[checkpoint] dir = "s3://bucket/prefix"`),
//! through the `object_store` crate (Apache Arrow's; the client Arroyo, Delta-rs and
//! DataFusion use). The local checkpoint directory stays the place state files are written
//! and read; this module mirrors it: every state file is uploaded before its subtask's ack,
//! the manifest is created last with a conditional put (`If-None-Match: *`, S3's answer to a
//! missing rename), and a restore downloads the newest complete checkpoint into the local
//! directory first.
//!
//! Invariants: a checkpoint is complete in the store exactly when its manifest exists there
//! (created once, never overwritten); a manifest is created only after every file it names
//! was uploaded; nothing is read back that the store did not return whole; every call is
//! bounded in time (retries included), so an unreachable store fails the checkpoint with an
//! error naming it instead of hanging the coordinator. Credentials, region and endpoint come
//! from the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
//! `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`), as every S3 tool reads them.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as ObjPath;
use object_store::{
    BackoffConfig, ClientConfigKey, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, RetryConfig,
    WriteMultipart,
};
use thiserror::Error;

use crate::io_runtime::io_runtime;

use crate::checkpoint::storage::AtomicFile;

/// Files larger than this go up in parts.
const MULTIPART_BYTES: u64 = 16 << 20;

/// Why the object store refused.
#[derive(Debug, Error)]
pub enum RemoteError {
    /// The URL is not `s3://bucket[/prefix]`.
    #[error("checkpoint storage `{url}`: {why}")]
    Url {
        /// As given.
        url: String,
        /// What is wrong.
        why: String,
    },
    /// A request failed (after retries).
    #[error("object store {url}: {op} `{key}` failed: {source}")]
    Request {
        /// Store URL.
        url: String,
        /// What was attempted.
        op: &'static str,
        /// Object key.
        key: String,
        /// The client's error.
        source: Box<object_store::Error>,
    },
    /// Local I/O around a transfer.
    #[error("object store {url}: {op} `{key}`: {source}")]
    Local {
        /// Store URL.
        url: String,
        /// What was attempted.
        op: &'static str,
        /// Object key.
        key: String,
        /// The local error.
        source: std::io::Error,
    },
    /// The object exists already (a conditional create lost).
    #[error("object store {url}: `{key}` exists already; another process published it")]
    Exists {
        /// Store URL.
        url: String,
        /// Object key.
        key: String,
    },
}

impl RemoteError {
    /// As an I/O error (the storage layer's error type), keeping the message.
    pub fn into_io(self) -> std::io::Error {
        std::io::Error::other(self.to_string())
    }
}

/// One prefix of an S3-compatible bucket.
#[derive(Debug, Clone)]
pub struct Remote {
    store: Arc<AmazonS3>,
    /// `s3://bucket/prefix` (for messages).
    url: String,
    prefix: String,
}

/// `s3://bucket[/prefix]` as (bucket, prefix without surrounding slashes).
pub fn parse_url(url: &str) -> Result<(String, String), String> {
    let rest = url.strip_prefix("s3://").ok_or("only s3://bucket/prefix is supported")?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err("no bucket".into());
    }
    let prefix = prefix.trim_matches('/').to_string();
    if prefix.split('/').any(|p| p == "." || p == ".." || (p.is_empty() && !prefix.is_empty())) {
        return Err("the prefix may not contain empty, `.` or `..` segments".into());
    }
    Ok((bucket.to_string(), prefix))
}

/// Runs `fut` to completion on the object store's runtime. From inside another runtime
/// (the API's), on a helper thread, since a runtime cannot block inside another.
fn block<T: Send>(fut: impl std::future::Future<Output = T> + Send) -> T {
    if tokio::runtime::Handle::try_current().is_ok() {
        std::thread::scope(|s| s.spawn(|| io_runtime().block_on(fut)).join().expect("object store call panicked"))
    } else {
        io_runtime().block_on(fut)
    }
}

impl Remote {
    /// `url` is `s3://bucket[/prefix]`; the rest of the configuration comes from the
    /// environment (see the module docs).
    pub fn open(url: &str) -> Result<Remote, RemoteError> {
        let bad = |why: &str| RemoteError::Url { url: url.to_string(), why: why.to_string() };
        let (bucket, prefix) = parse_url(url).map_err(|why| bad(&why))?;
        // HTTPS through rustls needs a crypto provider; ring, as everywhere else here (a
        // second install is refused, harmlessly).
        let _ = rustls::crypto::ring::default_provider().install_default();
        if prefix.split('/').any(|p| p == "." || p == "..") {
            return Err(bad("the prefix may not contain `.` or `..` segments"));
        }
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(2),
                base: 2.0,
            },
            max_retries: 4,
            retry_timeout: Duration::from_secs(15),
        };
        // Timeouts as settings, not a whole `ClientOptions`, which would drop the client
        // settings the environment gave (`AWS_ALLOW_HTTP`).
        let store = AmazonS3Builder::from_env()
            .with_bucket_name(&bucket)
            .with_retry(retry)
            .with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), "30s")
            .with_config(AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout), "5s")
            .build()
            .map_err(|e| bad(&e.to_string()))?;
        Ok(Remote { store: Arc::new(store), url: format!("s3://{bucket}/{prefix}"), prefix })
    }

    /// The same store under `<prefix>/<name>`.
    pub fn child(&self, name: &str) -> Remote {
        let prefix = if self.prefix.is_empty() { name.to_string() } else { format!("{}/{name}", self.prefix) };
        Remote { store: self.store.clone(), url: format!("{}/{name}", self.url.trim_end_matches('/')), prefix }
    }

    /// `s3://bucket/prefix`.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn key(&self, rel: &str) -> ObjPath {
        if self.prefix.is_empty() { ObjPath::from(rel) } else { ObjPath::from(format!("{}/{rel}", self.prefix)) }
    }

    fn request(&self, op: &'static str, rel: &str) -> impl FnOnce(object_store::Error) -> RemoteError + '_ {
        let key = self.key(rel).to_string();
        move |source| RemoteError::Request { url: self.url.clone(), op, key, source: Box::new(source) }
    }

    fn local(&self, op: &'static str, rel: &str) -> impl FnOnce(std::io::Error) -> RemoteError + '_ {
        let key = self.key(rel).to_string();
        move |source| RemoteError::Local { url: self.url.clone(), op, key, source }
    }

    /// Uploads the local file `local` as `rel` (in parts when large).
    pub fn upload(&self, rel: &str, local: &Path) -> Result<(), RemoteError> {
        let len = std::fs::metadata(local).map_err(self.local("reading for upload", rel))?.len();
        let key = self.key(rel);
        block(async {
            if len <= MULTIPART_BYTES {
                let bytes = std::fs::read(local).map_err(self.local("reading for upload", rel))?;
                self.store.put(&key, PutPayload::from(bytes)).await.map_err(self.request("uploading", rel))?;
                return Ok(());
            }
            let upload = self.store.put_multipart(&key).await.map_err(self.request("starting the upload of", rel))?;
            let mut w = WriteMultipart::new(upload);
            let mut file = std::fs::File::open(local).map_err(self.local("reading for upload", rel))?;
            let mut buf = vec![0u8; 4 << 20];
            loop {
                let n = std::io::Read::read(&mut file, &mut buf).map_err(self.local("reading for upload", rel))?;
                if n == 0 {
                    break;
                }
                w.wait_for_capacity(4).await.map_err(self.request("uploading", rel))?;
                w.write(&buf[..n]);
            }
            w.finish().await.map_err(self.request("finishing the upload of", rel))?;
            Ok(())
        })
    }

    /// Creates `rel` with `bytes` unless it exists ([`RemoteError::Exists`] then).
    pub fn create(&self, rel: &str, bytes: &[u8]) -> Result<(), RemoteError> {
        let key = self.key(rel);
        let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
        block(async {
            match self.store.put_opts(&key, PutPayload::from(bytes.to_vec()), opts).await {
                Ok(_) => Ok(()),
                Err(object_store::Error::AlreadyExists { .. }) => {
                    Err(RemoteError::Exists { url: self.url.clone(), key: key.to_string() })
                }
                Err(e) => Err(self.request("creating", rel)(e)),
            }
        })
    }

    /// Size of `rel`, `None` when it does not exist.
    pub fn size(&self, rel: &str) -> Result<Option<u64>, RemoteError> {
        block(async {
            match self.store.head(&self.key(rel)).await {
                Ok(m) => Ok(Some(m.size)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(self.request("looking up", rel)(e)),
            }
        })
    }

    /// The bytes of `rel` (at most `max`), `None` when it does not exist: one request.
    pub fn read(&self, rel: &str, max: u64) -> Result<Option<Vec<u8>>, RemoteError> {
        block(async {
            let got = match self.store.get(&self.key(rel)).await {
                Ok(g) => g,
                Err(object_store::Error::NotFound { .. }) => return Ok(None),
                Err(e) => return Err(self.request("reading", rel)(e)),
            };
            if got.meta.size > max {
                let too_big = std::io::Error::other(format!("{} bytes, more than the {max} accepted", got.meta.size));
                return Err(self.local("reading", rel)(too_big));
            }
            Ok(Some(got.bytes().await.map_err(self.request("reading", rel))?.to_vec()))
        })
    }

    /// Downloads `rel` into `local` (whole, or not at all: written to a temporary name and
    /// renamed); `max` bounds what is accepted.
    pub fn download(&self, rel: &str, local: &Path, max: u64) -> Result<u64, RemoteError> {
        if let Some(dir) = local.parent() {
            std::fs::create_dir_all(dir).map_err(self.local("downloading", rel))?;
        }
        let mut out = AtomicFile::create(local).map_err(self.local("downloading", rel))?;
        let key = self.key(rel);
        let written = block(async {
            let got = self.store.get(&key).await.map_err(self.request("downloading", rel))?;
            if got.meta.size > max {
                let too_big = std::io::Error::other(format!("{} bytes, more than the {max} accepted", got.meta.size));
                return Err(self.local("downloading", rel)(too_big));
            }
            let mut stream = got.into_stream();
            let mut n = 0u64;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(self.request("downloading", rel))?;
                n += chunk.len() as u64;
                if n > max {
                    let too_big = std::io::Error::other(format!("more than the {max} bytes accepted"));
                    return Err(self.local("downloading", rel)(too_big));
                }
                std::io::Write::write_all(&mut out.file, &chunk).map_err(self.local("downloading", rel))?;
            }
            Ok(n)
        })?;
        out.commit().map_err(self.local("downloading", rel))?;
        Ok(written)
    }

    /// The objects directly under `<prefix>/<dir>/`: name → size (one listing request per
    /// thousand objects).
    pub fn files(&self, dir: &str) -> Result<std::collections::HashMap<String, u64>, RemoteError> {
        let prefix = self.key(dir);
        block(async {
            let listed = self.store.list_with_delimiter(Some(&prefix)).await.map_err(self.request("listing", dir))?;
            Ok(listed.objects.iter().filter_map(|m| Some((m.location.filename()?.to_string(), m.size))).collect())
        })
    }

    /// The names of the "directories" directly under the prefix (`chk-1`, `components`, ...).
    pub fn dirs(&self) -> Result<Vec<String>, RemoteError> {
        let prefix = (!self.prefix.is_empty()).then(|| ObjPath::from(self.prefix.as_str()));
        block(async {
            let listed = self.store.list_with_delimiter(prefix.as_ref()).await.map_err(self.request("listing", ""))?;
            Ok(listed.common_prefixes.iter().filter_map(|p| p.filename().map(str::to_string)).collect())
        })
    }

    /// Deletes every object under `<prefix>/<dir>/`.
    pub fn delete_dir(&self, dir: &str) -> Result<(), RemoteError> {
        let prefix = self.key(dir);
        block(async {
            let mut listed = self.store.list(Some(&prefix));
            let mut keys = Vec::new();
            while let Some(m) = listed.next().await {
                keys.push(m.map_err(self.request("listing", dir))?.location);
            }
            for k in keys {
                match self.store.delete(&k).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(self.request("deleting", dir)(e)),
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_s3_urls_with_a_bucket_and_a_plain_prefix_are_accepted() {
        for bad in ["gs://b/p", "s3://", "s3:///p", "s3://b/../x", "/local/dir"] {
            assert!(Remote::open(bad).is_err(), "{bad} accepted");
        }
        let r = Remote::open("s3://bucket/some/prefix/").unwrap();
        assert_eq!(r.url(), "s3://bucket/some/prefix");
        assert_eq!(r.child("job").key("chk-1/_metadata").to_string(), "some/prefix/job/chk-1/_metadata");
        assert_eq!(Remote::open("s3://bucket").unwrap().child("job").key("x").to_string(), "job/x");
    }
}
