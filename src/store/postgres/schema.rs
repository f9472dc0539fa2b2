//! The PostgreSQL store's schema and its versions: `toolscript_meta` says which version a
//! database holds, and each step from one version to the next runs once, under an advisory
//! lock, so that instances starting together upgrade a database once. A database that holds
//! tables but no `toolscript_meta` is another program's, and is refused untouched.

use tokio_postgres::Transaction;

/// The schema version this toolscript writes (the PostgreSQL store's own count, apart from
/// SQLite's `user_version`).
pub(super) const SCHEMA_VERSION: i64 = 2;

/// The advisory lock taken while the schema is checked or set up ("toolscri" in ASCII).
const MIGRATION_LOCK: i64 = 0x746f_6f6c_7363_7269;

/// The steps from each version to the next: `MIGRATIONS[v]` takes version `v` to `v + 1`.
/// Version 1 is the schema of SQLite's version 10, and a table for the digest key; version 2
/// keeps a keyed digest of a run's per-run context (as SQLite's version 11).
const MIGRATIONS: [&str; 2] = [
    "
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    script_name TEXT NOT NULL,
    script TEXT NOT NULL,
    catalog_sha256 TEXT NOT NULL,
    mode TEXT NOT NULL,
    status TEXT NOT NULL,
    started_ms BIGINT NOT NULL,
    updated_ms BIGINT NOT NULL,
    pending TEXT,
    outcome TEXT,
    input TEXT,
    catalog TEXT,
    input_artifact TEXT,
    lease_owner TEXT,
    lease_host TEXT,
    lease_token BIGINT NOT NULL DEFAULT 0,
    lease_expires_ms BIGINT,
    lease_since_ms BIGINT,
    tenant TEXT,
    started_by TEXT
);
CREATE TABLE writes (
    run_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    tool TEXT NOT NULL,
    args TEXT NOT NULL,
    approved BOOLEAN NOT NULL DEFAULT FALSE,
    retry BOOLEAN NOT NULL DEFAULT FALSE,
    intent BOOLEAN NOT NULL DEFAULT FALSE,
    outcome TEXT,
    processes TEXT,
    approved_rule TEXT,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE artifacts (
    id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    policy TEXT NOT NULL,
    page_tokens BIGINT NOT NULL,
    content BYTEA NOT NULL,
    created_ms BIGINT NOT NULL,
    page_index BYTEA
);
CREATE TABLE reads (
    run_id TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    tool TEXT NOT NULL,
    args TEXT NOT NULL,
    n BIGINT NOT NULL,
    outcome TEXT NOT NULL,
    PRIMARY KEY (run_id, epoch, tool, args, n)
);
CREATE TABLE approved_reads (
    run_id TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    tool TEXT NOT NULL,
    args TEXT NOT NULL,
    n BIGINT NOT NULL,
    rule TEXT,
    PRIMARY KEY (run_id, epoch, tool, args, n)
);
CREATE TABLE artifact_refs (
    run_id TEXT NOT NULL,
    artifact_id TEXT NOT NULL,
    PRIMARY KEY (run_id, artifact_id)
);
CREATE INDEX artifact_refs_by_artifact ON artifact_refs (artifact_id);
CREATE INDEX runs_by_start ON runs (started_ms DESC, run_id);
CREATE INDEX runs_by_status ON runs (status, updated_ms);
CREATE INDEX runs_by_lease ON runs (status, lease_expires_ms);
CREATE TABLE cache (
    key TEXT PRIMARY KEY,
    tool TEXT NOT NULL,
    scope TEXT NOT NULL,
    value TEXT NOT NULL,
    created_us BIGINT NOT NULL,
    expires_us BIGINT NOT NULL
);
CREATE INDEX cache_by_tool ON cache (tool, scope);
CREATE TABLE plans (
    plan_id TEXT PRIMARY KEY,
    created_ms BIGINT NOT NULL,
    expires_ms BIGINT NOT NULL,
    applied_run TEXT,
    body TEXT NOT NULL,
    tenant TEXT,
    made_by TEXT
);
CREATE INDEX plans_by_run ON plans (applied_run);
CREATE TABLE digest_key (
    id SMALLINT PRIMARY KEY CHECK (id = 1),
    key BYTEA NOT NULL CHECK (octet_length(key) = 32)
);
",
    "
ALTER TABLE runs ADD COLUMN context_digest TEXT;
",
];

/// What a database is, as far as a store is concerned.
enum Kind {
    /// No tables in its schema: it becomes a store.
    Empty,
    /// A store, of this version.
    Store(i64),
    /// Another program's: these are some of its tables.
    Foreign(Vec<String>),
}

/// Checks the database `tx` is in and sets its schema up or upgrades it, all in `tx`, under
/// the advisory lock (held until `tx` ends). `Err` says why the database is refused; it is
/// then left as it was.
pub(super) async fn migrate(
    tx: &Transaction<'_>,
) -> Result<Result<(), String>, tokio_postgres::Error> {
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    let version = match classify(tx).await? {
        Kind::Foreign(tables) => return Ok(Err(foreign(&tables))),
        Kind::Store(v) if v > SCHEMA_VERSION => {
            return Ok(Err(format!(
                "the store has schema version {v}; this toolscript knows {SCHEMA_VERSION}: use a newer toolscript"
            )))
        }
        Kind::Store(v) => v,
        Kind::Empty => {
            tx.batch_execute(
                "CREATE TABLE toolscript_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL); \
                 INSERT INTO toolscript_meta VALUES ('schema_version', '0');",
            )
            .await?;
            0
        }
    };
    for step in &MIGRATIONS[version.max(0) as usize..] {
        tx.batch_execute(step).await?;
    }
    if version < SCHEMA_VERSION {
        tx.execute(
            "UPDATE toolscript_meta SET value = $1 WHERE key = 'schema_version'",
            &[&SCHEMA_VERSION.to_string()],
        )
        .await?;
    }
    Ok(Ok(()))
}

/// What the database is: its tables in the current schema, and `toolscript_meta`'s version.
async fn classify(tx: &Transaction<'_>) -> Result<Kind, tokio_postgres::Error> {
    let tables: Vec<String> = tx
        .query(
            "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'v', 'm', 'f') \
             ORDER BY 1",
            &[],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    if tables.is_empty() {
        return Ok(Kind::Empty);
    }
    if !tables.iter().any(|t| t == "toolscript_meta") {
        return Ok(Kind::Foreign(tables));
    }
    let version: Option<String> = tx
        .query_opt(
            "SELECT value FROM toolscript_meta WHERE key = 'schema_version'",
            &[],
        )
        .await?
        .map(|row| row.get(0));
    Ok(match version.and_then(|v| v.parse::<i64>().ok()) {
        Some(v) => Kind::Store(v),
        None => Kind::Foreign(tables),
    })
}

/// The message refusing another program's database, naming a few of its tables.
fn foreign(tables: &[String]) -> String {
    let shown: Vec<String> = tables.iter().take(5).map(|t| format!("`{t}`")).collect();
    let more = if tables.len() > 5 { ", …" } else { "" };
    format!(
        "not a toolscript store: the database holds {} {}{more} and no toolscript_meta; it was left untouched: give an empty database (CREATE DATABASE ...) or another schema",
        if shown.len() == 1 { "table" } else { "tables" },
        shown.join(", ")
    )
}
