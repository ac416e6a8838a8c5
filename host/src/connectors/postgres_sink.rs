//! The PostgreSQL sink: record values (JSON objects or CSV lines) appended or upserted into a
//! table, exactly-once by two-phase commit on checkpoints.
//!
//! Lifecycle of the rows a subtask writes between two barriers:
//! 1. written inside one transaction (`BEGIN` at the first batch after a barrier; one
//!    `INSERT ... SELECT FROM json_populate_recordset(...)` per batch);
//! 2. **pre-committed** at checkpoint `c`'s barrier: `PREPARE TRANSACTION '<prefix>/<s>/<c>'`
//!    (durable on the server, invisible to readers), and recorded in the subtask's
//!    checkpointed [`SinkState`] as pending `(c, 0)`;
//! 3. **committed** when checkpoint `c` completes: `COMMIT PREPARED` for every pending
//!    transaction of `c` or older.
//!
//! A prepared transaction keeps its row locks until it commits, so rows that arrive while one
//! is pending are kept in memory and written once it is committed (an upsert of the same key
//! would otherwise wait on it forever); the next barrier waits for that (`must_settle`). If
//! the newest pre-committed checkpoint is aborted, the pending transactions are rolled back and
//! their rows written again for the next checkpoint.
//!
//! On start the sink finishes what the restored checkpoint pre-committed (`COMMIT PREPARED`;
//! one that no longer exists was committed already) and rolls back every other prepared
//! transaction of its subtask (work after the checkpoint, replayed anyway), of subtasks it
//! adopts on a rescale, and (subtask 0) of subtask indexes the job no longer has. A commit
//! that fails (the database down at that moment) fails the subtask; the restart commits it
//! from the checkpoint. Invariant: a visible row is covered by exactly one complete
//! checkpoint.
//!
//! The table is checked before the job starts: it exists, has every mapped column, and for
//! upserts a unique index on exactly the key columns; the server allows prepared transactions
//! and does not end idle transactions sooner than the checkpoint interval.

use std::str::FromStr;
use std::time::Duration;

use std::sync::Arc;

use postgres::Client;
use postgres::error::SqlState;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::checkpoint::snapshot::SinkState;
use crate::graph::logical::{PostgresTarget, ValueFormat};
use crate::ids::CheckpointId;
use crate::record::{Batch, RecordRef};

/// Longest transaction id PostgreSQL accepts, bytes.
pub const MAX_GID: usize = 199;
/// Longest `transaction_prefix`, bytes (room for `/<subtask>/<checkpoint>`).
pub const MAX_PREFIX: usize = 160;

/// Why the sink failed: a sentence naming the table, the database and what to do.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct PgSinkError {
    /// The sentence.
    pub message: String,
    /// The database could not be reached (or went away): an outage, not a mistake.
    pub transient: bool,
}

impl PgSinkError {
    fn new(message: impl Into<String>) -> Self {
        PgSinkError { message: message.into(), transient: false }
    }
}

/// Whether `e` is the database being unreachable or going away rather than a refused
/// statement: no server error at all (I/O, closed connection) or a connection-class one.
fn is_outage(e: &postgres::Error) -> bool {
    match e.code() {
        None => true,
        Some(c) => {
            c.code().starts_with("08")
                || [SqlState::ADMIN_SHUTDOWN, SqlState::CRASH_SHUTDOWN, SqlState::CANNOT_CONNECT_NOW].contains(c)
        }
    }
}

type Result<T> = std::result::Result<T, PgSinkError>;

/// `"a"."b"` for `a.b`: each part quoted, quotes doubled.
pub fn quote_name(name: &str) -> String {
    name.split('.').map(quote_ident).collect::<Vec<_>>().join(".")
}

fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Where a connection string points, without its password.
pub fn describe_url(url: &str) -> String {
    match postgres::Config::from_str(url) {
        Ok(c) => {
            let hosts: Vec<String> = c
                .get_hosts()
                .iter()
                .map(|h| match h {
                    postgres::config::Host::Tcp(h) => h.clone(),
                    postgres::config::Host::Unix(p) => p.display().to_string(),
                })
                .collect();
            let port = c.get_ports().first().copied().unwrap_or(5432);
            format!("database `{}` at {}:{port}", c.get_dbname().unwrap_or("(default)"), hosts.join(","))
        }
        Err(_) => "an unparsable connection string".into(),
    }
}

/// The transaction id of subtask `subtask`'s transaction for checkpoint `chk`.
pub fn gid(prefix: &str, subtask: u32, chk: u64) -> String {
    format!("{prefix}/{subtask}/{chk}")
}

/// (subtask, checkpoint) of a transaction id under `prefix`.
fn parse_gid(prefix: &str, gid: &str) -> Option<(u32, u64)> {
    let rest = gid.strip_prefix(prefix)?.strip_prefix('/')?;
    let (s, c) = rest.split_once('/')?;
    Some((s.parse().ok()?, c.parse().ok()?))
}

/// The SQL statements of one target (pure: tested without a server).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statements {
    /// One batch: `$1` is a JSON array of objects.
    pub insert: String,
}

impl Statements {
    /// The statements writing `columns` of `target`.
    pub fn new(target: &PostgresTarget, columns: &[String]) -> Self {
        let table = quote_name(&target.table);
        let cols = columns.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", ");
        let rows = format!("json_populate_recordset(null::{table}, $1::text::json) WITH ORDINALITY AS r");
        let insert = if target.upsert_key.is_empty() {
            format!("INSERT INTO {table} ({cols}) SELECT {cols} FROM {rows} ORDER BY r.ordinality")
        } else {
            // One row per key and batch (the last one written wins), as ON CONFLICT cannot
            // touch a row twice in one statement.
            let keys = target.upsert_key.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
            let set: Vec<String> = columns
                .iter()
                .filter(|c| !target.upsert_key.contains(c))
                .map(|c| format!("{0} = EXCLUDED.{0}", quote_ident(c)))
                .collect();
            let action = if set.is_empty() { "NOTHING".to_string() } else { format!("UPDATE SET {}", set.join(", ")) };
            format!(
                "INSERT INTO {table} ({cols}) SELECT {cols} FROM (SELECT DISTINCT ON ({keys}) {cols} FROM {rows} \
                 ORDER BY {keys}, r.ordinality DESC) AS d ON CONFLICT ({keys}) DO {action}"
            )
        };
        Statements { insert }
    }
}

/// Appends record `rec`'s value to the JSON array being built in `out` (without brackets).
/// `keys` are the columns as JSON strings (quoted and escaped), for CSV values.
pub fn append_row(out: &mut String, format: &ValueFormat, keys: &[String], rec: &RecordRef<'_>) -> Result<()> {
    if !out.is_empty() {
        out.push(',');
    }
    let text = std::str::from_utf8(rec.value).map_err(|e| PgSinkError::new(format!("the value is not UTF-8 ({e})")))?;
    match format {
        ValueFormat::Json => {
            serde_json::from_str::<serde::de::IgnoredAny>(text)
                .map_err(|e| PgSinkError::new(format!("the value is not JSON ({e})")))?;
            if !text.trim_start().starts_with('{') {
                return Err(PgSinkError::new("the value is JSON but not an object of column values"));
            }
            out.push_str(text);
        }
        ValueFormat::Csv { delimiter } => csv_object(out, text, *delimiter, keys)?,
    }
    Ok(())
}

