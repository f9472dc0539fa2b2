//! The embedded backend of [`Store`]: one SQLite file (bundled: a fresh machine needs
//! nothing). Its work is blocking, so every method runs it on tokio's blocking pool, holding the
//! one connection for the length of a statement or a transaction.
//!
//! Durability: the database is in WAL mode with `synchronous = FULL`, so that every committed
//! transaction survives a crash of the process (and of the machine).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;

use super::journal::{decode_outcome, encode_outcome, ApprovedRead};
use super::plans;
use super::{
    now_ms, now_us, CacheDrop, CacheEntry, CatalogPrint, Claim, Fence, JournalRows, JournaledWrite,
    Lease, PageIndex, PruneRule, Pruned, ReadRow, Renewed, RunPage, RunQuery, RunRecord, RunStatus,
    RunSummary, Store, StoreFuture, StoredArtifact, StoredEnd, StoredPlan, TakeDecision,
    TakeRefused, Verdict, WriteState, DEFAULT_LEASE,
};
use crate::error::{Cause, Error};
use crate::sync::lock;

/// The store's schema version, kept in `PRAGMA user_version`.
const SCHEMA_VERSION: i64 = 11;

/// The store's `PRAGMA application_id` ("TScr"): what marks a SQLite file as a toolscript
/// store.
const APPLICATION_ID: i32 = 0x5453_6372;

/// The tables a store of any version may hold: a file whose tables are these (with `runs`
/// among them) and whose `user_version` is a store's, but that has no application id, is a
/// store written before stores were stamped.
const STORE_TABLES: [&str; 13] = [
    "runs",
    "writes",
    "artifacts",
    "reads",
    "approved_reads",
    "artifact_refs",
    "artifact_refs_by_artifact",
    "runs_by_start",
    "runs_by_status",
    "cache",
    "cache_by_tool",
    "plans",
    "plans_by_run",
];

/// A run's input longer than this (in bytes of JSON) is kept as an artifact, which the run's
/// row refers to: a list of runs never reads it, and runs that share an input share it.
pub(crate) const INPUT_INLINE_MAX: usize = 64 * 1024;

/// The tokens a page of an input kept as an artifact holds.
const INPUT_PAGE_TOKENS: usize = 2000;

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
    started_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    pending TEXT,
    outcome TEXT,
    input TEXT,
    catalog TEXT,
    input_artifact TEXT,
    lease_owner TEXT,
    lease_host TEXT,
    lease_token INTEGER NOT NULL DEFAULT 0,
    lease_expires_ms INTEGER,
    lease_since_ms INTEGER,
    tenant TEXT,
    started_by TEXT,
    context_digest TEXT
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
    processes TEXT,
    approved_rule TEXT,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE IF NOT EXISTS artifacts (
    id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    policy TEXT NOT NULL,
    page_tokens INTEGER NOT NULL,
    content BLOB NOT NULL,
    created_ms INTEGER NOT NULL,
    page_index BLOB
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
CREATE TABLE IF NOT EXISTS approved_reads (
    run_id TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    tool TEXT NOT NULL,
    args TEXT NOT NULL,
    n INTEGER NOT NULL,
    rule TEXT,
    PRIMARY KEY (run_id, epoch, tool, args, n)
);
CREATE TABLE IF NOT EXISTS artifact_refs (
    run_id TEXT NOT NULL,
    artifact_id TEXT NOT NULL,
    PRIMARY KEY (run_id, artifact_id)
);
CREATE INDEX IF NOT EXISTS artifact_refs_by_artifact ON artifact_refs (artifact_id);
CREATE INDEX IF NOT EXISTS runs_by_start ON runs (started_ms DESC, run_id);
CREATE INDEX IF NOT EXISTS runs_by_status ON runs (status, updated_ms);
CREATE TABLE IF NOT EXISTS cache (
    key TEXT PRIMARY KEY,
    tool TEXT NOT NULL,
    scope TEXT NOT NULL,
    value TEXT NOT NULL,
    created_us INTEGER NOT NULL,
    expires_us INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS cache_by_tool ON cache (tool, scope);
CREATE TABLE IF NOT EXISTS plans (
    plan_id TEXT PRIMARY KEY,
    created_ms INTEGER NOT NULL,
    expires_ms INTEGER NOT NULL,
    applied_run TEXT,
    body TEXT NOT NULL,
    tenant TEXT,
    made_by TEXT
);
CREATE INDEX IF NOT EXISTS plans_by_run ON plans (applied_run);
";

/// The embedded store: one SQLite file.
pub struct SqliteStore {
    path: PathBuf,
    /// The one connection, taken by one blocking job at a time.
    conn: Arc<Mutex<Connection>>,
    /// The file could not be opened for writing: reads work, writes fail saying so.
    read_only: bool,
    /// How long a run's lease holds unless renewed.
    lease: Duration,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish()
    }
}

impl SqliteStore {
    /// Opens the store at `path`, creating the file (and its folder) on first use.
    ///
    /// A store is known by its `PRAGMA application_id`; a store written before stores were
    /// stamped is known by its tables and schema version, and is stamped (and upgraded) when
    /// opened. Any other non-empty database is refused, left untouched. A file this process
    /// cannot write is opened read-only: its runs can be read, and every write fails with an
    /// error that says the store is read-only.
    ///
    /// # Errors
    ///
    /// [`Error::Store`] when the file cannot be created or opened, is not a toolscript store
    /// (another program's database, or not a database), is a store of a later version, or its
    /// schema cannot be set up.
    pub fn open(path: &Path) -> Result<SqliteStore, Error> {
        let location = path.display().to_string();
        let fail = |message: &str, e: Cause| Error::store(&location, message, e);
        let say = |message: String| Error::store(&location, message, None);
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if !dir.exists() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| fail("cannot create its folder", e.into()))?;
            }
        }
        let mut conn = match Connection::open(path) {
            Ok(conn) => conn,
            // A file that exists but cannot be opened for writing (nor created beside, where
            // SQLite keeps its journal) is read, at least.
            Err(e) if path.exists() => {
                return SqliteStore::open_read_only(path)
                    .map_err(|_| fail("cannot open it", e.into()))
            }
            Err(e) => return Err(fail("cannot open it", e.into())),
        };
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(|e| fail("cannot open it", e.into()))?;
        if conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(false) {
            drop(conn);
            return SqliteStore::open_read_only(path);
        }
        // Nothing is written before the file is known to be a store, or empty.
        let (kind, stamped) = classify(&conn).map_err(|e| not_a_store(&location, e))?;
        let version = match kind {
            Kind::Foreign(why) => return Err(say(foreign(&why))),
            Kind::Empty => 0,
            Kind::Store(version) => version,
        };
        if version > SCHEMA_VERSION {
            return Err(say(format!(
                "the store has schema version {version}; this toolscript knows {SCHEMA_VERSION}"
            )));
        }
        if matches!(kind, Kind::Empty) {
            // A new store gives freed pages back without rewriting the file. It must be said
            // before the first table exists, and outside a transaction.
            conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL;")
                .map_err(|e| not_a_store(&location, e))?;
        }
        // Several processes may open a new store at once: switching to WAL can be refused
        // while another does the same, without the busy handler, so it is tried again.
        let started = std::time::Instant::now();
        loop {
            let mode = conn.query_row("PRAGMA journal_mode = WAL", [], |row| {
                row.get::<_, String>(0)
            });
            match mode {
                Ok(mode) if mode.eq_ignore_ascii_case("wal") => break,
                Ok(mode) => return Err(say(format!("cannot use WAL mode (journal mode {mode})"))),
                Err(e) if is_busy(&e) && started.elapsed() < BUSY_TIMEOUT => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) if is_read_only(&e) => {
                    drop(conn);
                    return SqliteStore::open_read_only(path);
                }
                Err(e) => return Err(not_a_store(&location, e)),
            }
        }
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(|e| fail("cannot open it", e.into()))?;
        if version < SCHEMA_VERSION || !stamped {
            // One writer sets the schema up; the others wait for it (`IMMEDIATE` takes the
            // write lock at once, through the busy handler), then find it done. What the file
            // is, is asked again under the lock.
            let mut upgrade = || -> Result<(), Error> {
                let tx = conn
                    .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                    .map_err(|e| not_a_store(&location, e))?;
                let now = match classify(&tx).map_err(|e| not_a_store(&location, e))? {
                    (Kind::Foreign(why), _) => return Err(say(foreign(&why))),
                    (Kind::Store(now), true) if now >= SCHEMA_VERSION => return Ok(()),
                    (Kind::Store(now), _) => now,
                    (Kind::Empty, _) => 0,
                };
                let setup = || -> rusqlite::Result<()> {
                    // Version 3 keeps each run's input.
                    if (1..3).contains(&now) {
                        tx.execute_batch("ALTER TABLE runs ADD COLUMN input TEXT;")?;
                    }
                    // Version 4 keeps each run's tool fingerprints, a large input as an
                    // artifact, which runs refer to which artifacts, where each page of an
                    // artifact is (older artifacts have none, and are cut into pages when read),
                    // and, with each intent, the processes the call might reach.
                    if (1..4).contains(&now) {
                        tx.execute_batch(
                            "ALTER TABLE runs ADD COLUMN catalog TEXT; \
                             ALTER TABLE runs ADD COLUMN input_artifact TEXT; \
                             ALTER TABLE artifacts ADD COLUMN page_index BLOB; \
                             ALTER TABLE writes ADD COLUMN processes TEXT;",
                        )?;
                    }
                    // Version 5 keeps the guard's rule a person approved with a call.
                    if (1..5).contains(&now) {
                        tx.execute_batch("ALTER TABLE writes ADD COLUMN approved_rule TEXT;")?;
                    }
                    // Version 8 owns a running run by a lease, not a process id: a run an
                    // older store holds as running has no lease, which counts as expired.
                    if (1..8).contains(&now) {
                        tx.execute_batch(
                            "ALTER TABLE runs ADD COLUMN lease_owner TEXT; \
                             ALTER TABLE runs ADD COLUMN lease_host TEXT; \
                             ALTER TABLE runs ADD COLUMN lease_token INTEGER NOT NULL DEFAULT 0; \
                             ALTER TABLE runs ADD COLUMN lease_expires_ms INTEGER; \
                             ALTER TABLE runs ADD COLUMN lease_since_ms INTEGER;",
                        )?;
                    }
                    // Version 10 keeps the tenant a run or a plan belongs to, and which token
                    // (a prefix of its SHA-256) started a run (`serve --http --auth`).
                    if (1..10).contains(&now) {
                        tx.execute_batch(
                            "ALTER TABLE runs ADD COLUMN tenant TEXT; \
                             ALTER TABLE runs ADD COLUMN started_by TEXT;",
                        )?;
                    }
                    // Version 11 keeps a keyed digest of a run's per-run context.
                    if (1..11).contains(&now) {
                        tx.execute_batch("ALTER TABLE runs ADD COLUMN context_digest TEXT;")?;
                    }
                    if now == 9 {
                        tx.execute_batch(
                            "ALTER TABLE plans ADD COLUMN tenant TEXT; \
                             ALTER TABLE plans ADD COLUMN made_by TEXT;",
                        )?;
                    }
                    // Version 6 keeps the reads a person approved (`approved_reads`, which
                    // the schema below creates); version 7, cached reads (`cache`, likewise);
                    // version 9, plans (`plans`, likewise).
                    tx.execute_batch(&format!(
                        "{SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; \
                         PRAGMA application_id = {APPLICATION_ID};"
                    ))?;
                    if (1..4).contains(&now) {
                        refer_to_artifacts(&tx)?;
                    }
                    Ok(())
                };
                setup().map_err(|e| not_a_store(&location, e))?;
                tx.commit().map_err(|e| not_a_store(&location, e))
            };
            upgrade()?;
        }
        Ok(SqliteStore {
            path: path.to_path_buf(),
            conn: Arc::new(Mutex::new(conn)),
            read_only: false,
            lease: DEFAULT_LEASE,
        })
    }

    /// Opens the store at `path` for reading only: nothing is created, upgraded or written,
    /// and every write fails with an error that says the store is read-only. A store in a
    /// folder this process cannot write, whose WAL index SQLite cannot create, is read as an
    /// immutable file.
    ///
    /// # Errors
    ///
    /// [`Error::Store`] when the file cannot be opened, is not a toolscript store, or is a
    /// store of another schema version (an older one is upgraded only when it can be written).
    pub fn open_read_only(path: &Path) -> Result<SqliteStore, Error> {
        use rusqlite::OpenFlags;
        let location = path.display().to_string();
        let say = |message: String| Error::store(&location, message, None);
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let opened = Connection::open_with_flags(path, flags).and_then(|conn| {
            let kind = classify(&conn)?;
            Ok((conn, kind))
        });
        let (conn, (kind, _)) = match opened {
            Ok(opened) => opened,
            Err(e) if is_cant_open(&e) && path.exists() => {
                let uri = format!("file:{}?immutable=1", uri_path(path));
                let flags = flags | OpenFlags::SQLITE_OPEN_URI;
                let conn = Connection::open_with_flags(uri, flags)
                    .map_err(|e| Error::store(&location, "cannot open it", Cause::from(e)))?;
                let kind = classify(&conn).map_err(|e| not_a_store(&location, e))?;
                (conn, kind)
            }
            Err(e) => return Err(not_a_store(&location, e)),
        };
        match kind {
            Kind::Foreign(why) => Err(say(foreign(&why))),
            Kind::Empty => Err(say(
                "the file is read-only and empty: it is not a store, and cannot be made one".into(),
            )),
            Kind::Store(version) if version != SCHEMA_VERSION => Err(say(format!(
                "the store is read-only and has schema version {version}; this toolscript reads {SCHEMA_VERSION} (and upgrades an older one only where it can write it)"
            ))),
            Kind::Store(_) => {
                conn.busy_timeout(BUSY_TIMEOUT)
                    .map_err(|e| Error::store(&location, "cannot open it", Cause::from(e)))?;
                Ok(SqliteStore {
                    path: path.to_path_buf(),
                    conn: Arc::new(Mutex::new(conn)),
                    read_only: true,
                    lease: DEFAULT_LEASE,
                })
            }
        }
    }

    /// Sets how long a write waits for another connection's transaction before it fails (10 s
    /// unless set).
    ///
    /// # Errors
    ///
    /// [`Error::Store`] when SQLite refuses it.
    pub fn busy_timeout(self, timeout: Duration) -> Result<SqliteStore, Error> {
        lock(&self.conn).busy_timeout(timeout).map_err(|e| {
            Error::store(
                &self.location(),
                "cannot set its busy timeout",
                Cause::from(e),
            )
        })?;
        Ok(self)
    }

    /// Sets how long a run's lease holds unless renewed (the store's `lease_s`: 30 s unless
    /// set; `--lease-s` and `$TOOLSCRIPT_LEASE_S` on the command line). Its owner renews it
    /// every third of that while the run is live; a resume elsewhere takes the run once it
    /// has expired. Shorter leases notice a dead owner sooner and renew more often.
    pub fn with_lease_ttl(mut self, ttl: Duration) -> SqliteStore {
        self.lease = ttl;
        self
    }

    /// Whether the store was opened read-only (its file cannot be written by this process).
    pub fn is_read_only(&self) -> bool {
        self.read_only
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

    /// As [`SqliteStore::blocking`], for a job that writes: a read-only store refuses it.
    fn writing<T: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Connection, &Fail) -> Result<T, Error> + Send + 'static,
    ) -> StoreFuture<'static, T> {
        if self.read_only {
            let refused = Error::store(&self.location(), READ_ONLY, None);
            return Box::pin(async move { Err(refused) });
        }
        self.blocking(job)
    }

    /// Runs `job` with the connection on tokio's blocking pool: SQLite's calls block, and a
    /// worker must not wait for a disk sync (nor for another process's lock).
    fn blocking<T: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Connection, &Fail) -> Result<T, Error> + Send + 'static,
    ) -> StoreFuture<'static, T> {
        let conn = Arc::clone(&self.conn);
        let fail = Fail(self.path.display().to_string());
        Box::pin(async move {
            let location = fail.0.clone();
            tokio::task::spawn_blocking(move || job(&mut lock(&conn), &fail))
                .await
                .unwrap_or_else(|e| Err(Error::store(&location, "its task failed", Cause::from(e))))
        })
    }
}

