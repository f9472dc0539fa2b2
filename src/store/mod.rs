//! The store of durable runs: runs (their script, catalog hash, status and pending call) and
//! their journals, in one embedded SQLite database. Its interface is narrow — open, the run
//! records, a run's journal loaded whole, journal rows appended in one transaction — so that a
//! server database can back it later.
//!
//! Durability: the database is in WAL mode with `synchronous = FULL`, so that every committed
//! transaction survives a crash of the process (and of the machine). The journal commits a
//! non-read call's intent before the call reaches its body.

mod journal;

pub(crate) use journal::{Journal, JournaledWrite, ReadRow, WriteState};

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, ErrorKind, ToolError};
use crate::sync::lock;

/// The store's schema version, kept in `PRAGMA user_version`.
const SCHEMA_VERSION: i64 = 3;

/// How long a writer waits for another process's transaction before it gives up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The environment variable naming the store when no `--store` is given.
pub const STORE_ENV: &str = "TOOLSCRIPT_STORE";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    script_name TEXT NOT NULL,
    script TEXT NOT NULL,
    catalog_sha256 TEXT NOT NULL,
    mode TEXT NOT NULL,
    status TEXT NOT NULL,
    owner_pid INTEGER,
    started_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    pending TEXT,
    outcome TEXT,
    input TEXT
);
CREATE TABLE IF NOT EXISTS writes (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    tool TEXT NOT NULL,
    args TEXT NOT NULL,
    approved INTEGER NOT NULL DEFAULT 0,
    retry INTEGER NOT NULL DEFAULT 0,
    intent INTEGER NOT NULL DEFAULT 0,
    outcome TEXT,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE IF NOT EXISTS artifacts (
    id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    policy TEXT NOT NULL,
    page_tokens INTEGER NOT NULL,
    content BLOB NOT NULL,
    created_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS reads (
    run_id TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    tool TEXT NOT NULL,
    args TEXT NOT NULL,
    n INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    PRIMARY KEY (run_id, epoch, tool, args, n)
);
";

/// Where a run is in its life.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum RunStatus {
    /// A process is running it, or died while it ran (then `resume` goes on with it).
    Running,
    /// It waits for a person's decision on its pending call.
    Paused,
    /// The script finished with a value.
    Completed,
    /// The script finished with an error.
    Failed,
}

impl RunStatus {
    /// The status as the store and `run --json` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Paused => "paused",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
        }
    }

    fn parse(text: &str) -> RunStatus {
        match text {
            "paused" => RunStatus::Paused,
            "completed" => RunStatus::Completed,
            "failed" => RunStatus::Failed,
            _ => RunStatus::Running,
        }
    }

    /// Whether the run has ended: nothing is left to resume.
    pub fn is_final(self) -> bool {
        matches!(self, RunStatus::Completed | RunStatus::Failed)
    }
}

/// One run as the store keeps it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RunRecord {
    /// The run's id, as in its receipts.
    pub run_id: String,
    /// The script's name (its file, or `-`).
    pub script_name: String,
    /// The script's text, as it started: resume runs this.
    pub script: String,
    /// SHA-256 of the catalog the run started with: resume refuses another.
    pub catalog_sha256: String,
    /// `speculative` or `sequential`.
    pub mode: String,
    /// Where the run is.
    pub status: RunStatus,
    /// The process running it, while it runs.
    pub owner_pid: Option<u32>,
    /// When it started, in milliseconds since the Unix epoch.
    pub started_ms: i64,
    /// When its record last changed.
    pub updated_ms: i64,
    /// The pending call of a paused run: `{seq, tool, effect, args, awaiting}`.
    pub pending: Option<Value>,
    /// What the run's last process printed with `--json` (a final or paused run).
    pub outcome: Option<Value>,
    /// The script's `input`, which a resume gives it again (`None`: the script had none).
    pub input: Option<Value>,
}

impl RunRecord {
    /// When the run started, as a UTC date and time (`2026-12-01T11:37:06Z`).
    pub fn started(&self) -> String {
        utc(self.started_ms)
    }
}