/// One CSV line as a JSON object of `keys`: fields separated by `delimiter`, a field in double
/// quotes may hold the delimiter and `""` (a quote); an empty unquoted field is NULL (as in
/// PostgreSQL's own CSV format), a quoted one the empty string.
fn csv_object(out: &mut String, line: &str, delimiter: u8, keys: &[String]) -> Result<()> {
    let b = line.as_bytes();
    let mut i = 0;
    let mut n = 0;
    out.push('{');
    loop {
        if n == keys.len() {
            return Err(too_many_fields(line, delimiter, keys));
        }
        if n > 0 {
            out.push(',');
        }
        out.push_str(&keys[n]);
        out.push(':');
        if b.get(i) == Some(&b'"') {
            let mut field = String::new();
            let mut j = i + 1;
            loop {
                match b.get(j) {
                    None => return Err(PgSinkError::new(format!("CSV field {} has no closing quote", n + 1))),
                    Some(b'"') if b.get(j + 1) == Some(&b'"') => {
                        field.push('"');
                        j += 2;
                    }
                    Some(b'"') => break,
                    Some(_) => {
                        let next = b[j + 1..].iter().position(|&c| c == b'"').map_or(b.len(), |p| j + 1 + p);
                        field.push_str(&line[j..next]);
                        j = next;
                    }
                }
            }
            json_string(out, &field);
            i = j + 1;
            if i < b.len() && b[i] != delimiter {
                return Err(PgSinkError::new(format!("CSV field {} has text after its closing quote", n + 1)));
            }
        } else {
            let end = b[i..].iter().position(|&c| c == delimiter).map_or(b.len(), |p| i + p);
            let field = line[i..end].trim_end_matches(['\r', '\n']);
            if field.is_empty() {
                out.push_str("null");
            } else {
                json_string(out, field);
            }
            i = end;
        }
        n += 1;
        if i >= b.len() {
            break;
        }
        i += 1; // the delimiter
        if i == b.len() {
            // A trailing delimiter: one more, empty field.
            if n == keys.len() {
                return Err(too_many_fields(line, delimiter, keys));
            }
            out.push(',');
            out.push_str(&keys[n]);
            out.push_str(":null");
            n += 1;
            break;
        }
    }
    if n != keys.len() {
        return Err(PgSinkError::new(format!("the CSV line has {n} field(s) for {} column(s)", keys.len())));
    }
    out.push('}');
    Ok(())
}

fn too_many_fields(line: &str, delimiter: u8, keys: &[String]) -> PgSinkError {
    let fields = line.split(delimiter as char).count();
    PgSinkError::new(format!("the CSV line has {fields} field(s) or more for {} column(s)", keys.len()))
}

/// `s` as a JSON string literal.
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The columns as JSON object keys.
pub fn json_keys(columns: &[String]) -> Vec<String> {
    columns.iter().map(|c| serde_json::Value::from(c.as_str()).to_string()).collect()
}

/// What opening a sink subtask needs besides its target.
#[derive(Debug, Clone)]
pub struct Opening<'a> {
    /// The sink's subtask index and parallelism.
    pub subtask: u32,
    /// Parallelism of the sink in this run.
    pub parallelism: u32,
    /// The restored checkpoint's state of this subtask.
    pub restored: Option<&'a SinkState>,
    /// Subtasks this one adopts on a rescale to fewer (their old index and state).
    pub adopted: &'a [(u32, SinkState)],
    /// The checkpoint interval, if checkpointing is on.
    pub checkpoint_interval: Option<Duration>,
}

/// One sink subtask's transactional writer.
pub struct PostgresSink {
    client: Client,
    target: PostgresTarget,
    /// The columns written, as JSON object keys (CSV values become objects of them).
    keys: Vec<String>,
    /// The insert, prepared once per connection.
    insert_stmt: Option<postgres::Statement>,
    subtask: u32,
    in_transaction: bool,
    /// Prepared transactions not known committed: (checkpoint, 0), as [`SinkState`] has them.
    pending: Vec<(u64, u64)>,
    /// The rows (JSON arrays, one per batch) of each pending transaction, to write again if
    /// its checkpoint is aborted.
    prepared_rows: Vec<Vec<String>>,
    /// The rows of the open transaction.
    current_rows: Vec<String>,
    /// Rows that arrived while a prepared transaction was pending (it holds the locks they may
    /// need: writing them now could wait on it forever).
    deferred: Vec<String>,
    /// The newest checkpoint pre-committed.
    last_precommit: Option<u64>,
    where_: String,
}