/// Why a read-only store refuses a write.
const READ_ONLY: &str = "the store is read-only (this process cannot write its file): its runs can be listed and read, not written; give a writable --store";

/// Makes the store's errors, naming its file.
struct Fail(String);

impl Fail {
    /// A failed database call.
    fn of(&self, e: rusqlite::Error) -> Error {
        Error::store(&self.0, "a database call failed", Cause::from(e))
    }

    /// Something found wrong in what the store holds.
    fn say(&self, message: String) -> Error {
        Error::store(&self.0, message, None)
    }
}

impl Store for SqliteStore {
    fn location(&self) -> String {
        self.path.display().to_string()
    }

    fn digest_key(&self) -> StoreFuture<'_, Arc<[u8; 32]>> {
        let path = key_path(&self.path);
        let location = self.location();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || read_or_make_key(&path))
                .await
                .map_err(|e| Error::store(&location, "its key's task failed", Cause::from(e)))?
                .map(Arc::new)
                .map_err(|why| Error::store(&location, why, None))
        })
    }

    fn create_run(&self, record: RunRecord) -> StoreFuture<'_, ()> {
        let ttl = self.lease.as_millis() as i64;
        self.writing(move |conn, fail| {
            let now = now_ms();
            let catalog = record
                .catalog
                .as_ref()
                .map(serde_json::to_string)
                .transpose()
                .map_err(|e| fail.say(format!("the run's catalog cannot be written: {e}")))?;
            let input = record.input.as_ref().map(Value::to_string);
            let tx = conn.transaction().map_err(|e| fail.of(e))?;
            // A large input is kept as an artifact, which the run refers to.
            let (input, input_artifact) = match input {
                Some(text) if text.len() > INPUT_INLINE_MAX => {
                    let id = crate::json::sha256_hex(&text)[..32].to_string();
                    tx.execute(
                        "INSERT OR IGNORE INTO artifacts \
                         (id, run_id, policy, page_tokens, content, created_ms) \
                         VALUES (?1, ?2, 'input', ?3, ?4, ?5)",
                        params![
                            id,
                            record.run_id,
                            INPUT_PAGE_TOKENS as i64,
                            text.as_bytes(),
                            now_ms()
                        ],
                    )
                    .map_err(|e| fail.of(e))?;
                    refer(&tx, &record.run_id, &id).map_err(|e| fail.of(e))?;
                    (None, Some(id))
                }
                other => (other, None),
            };
            tx.execute(
                "INSERT INTO runs (run_id, script_name, script, catalog_sha256, mode, status, \
                 started_ms, updated_ms, input, catalog, input_artifact, lease_owner, lease_host, \
                 lease_token, lease_expires_ms, lease_since_ms, tenant, started_by, \
                 context_digest) \
                 VALUES (?1, ?2, ?3, ?4, ?5, 'running', ?6, ?6, ?7, ?8, ?9, ?10, ?11, 1, ?12, ?13, \
                 ?14, ?15, ?16)",
                params![
                    record.run_id,
                    record.script_name,
                    record.script,
                    record.catalog_sha256,
                    record.mode.as_str(),
                    record.started_ms,
                    input,
                    catalog,
                    input_artifact,
                    record.lease.as_ref().map(|l| &l.owner),
                    record.lease.as_ref().map(|l| &l.host),
                    record.lease.as_ref().map(|_| now + ttl),
                    record.lease.as_ref().map(|_| now),
                    record.tenant,
                    record.started_by,
                    record.context_digest,
                ],
            )
            .map_err(|e| fail.of(e))?;
            // Artifacts of earlier runs that the script or its input names (to read them with
            // `ts_artifact`) stay while this run is kept.
            for text in [Some(&record.script), input.as_ref()].into_iter().flatten() {
                refer_to_ids_in(&tx, &record.run_id, text, record.tenant.as_deref())
                    .map_err(|e| fail.of(e))?;
            }
            tx.commit().map_err(|e| fail.of(e))
        })
    }

    fn run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<RunRecord>> {
        let run_id = run_id.to_string();
        self.blocking(move |conn, fail| {
            let raw = conn
                .query_row(
                    &format!("{SELECT_RUN} WHERE run_id = ?1"),
                    [&run_id],
                    RawRun::read,
                )
                .optional()
                .map_err(|e| fail.of(e))?;
            raw.map(|raw| raw.parse(conn, fail)).transpose()
        })
    }

    fn list_runs(&self, query: RunQuery) -> StoreFuture<'_, RunPage> {
        self.blocking(move |conn, fail| list_runs(conn, &query, fail))
    }

    fn prune(&self, rule: PruneRule) -> StoreFuture<'_, Pruned> {
        let path = self.path.clone();
        self.writing(move |conn, fail| prune(conn, &path, &rule, fail))
    }

    fn lease_ttl(&self) -> Duration {
        self.lease
    }

    fn renew_lease<'a>(&'a self, run_id: &'a str, fence: &'a Fence) -> StoreFuture<'a, Renewed> {
        let (run_id, fence) = (run_id.to_string(), fence.clone());
        let ttl = self.lease.as_millis() as i64;
        self.writing(move |conn, fail| {
            let tx = conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(|e| fail.of(e))?;
            let renewed = match held(&tx, &run_id, &fence, ttl).map_err(|e| fail.of(e))? {
                Held::Newer(now) => Renewed::TakenOver(now),
                Held::Renewed(lease) => Renewed::Kept(lease),
                Held::Gone | Held::Released => Renewed::Released,
            };
            tx.commit().map_err(|e| fail.of(e))?;
            Ok(renewed)
        })
    }

    fn set_catalog<'a>(
        &'a self,
        run_id: &'a str,
        catalog_sha256: String,
        catalog: CatalogPrint,
    ) -> StoreFuture<'a, ()> {
        let run_id = run_id.to_string();
        self.writing(move |conn, fail| {
            let catalog = serde_json::to_string(&catalog)
                .map_err(|e| fail.say(format!("the run's catalog cannot be written: {e}")))?;
            conn.execute(
                "UPDATE runs SET catalog_sha256 = ?2, catalog = ?3 WHERE run_id = ?1",
                params![run_id, catalog_sha256, catalog],
            )
            .map_err(|e| fail.of(e))?;
            Ok(())
        })
    }

    fn take_run<'a>(
        &'a self,
        run_id: &'a str,
        claim: Claim,
        decision: Option<TakeDecision>,
    ) -> StoreFuture<'a, Result<RunRecord, TakeRefused>> {
        let run_id = run_id.to_string();
        let ttl = self.lease.as_millis() as i64;
        self.writing(move |conn, fail| {
            let tx = conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(|e| fail.of(e))?;
            let raw = tx
                .query_row(
                    &format!("{SELECT_RUN} WHERE run_id = ?1"),
                    [&run_id],
                    RawRun::read,
                )
                .optional()
                .map_err(|e| fail.of(e))?;
            // Every refusal below returns before the commit: the transaction rolls back and
            // nothing changes.
            let (mut record, token) = match raw {
                Some(raw) => {
                    let token = raw.lease_token;
                    (raw.parse(&tx, fail)?, token)
                }
                None => return Ok(Err(TakeRefused::Unknown)),
            };
            if record.status.is_final() {
                return Ok(Err(TakeRefused::Ended(Box::new(record))));
            }
            if record.status == RunStatus::Running {
                let now = now_ms();
                if let Some(lease) = record.lease.as_ref().filter(|l| l.live_at(now)) {
                    if !(claim.retake_own && lease.owner == claim.owner) {
                        return Ok(Err(TakeRefused::Busy(lease.clone())));
                    }
                }
            }
            let paused = record
                .pending
                .as_ref()
                .filter(|_| record.status == RunStatus::Paused);
            match (&decision, paused) {
                (None, None) => {}
                (Some(d), Some(p))
                    if p.seq == d.seq && p.read == d.read && d.verdict.answers(p.awaiting) =>
                {
                    if let Some(at) = p.read {
                        let decided =
                            decide_read(&tx, &run_id, p, at, &d.verdict).map_err(|e| fail.of(e))?;
                        if !decided {
                            return Ok(Err(TakeRefused::Settled(p.seq)));
                        }
                    } else {
                        let stored = tx
                            .query_row(
                                &format!("{SELECT_WRITE} AND seq = ?2"),
                                params![run_id, p.seq as i64],
                                read_write,
                            )
                            .optional()
                            .map_err(|e| fail.of(e))?;
                        let mut entry = stored.unwrap_or_else(|| {
                            JournaledWrite::new(
                                p.seq,
                                p.tool.clone(),
                                p.journal_args(),
                                WriteState::default(),
                                None,
                            )
                        });
                        // A decision never replaces an outcome, nor approves a call already made.
                        let made =
                            entry.state.intent && p.awaiting == crate::store::Awaiting::Approval;
                        if entry.outcome.is_some() || made {
                            return Ok(Err(TakeRefused::Settled(p.seq)));
                        }
                        d.verdict.apply(&mut entry);
                        upsert_write(&tx, &run_id, &entry).map_err(|e| fail.of(e))?;
                    }
                }
                _ => return Ok(Err(TakeRefused::Stale(Box::new(record)))),
            }
            // The next owner's token is one more than any before it.
            let now = now_ms();
            let lease = Lease::new(&claim, token.max(0) as u64 + 1, now, now + ttl);
            tx.execute(
                "UPDATE runs SET status = 'running', updated_ms = ?2, lease_owner = ?3, \
                 lease_host = ?4, lease_token = ?5, lease_expires_ms = ?6, lease_since_ms = ?2 \
                 WHERE run_id = ?1",
                params![
                    run_id,
                    now,
                    lease.owner,
                    lease.host,
                    lease.token as i64,
                    lease.expires_ms
                ],
            )
            .map_err(|e| fail.of(e))?;
            tx.commit().map_err(|e| fail.of(e))?;
            record.lease = Some(lease);
            Ok(Ok(record))
        })
    }

    fn finish_run<'a>(&'a self, run_id: &'a str, end: StoredEnd) -> StoreFuture<'a, ()> {
        let run_id = run_id.to_string();
        let location = self.location();
        self.writing(move |conn, fail| {
            let pending = end
                .pending
                .as_ref()
                .map(serde_json::to_string)
                .transpose()
                .map_err(|e| fail.say(format!("the run's pending call cannot be written: {e}")))?;
            let tx = conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(|e| fail.of(e))?;
            if let Some(fence) = &end.fence {
                let now = held(&tx, &run_id, fence, 0).map_err(|e| fail.of(e))?;
                refuse_unheld(&now, &location, &run_id, fence)?;
            }
            // The lease is let go (it expires now); its token stays, for the next owner's.
            let now = now_ms();
            tx.execute(
                "UPDATE runs SET status = ?2, pending = ?3, outcome = ?4, updated_ms = ?5, \
                 lease_expires_ms = CASE WHEN lease_expires_ms > ?5 THEN ?5 \
                 ELSE lease_expires_ms END WHERE run_id = ?1",
                params![
                    run_id,
                    end.status.as_str(),
                    pending,
                    end.outcome.to_string(),
                    now,
                ],
            )
            .map_err(|e| fail.of(e))?;
            tx.commit().map_err(|e| fail.of(e))
        })
    }

    fn load_journal<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, JournalRows> {
        let run_id = run_id.to_string();
        self.blocking(move |conn, fail| {
            let mut writes = conn
                .prepare(&format!("{SELECT_WRITE} ORDER BY seq"))
                .map_err(|e| fail.of(e))?;
            let writes = writes
                .query_map([&run_id], read_write)
                .map_err(|e| fail.of(e))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| fail.of(e))?;
            let mut reads = conn
                .prepare("SELECT epoch, tool, args, n, outcome FROM reads WHERE run_id = ?1")
                .map_err(|e| fail.of(e))?;
            let reads = reads
                .query_map([&run_id], |row| {
                    Ok(ReadRow {
                        epoch: row.get::<_, i64>(0)? as u64,
                        tool: row.get(1)?,
                        args: row.get(2)?,
                        n: row.get::<_, i64>(3)? as u64,
                        outcome: Arc::new(decode_outcome(&row.get::<_, String>(4)?)),
                    })
                })
                .map_err(|e| fail.of(e))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| fail.of(e))?;
            let mut approved = conn
                .prepare("SELECT epoch, tool, args, n, rule FROM approved_reads WHERE run_id = ?1")
                .map_err(|e| fail.of(e))?;
            let approved_reads = approved
                .query_map([&run_id], |row| {
                    Ok(ApprovedRead::new(
                        row.get::<_, i64>(0)? as u64,
                        row.get::<_, String>(1)?,
                        row.get::<_, String>(2)?,
                        row.get::<_, i64>(3)? as u64,
                        row.get(4)?,
                    ))
                })
                .map_err(|e| fail.of(e))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| fail.of(e))?;
            let mut rows = JournalRows::new(writes, reads);
            rows.approved_reads = approved_reads;
            Ok(rows)
        })
    }

    fn append<'a>(&'a self, run_id: &'a str, rows: JournalRows) -> StoreFuture<'a, ()> {
        let run_id = run_id.to_string();
        let (location, ttl) = (self.location(), self.lease.as_millis() as i64);
        self.writing(move |conn, fail| append(conn, &run_id, &rows, (&location, ttl), fail))
    }

    fn put_artifact<'a>(&'a self, id: &'a str, artifact: StoredArtifact) -> StoreFuture<'a, ()> {
        let id = id.to_string();
        self.writing(move |conn, fail| {
            let tx = conn.transaction().map_err(|e| fail.of(e))?;
            // The run refers to it even when an earlier run kept the same bytes first.
            refer(&tx, &artifact.run_id, &id).map_err(|e| fail.of(e))?;
            tx.execute(
                "INSERT OR IGNORE INTO artifacts \
                 (id, run_id, policy, page_tokens, content, created_ms, page_index) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    id,
                    artifact.run_id,
                    artifact.policy,
                    artifact.page_tokens as i64,
                    artifact.content,
                    now_ms(),
                    artifact.index.as_ref().map(PageIndex::encode),
                ],
            )
            .map_err(|e| fail.of(e))?;
            tx.commit().map_err(|e| fail.of(e))
        })
    }

    fn artifact_of_tenant<'a>(&'a self, id: &'a str, tenant: &'a str) -> StoreFuture<'a, bool> {
        let (id, tenant) = (id.to_string(), tenant.to_string());
        self.blocking(move |conn, fail| {
            conn.query_row(
                "SELECT EXISTS (SELECT 1 FROM runs WHERE tenant = ?2 AND run_id IN \
                 (SELECT run_id FROM artifacts WHERE id = ?1 \
                  UNION SELECT run_id FROM artifact_refs WHERE artifact_id = ?1))",
                params![id, tenant],
                |row| row.get::<_, bool>(0),
            )
            .map_err(|e| fail.of(e))
        })
    }

    fn artifact<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<StoredArtifact>> {
        let id = id.to_string();
        self.blocking(move |conn, fail| {
            let row = conn
                .query_row(
                    "SELECT page_tokens, policy, run_id, page_index, content FROM artifacts \
                     WHERE id = ?1",
                    [&id],
                    |row| Ok((artifact_row(row)?, row.get::<_, Vec<u8>>(4)?)),
                )
                .optional()
                .map_err(|e| fail.of(e))?;
            let Some((row, content)) = row else {
                return Ok(None);
            };
            let mut artifact = row.parse(&id, fail)?;
            artifact.content = content;
            Ok(Some(artifact))
        })
    }

    fn artifact_page<'a>(
        &'a self,
        id: &'a str,
        page: usize,
    ) -> StoreFuture<'a, Option<StoredArtifact>> {
        let id = id.to_string();
        self.blocking(move |conn, fail| {
            // The row without its content first: its index says which bytes to read.
            let row = conn
                .query_row(
                    "SELECT page_tokens, policy, run_id, page_index FROM artifacts WHERE id = ?1",
                    [&id],
                    artifact_row,
                )
                .optional()
                .map_err(|e| fail.of(e))?;
            let Some(mut artifact) = row.map(|row| row.parse(&id, fail)).transpose()? else {
                return Ok(None);
            };
            artifact.content = match artifact.index.as_ref().map(|i| i.ranges.get(page)) {
                None => conn
                    .query_row("SELECT content FROM artifacts WHERE id = ?1", [&id], |r| {
                        r.get(0)
                    })
                    .map_err(|e| fail.of(e))?,
                Some(None) => Vec::new(),
                Some(Some(range)) => read_bytes(conn, &id, range.clone(), fail)?,
            };
            Ok(Some(artifact))
        })
    }

    fn cache_get<'a>(&'a self, key: &'a str, at_us: i64) -> StoreFuture<'a, Option<CacheEntry>> {
        let key = key.to_string();
        self.blocking(move |conn, fail| {
            let row = conn
                .prepare_cached(
                    "SELECT tool, scope, value, created_us, expires_us FROM cache \
                     WHERE key = ?1 AND created_us < ?2 AND expires_us > ?2",
                )
                .and_then(|mut s| {
                    s.query_row(params![key, at_us], |row| {
                        Ok((
                            row.get::<_, String>(0)?,
                            row.get::<_, String>(1)?,
                            row.get::<_, String>(2)?,
                            row.get::<_, i64>(3)?,
                            row.get::<_, i64>(4)?,
                        ))
                    })
                    .optional()
                })
                .map_err(|e| fail.of(e))?;
            let Some((tool, scope, value, created_us, expires_us)) = row else {
                return Ok(None);
            };
            let value = serde_json::from_str(&value).map_err(|e| {
                fail.say(format!(
                    "the cached result of `{tool}` under {key} does not parse ({e}); prune the store's cache with `toolscript prune`"
                ))
            })?;
            Ok(Some(CacheEntry::new(
                key, tool, scope, value, created_us, expires_us,
            )))
        })
    }

    fn cache_put(&self, entries: Vec<CacheEntry>) -> StoreFuture<'_, ()> {
        self.writing(move |conn, fail| {
            let tx = conn.transaction().map_err(|e| fail.of(e))?;
            {
                let mut insert = tx
                    .prepare_cached(
                        "INSERT OR REPLACE INTO cache \
                         (key, tool, scope, value, created_us, expires_us) \
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    )
                    .map_err(|e| fail.of(e))?;
                for entry in entries {
                    insert
                        .execute(params![
                            entry.key,
                            entry.tool,
                            entry.scope,
                            entry.value.to_string(),
                            entry.created_us,
                            entry.expires_us
                        ])
                        .map_err(|e| fail.of(e))?;
                }
            }
            tx.commit().map_err(|e| fail.of(e))
        })
    }

    fn cache_drop(&self, drops: Vec<CacheDrop>) -> StoreFuture<'_, u64> {
        self.writing(move |conn, fail| {
            let tx = conn.transaction().map_err(|e| fail.of(e))?;
            let mut dropped = 0;
            for drop in &drops {
                let n = match &drop.scope {
                    Some(scope) => tx.execute(
                        "DELETE FROM cache WHERE tool = ?1 AND scope = ?2",
                        params![drop.tool, scope],
                    ),
                    None => tx.execute("DELETE FROM cache WHERE tool = ?1", params![drop.tool]),
                };
                dropped += n.map_err(|e| fail.of(e))? as u64;
            }
            tx.commit().map_err(|e| fail.of(e))?;
            Ok(dropped)
        })
    }

    fn put_plan(&self, plan: StoredPlan) -> StoreFuture<'_, ()> {
        self.writing(move |conn, fail| plans::put(conn, &plan).map_err(|e| fail.of(e)))
    }

    fn plan<'a>(&'a self, plan_id: &'a str) -> StoreFuture<'a, Option<StoredPlan>> {
        let plan_id = plan_id.to_string();
        self.blocking(move |conn, fail| {
            plans::get(conn, "plan_id", &plan_id).map_err(|e| fail.of(e))
        })
    }

    fn plan_of_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<StoredPlan>> {
        let run_id = run_id.to_string();
        self.blocking(move |conn, fail| {
            plans::get(conn, "applied_run", &run_id).map_err(|e| fail.of(e))
        })
    }

    fn claim_plan<'a>(
        &'a self,
        plan_id: &'a str,
        run_id: &'a str,
    ) -> StoreFuture<'a, Option<String>> {
        let (plan_id, run_id) = (plan_id.to_string(), run_id.to_string());
        self.writing(move |conn, fail| {
            plans::claim(conn, &plan_id, &run_id).map_err(|e| fail.of(e))
        })
    }

    fn release_plan<'a>(&'a self, plan_id: &'a str, run_id: &'a str) -> StoreFuture<'a, ()> {
        let (plan_id, run_id) = (plan_id.to_string(), run_id.to_string());
        self.writing(move |conn, fail| {
            plans::release(conn, &plan_id, &run_id).map_err(|e| fail.of(e))
        })
    }
}