/// Milliseconds since the Unix epoch as a UTC date and time, `2026-12-01T11:37:06Z`.
fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// The embedded store: runs and their journals.
pub struct Store {
    path: PathBuf,
    conn: Mutex<Connection>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

impl Store {
    /// Opens the store at `path`, creating the file (and its folder) on first use.
    ///
    /// # Errors
    ///
    /// [`Error::Store`] when the file cannot be created or opened, is not a store of this
    /// version, or its schema cannot be set up.
    pub fn open(path: &Path) -> Result<Store, Error> {
        let fail = |message: String| Error::Store {
            path: path.to_path_buf(),
            message,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| fail(format!("cannot create its folder: {e}")))?;
        }
        let mut conn = Connection::open(path).map_err(|e| fail(e.to_string()))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(|e| fail(e.to_string()))?;
        // Several processes may open a new store at once: switching to WAL can be refused
        // while another does the same, without the busy handler, so it is tried again.
        let started = std::time::Instant::now();
        loop {
            let mode = conn.query_row("PRAGMA journal_mode = WAL", [], |row| {
                row.get::<_, String>(0)
            });
            match mode {
                Ok(mode) if mode.eq_ignore_ascii_case("wal") => break,
                Ok(mode) => return Err(fail(format!("cannot use WAL mode (journal mode {mode})"))),
                Err(e) if is_busy(&e) && started.elapsed() < BUSY_TIMEOUT => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(fail(format!("not a store: {e}"))),
            }
        }
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(|e| fail(e.to_string()))?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .map_err(|e| fail(format!("not a store: {e}")))?;
        if version > SCHEMA_VERSION {
            return Err(fail(format!(
                "the store has schema version {version}; this toolscript knows {SCHEMA_VERSION}"
            )));
        }
        if version < SCHEMA_VERSION {
            // One writer sets the schema up; the others wait for it (`IMMEDIATE` takes the
            // write lock at once, through the busy handler), then find it done.
            let mut upgrade = || -> rusqlite::Result<()> {
                let tx =
                    conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                let now: i64 = tx.pragma_query_value(None, "user_version", |row| row.get(0))?;
                if now < SCHEMA_VERSION {
                    // Version 3 keeps each run's input.
                    if (1..3).contains(&now) {
                        tx.execute_batch("ALTER TABLE runs ADD COLUMN input TEXT;")?;
                    }
                    tx.execute_batch(&format!("{SCHEMA} PRAGMA user_version = {SCHEMA_VERSION};"))?;
                }
                tx.commit()
            };
            upgrade().map_err(|e| fail(format!("not a store: {e}")))?;
        }
        Ok(Store {
            path: path.to_path_buf(),
            conn: Mutex::new(conn),
        })
    }

    /// The store's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where the store is when no path is given: `$TOOLSCRIPT_STORE`, else
    /// `toolscript/store.sqlite3` in the user's data directory (`~/.local/share` on Linux).
    pub fn default_path() -> Option<PathBuf> {
        if let Some(path) = std::env::var_os(STORE_ENV).filter(|p| !p.is_empty()) {
            return Some(PathBuf::from(path));
        }
        dirs::data_dir().map(|dir| dir.join("toolscript").join("store.sqlite3"))
    }

    fn fail(&self, e: impl std::fmt::Display) -> Error {
        Error::Store {
            path: self.path.clone(),
            message: e.to_string(),
        }
    }