impl PostgresSink {
    /// Connects, checks the table and the server, and finishes the restored checkpoint's
    /// transactions (rolling back every other one of this subtask's).
    pub fn open(target: &PostgresTarget, o: Opening<'_>) -> Result<Self> {
        let where_ = describe_url(&target.url);
        let mut config = postgres::Config::from_str(&target.url)
            .map_err(|e| PgSinkError::new(format!("`url` is not a PostgreSQL connection string: {e}")))?;
        config.connect_timeout(Duration::from_secs(10)).application_name("weir");
        let client = config.connect(tls(target.ca_cert.as_deref())?).map_err(|e| PgSinkError {
            message: format!("cannot connect to {where_}: {}; check `url` and that the server is running", chain(&e)),
            transient: is_outage(&e),
        })?;
        let mut sink = PostgresSink {
            client,
            target: target.clone(),
            keys: Vec::new(),
            insert_stmt: None,
            subtask: o.subtask,
            in_transaction: false,
            pending: Vec::new(),
            prepared_rows: Vec::new(),
            current_rows: Vec::new(),
            deferred: Vec::new(),
            last_precommit: None,
            where_,
        };
        sink.check_server(o.checkpoint_interval)?;
        let columns = sink.check_table()?;
        sink.keys = json_keys(&columns);
        let insert = Statements::new(&sink.target, &columns).insert;
        let stmt = sink.client.prepare(&insert).map_err(sink.db("preparing the insert"))?;
        sink.insert_stmt = Some(stmt);
        sink.recover(&o)?;
        Ok(sink)
    }