/// Bytes `range` of artifact `id`'s content alone, through an incremental blob handle (`substr`
/// would load the whole content first: 47 ms a page of an 18 MB artifact); a range the content
/// does not hold is an error, not a panic or a short page.
fn read_bytes(
    conn: &Connection,
    id: &str,
    range: std::ops::Range<u64>,
    fail: &Fail,
) -> Result<Vec<u8>, Error> {
    let rowid: i64 = conn
        .query_row("SELECT rowid FROM artifacts WHERE id = ?1", [id], |r| {
            r.get(0)
        })
        .map_err(|e| fail.of(e))?;
    let blob = conn
        .blob_open(rusqlite::MAIN_DB, "artifacts", "content", rowid, true)
        .map_err(|e| fail.of(e))?;
    let held = |n: u64| usize::try_from(n).ok().filter(|n| *n <= blob.len());
    let (Some(start), Some(end)) = (held(range.start), held(range.end)) else {
        return Err(fail.say(format!(
            "artifact {id}: its page index names bytes {}..{}, but it holds {}",
            range.start,
            range.end,
            blob.len()
        )));
    };
    let mut bytes = vec![0; end.saturating_sub(start)];
    blob.read_at_exact(&mut bytes, start)
        .map_err(|e| fail.of(e))?;
    Ok(bytes)
}

