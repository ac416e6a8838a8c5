//! A benchmark configuration derived from a job file: the same job with other parallelism,
//! checkpointing, record count, rate or operator, written where the run may put its
//! checkpoints.
//!
//! Invariant: everything the variant does not set is the job file's own; component paths
//! stay pointing at the same files (made absolute, since the variant lives elsewhere).

use std::path::Path;

use thiserror::Error;

/// What to change.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Variant {
    /// Parallelism of every source, operator and sink.
    pub parallelism: Option<u32>,
    /// Checkpoint interval; `Some(0)` turns checkpointing off.
    pub interval_ms: Option<u64>,
    /// `[checkpoint] incremental`.
    pub incremental: Option<bool>,
    /// Records per generator source.
    pub count: Option<u64>,
    /// Records per second per generator subtask (0 = unthrottled).
    pub rate: Option<u64>,
    /// Every operator's component (a path or `native:<name>`).
    pub component: Option<String>,
    /// Every sink becomes a `blackhole` (benchmarks measure the engine, not the disk).
    pub blackhole_sinks: bool,
    /// `[checkpoint] alignment` (`aligned` or `unaligned`).
    pub alignment: Option<&'static str>,
    /// `[checkpoint] alignment_timeout_ms`.
    pub alignment_timeout_ms: Option<u64>,
    /// Every operator's `state_backend` (`memory` or `disk`).
    pub state_backend: Option<&'static str>,
    /// `[limits] memory_mb`.
    pub memory_mb: Option<u64>,
}

/// A job file the variant cannot be applied to.
#[derive(Debug, Error)]
#[error("benchmark job file {path}: {what}")]
pub struct VariantError {
    /// The job file.
    pub path: String,
    /// What is wrong.
    pub what: String,
}

/// `toml` (the job file at `path`) with `v` applied.
pub fn apply(toml_text: &str, path: &Path, v: &Variant) -> Result<String, VariantError> {
    let err = |what: String| VariantError { path: path.display().to_string(), what };
    let mut t: toml::Table = toml_text.parse().map_err(|e| err(format!("not valid TOML: {e}")))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let nodes = |t: &mut toml::Table, section: &str| -> Vec<toml::Table> {
        t.get(section)
            .and_then(|s| s.as_array())
            .map_or(Vec::new(), |a| a.iter().filter_map(|n| n.as_table().cloned()).collect())
    };
    for section in ["source", "operator", "sink"] {
        let mut list = nodes(&mut t, section);
        for n in &mut list {
            if let Some(p) = v.parallelism {
                n.insert("parallelism".into(), toml::Value::Integer(p as i64));
            }
            if section == "operator" {
                let c = match &v.component {
                    Some(c) => c.clone(),
                    None => n.get("component").and_then(|c| c.as_str()).unwrap_or_default().to_string(),
                };
                let c = if c.starts_with("native:") || Path::new(&c).is_absolute() {
                    c
                } else {
                    dir.join(&c).display().to_string()
                };
                n.insert("component".into(), toml::Value::String(c));
            }
            if section == "operator"
                && let Some(b) = v.state_backend
            {
                n.insert("state_backend".into(), toml::Value::String(b.into()));
            }
            if section == "sink" && v.blackhole_sinks {
                n.retain(|k, _| matches!(k, "id" | "inputs" | "parallelism"));
                n.insert("type".into(), toml::Value::String("blackhole".into()));
            }
            if section == "source"
                && n.get("type").and_then(|t| t.as_str()) == Some("nexmark")
                && let Some(c) = v.count
            {
                n.insert("count".into(), toml::Value::Integer(c as i64));
            }
            if section == "source" && n.get("type").and_then(|t| t.as_str()) == Some("generator") {
                if let Some(c) = v.count {
                    n.insert("count".into(), toml::Value::Integer(c as i64));
                }
                if let Some(r) = v.rate {
                    n.insert("rate".into(), toml::Value::Integer(r as i64));
                }
            }
        }
        if !list.is_empty() {
            t.insert(section.into(), toml::Value::Array(list.into_iter().map(toml::Value::Table).collect()));
        }
    }
    if let Some(mb) = v.memory_mb {
        let l = t
            .entry("limits")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .ok_or_else(|| err("[limits] is not a table".into()))?;
        l.insert("memory_mb".into(), toml::Value::Integer(mb as i64));
    }
    if v.interval_ms.is_some() || v.incremental.is_some() || v.alignment.is_some() || v.alignment_timeout_ms.is_some() {
        let c = t
            .entry("checkpoint")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .ok_or_else(|| err("[checkpoint] is not a table".into()))?;
        if let Some(ms) = v.interval_ms {
            c.insert("interval_ms".into(), toml::Value::Integer(ms as i64));
        }
        if let Some(i) = v.incremental {
            c.insert("incremental".into(), toml::Value::Boolean(i));
        }
        if let Some(a) = v.alignment {
            c.insert("alignment".into(), toml::Value::String(a.into()));
        }
        if let Some(ms) = v.alignment_timeout_ms {
            c.insert("alignment_timeout_ms".into(), toml::Value::Integer(ms as i64));
        }
        c.entry("interval_ms").or_insert(toml::Value::Integer(0));
    }
    Ok(toml::to_string(&t).expect("a table always serializes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOB: &str = r#"
[job]
name = "j"
[[source]]
id = "gen"
type = "generator"
count = 10
[[operator]]
id = "op"
component = "../c.wasm"
inputs = [{ from = "gen", partition = "hash" }]
[[sink]]
id = "out"
type = "blackhole"
inputs = [{ from = "op" }]
"#;

    #[test]
    fn applies_what_is_set_and_keeps_the_rest() {
        let v = Variant { parallelism: Some(2), interval_ms: Some(100), count: Some(99), ..Default::default() };
        let out = apply(JOB, Path::new("/b/x/job.toml"), &v).unwrap();
        let t: toml::Table = out.parse().unwrap();
        assert_eq!(t["source"][0]["parallelism"].as_integer(), Some(2));
        assert_eq!(t["sink"][0]["parallelism"].as_integer(), Some(2));
        assert_eq!(t["source"][0]["count"].as_integer(), Some(99));
        assert_eq!(t["operator"][0]["component"].as_str(), Some("/b/x/../c.wasm"));
        assert_eq!(t["checkpoint"]["interval_ms"].as_integer(), Some(100));
        assert_eq!(t["job"]["name"].as_str(), Some("j"));
        let native = Variant { component: Some("native:keyed-count".into()), ..Default::default() };
        let out = apply(JOB, Path::new("/b/x/job.toml"), &native).unwrap();
        assert!(out.contains("component = \"native:keyed-count\""));
        assert!(!out.contains("[checkpoint]"));
        assert!(apply("[job", Path::new("j.toml"), &v).unwrap_err().to_string().contains("j.toml"));
    }

    #[test]
    fn nexmark_counts_and_blackhole_sinks() {
        let job = JOB
            .replace("type = \"generator\"", "type = \"nexmark\"")
            .replace("type = \"blackhole\"", "type = \"file\"\npath = \"out\"");
        let v = Variant { count: Some(7), blackhole_sinks: true, ..Default::default() };
        let t: toml::Table = apply(&job, Path::new("/b/job.toml"), &v).unwrap().parse().unwrap();
        assert_eq!(t["source"][0]["count"].as_integer(), Some(7));
        assert_eq!(t["sink"][0]["type"].as_str(), Some("blackhole"));
        assert!(t["sink"][0].get("path").is_none());
        assert!(t["sink"][0].get("inputs").is_some());
    }
}