    fn db(&self, what: &str) -> impl Fn(postgres::Error) -> PgSinkError + '_ {
        let what = what.to_string();
        move |e| PgSinkError {
            message: format!("{what} in {}: {}", self.where_, db_message(&e)),
            transient: is_outage(&e),
        }
    }

    fn setting(&mut self, name: &str) -> Result<String> {
        let row =
            self.client.query_one("SELECT current_setting($1)", &[&name]).map_err(self.db("reading a setting"))?;
        Ok(row.get(0))
    }

    /// Prepared transactions are on; idle transactions live longer than a checkpoint interval.
    fn check_server(&mut self, interval: Option<Duration>) -> Result<()> {
        let Some(interval) = interval else { return Ok(()) };
        let max: i64 = self.setting("max_prepared_transactions")?.parse().unwrap_or(0);
        if max <= 0 {
            return Err(PgSinkError::new(format!(
                "{} has max_prepared_transactions = 0; exactly-once needs prepared transactions: set it to at least \
                 twice the sink's parallelism in postgresql.conf and restart the server",
                self.where_
            )));
        }
        let idle = self.setting("idle_in_transaction_session_timeout")?;
        let idle_ms = parse_pg_duration_ms(&idle).unwrap_or(0);
        if idle_ms > 0 && idle_ms <= interval.as_millis() as u64 {
            return Err(PgSinkError::new(format!(
                "{}: idle_in_transaction_session_timeout = {idle} is not longer than the job's checkpoint interval \
                 ([checkpoint] interval_ms = {}): the server would end the sink's transaction between two \
                 checkpoints; raise the timeout or lower interval_ms",
                self.where_,
                interval.as_millis()
            )));
        }
        Ok(())
    }

    /// The columns written: the table has them all (and the upsert key a unique index).
    fn check_table(&mut self) -> Result<Vec<String>> {
        let table = self.target.table.clone();
        let quoted = quote_name(&table);
        let exists: Option<String> = self
            .client
            .query_one("SELECT to_regclass($1)::text", &[&quoted])
            .map_err(self.db("looking up the table"))?
            .get(0);
        if exists.is_none() {
            return Err(PgSinkError::new(format!(
                "table `{table}` does not exist in {}; create it before starting the job",
                self.where_
            )));
        }
        let have: Vec<String> = self
            .client
            .query(
                "SELECT attname::text FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 \
                 AND NOT attisdropped ORDER BY attnum",
                &[&quoted],
            )
            .map_err(self.db("reading the table's columns"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let columns = if self.target.columns.is_empty() { have.clone() } else { self.target.columns.clone() };
        for c in columns.iter().chain(&self.target.upsert_key) {
            if !have.contains(c) {
                return Err(PgSinkError::new(format!(
                    "table `{table}` in {} has no column `{c}` (it has {}); fix `columns`/`key` or the table",
                    self.where_,
                    have.join(", ")
                )));
            }
        }
        if !self.target.upsert_key.is_empty() {
            self.check_unique_key(&quoted)?;
        }
        Ok(columns)
    }

    fn check_unique_key(&mut self, quoted: &str) -> Result<()> {
        let indexes: Vec<Vec<String>> = self
            .client
            .query(
                "SELECT array(SELECT attname::text FROM pg_attribute a WHERE a.attrelid = i.indrelid \
                 AND a.attnum = ANY(i.indkey)) FROM pg_index i WHERE i.indrelid = to_regclass($1) \
                 AND i.indisunique AND i.indpred IS NULL",
                &[&quoted],
            )
            .map_err(self.db("reading the table's unique indexes"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut key = self.target.upsert_key.clone();
        key.sort();
        if indexes.iter().any(|cols| {
            let mut cols = cols.clone();
            cols.sort();
            cols == key
        }) {
            return Ok(());
        }
        Err(PgSinkError::new(format!(
            "table `{}` in {} has no unique index or primary key on exactly ({}), which an upsert needs; \
             add one (ALTER TABLE ... ADD PRIMARY KEY ({})) or use mode = \"append\"",
            self.target.table,
            self.where_,
            self.target.upsert_key.join(", "),
            self.target.upsert_key.join(", ")
        )))
    }

    /// Commits what the restored checkpoint (and adopted subtasks') pre-committed; rolls back
    /// every other prepared transaction this subtask answers for.
    fn recover(&mut self, o: &Opening<'_>) -> Result<()> {
        let prefix = self.target.transaction_prefix.clone();
        let mut commit: Vec<String> = Vec::new();
        for (s, st) in o.restored.map(|st| (o.subtask, st)).into_iter().chain(o.adopted.iter().map(|(s, st)| (*s, st)))
        {
            commit.extend(st.pending.iter().map(|(c, _)| gid(&prefix, s, *c)));
        }
        let adopted: Vec<u32> = o.adopted.iter().map(|(s, _)| *s).collect();
        let lingering: Vec<String> = self
            .client
            .query(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND starts_with(gid, $1)",
                &[&format!("{prefix}/")],
            )
            .map_err(self.db("listing prepared transactions"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        for g in lingering {
            let Some((s, _)) = parse_gid(&prefix, &g) else { continue };
            let mine = s == o.subtask || adopted.contains(&s) || (o.subtask == 0 && s >= o.parallelism);
            if !mine {
                continue;
            }
            let sql = if commit.contains(&g) { "COMMIT PREPARED" } else { "ROLLBACK PREPARED" };
            match self.client.batch_execute(&format!("{sql} {}", quote_literal(&g))) {
                Ok(()) => {}
                // Another subtask or an earlier attempt finished it first.
                Err(e) if e.code() == Some(&SqlState::UNDEFINED_OBJECT) => {}
                Err(e) => return Err(self.db(&format!("finishing prepared transaction `{g}`"))(e)),
            }
        }
        Ok(())
    }

    /// Writes a batch (inside the current transaction), or keeps it for later while a
    /// prepared transaction is pending.
    pub fn write(&mut self, batch: &Batch, describe: impl Fn(u32) -> String) -> Result<()> {
        let mut rows = String::new();
        for (i, rec) in batch.iter().enumerate() {
            append_row(&mut rows, &self.target.format, &self.keys, &rec)
                .map_err(|e| PgSinkError::new(format!("{}: {e}", describe(i as u32))))?;
        }
        if rows.is_empty() {
            return Ok(());
        }
        let array = format!("[{rows}]");
        if self.pending.is_empty() {
            self.insert(array)
        } else {
            self.deferred.push(array);
            Ok(())
        }
    }

    fn insert(&mut self, array: String) -> Result<()> {
        if !self.in_transaction {
            self.client.batch_execute("BEGIN").map_err(self.db("starting a transaction"))?;
            self.in_transaction = true;
        }
        let table = self.target.table.clone();
        let stmt = self.insert_stmt.as_ref().expect("prepared at open");
        self.client.execute(stmt, &[&array]).map_err(self.db(&format!("writing into `{table}`")))?;
        self.current_rows.push(array);
        Ok(())
    }

    /// Writes what was kept while a prepared transaction was pending (none is any more).
    fn flush_deferred(&mut self) -> Result<()> {
        for array in std::mem::take(&mut self.deferred) {
            self.insert(array)?;
        }
        Ok(())
    }

    /// Whether rows wait behind a pending prepared transaction: before the next
    /// pre-commit, its checkpoint must complete or abort ([`Self::commit`], [`Self::abort`]).
    pub fn must_settle(&self) -> bool {
        !self.pending.is_empty() && !self.deferred.is_empty()
    }

    /// Phase 1 at checkpoint `id`: prepares the open transaction; returns the state to
    /// checkpoint.
    pub fn precommit(&mut self, id: CheckpointId) -> Result<SinkState> {
        if self.must_settle() {
            return Err(PgSinkError::new(format!(
                "internal error: pre-committing checkpoint {} while checkpoint {:?}'s transaction is pending and rows \
                 wait behind it",
                id.0, self.pending
            )));
        }
        self.flush_deferred()?;
        if self.in_transaction {
            let g = gid(&self.target.transaction_prefix, self.subtask, id.0);
            self.client
                .batch_execute(&format!("PREPARE TRANSACTION {}", quote_literal(&g)))
                .map_err(self.db(&format!("preparing transaction `{g}` for checkpoint {}", id.0)))?;
            self.in_transaction = false;
            self.pending.push((id.0, 0));
            self.prepared_rows.push(std::mem::take(&mut self.current_rows));
        }
        self.last_precommit = Some(id.0);
        Ok(SinkState { next_part: 0, pending: self.pending.clone() })
    }

    /// Phase 2: checkpoint `id` is complete; commits every transaction it (or an older one)
    /// prepared, then writes the rows that waited for them.
    pub fn commit(&mut self, id: CheckpointId) -> Result<usize> {
        let done = self.pending.iter().take_while(|(c, _)| *c <= id.0).count();
        for &(c, _) in &self.pending[..done] {
            let g = gid(&self.target.transaction_prefix, self.subtask, c);
            match self.client.batch_execute(&format!("COMMIT PREPARED {}", quote_literal(&g))) {
                Ok(()) => {}
                Err(e) if e.code() == Some(&SqlState::UNDEFINED_OBJECT) => {}
                Err(e) => {
                    return Err(self.db(&format!(
                        "committing transaction `{g}` of checkpoint {c} (the restart commits it from the checkpoint)"
                    ))(e));
                }
            }
        }
        self.pending.drain(..done);
        self.prepared_rows.drain(..done);
        if self.pending.is_empty() {
            self.flush_deferred()?;
        }
        Ok(done)
    }

    /// Checkpoint `id` was aborted. If it is the newest pre-committed one, no checkpoint that
    /// could ever be restored refers to the pending transactions (completed ones committed
    /// theirs; a restore rolls back anything newer): they are rolled back, and their rows are
    /// written again, with the waiting ones, into the open transaction for the next
    /// checkpoint. Otherwise a newer pre-commit refers to them, and its outcome decides.
    /// Returns whether this sink had seen that checkpoint's barrier.
    pub fn abort(&mut self, id: CheckpointId) -> Result<bool> {
        let seen = self.last_precommit.is_some_and(|l| l >= id.0);
        if self.last_precommit != Some(id.0) || self.pending.is_empty() {
            return Ok(seen);
        }
        for (c, _) in std::mem::take(&mut self.pending) {
            let g = gid(&self.target.transaction_prefix, self.subtask, c);
            match self.client.batch_execute(&format!("ROLLBACK PREPARED {}", quote_literal(&g))) {
                Ok(()) => {}
                Err(e) if e.code() == Some(&SqlState::UNDEFINED_OBJECT) => {}
                Err(e) => return Err(self.db(&format!("rolling back transaction `{g}` of aborted checkpoint {c}"))(e)),
            }
        }
        let mut again: Vec<String> = std::mem::take(&mut self.prepared_rows).into_iter().flatten().collect();
        again.append(&mut self.deferred);
        for array in again {
            self.insert(array)?;
        }
        Ok(true)
    }

    /// Without checkpointing: commits the open transaction at end of stream.
    pub fn commit_at_end(&mut self) -> Result<()> {
        if self.in_transaction {
            self.client.batch_execute("COMMIT").map_err(self.db("committing at the end of the stream"))?;
            self.in_transaction = false;
            self.current_rows.clear();
        }
        Ok(())
    }
}

/// TLS for `sslmode=prefer` (the default: TLS when the server offers it) or `require`: the
/// server's certificate verified against the CA in `ca` (PEM), else the public web roots.
fn tls(ca: Option<&std::path::Path>) -> Result<MakeRustlsConnect> {
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(path) => {
            let bad = |e: String| PgSinkError::new(format!("`ca_cert` {}: {e}", path.display()));
            for c in crate::pem::certificates(path).map_err(bad)? {
                roots.add(c).map_err(|e| bad(e.to_string()))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| PgSinkError::new(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// The server's message, its detail and hint.
fn db_message(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => {
            let mut m = d.message().to_string();
            if let Some(x) = d.detail() {
                m += &format!(" ({x})");
            }
            if let Some(h) = d.hint() {
                m += &format!("; hint: {h}");
            }
            m
        }
        None => chain(e),
    }
}

/// `e` and its causes, `: `-separated (a TLS failure says why the certificate was refused).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text += &format!(": {more}");
        }
        cause = c.source();
    }
    text
}

/// A PostgreSQL duration setting (`0`, `500ms`, `10s`, `5min`, `1h`, `2d`, bare ms) in ms.
fn parse_pg_duration_ms(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    let factor = match unit.trim() {
        "" | "ms" => 1,
        "s" => 1_000,
        "min" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    Some(n * factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(key: &[&str]) -> PostgresTarget {
        PostgresTarget {
            url: "host=127.0.0.1 port=5 user=u password=secret dbname=d".into(),
            table: "public.Counts".into(),
            upsert_key: key.iter().map(|k| k.to_string()).collect(),
            columns: vec![],
            format: ValueFormat::Json,
            transaction_prefix: "weir/j/db".into(),
            ca_cert: None,
        }
    }

    #[test]
    fn statements_quote_names_and_keep_the_last_row_per_key() {
        let cols = vec!["word".to_string(), "n\"x".to_string()];
        let s = Statements::new(&target(&[]), &cols);
        assert_eq!(
            s.insert,
            "INSERT INTO \"public\".\"Counts\" (\"word\", \"n\"\"x\") SELECT \"word\", \"n\"\"x\" FROM \
             json_populate_recordset(null::\"public\".\"Counts\", $1::text::json) WITH ORDINALITY AS r ORDER BY r.ordinality"
        );
        let u = Statements::new(&target(&["word"]), &cols);
        assert!(u.insert.contains("DISTINCT ON (\"word\")"), "{}", u.insert);
        assert!(u.insert.contains("ORDER BY \"word\", r.ordinality DESC"), "{}", u.insert);
        assert!(u.insert.ends_with("ON CONFLICT (\"word\") DO UPDATE SET \"n\"\"x\" = EXCLUDED.\"n\"\"x\""));
        let all_keys = Statements::new(&target(&["word", "n\"x"]), &cols);
        assert!(all_keys.insert.ends_with("DO NOTHING"), "{}", all_keys.insert);
    }

    #[test]
    fn rows_from_json_and_csv_values() {
        let rec = |v: &'static [u8]| RecordRef { tag: 0, timestamp: 0, key: b"k", value: v };
        let cols = json_keys(&["a".to_string(), "b\"".to_string()]);
        let mut out = String::new();
        append_row(&mut out, &ValueFormat::Json, &cols, &rec(br#"{"a": 1, "b": "x"}"#)).unwrap();
        append_row(&mut out, &ValueFormat::Csv { delimiter: b' ' }, &cols, &rec(b"7 \"y \"\"z\"\"\"")).unwrap();
        append_row(&mut out, &ValueFormat::Csv { delimiter: b',' }, &cols, &rec(b"8,")).unwrap();
        append_row(&mut out, &ValueFormat::Csv { delimiter: b',' }, &cols, &rec(b"\"\",a\\b\t")).unwrap();
        assert_eq!(
            out,
            r#"{"a": 1, "b": "x"},{"a":"7","b\"":"y \"z\""},{"a":"8","b\"":null},{"a":"","b\"":"a\\b\u0009"}"#
        );
        // Whatever the CSV, the object is valid JSON.
        let parsed: serde_json::Value = serde_json::from_str(&format!("[{out}]")).unwrap();
        assert_eq!(parsed[1]["b\""], "y \"z\"");
        let e = append_row(&mut String::new(), &ValueFormat::Json, &cols, &rec(b"[1]")).unwrap_err();
        assert!(e.message.contains("not an object"), "{e}");
        let e = append_row(&mut String::new(), &ValueFormat::Json, &cols, &rec(b"{nope")).unwrap_err();
        assert!(e.message.contains("not JSON"), "{e}");
        let csv = ValueFormat::Csv { delimiter: b',' };
        let e = append_row(&mut String::new(), &csv, &cols, &rec(b"1,2,3")).unwrap_err();
        assert!(e.message.contains("3 field(s) or more for 2 column(s)"), "{e}");
        let e = append_row(&mut String::new(), &csv, &cols, &rec(b"1")).unwrap_err();
        assert!(e.message.contains("1 field(s) for 2 column(s)"), "{e}");
        let e = append_row(&mut String::new(), &csv, &cols, &rec(b"\"1,2")).unwrap_err();
        assert!(e.message.contains("field 1 has no closing quote"), "{e}");
        let e = append_row(&mut String::new(), &csv, &cols, &rec(b"\xff,2")).unwrap_err();
        assert!(e.message.contains("not UTF-8"), "{e}");
    }

    #[test]
    fn gids_durations_and_urls() {
        assert_eq!(gid("weir/j/db", 2, 17), "weir/j/db/2/17");
        assert_eq!(parse_gid("weir/j/db", "weir/j/db/2/17"), Some((2, 17)));
        assert_eq!(parse_gid("weir/j/db", "weir/j/dbx/2/17"), None);
        assert_eq!(parse_gid("weir/j/db", "weir/j/db/2"), None);
        assert_eq!(parse_pg_duration_ms("0"), Some(0));
        assert_eq!(parse_pg_duration_ms("10s"), Some(10_000));
        assert_eq!(parse_pg_duration_ms("5min"), Some(300_000));
        assert_eq!(parse_pg_duration_ms("250ms"), Some(250));
        let d = describe_url(&target(&[]).url);
        assert_eq!(d, "database `d` at 127.0.0.1:5");
        assert!(!describe_url("postgres://u:secret@h:7/db").contains("secret"));
        assert!(MAX_GID >= gid(&"x".repeat(MAX_PREFIX), u32::MAX, u64::MAX).len());
    }
}