/// An artifact's row as read, without its content and with its page index still encoded.
struct ArtifactRow {
    page_tokens: i64,
    policy: String,
    run_id: String,
    index: Option<Vec<u8>>,
}

/// The first four columns of an artifact's row: `page_tokens, policy, run_id, page_index`.
fn artifact_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ArtifactRow> {
    Ok(ArtifactRow {
        page_tokens: row.get(0)?,
        policy: row.get(1)?,
        run_id: row.get(2)?,
        index: row.get(3)?,
    })
}

impl ArtifactRow {
    /// The artifact (without content); an index that does not decode is an error naming it.
    fn parse(self, id: &str, fail: &Fail) -> Result<StoredArtifact, Error> {
        let index = match self.index {
            None => None,
            Some(bytes) => Some(PageIndex::decode(&bytes).ok_or_else(|| {
                fail.say(format!("the page index of artifact {id} does not decode"))
            })?),
        };
        Ok(StoredArtifact {
            content: Vec::new(),
            page_tokens: self.page_tokens.max(1) as usize,
            policy: self.policy,
            run_id: self.run_id,
            index,
        })
    }
}

/// Journal rows in one transaction: the reads, then the non-read calls. A non-read call whose
/// stored row has an outcome is never replaced: the append fails whole.
/// Appends `rows` to the journal of `run_id` in one transaction; with a fence, only while it
/// is the run's newest lease (`lease` is the store's location and the lease's time to live in
/// ms, which the append renews).
fn append(
    conn: &mut Connection,
    run_id: &str,
    rows: &JournalRows,
    lease: (&str, i64),
    fail: &Fail,
) -> Result<(), Error> {
    // Immediate: the fence is read under the write lock, so no take-over slips in between.
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(|e| fail.of(e))?;
    if let Some(fence) = &rows.fence {
        let now = held(&tx, run_id, fence, lease.1).map_err(|e| fail.of(e))?;
        refuse_unheld(&now, lease.0, run_id, fence)?;
    }
    {
        let mut insert_read = tx
            .prepare_cached(
                "INSERT OR IGNORE INTO reads (run_id, epoch, tool, args, n, outcome) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .map_err(|e| fail.of(e))?;
        for read in &rows.reads {
            insert_read
                .execute(params![
                    run_id,
                    read.epoch as i64,
                    read.tool,
                    read.args,
                    read.n as i64,
                    encode_outcome(&read.outcome),
                ])
                .map_err(|e| fail.of(e))?;
        }
        for approved in &rows.approved_reads {
            approve_read(&tx, run_id, approved).map_err(|e| fail.of(e))?;
        }
        for write in &rows.writes {
            if upsert_write(&tx, run_id, write).map_err(|e| fail.of(e))? == 0 {
                return Err(fail.say(format!(
                    "run {}: the journal already holds the outcome of call #{}, and a journaled outcome is never replaced",
                    super::shown_run_id(run_id),
                    write.seq
                )));
            }
        }
    }
    tx.commit().map_err(|e| fail.of(e))
}

/// Where the key of a store's keyed digests lives: beside the store, `STORE.key`.
fn key_path(store: &Path) -> PathBuf {
    let mut name = store.as_os_str().to_owned();
    name.push(".key");
    PathBuf::from(name)
}

/// The key at `path`, made if there is none: 32 random bytes in a file only its owner may read
/// (mode 0600 on Unix), put in place whole (a file written aside, then linked, so that two
/// processes making it at once agree on one key).
fn read_or_make_key(path: &Path) -> Result<[u8; 32], String> {
    let read = |path: &Path| -> Result<Option<[u8; 32]>, String> {
        match std::fs::read(path) {
            Ok(bytes) => <[u8; 32]>::try_from(bytes.as_slice()).map(Some).map_err(|_| {
                format!(
                    "its key {} is not 32 bytes: restore it, or remove it (the digests it made then no longer match)",
                    path.display()
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("its key {} cannot be read: {e}", path.display())),
        }
    };
    if let Some(key) = read(path)? {
        return Ok(key);
    }
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).map_err(|e| format!("no random bytes for its key: {e}"))?;
    // A name of its own for every attempt: two runs of one process may make the key at once.
    static ATTEMPT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let attempt = ATTEMPT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let aside = path.with_extension(format!("key.{}.{attempt}", std::process::id()));
    let made = (|| -> std::io::Result<()> {
        use std::io::Write;
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&aside)?;
        file.write_all(&key)?;
        file.sync_all()?;
        match std::fs::hard_link(&aside, path) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
            _ => Ok(()),
        }
    })();
    let _ = std::fs::remove_file(&aside);
    made.map_err(|e| format!("its key {} cannot be made: {e}", path.display()))?;
    // Another process may have put its own in place first: the key is the one in place.
    read(path)?.ok_or_else(|| format!("its key {} vanished as it was made", path.display()))
}