    /// Every run, newest first.
    ///
    /// # Errors
    ///
    /// [`Error::Store`] when the database cannot be read.
    pub fn runs(&self) -> Result<Vec<RunRecord>, Error> {
        let conn = lock(&self.conn);
        let mut statement = conn
            .prepare(&format!("{SELECT_RUN} ORDER BY started_ms DESC, run_id"))
            .map_err(|e| self.fail(e))?;
        let rows = statement
            .query_map([], run_record)
            .map_err(|e| self.fail(e))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.fail(e))
    }

    /// One run, if the store has it.
    ///
    /// # Errors
    ///
    /// [`Error::Store`] when the database cannot be read.
    pub fn run(&self, run_id: &str) -> Result<Option<RunRecord>, Error> {
        let conn = lock(&self.conn);
        conn.query_row(
            &format!("{SELECT_RUN} WHERE run_id = ?1"),
            [run_id],
            run_record,
        )
        .optional()
        .map_err(|e| self.fail(e))
    }

    /// Records a new run, owned by this process.
    pub(crate) fn create_run(&self, record: &RunRecord) -> Result<(), Error> {
        let conn = lock(&self.conn);
        conn.execute(
            "INSERT INTO runs (run_id, script_name, script, catalog_sha256, mode, status, \
             owner_pid, started_ms, updated_ms, input) \
             VALUES (?1, ?2, ?3, ?4, ?5, 'running', ?6, ?7, ?7, ?8)",
            params![
                record.run_id,
                record.script_name,
                record.script,
                record.catalog_sha256,
                record.mode,
                std::process::id(),
                record.started_ms,
                record.input.as_ref().map(Value::to_string),
            ],
        )
        .map_err(|e| self.fail(e))?;
        Ok(())
    }

    /// Takes a run for this process to resume, in one transaction: a paused run, or one whose
    /// process is gone. The run is `running` again, owned by this process.
    ///
    /// `alive` says whether the process that owns a `running` run still runs.
    pub(crate) fn take_run(
        &self,
        run_id: &str,
        alive: impl Fn(u32) -> bool,
    ) -> Result<RunRecord, TakeRefused> {
        let mut conn = lock(&self.conn);
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|e| TakeRefused::Store(self.fail(e)))?;
        let record = tx
            .query_row(
                &format!("{SELECT_RUN} WHERE run_id = ?1"),
                [run_id],
                run_record,
            )
            .optional()
            .map_err(|e| TakeRefused::Store(self.fail(e)))?
            .ok_or(TakeRefused::Unknown)?;
        if record.status.is_final() {
            return Err(TakeRefused::Ended(Box::new(record)));
        }
        if record.status == RunStatus::Running {
            if let Some(pid) = record.owner_pid.filter(|pid| alive(*pid)) {
                return Err(TakeRefused::Busy(pid));
            }
        }
        tx.execute(
            "UPDATE runs SET status = 'running', owner_pid = ?2, updated_ms = ?3 WHERE run_id = ?1",
            params![run_id, std::process::id(), now_ms()],
        )
        .map_err(|e| TakeRefused::Store(self.fail(e)))?;
        tx.commit().map_err(|e| TakeRefused::Store(self.fail(e)))?;
        Ok(record)
    }

    /// Records where a run ended (or paused): its status, pending call and printed outcome.
    pub(crate) fn finish_run(
        &self,
        run_id: &str,
        status: RunStatus,
        pending: Option<&Value>,
        outcome: &Value,
    ) -> Result<(), Error> {
        let conn = lock(&self.conn);
        conn.execute(
            "UPDATE runs SET status = ?2, owner_pid = NULL, pending = ?3, outcome = ?4, \
             updated_ms = ?5 WHERE run_id = ?1",
            params![
                run_id,
                status.as_str(),
                pending.map(Value::to_string),
                outcome.to_string(),
                now_ms(),
            ],
        )
        .map_err(|e| self.fail(e))?;
        Ok(())
    }

    /// A run's journal: its non-read calls by seq, and the reads the executor used.
    pub(crate) fn load_journal(
        &self,
        run_id: &str,
    ) -> Result<(Vec<JournaledWrite>, Vec<ReadRow>), Error> {
        let conn = lock(&self.conn);
        let mut writes = conn
            .prepare(
                "SELECT seq, tool, args, approved, retry, intent, outcome FROM writes \
                 WHERE run_id = ?1 ORDER BY seq",
            )
            .map_err(|e| self.fail(e))?;
        let writes = writes
            .query_map([run_id], |row| {
                let outcome: Option<String> = row.get(6)?;
                Ok(JournaledWrite {
                    seq: row.get::<_, i64>(0)? as u64,
                    tool: row.get(1)?,
                    args: row.get(2)?,
                    state: WriteState {
                        approved: row.get(3)?,
                        retry: row.get(4)?,
                        intent: row.get(5)?,
                    },
                    outcome: outcome.map(|text| decode_outcome(&text)),
                })
            })
            .map_err(|e| self.fail(e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.fail(e))?;
        let mut reads = conn
            .prepare("SELECT epoch, tool, args, n, outcome FROM reads WHERE run_id = ?1")
            .map_err(|e| self.fail(e))?;
        let reads = reads
            .query_map([run_id], |row| {
                Ok(ReadRow {
                    epoch: row.get::<_, i64>(0)? as u64,
                    tool: row.get(1)?,
                    args: row.get(2)?,
                    n: row.get::<_, i64>(3)? as u64,
                    outcome: std::sync::Arc::new(decode_outcome(&row.get::<_, String>(4)?)),
                })
            })
            .map_err(|e| self.fail(e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.fail(e))?;
        Ok((writes, reads))
    }

    /// Appends journal rows in one transaction, committed (and synced) before it returns:
    /// the reads, then the state of non-read calls (a row per seq, replaced whole).
    pub(crate) fn append(
        &self,
        run_id: &str,
        reads: &[ReadRow],
        writes: &[JournaledWrite],
    ) -> Result<(), Error> {
        let mut conn = lock(&self.conn);
        let tx = conn.transaction().map_err(|e| self.fail(e))?;
        {
            let mut insert_read = tx
                .prepare_cached(
                    "INSERT OR IGNORE INTO reads (run_id, epoch, tool, args, n, outcome) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .map_err(|e| self.fail(e))?;
            for read in reads {
                insert_read
                    .execute(params![
                        run_id,
                        read.epoch as i64,
                        read.tool,
                        read.args,
                        read.n as i64,
                        encode_outcome(&read.outcome),
                    ])
                    .map_err(|e| self.fail(e))?;
            }
            let mut upsert_write = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO writes \
                     (run_id, seq, tool, args, approved, retry, intent, outcome) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                )
                .map_err(|e| self.fail(e))?;
            for write in writes {
                upsert_write
                    .execute(params![
                        run_id,
                        write.seq as i64,
                        write.tool,
                        write.args,
                        write.state.approved,
                        write.state.retry,
                        write.state.intent,
                        write.outcome.as_ref().map(encode_outcome),
                    ])
                    .map_err(|e| self.fail(e))?;
            }
        }
        tx.commit().map_err(|e| self.fail(e))
    }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// An artifact as the store keeps it: the canonical JSON of a value a run's output could not
/// hold, and the page budget its pages are cut for.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct StoredArtifact {
    /// The bytes, exactly as stored (their SHA-256 is the id).
    pub content: Vec<u8>,
    /// The tokens each page holds at most.
    pub page_tokens: usize,
    /// The policy that made it.
    pub policy: String,
    /// The run that made it first.
    pub run_id: String,
}

impl Store {
    /// Keeps an artifact (content-addressed: one made before with the same bytes stays).
    pub(crate) fn put_artifact(
        &self,
        id: &str,
        run_id: &str,
        policy: &str,
        page_tokens: usize,
        content: &[u8],
    ) -> Result<(), Error> {
        let conn = lock(&self.conn);
        conn.execute(
            "INSERT OR IGNORE INTO artifacts (id, run_id, policy, page_tokens, content, created_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![id, run_id, policy, page_tokens as i64, content, now_ms()],
        )
        .map_err(|e| self.fail(e))?;
        Ok(())
    }

    /// An artifact, if the store has it.
    ///
    /// # Errors
    ///
    /// [`Error::Store`] when the database cannot be read.
    pub fn artifact(&self, id: &str) -> Result<Option<StoredArtifact>, Error> {
        let conn = lock(&self.conn);
        conn.query_row(
            "SELECT content, page_tokens, policy, run_id FROM artifacts WHERE id = ?1",
            [id],
            |row| {
                Ok(StoredArtifact {
                    content: row.get(0)?,
                    page_tokens: row.get::<_, i64>(1)?.max(1) as usize,
                    policy: row.get(2)?,
                    run_id: row.get(3)?,
                })
            },
        )
        .optional()
        .map_err(|e| self.fail(e))
    }
}

/// Why a run cannot be taken for resuming.
#[derive(Debug)]
pub(crate) enum TakeRefused {
    /// The store has no such run.
    Unknown,
    /// The run has ended.
    Ended(Box<RunRecord>),
    /// The run is running in this process.
    Busy(u32),
    /// The store failed.
    Store(Error),
}

const SELECT_RUN: &str = "SELECT run_id, script_name, script, catalog_sha256, mode, status, \
                          owner_pid, started_ms, updated_ms, pending, outcome, input FROM runs";

fn run_record(row: &rusqlite::Row<'_>) -> rusqlite::Result<RunRecord> {
    let json = |text: Option<String>| text.and_then(|t| serde_json::from_str(&t).ok());
    Ok(RunRecord {
        run_id: row.get(0)?,
        script_name: row.get(1)?,
        script: row.get(2)?,
        catalog_sha256: row.get(3)?,
        mode: row.get(4)?,
        status: RunStatus::parse(&row.get::<_, String>(5)?),
        owner_pid: row.get(6)?,
        started_ms: row.get(7)?,
        updated_ms: row.get(8)?,
        pending: json(row.get(9)?),
        outcome: json(row.get(10)?),
        input: json(row.get(11)?),
    })
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A call's outcome as the journal keeps it: `{"ok": value}` or `{"error": {...}}`.
fn encode_outcome(outcome: &Result<Value, ToolError>) -> String {
    let value = match outcome {
        Ok(value) => serde_json::json!({ "ok": value }),
        Err(e) => serde_json::json!({ "error": {
            "kind": e.kind.as_str(),
            "message": e.message,
            "tool": e.tool,
            "recoverable": e.recoverable,
            "suggested_next_action": e.suggested_next_action,
        }}),
    };
    value.to_string()
}

fn decode_outcome(text: &str) -> Result<Value, ToolError> {
    let corrupt = || ToolError::internal("the journal holds an outcome it cannot read");
    let mut value: Value = serde_json::from_str(text).map_err(|_| corrupt())?;
    if let Some(ok) = value.get_mut("ok") {
        return Ok(ok.take());
    }
    let e = value.get("error").ok_or_else(corrupt)?;
    let text = |key: &str| e.get(key).and_then(Value::as_str).map(str::to_string);
    let kind = text("kind")
        .and_then(|k| ErrorKind::parse(&k))
        .ok_or_else(corrupt)?;
    let mut error = ToolError::new(kind, text("message").unwrap_or_default());
    error.tool = text("tool");
    error.recoverable = e
        .get("recoverable")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    error.suggested_next_action = text("suggested_next_action");
    Err(error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(run_id: &str) -> RunRecord {
        RunRecord {
            run_id: run_id.into(),
            script_name: "s.rhai".into(),
            script: "1".into(),
            catalog_sha256: "c".into(),
            mode: "speculative".into(),
            status: RunStatus::Running,
            owner_pid: None,
            started_ms: now_ms(),
            updated_ms: now_ms(),
            pending: None,
            outcome: None,
            input: None,
        }
    }

    #[test]
    fn outcomes_round_trip() {
        let error = ToolError::not_found("no user 7")
            .for_tool("get_user")
            .with_next_action("look again");
        for outcome in [Ok(json!({"a": [1, 2.5, null]})), Err(error)] {
            assert_eq!(decode_outcome(&encode_outcome(&outcome)), outcome);
        }
        assert_eq!(
            decode_outcome("garbage").unwrap_err().kind,
            ErrorKind::Internal
        );
    }

    #[test]
    fn runs_are_taken_once_and_never_after_they_end() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("deep/er/store.sqlite3")).unwrap();
        store.create_run(&record("r1")).unwrap();
        assert!(
            matches!(store.take_run("r1", |_| true), Err(TakeRefused::Busy(_))),
            "a run whose process lives is not taken"
        );
        assert_eq!(store.take_run("r1", |_| false).unwrap().run_id, "r1");
        store
            .finish_run("r1", RunStatus::Completed, None, &json!({"ok": true}))
            .unwrap();
        assert!(matches!(
            store.take_run("r1", |_| false),
            Err(TakeRefused::Ended(_))
        ));
        assert!(matches!(
            store.take_run("nope", |_| false),
            Err(TakeRefused::Unknown)
        ));
        let runs = store.runs().unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].status, RunStatus::Completed);
        assert_eq!(runs[0].outcome, Some(json!({"ok": true})));
    }

    #[test]
    fn journal_rows_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.sqlite3");
        {
            let store = Store::open(&path).unwrap();
            store.create_run(&record("r")).unwrap();
            let read = ReadRow {
                epoch: 0,
                tool: "get".into(),
                args: "{}".into(),
                n: 0,
                outcome: std::sync::Arc::new(Ok(json!(1))),
            };
            let write = JournaledWrite {
                seq: 0,
                tool: "put".into(),
                args: "{}".into(),
                state: WriteState {
                    intent: true,
                    ..WriteState::default()
                },
                outcome: None,
            };
            store.append("r", &[read.clone(), read], &[write]).unwrap();
        }
        let store = Store::open(&path).unwrap();
        let (writes, reads) = store.load_journal("r").unwrap();
        assert_eq!(reads.len(), 1, "a read is journaled once");
        assert_eq!(writes.len(), 1);
        assert!(writes[0].state.intent && writes[0].outcome.is_none());
    }

    #[test]
    fn a_file_that_is_not_a_store_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("not.sqlite3");
        std::fs::write(&path, "this is not a database, it is text").unwrap();
        let e = Store::open(&path).unwrap_err().to_string();
        assert!(e.contains("not.sqlite3"), "{e}");
    }
}