/// Journals a person's decision on the read `pending` (at `at`) a paused run waits at: an
/// approval (with its rule), or a rejection as the read's outcome. `false`, and nothing
/// written, when the journal already holds the read's outcome or an approval of it.
fn decide_read(
    tx: &Connection,
    run_id: &str,
    pending: &crate::store::PendingCall,
    at: crate::store::ReadAt,
    verdict: &Verdict,
) -> rusqlite::Result<bool> {
    let args = pending.journal_args();
    let key = params![
        run_id,
        at.epoch as i64,
        pending.tool,
        args,
        at.occurrence as i64
    ];
    let known = |table: &str| -> rusqlite::Result<bool> {
        tx.prepare_cached(&format!(
            "SELECT 1 FROM {table} WHERE run_id = ?1 AND epoch = ?2 AND tool = ?3 AND args = ?4 AND n = ?5"
        ))?
        .exists(key)
    };
    if known("reads")? || known("approved_reads")? {
        return Ok(false);
    }
    let approve = |rule: Option<String>| {
        let read = ApprovedRead::new(
            at.epoch,
            pending.tool.clone(),
            args.clone(),
            at.occurrence,
            rule,
        );
        approve_read(tx, run_id, &read)
    };
    match verdict {
        Verdict::Approve => approve(None)?,
        Verdict::ApproveRule(rule) => approve(Some(rule.clone()))?,
        Verdict::Reject(error) => tx
            .prepare_cached(
                "INSERT INTO reads (run_id, epoch, tool, args, n, outcome) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                run_id,
                at.epoch as i64,
                pending.tool,
                args,
                at.occurrence as i64,
                encode_outcome(&Err(error.clone())),
            ])?,
        // A read never waits for a word on a lost outcome: `take_run` matched the verdict
        // against what the run waits for.
        Verdict::Done | Verdict::Retry => return Ok(false),
    };
    Ok(true)
}

/// Journals a person's approval of a read (one already journaled is kept as it is).
fn approve_read(conn: &Connection, run_id: &str, read: &ApprovedRead) -> rusqlite::Result<usize> {
    conn.prepare_cached(
        "INSERT OR IGNORE INTO approved_reads (run_id, epoch, tool, args, n, rule) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        run_id,
        read.epoch as i64,
        read.tool,
        read.args,
        read.n as i64,
        read.rule,
    ])
}

/// Writes a non-read call's row, unless the stored one has an outcome; the rows changed.
fn upsert_write(
    conn: &Connection,
    run_id: &str,
    write: &JournaledWrite,
) -> rusqlite::Result<usize> {
    conn.prepare_cached(
        "INSERT INTO writes (run_id, seq, tool, args, approved, retry, intent, outcome, processes, approved_rule) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) \
         ON CONFLICT (run_id, seq) DO UPDATE SET tool = excluded.tool, args = excluded.args, \
         approved = excluded.approved, retry = excluded.retry, intent = excluded.intent, \
         outcome = excluded.outcome, processes = excluded.processes, \
         approved_rule = excluded.approved_rule WHERE writes.outcome IS NULL",
    )?
    .execute(params![
        run_id,
        write.seq as i64,
        write.tool,
        write.args,
        write.state.approved,
        write.state.retry,
        write.state.intent,
        write.outcome.as_ref().map(encode_outcome),
        write
            .processes
            .as_ref()
            .and_then(|p| serde_json::to_string(p).ok()),
        write.approved_rule,
    ])
}

const SELECT_WRITE: &str =
    "SELECT seq, tool, args, approved, retry, intent, outcome, processes, run_id, approved_rule FROM writes WHERE run_id = ?1";

/// A row of `writes`, as [`SELECT_WRITE`] reads it.
fn read_write(row: &rusqlite::Row<'_>) -> rusqlite::Result<JournaledWrite> {
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
        approved_rule: row.get(9)?,
        // One that does not parse is an error naming the run and the field, never a default.
        processes: match row.get::<_, Option<String>>(7)? {
            None => None,
            Some(text) => Some(
                RunRecord::parse_field(&row.get::<_, String>(8)?, "processes", &text, true)
                    .map_err(|e| {
                        rusqlite::Error::FromSqlConversionFailure(
                            7,
                            rusqlite::types::Type::Text,
                            e.into(),
                        )
                    })?,
            ),
        },
    })
}

/// What a SQLite file is, as far as a store is concerned.
enum Kind {
    /// No tables, no version: a new file, which becomes a store.
    Empty,
    /// A store, of this schema version.
    Store(i64),
    /// Another program's database: why it is not a store.
    Foreign(String),
}

/// What the file behind `conn` is, and whether it is stamped with the store's application id.
/// Reads only: a database that is not a store is never written.
fn classify(conn: &Connection) -> rusqlite::Result<(Kind, bool)> {
    let application: i32 = conn.pragma_query_value(None, "application_id", |row| row.get(0))?;
    let version: i64 = conn.pragma_query_value(None, "user_version", |row| row.get(0))?;
    let mut statement = conn.prepare(
        "SELECT name FROM sqlite_master WHERE substr(name, 1, 7) != 'sqlite_' ORDER BY name",
    )?;
    let names = statement
        .query_map([], |row| row.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    if application == APPLICATION_ID {
        return Ok((Kind::Store(version), true));
    }
    if application != 0 {
        return Ok((
            Kind::Foreign(format!(
                "its application_id is {application:#x}, another program's"
            )),
            false,
        ));
    }
    if names.is_empty() && version == 0 {
        return Ok((Kind::Empty, false));
    }
    let ours = names.iter().all(|n| STORE_TABLES.contains(&n.as_str()))
        && names.iter().any(|n| n == "runs")
        && (1..=SCHEMA_VERSION).contains(&version);
    if ours {
        return Ok((Kind::Store(version), false));
    }
    let shown: Vec<String> = names.iter().take(5).map(|n| format!("`{n}`")).collect();
    let more = if names.len() > 5 { ", …" } else { "" };
    Ok((
        Kind::Foreign(if names.is_empty() {
            format!("it holds no tables but its user_version is {version}")
        } else {
            format!(
                "it holds {} that are not a store's, or a user_version ({version}) that is not",
                if shown.len() == 1 {
                    format!("table {}{more}", shown[0])
                } else {
                    format!("tables {}{more}", shown.join(", "))
                }
            )
        }),
        false,
    ))
}

/// The message refusing another program's database.
fn foreign(why: &str) -> String {
    format!("not a toolscript store ({why}); it was left untouched: give another --store")
}

/// A file SQLite could not read as a database, or not set up as a store.
fn not_a_store(location: &str, e: rusqlite::Error) -> Error {
    Error::store(location, "not a store", Cause::from(e))
}

fn is_read_only(e: &rusqlite::Error) -> bool {
    matches!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::ReadOnly))
}

fn is_cant_open(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::CannotOpen | rusqlite::ErrorCode::ReadOnly)
    )
}

/// A path as the path of a `file:` URI: the characters a URI gives a meaning escaped.
fn uri_path(path: &Path) -> String {
    let mut out = String::new();
    for c in path.to_string_lossy().chars() {
        match c {
            '%' => out.push_str("%25"),
            '?' => out.push_str("%3f"),
            '#' => out.push_str("%23"),
            c => out.push(c),
        }
    }
    out
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

const SELECT_RUN: &str = "SELECT run_id, script_name, script, catalog_sha256, mode, status, \
                          lease_owner, started_ms, updated_ms, pending, outcome, input, catalog, \
                          input_artifact, lease_host, lease_token, lease_expires_ms, \
                          lease_since_ms, tenant, started_by, context_digest FROM runs";

/// A row of `runs` as SQLite holds it, before its fields are parsed.
struct RawRun {
    run_id: String,
    script_name: String,
    script: String,
    catalog_sha256: String,
    mode: String,
    status: String,
    lease_owner: Option<String>,
    lease_host: Option<String>,
    lease_token: i64,
    lease_expires_ms: Option<i64>,
    lease_since_ms: Option<i64>,
    started_ms: i64,
    updated_ms: i64,
    pending: Option<String>,
    outcome: Option<String>,
    input: Option<String>,
    catalog: Option<String>,
    input_artifact: Option<String>,
    tenant: Option<String>,
    started_by: Option<String>,
    context_digest: Option<String>,
}

impl RawRun {
    fn read(row: &rusqlite::Row<'_>) -> rusqlite::Result<RawRun> {
        Ok(RawRun {
            run_id: row.get(0)?,
            script_name: row.get(1)?,
            script: row.get(2)?,
            catalog_sha256: row.get(3)?,
            mode: row.get(4)?,
            status: row.get(5)?,
            lease_owner: row.get(6)?,
            lease_host: row.get(14)?,
            lease_token: row.get(15)?,
            lease_expires_ms: row.get(16)?,
            lease_since_ms: row.get(17)?,
            started_ms: row.get(7)?,
            updated_ms: row.get(8)?,
            pending: row.get(9)?,
            outcome: row.get(10)?,
            input: row.get(11)?,
            catalog: row.get(12)?,
            input_artifact: row.get(13)?,
            tenant: row.get(18)?,
            started_by: row.get(19)?,
            context_digest: row.get(20)?,
        })
    }

    /// The run's lease, when an owner has held it since stores kept leases (one without an
    /// expiry has expired).
    fn lease(&self) -> Option<Lease> {
        let owner = self.lease_owner.clone()?;
        Some(Lease {
            owner,
            host: self.lease_host.clone().unwrap_or_default(),
            token: self.lease_token.max(0) as u64,
            expires_ms: self.lease_expires_ms.unwrap_or(0),
            since_ms: self.lease_since_ms.unwrap_or(0),
        })
    }

    /// The record, every field parsed (an input kept as an artifact read from it); one that
    /// does not parse is an error naming it.
    fn parse(mut self, conn: &Connection, fail: &Fail) -> Result<RunRecord, Error> {
        if let Some(id) = &self.input_artifact {
            let content: Option<Vec<u8>> = conn
                .query_row("SELECT content FROM artifacts WHERE id = ?1", [id], |row| {
                    row.get(0)
                })
                .optional()
                .map_err(|e| fail.of(e))?;
            let Some(content) = content else {
                return Err(fail.say(format!(
                    "run {}: its input was kept as the artifact {id}, which the store no longer has",
                    super::shown_run_id(&self.run_id)
                )));
            };
            self.input = Some(String::from_utf8(content).map_err(|_| {
                fail.say(format!(
                    "run {}: its input artifact {id} is not UTF-8 text",
                    super::shown_run_id(&self.run_id)
                ))
            })?);
        }
        fn name<T: serde::de::DeserializeOwned>(
            id: &str,
            field: &str,
            text: &str,
        ) -> Result<T, String> {
            RunRecord::parse_field(id, field, text, false)
        }
        fn json<T: serde::de::DeserializeOwned>(
            id: &str,
            field: &str,
            text: Option<&String>,
        ) -> Result<Option<T>, String> {
            text.map(|t| RunRecord::parse_field(id, field, t, true))
                .transpose()
        }
        let id = self.run_id.as_str();
        let parsed = (|| {
            Ok::<_, String>(RunRecord {
                mode: name(id, "mode", &self.mode)?,
                status: name(id, "status", &self.status)?,
                pending: json(id, "pending", self.pending.as_ref())?,
                outcome: json(id, "outcome", self.outcome.as_ref())?,
                input: json(id, "input", self.input.as_ref())?,
                catalog: json(id, "catalog", self.catalog.as_ref())?,
                run_id: self.run_id.clone(),
                script_name: self.script_name.clone(),
                script: self.script.clone(),
                catalog_sha256: self.catalog_sha256.clone(),
                lease: self.lease(),
                started_ms: self.started_ms,
                updated_ms: self.updated_ms,
                tenant: self.tenant.clone(),
                started_by: self.started_by.clone(),
                context_digest: self.context_digest.clone(),
            })
        })();
        parsed.map_err(|why| fail.say(why))
    }
}

/// What the store holds of a run's lease, against the fence of a write.
enum Held {
    /// The store has no such run.
    Gone,
    /// The fence is the run's newest lease, and the run is running: renewed (when asked to).
    Renewed(Lease),
    /// The fence is the run's newest lease, but the run has paused or ended: nothing to renew.
    Released,
    /// A newer owner took the run: its lease.
    Newer(Lease),
}

/// Refuses a fenced write to a run a newer owner took, or that the store no longer has (it was
/// pruned while its lease had expired).
fn refuse_unheld(held: &Held, location: &str, run_id: &str, fence: &Fence) -> Result<(), Error> {
    match held {
        Held::Newer(now) => Err(super::lease::fenced(location, run_id, now, fence.token)),
        Held::Gone => Err(Error::store(
            location,
            format!(
                "the run {} is no longer in the store (it was removed while its lease had expired); this process stops: it makes no further non-read call or write of the run",
                super::shown_run_id(run_id)
            ),
            None,
        )),
        Held::Renewed(_) | Held::Released => Ok(()),
    }
}

/// Checks `fence` against the run's lease within the caller's transaction; when it holds and
/// the run is running, renews it for `ttl_ms` (none when 0).
fn held(tx: &Connection, run_id: &str, fence: &Fence, ttl_ms: i64) -> rusqlite::Result<Held> {
    let row = tx
        .query_row(
            "SELECT status, lease_owner, lease_host, lease_token, lease_expires_ms, \
             lease_since_ms FROM runs WHERE run_id = ?1",
            [run_id],
            |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    Lease {
                        owner: row
                            .get::<_, Option<String>>(1)?
                            .unwrap_or_else(|| "an unknown owner".into()),
                        host: row
                            .get::<_, Option<String>>(2)?
                            .unwrap_or_else(|| "an unknown host".into()),
                        token: row.get::<_, i64>(3)?.max(0) as u64,
                        expires_ms: row.get::<_, Option<i64>>(4)?.unwrap_or(0),
                        since_ms: row.get::<_, Option<i64>>(5)?.unwrap_or(0),
                    },
                ))
            },
        )
        .optional()?;
    let Some((status, mut lease)) = row else {
        return Ok(Held::Gone);
    };
    if lease.token != fence.token {
        return Ok(Held::Newer(lease));
    }
    if status != RunStatus::Running.as_str() {
        return Ok(Held::Released);
    }
    if ttl_ms > 0 {
        lease.expires_ms = now_ms() + ttl_ms;
        tx.execute(
            "UPDATE runs SET lease_expires_ms = ?2 WHERE run_id = ?1",
            params![run_id, lease.expires_ms],
        )?;
    }
    Ok(Held::Renewed(lease))
}

const SELECT_SUMMARY: &str =
    "SELECT run_id, script_name, mode, status, started_ms, pending, lease_owner, lease_host, \
     lease_token, lease_expires_ms, lease_since_ms FROM runs";

/// A page of the list of runs: the columns a list shows, newest first, one more run read than
/// the page holds to know whether another page follows.
fn list_runs(conn: &Connection, query: &RunQuery, fail: &Fail) -> Result<RunPage, Error> {
    let position = query.position().map_err(|why| fail.say(why))?;
    let mut clauses = Vec::new();
    if !query.statuses.is_empty() {
        // The statuses' names are this crate's constants, never a caller's text.
        let names: Vec<String> = query
            .statuses
            .iter()
            .map(|s| format!("'{}'", s.as_str()))
            .collect();
        clauses.push(format!("status IN ({})", names.join(", ")));
    }
    if position.is_some() {
        clauses.push("(started_ms < ?1 OR (started_ms = ?1 AND run_id > ?2))".to_string());
    }
    // A tenant's list holds its runs only (`?3`, bound below); no tenant lists every run.
    if query.tenant.is_some() {
        clauses.push("tenant = ?3".to_string());
    }
    let filter = if clauses.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", clauses.join(" AND "))
    };
    let limit = query.limit.clamp(1, i64::MAX as usize - 1);
    let sql = format!(
        "{SELECT_SUMMARY}{filter} ORDER BY started_ms DESC, run_id LIMIT {}",
        limit + 1
    );
    let mut statement = conn.prepare(&sql).map_err(|e| fail.of(e))?;
    let read = |row: &rusqlite::Row<'_>| {
        Ok((
            row.get::<_, String>(0)?,
            row.get::<_, String>(1)?,
            row.get::<_, String>(2)?,
            row.get::<_, String>(3)?,
            row.get::<_, i64>(4)?,
            row.get::<_, Option<String>>(5)?,
            summary_lease(row)?,
        ))
    };
    let (ms, id) = position.unwrap_or((0, ""));
    let rows = match (position.is_some(), &query.tenant) {
        (true, Some(tenant)) => statement.query_map(params![ms, id, tenant], read),
        (true, None) => statement.query_map(params![ms, id], read),
        // `?1` and `?2` are unused: SQLite numbers parameters, so they are bound all the same.
        (false, Some(tenant)) => statement.query_map(params![ms, id, tenant], read),
        (false, None) => statement.query_map([], read),
    }
    .map_err(|e| fail.of(e))?;
    let mut runs = Vec::new();
    let mut more = false;
    for row in rows {
        let (run_id, script_name, mode, status, started_ms, pending, lease) =
            row.map_err(|e| fail.of(e))?;
        if runs.len() == limit {
            more = true;
            break;
        }
        let parsed = (|| {
            Ok::<_, String>(RunSummary {
                mode: RunRecord::parse_field(&run_id, "mode", &mode, false)?,
                status: RunRecord::parse_field(&run_id, "status", &status, false)?,
                pending: pending
                    .as_deref()
                    .map(|p| RunRecord::parse_field(&run_id, "pending", p, true))
                    .transpose()?,
                lease: lease.filter(|_| status == RunStatus::Running.as_str()),
                run_id: run_id.clone(),
                script_name,
                started_ms,
            })
        })();
        runs.push(parsed.map_err(|why| fail.say(why))?);
    }
    let next = if more {
        runs.last().map(RunSummary::cursor)
    } else {
        None
    };
    Ok(RunPage { runs, next })
}

/// The lease of a row of [`SELECT_SUMMARY`], when it has an owner.
fn summary_lease(row: &rusqlite::Row<'_>) -> rusqlite::Result<Option<Lease>> {
    let Some(owner) = row.get::<_, Option<String>>(6)? else {
        return Ok(None);
    };
    Ok(Some(Lease {
        owner,
        host: row.get::<_, Option<String>>(7)?.unwrap_or_default(),
        token: row.get::<_, i64>(8)?.max(0) as u64,
        expires_ms: row.get::<_, Option<i64>>(9)?.unwrap_or(0),
        since_ms: row.get::<_, Option<i64>>(10)?.unwrap_or(0),
    }))
}

/// Removes the runs `rule` names and the artifacts no kept run refers to, in one transaction
/// (rolled back for a dry run); then gives freed pages back.
fn prune(
    conn: &mut Connection,
    path: &Path,
    rule: &PruneRule,
    fail: &Fail,
) -> Result<Pruned, Error> {
    let size = || {
        let wal = PathBuf::from(format!("{}-wal", path.display()));
        let len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        std::fs::metadata(path).ok().map(|m| m.len() + len(&wal))
    };
    let mut pruned = Pruned {
        bytes_before: size(),
        ..Pruned::default()
    };
    // Expired cached reads go whatever the rule says of runs.
    let expired = "DELETE FROM cache WHERE expires_us <= ?1";
    if rule.dry_run {
        pruned.cache_entries = conn
            .query_row(
                "SELECT COUNT(*) FROM cache WHERE expires_us <= ?1",
                [now_us()],
                |row| row.get::<_, i64>(0),
            )
            .map_err(|e| fail.of(e))? as u64;
    } else {
        pruned.cache_entries = conn.execute(expired, [now_us()]).map_err(|e| fail.of(e))? as u64;
        plans::prune(conn, now_ms()).map_err(|e| fail.of(e))?;
    }
    if rule.statuses.is_empty() {
        pruned.bytes_after = pruned.bytes_before;
        return Ok(pruned);
    }
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(|e| fail.of(e))?;
    let names: Vec<String> = rule
        .statuses
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect();
    let candidates: Vec<(String, String, Option<i64>)> = {
        let mut statement = tx
            .prepare(&format!(
                "SELECT run_id, status, lease_expires_ms FROM runs WHERE status IN ({}) \
                 AND updated_ms < ?1",
                names.join(", ")
            ))
            .map_err(|e| fail.of(e))?;
        let rows = statement
            .query_map([rule.updated_before_ms.unwrap_or(i64::MAX)], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?))
            })
            .map_err(|e| fail.of(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| fail.of(e))?
    };
    let now = now_ms();
    for (run_id, status, expires) in candidates {
        // A run under a live lease is never removed, whatever the rule says.
        if status == RunStatus::Running.as_str() && expires.is_some_and(|at| at > now) {
            pruned.kept_alive += 1;
            continue;
        }
        for table in ["writes", "reads", "approved_reads", "artifact_refs", "runs"] {
            tx.prepare_cached(&format!("DELETE FROM {table} WHERE run_id = ?1"))
                .and_then(|mut s| s.execute([&run_id]))
                .map_err(|e| fail.of(e))?;
        }
        pruned.runs += 1;
    }
    if pruned.runs > 0 || rule.vacuum {
        // An artifact stays while a run the store keeps refers to it (or made it).
        pruned.artifacts = tx
            .execute_batch(
                "DELETE FROM artifact_refs WHERE NOT EXISTS \
                 (SELECT 1 FROM runs WHERE runs.run_id = artifact_refs.run_id);",
            )
            .and_then(|()| {
                tx.execute(
                    "DELETE FROM artifacts WHERE NOT EXISTS \
                     (SELECT 1 FROM artifact_refs r WHERE r.artifact_id = artifacts.id) \
                     AND NOT EXISTS (SELECT 1 FROM runs WHERE runs.run_id = artifacts.run_id)",
                    [],
                )
            })
            .map_err(|e| fail.of(e))? as u64;
    }
    if rule.dry_run {
        tx.rollback().map_err(|e| fail.of(e))?;
        pruned.bytes_after = pruned.bytes_before;
        return Ok(pruned);
    }
    tx.commit().map_err(|e| fail.of(e))?;
    let incremental: i64 = conn
        .pragma_query_value(None, "auto_vacuum", |row| row.get(0))
        .map_err(|e| fail.of(e))?;
    let vacuum = if incremental == 2 {
        (pruned.runs > 0 || pruned.artifacts > 0 || rule.vacuum)
            .then_some("PRAGMA incremental_vacuum;")
    } else {
        // A store made before version 4 is rewritten once, and gives pages back from then on
        // without a rewrite.
        rule.vacuum
            .then_some("PRAGMA auto_vacuum = INCREMENTAL; VACUUM;")
    };
    if let Some(vacuum) = vacuum {
        // Stepped to its end: `incremental_vacuum` frees a page a step.
        let run = |sql: &str| -> rusqlite::Result<()> {
            for statement in sql.split_terminator(';').map(str::trim) {
                let mut statement = conn.prepare(statement)?;
                let mut rows = statement.query([])?;
                while rows.next()?.is_some() {}
            }
            Ok(())
        };
        run(vacuum).map_err(|e| {
            Error::store(
                &fail.0,
                format!(
                    "{} runs were removed, but the vacuum that gives their space back failed",
                    pruned.runs
                ),
                Cause::from(e),
            )
        })?;
        // The pages the vacuum moved are in the WAL until a checkpoint writes them back.
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .map_err(|e| fail.of(e))?;
    }
    pruned.bytes_after = size();
    Ok(pruned)
}

/// Records that `run_id` refers to the artifact `id`: it stays while the run is kept.
fn refer(conn: &Connection, run_id: &str, id: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT OR IGNORE INTO artifact_refs (run_id, artifact_id) VALUES (?1, ?2)",
    )?
    .execute([run_id, id])?;
    Ok(())
}

/// Records that `run_id` refers to every stored artifact whose id `text` holds.
///
/// A run of a tenant refers only to artifacts its tenant already has: naming another tenant's
/// artifact in a script never makes it the tenant's.
fn refer_to_ids_in(
    conn: &Connection,
    run_id: &str,
    text: &str,
    tenant: Option<&str>,
) -> rusqlite::Result<()> {
    let mut statement = conn.prepare_cached(
        "INSERT OR IGNORE INTO artifact_refs (run_id, artifact_id) \
         SELECT ?1, id FROM artifacts WHERE id = ?2 AND (?3 IS NULL OR EXISTS \
         (SELECT 1 FROM runs WHERE tenant = ?3 AND run_id IN (artifacts.run_id) \
          UNION SELECT 1 FROM artifact_refs r JOIN runs USING (run_id) \
          WHERE r.artifact_id = artifacts.id AND runs.tenant = ?3))",
    )?;
    for id in artifact_ids_in(text) {
        statement.execute(params![run_id, id, tenant])?;
    }
    Ok(())
}

/// The words of `text` that may be artifact ids: runs of exactly 32 lowercase hex digits.
fn artifact_ids_in(text: &str) -> impl Iterator<Item = &str> {
    let bytes = text.as_bytes();
    let mut start = 0;
    let mut i = 0;
    std::iter::from_fn(move || {
        while i <= bytes.len() {
            let hex = i < bytes.len() && matches!(bytes[i], b'0'..=b'9' | b'a'..=b'f');
            i += 1;
            if hex {
                continue;
            }
            let word = (start, i - 1);
            start = i;
            if word.1 - word.0 == 32 {
                // Hex digits are ASCII: the word's ends are character boundaries.
                return Some(&text[word.0..word.1]);
            }
        }
        None
    })
}

/// Fills `artifact_refs` in a store of an earlier version: each artifact's first run refers to
/// it, and so does every run whose script, input or outcome names it.
fn refer_to_artifacts(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "INSERT OR IGNORE INTO artifact_refs (run_id, artifact_id) SELECT run_id, id FROM artifacts;",
    )?;
    let mut statement = conn.prepare("SELECT run_id, script, input, outcome FROM runs")?;
    let mut rows = statement.query([])?;
    while let Some(row) = rows.next()? {
        let run_id: String = row.get(0)?;
        for i in 1..=3 {
            if let Some(text) = row.get::<_, Option<String>>(i)? {
                refer_to_ids_in(conn, &run_id, &text, None)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::effect::Effect;
    use crate::store::{Awaiting, Mode, PendingCall};
    use serde_json::json;

    fn record(run_id: &str) -> RunRecord {
        RunRecord::new(run_id, "s.rhai", "1", "c", Mode::Speculative)
    }

    /// A claim of another owner than the run's.
    fn other() -> Claim {
        Claim::new("another owner", "elsewhere")
    }

    #[tokio::test]
    async fn runs_are_taken_once_and_never_after_they_end() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("deep/er/store.sqlite3")).unwrap();
        let mut leased = record("r1");
        leased.lease = Some(Lease::new(&Claim::new("its owner", "here"), 1, 0, 0));
        store.create_run(leased).await.unwrap();
        let taken = store.take_run("r1", other(), None).await.unwrap();
        assert!(
            matches!(taken, Err(TakeRefused::Busy(_))),
            "a run under a live lease is not taken"
        );
        let store = store.with_lease_ttl(Duration::from_millis(1));
        let mut expiring = record("r2");
        expiring.lease = Some(Lease::new(&Claim::new("its owner", "here"), 1, 0, 0));
        store.create_run(expiring).await.unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let taken = store.take_run("r2", other(), None).await.unwrap();
        assert_eq!(
            taken.unwrap().lease.unwrap().token,
            2,
            "an expired lease is taken"
        );
        let end = StoredEnd::new(RunStatus::Completed, None, json!({"ok": true}));
        store.finish_run("r2", end).await.unwrap();
        let taken = store
            .take_run("r1", other().retaking_own(), None)
            .await
            .unwrap();
        assert!(
            matches!(taken, Err(TakeRefused::Busy(_))),
            "only its own owner retakes it"
        );
        let taken = store
            .take_run("r1", Claim::new("its owner", "here").retaking_own(), None)
            .await
            .unwrap();
        assert_eq!(taken.unwrap().run_id, "r1");
        let end = StoredEnd::new(RunStatus::Completed, None, json!({"ok": true}));
        store.finish_run("r1", end).await.unwrap();
        let taken = store.take_run("r1", other(), None).await.unwrap();
        assert!(matches!(taken, Err(TakeRefused::Ended(_))));
        let taken = store.take_run("nope", other(), None).await.unwrap();
        assert!(matches!(taken, Err(TakeRefused::Unknown)));
        let runs = store.list_runs(RunQuery::first(10)).await.unwrap().runs;
        assert_eq!(runs.len(), 2);
        assert!(runs.iter().all(|r| r.status == RunStatus::Completed));
        let run = store.run("r1").await.unwrap().unwrap();
        assert_eq!(run.outcome, Some(json!({"ok": true})));
    }

    #[tokio::test]
    async fn a_paused_run_keeps_its_typed_pending_call() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("store.sqlite3")).unwrap();
        let mut run = record("p");
        run.mode = Mode::Sequential;
        store.create_run(run).await.unwrap();
        let pending = PendingCall::new(
            2,
            "refund",
            Effect::Write,
            json!({"id": 1}),
            Awaiting::Approval,
        );
        let end = StoredEnd::new(RunStatus::Paused, Some(pending.clone()), json!({}));
        store.finish_run("p", end).await.unwrap();
        let read = store.run("p").await.unwrap().unwrap();
        assert_eq!(read.mode, Mode::Sequential);
        assert_eq!(read.status, RunStatus::Paused);
        assert_eq!(read.pending, Some(pending));
    }

    #[tokio::test]
    async fn a_record_that_does_not_parse_is_an_error_naming_the_run_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("store.sqlite3")).unwrap();
        store.create_run(record("bad")).await.unwrap();
        for (column, text, field) in [
            ("pending", r#"{"seq": "three"}"#, "pending"),
            ("mode", "fast", "mode"),
            ("status", "sleeping", "status"),
        ] {
            let fresh = record("bad");
            lock(&store.conn)
                .execute(
                    &format!(
                        "UPDATE runs SET mode = ?1, status = 'paused', pending = NULL, \
                         {column} = ?2 WHERE run_id = 'bad'"
                    ),
                    params![fresh.mode.as_str(), text],
                )
                .unwrap();
            let e = store.run("bad").await.unwrap_err().to_string();
            assert!(
                e.contains("run bad") && e.contains(&format!("`{field}`")),
                "{e}"
            );
            let e = store
                .list_runs(RunQuery::first(10))
                .await
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("`{field}`")), "{e}");
            let taken = store.take_run("bad", other(), None).await;
            assert!(matches!(taken, Err(Error::Store { .. })), "{taken:?}");
        }
    }

    #[tokio::test]
    async fn journal_rows_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.sqlite3");
        {
            let store = SqliteStore::open(&path).unwrap();
            store.create_run(record("r")).await.unwrap();
            let read = ReadRow::new(0, "get", "{}", 0, Arc::new(Ok(json!(1))));
            let mut write =
                JournaledWrite::new(0, "put", "{}", WriteState::new(false, false, true), None);
            write.processes = Some(crate::children::snapshot());
            let rows = JournalRows::new(vec![write], vec![read.clone(), read]);
            store.append("r", rows).await.unwrap();
        }
        let store = SqliteStore::open(&path).unwrap();
        let rows = store.load_journal("r").await.unwrap();
        assert_eq!(rows.reads.len(), 1, "a read is journaled once");
        assert_eq!(rows.writes.len(), 1);
        assert!(rows.writes[0].state.intent && rows.writes[0].outcome.is_none());
        assert_eq!(
            rows.writes[0].processes,
            Some(crate::children::snapshot()),
            "the intent's processes are kept"
        );
        // A record of processes that does not parse is an error naming the run and the field.
        lock(&store.conn)
            .execute("UPDATE writes SET processes = '{\"pid\": -1}'", [])
            .unwrap();
        let e = store.load_journal("r").await.unwrap_err().report();
        assert!(e.contains("run r") && e.contains("`processes`"), "{e}");
    }

    #[tokio::test]
    async fn artifacts_are_kept_once_by_id() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("store.sqlite3")).unwrap();
        let first = StoredArtifact::new(b"[1]".to_vec(), 10, "page", "r");
        store.put_artifact("a", first.clone()).await.unwrap();
        let second = StoredArtifact::new(b"[2]".to_vec(), 10, "page", "r2");
        store.put_artifact("a", second).await.unwrap();
        assert_eq!(store.artifact("a").await.unwrap(), Some(first));
        assert_eq!(store.artifact("b").await.unwrap(), None);
    }

    #[test]
    fn artifact_ids_are_whole_words_of_32_hex_digits() {
        let a = "0123456789abcdef0123456789abcdef";
        let text = format!("{a} x{a}y {a}0 \"{a}\" é{a}");
        let found: Vec<&str> = artifact_ids_in(&text).collect();
        assert_eq!(found, [a, a, a, a]);
        assert_eq!(artifact_ids_in(a).count(), 1);
        assert_eq!(artifact_ids_in("").count(), 0);
        assert_eq!(artifact_ids_in(&a.to_uppercase()).count(), 0);
    }

    #[test]
    fn a_file_that_is_not_a_store_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("not.sqlite3");
        std::fs::write(&path, "this is not a database, it is text").unwrap();
        let error = SqliteStore::open(&path).unwrap_err();
        let e = error.to_string();
        assert!(
            e.contains("not.sqlite3") && e.ends_with("not a store"),
            "{e}"
        );
        // SQLite's own words are the source, which the report adds.
        let source = std::error::Error::source(&error).expect("a source");
        assert!(
            source.downcast_ref::<rusqlite::Error>().is_some(),
            "{source:?}"
        );
        assert!(
            error.report().starts_with(&format!("{e}: {source}")),
            "{}",
            error.report()
        );
    }
}
