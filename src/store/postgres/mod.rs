//! The networked backend of [`Store`]: one PostgreSQL database, which several toolscript
//! instances on several machines share (see docs/several-machines.md).
//!
//! It keeps what the SQLite store keeps, in the same tables, with the same meaning; what
//! differs:
//!
//! - Time: a lease's expiry is read and set by the database's clock, never a machine's, so
//!   that instances whose clocks disagree still agree on whose lease holds.
//! - Locks: every transaction that checks a lease locks the run's row (`SELECT ... FOR
//!   UPDATE`) first, so that no take-over slips in between a fence's check and the write.
//! - Retries: a transaction the server aborts for a serialization failure or a deadlock is run
//!   again, a few times, each after a short pause.
//! - The digest key lives in the database (table `digest_key`), so that every instance on one
//!   database uses one key.

mod connect;
mod rows;
mod schema;

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::OnceCell;

use super::journal::encode_outcome;
use super::{
    now_ms, CacheDrop, CacheEntry, CatalogPrint, Claim, Fence, JournalRows, JournaledWrite, Lease,
    PageIndex, PruneRule, Pruned, Renewed, RunPage, RunQuery, RunRecord, RunStatus, Store,
    StoreFuture, StoredArtifact, StoredEnd, StoredPlan, TakeDecision, TakeRefused, WriteState,
    DEFAULT_LEASE,
};
use crate::error::{Cause, Error};
pub use connect::{is_postgres_url, mask_url};
use rows::{Held, Oops};

/// How many times a transaction the server aborted (a serialization failure, a deadlock) is
/// tried again before its error is returned.
const RETRIES: u32 = 5;

/// A run's input longer than this (in bytes of JSON) is kept as an artifact, as SQLite does.
const INPUT_INLINE_MAX: usize = 64 * 1024;

/// The tokens a page of an input kept as an artifact holds.
const INPUT_PAGE_TOKENS: i64 = 2000;

/// Runs `$body` (an async block's body, which may use `?` on database calls) with a pooled
/// connection named `$client`; runs it again when the server aborted it for a serialization
/// failure or a deadlock. A body that writes opens and commits its own transaction.
macro_rules! attempt {
    ($store:expr, |$client:ident| $body:block) => {{
        let store = $store;
        let mut tries = 0u32;
        loop {
            #[allow(unused_mut)]
            let mut $client = match store.client().await {
                Ok(client) => client,
                Err(e) => break Err(e),
            };
            let result: Result<_, $crate::store::postgres::rows::Oops> = async { $body }.await;
            match result {
                Ok(value) => break Ok(value),
                Err($crate::store::postgres::rows::Oops::Db(e))
                    if $crate::store::postgres::rows::retryable(&e)
                        && tries < $crate::store::postgres::RETRIES =>
                {
                    tries += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(5 << tries)).await;
                }
                Err(e) => break Err(store.fail(e)),
            }
        }
    }};
}

/// The store of durable runs in a PostgreSQL database.
///
/// Made without a connection ([`PostgresStore::new`]): the first call connects, checks the
/// database (and sets up or upgrades its schema), and fails saying what to check when it
/// cannot. [`PostgresStore::connect`] does that at once.
pub struct PostgresStore {
    /// The URL, its password masked.
    location: String,
    pool: deadpool_postgres::Pool,
    /// Set once the database is known to be a store of this version.
    ready: OnceCell<()>,
    /// The digest key, once read.
    key: OnceCell<Arc<[u8; 32]>>,
    /// How long a run's lease holds unless renewed.
    lease: Duration,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("location", &self.location)
            .finish()
    }
}

impl PostgresStore {
    /// A store in the database `url` names (`postgres://USER:PASSWORD@HOST:PORT/DATABASE`,
    /// with libpq's `sslmode`, and `sslrootcert`, `connect_timeout`, `pool_max_size`), not yet
    /// connected.
    ///
    /// # Errors
    ///
    /// [`Error::Store`] when the URL does not parse or its TLS cannot be set up; the message
    /// shows the URL with its password masked.
    pub fn new(url: &str) -> Result<PostgresStore, Error> {
        let location = mask_url(url);
        let pool = connect::parse(url)
            .and_then(connect::pool)
            .map_err(|why| Error::store(&location, why, None))?;
        Ok(PostgresStore {
            location,
            pool,
            ready: OnceCell::new(),
            key: OnceCell::new(),
            lease: DEFAULT_LEASE,
        })
    }

    /// A store in the database `url` names, connected and checked: its schema set up or
    /// upgraded.
    ///
    /// # Errors
    ///
    /// [`Error::Store`] when the server cannot be reached in time, refuses the login, or the
    /// database is another program's or a newer toolscript's.
    pub async fn connect(url: &str) -> Result<PostgresStore, Error> {
        let store = PostgresStore::new(url)?;
        drop(store.client().await?);
        Ok(store)
    }

    /// Sets how long a run's lease holds unless renewed (30 s unless set), as
    /// [`SqliteStore::with_lease_ttl`](crate::SqliteStore) does.
    pub fn with_lease_ttl(mut self, ttl: Duration) -> PostgresStore {
        self.lease = ttl;
        self
    }

    /// A connection from the pool, the database checked first (once).
    async fn client(&self) -> Result<deadpool_postgres::Object, Error> {
        let client = self.pool.get().await.map_err(|e| self.unreachable(e))?;
        if self.ready.initialized() {
            return Ok(client);
        }
        let mut client = client;
        self.ready
            .get_or_try_init(|| async {
                let mut tries = 0;
                loop {
                    let result = async {
                        let tx = client.transaction().await?;
                        let checked = schema::migrate(&tx).await?;
                        if checked.is_ok() {
                            tx.commit().await?;
                        }
                        Ok::<_, tokio_postgres::Error>(checked)
                    }
                    .await;
                    match result {
                        Ok(Ok(())) => return Ok(()),
                        Ok(Err(why)) => return Err(Error::store(&self.location, why, None)),
                        Err(e) if rows::retryable(&e) && tries < RETRIES => tries += 1,
                        Err(e) => {
                            return Err(Error::store(
                                &self.location,
                                "its schema cannot be checked or set up (the user needs the right to create tables in the database)",
                                Cause::from(e),
                            ))
                        }
                    }
                }
            })
            .await?;
        Ok(client)
    }

    /// The error of a connection that could not be had.
    fn unreachable(&self, e: deadpool_postgres::PoolError) -> Error {
        let message = match &e {
            deadpool_postgres::PoolError::Timeout(_) => {
                "no connection to the database in time: check that the server runs and that its host and port are right (and reachable from here)"
            }
            _ => {
                "cannot connect to the database: check its host, port, user, password and database name, and sslmode (the server may refuse TLS, or require it)"
            }
        };
        Error::store(&self.location, message, Cause::from(e))
    }

    /// The store's error for what a transaction returned.
    fn fail(&self, oops: Oops) -> Error {
        match oops {
            Oops::Store(e) => e,
            Oops::Db(e) => Error::store(&self.location, "a database call failed", Cause::from(e)),
        }
    }

    fn say(&self, message: String) -> Oops {
        Oops::Store(Error::store(&self.location, message, None))
    }
}

/// The database's clock, in milliseconds since the Unix epoch: what leases are measured by.
const NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

impl Store for PostgresStore {
    fn location(&self) -> String {
        self.location.clone()
    }

    fn lease_ttl(&self) -> Duration {
        self.lease
    }

    /// Judged by the database's clock, oldest expiry first.
    fn expired_runs(&self, limit: usize) -> StoreFuture<'_, Vec<String>> {
        let limit = limit.min(i64::MAX as usize) as i64;
        Box::pin(async move {
            attempt!(self, |client| {
                let rows = client
                    .query(
                        &format!(
                            "SELECT run_id FROM runs WHERE status = 'running' AND \
                         (lease_expires_ms IS NULL OR lease_expires_ms <= {NOW_MS}) \
                         ORDER BY lease_expires_ms NULLS FIRST, run_id LIMIT $1"
                        ),
                        &[&limit],
                    )
                    .await?;
                Ok(rows.iter().map(|r| r.get(0)).collect())
            })
        })
    }

    fn digest_key(&self) -> StoreFuture<'_, Arc<[u8; 32]>> {
        Box::pin(async move {
            self.key
                .get_or_try_init(|| async {
                    let mut fresh = [0u8; 32];
                    getrandom::fill(&mut fresh).map_err(|e| {
                        Error::store(&self.location, format!("no random bytes for its key: {e}"), None)
                    })?;
                    let key: Vec<u8> = attempt!(self, |client| {
                        // Every instance on the database agrees on the first key made.
                        client
                            .execute(
                                "INSERT INTO digest_key (id, key) VALUES (1, $1) ON CONFLICT (id) DO NOTHING",
                                &[&fresh.as_slice()],
                            )
                            .await?;
                        let row = client
                            .query_one("SELECT key FROM digest_key WHERE id = 1", &[])
                            .await?;
                        Ok(row.get::<_, Vec<u8>>(0))
                    })?;
                    <[u8; 32]>::try_from(key.as_slice()).map(Arc::new).map_err(|_| {
                        Error::store(
                            &self.location,
                            "its digest key (table digest_key) is not 32 bytes: restore it, or delete its row (the digests it made then no longer match)",
                            None,
                        )
                    })
                })
                .await
                .cloned()
        })
    }

    fn create_run(&self, record: RunRecord) -> StoreFuture<'_, ()> {
        let ttl = self.lease.as_millis() as i64;
        Box::pin(async move {
            let catalog = record
                .catalog
                .as_ref()
                .map(serde_json::to_string)
                .transpose()
                .map_err(|e| {
                    self.fail(self.say(format!("the run's catalog cannot be written: {e}")))
                })?;
            let input = record.input.as_ref().map(Value::to_string);
            attempt!(self, |client| {
                let tx = client.transaction().await?;
                let now = rows::db_now(&tx).await?;
                let (input, input_artifact) = match &input {
                    Some(text) if text.len() > INPUT_INLINE_MAX => {
                        let id = crate::json::sha256_hex(text)[..32].to_string();
                        tx.execute(
                            "INSERT INTO artifacts (id, run_id, policy, page_tokens, content, created_ms) \
                             VALUES ($1, $2, 'input', $3, $4, $5) ON CONFLICT (id) DO NOTHING",
                            &[&id, &record.run_id, &INPUT_PAGE_TOKENS, &text.as_bytes(), &now_ms()],
                        )
                        .await?;
                        rows::refer(&tx, &record.run_id, &id).await?;
                        (None, Some(id))
                    }
                    other => (other.clone(), None),
                };
                let lease = record.lease.as_ref();
                tx.execute(
                    "INSERT INTO runs (run_id, script_name, script, catalog_sha256, mode, status, \
                     started_ms, updated_ms, input, catalog, input_artifact, lease_owner, lease_host, \
                     lease_token, lease_expires_ms, lease_since_ms, tenant, started_by, \
                     context_digest) \
                     VALUES ($1, $2, $3, $4, $5, 'running', $6, $6, $7, $8, $9, $10, $11, 1, $12, $13, \
                     $14, $15, $16)",
                    &[
                        &record.run_id,
                        &record.script_name,
                        &record.script,
                        &record.catalog_sha256,
                        &record.mode.as_str(),
                        &record.started_ms,
                        &input,
                        &catalog,
                        &input_artifact,
                        &lease.map(|l| &l.owner),
                        &lease.map(|l| &l.host),
                        &lease.map(|_| now + ttl),
                        &lease.map(|_| now),
                        &record.tenant,
                        &record.started_by,
                        &record.context_digest,
                    ],
                )
                .await?;
                for text in [Some(&record.script), input.as_ref()].into_iter().flatten() {
                    rows::refer_to_ids_in(&tx, &record.run_id, text, record.tenant.as_deref())
                        .await?;
                }
                tx.commit().await?;
                Ok(())
            })
        })
    }

    fn run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<RunRecord>> {
        Box::pin(async move {
            attempt!(self, |client| {
                let tx = client.transaction().await?;
                let record = rows::run(&tx, run_id, false, &self.location).await?;
                tx.commit().await?;
                Ok(record.map(|(record, _)| record))
            })
        })
    }

    fn list_runs(&self, query: RunQuery) -> StoreFuture<'_, RunPage> {
        Box::pin(async move {
            attempt!(self, |client| {
                rows::list_runs(&client, &query, &self.location).await
            })
        })
    }

    fn prune(&self, rule: PruneRule) -> StoreFuture<'_, Pruned> {
        Box::pin(async move { attempt!(self, |client| { rows::prune(&mut client, &rule).await }) })
    }

    fn renew_lease<'a>(&'a self, run_id: &'a str, fence: &'a Fence) -> StoreFuture<'a, Renewed> {
        let ttl = self.lease.as_millis() as i64;
        Box::pin(async move {
            attempt!(self, |client| {
                let tx = client.transaction().await?;
                let renewed = match rows::held(&tx, run_id, fence, ttl).await? {
                    Held::Newer(now) => Renewed::TakenOver(now),
                    Held::Renewed(lease) => Renewed::Kept(lease),
                    Held::Gone | Held::Released => Renewed::Released,
                };
                tx.commit().await?;
                Ok(renewed)
            })
        })
    }

    fn set_catalog<'a>(
        &'a self,
        run_id: &'a str,
        catalog_sha256: String,
        catalog: CatalogPrint,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let catalog = serde_json::to_string(&catalog).map_err(|e| {
                self.fail(self.say(format!("the run's catalog cannot be written: {e}")))
            })?;
            attempt!(self, |client| {
                client
                    .execute(
                        "UPDATE runs SET catalog_sha256 = $2, catalog = $3 WHERE run_id = $1",
                        &[&run_id, &catalog_sha256, &catalog],
                    )
                    .await?;
                Ok(())
            })
        })
    }

    fn take_run<'a>(
        &'a self,
        run_id: &'a str,
        claim: Claim,
        decision: Option<TakeDecision>,
    ) -> StoreFuture<'a, Result<RunRecord, TakeRefused>> {
        let ttl = self.lease.as_millis() as i64;
        Box::pin(async move {
            attempt!(self, |client| {
                let tx = client.transaction().await?;
                // The row is locked until the transaction ends: a second taker waits, then
                // sees the first one's lease. Every refusal returns before the commit.
                let Some((mut record, token)) =
                    rows::run(&tx, run_id, true, &self.location).await?
                else {
                    return Ok(Err(TakeRefused::Unknown));
                };
                if record.status.is_final() {
                    return Ok(Err(TakeRefused::Ended(Box::new(record))));
                }
                let now = rows::db_now(&tx).await?;
                if record.status == RunStatus::Running {
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
                            if !rows::decide_read(&tx, run_id, p, at, &d.verdict).await? {
                                return Ok(Err(TakeRefused::Settled(p.seq)));
                            }
                        } else {
                            let stored = rows::write_at(&tx, run_id, p.seq).await?;
                            let mut entry = stored.unwrap_or_else(|| {
                                JournaledWrite::new(
                                    p.seq,
                                    p.tool.clone(),
                                    p.journal_args(),
                                    WriteState::default(),
                                    None,
                                )
                            });
                            let made = entry.state.intent
                                && p.awaiting == crate::store::Awaiting::Approval;
                            if entry.outcome.is_some() || made {
                                return Ok(Err(TakeRefused::Settled(p.seq)));
                            }
                            d.verdict.apply(&mut entry);
                            rows::upsert_write(&tx, run_id, &entry).await?;
                        }
                    }
                    _ => return Ok(Err(TakeRefused::Stale(Box::new(record)))),
                }
                let lease = Lease::new(&claim, token.max(0) as u64 + 1, now, now + ttl);
                tx.execute(
                    "UPDATE runs SET status = 'running', updated_ms = $2, lease_owner = $3, \
                     lease_host = $4, lease_token = $5, lease_expires_ms = $6, lease_since_ms = $2 \
                     WHERE run_id = $1",
                    &[
                        &run_id,
                        &now,
                        &lease.owner,
                        &lease.host,
                        &(lease.token as i64),
                        &lease.expires_ms,
                    ],
                )
                .await?;
                tx.commit().await?;
                record.lease = Some(lease);
                Ok(Ok(record))
            })
        })
    }

    fn finish_run<'a>(&'a self, run_id: &'a str, end: StoredEnd) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let pending = end
                .pending
                .as_ref()
                .map(serde_json::to_string)
                .transpose()
                .map_err(|e| {
                    self.fail(self.say(format!("the run's pending call cannot be written: {e}")))
                })?;
            let outcome = end.outcome.to_string();
            attempt!(self, |client| {
                let tx = client.transaction().await?;
                if let Some(fence) = &end.fence {
                    let now = rows::held(&tx, run_id, fence, 0).await?;
                    rows::refuse_unheld(&now, &self.location, run_id, fence)?;
                }
                // The lease is let go (it expires now); its token stays, for the next owner's.
                let now = rows::db_now(&tx).await?;
                let update = tx
                    .prepare_cached(
                        "UPDATE runs SET status = $2, pending = $3, outcome = $4, updated_ms = $5, \
                         lease_expires_ms = CASE WHEN lease_expires_ms > $5 THEN $5 \
                         ELSE lease_expires_ms END WHERE run_id = $1",
                    )
                    .await?;
                tx.execute(
                    &update,
                    &[&run_id, &end.status.as_str(), &pending, &outcome, &now],
                )
                .await?;
                tx.commit().await?;
                Ok(())
            })
        })
    }

    fn load_journal<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, JournalRows> {
        Box::pin(async move {
            attempt!(self, |client| {
                let tx = client
                    .build_transaction()
                    .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                    .read_only(true)
                    .start()
                    .await?;
                let rows = rows::load_journal(&tx, run_id).await?;
                tx.commit().await?;
                Ok(rows)
            })
        })
    }

    fn append<'a>(&'a self, run_id: &'a str, rows: JournalRows) -> StoreFuture<'a, ()> {
        let ttl = self.lease.as_millis() as i64;
        Box::pin(async move {
            attempt!(self, |client| {
                let tx = client.transaction().await?;
                if let Some(fence) = &rows.fence {
                    let now = rows::held(&tx, run_id, fence, ttl).await?;
                    rows::refuse_unheld(&now, &self.location, run_id, fence)?;
                }
                let insert = tx
                    .prepare_cached(
                        "INSERT INTO reads (run_id, epoch, tool, args, n, outcome) \
                         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
                    )
                    .await?;
                for read in &rows.reads {
                    tx.execute(
                        &insert,
                        &[
                            &run_id,
                            &(read.epoch as i64),
                            &read.tool,
                            &read.args,
                            &(read.n as i64),
                            &encode_outcome(&read.outcome),
                        ],
                    )
                    .await?;
                }
                for approved in &rows.approved_reads {
                    rows::approve_read(&tx, run_id, approved).await?;
                }
                for write in &rows.writes {
                    if rows::upsert_write(&tx, run_id, write).await? == 0 {
                        return Err(self.say(format!(
                            "run {}: the journal already holds the outcome of call #{}, and a journaled outcome is never replaced",
                            super::shown_run_id(run_id),
                            write.seq
                        )));
                    }
                }
                tx.commit().await?;
                Ok(())
            })
        })
    }

    fn put_artifact<'a>(&'a self, id: &'a str, artifact: StoredArtifact) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let index = artifact.index.as_ref().map(PageIndex::encode);
            attempt!(self, |client| {
                let tx = client.transaction().await?;
                rows::refer(&tx, &artifact.run_id, id).await?;
                tx.execute(
                    "INSERT INTO artifacts (id, run_id, policy, page_tokens, content, created_ms, page_index) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (id) DO NOTHING",
                    &[
                        &id,
                        &artifact.run_id,
                        &artifact.policy,
                        &(artifact.page_tokens as i64),
                        &artifact.content,
                        &now_ms(),
                        &index,
                    ],
                )
                .await?;
                tx.commit().await?;
                Ok(())
            })
        })
    }

    fn artifact_of_tenant<'a>(&'a self, id: &'a str, tenant: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            attempt!(self, |client| {
                let row = client
                    .query_one(
                        "SELECT EXISTS (SELECT 1 FROM runs WHERE tenant = $2 AND run_id IN \
                         (SELECT run_id FROM artifacts WHERE id = $1 \
                          UNION SELECT run_id FROM artifact_refs WHERE artifact_id = $1))",
                        &[&id, &tenant],
                    )
                    .await?;
                Ok(row.get::<_, bool>(0))
            })
        })
    }

    fn artifact<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<StoredArtifact>> {
        Box::pin(async move {
            attempt!(self, |client| {
                let row = client
                    .query_opt(
                        "SELECT page_tokens, policy, run_id, page_index, content FROM artifacts \
                         WHERE id = $1",
                        &[&id],
                    )
                    .await?;
                let Some(row) = row else { return Ok(None) };
                let mut artifact = rows::artifact_row(&row, id, &self.location)?;
                artifact.content = row.get(4);
                Ok(Some(artifact))
            })
        })
    }

    fn artifact_page<'a>(
        &'a self,
        id: &'a str,
        page: usize,
    ) -> StoreFuture<'a, Option<StoredArtifact>> {
        Box::pin(async move {
            attempt!(self, |client| {
                // The row without its content first: its index says which bytes to read.
                let row = client
                    .query_opt(
                        "SELECT page_tokens, policy, run_id, page_index, octet_length(content)::bigint \
                         FROM artifacts WHERE id = $1",
                        &[&id],
                    )
                    .await?;
                let Some(row) = row else { return Ok(None) };
                let mut artifact = rows::artifact_row(&row, id, &self.location)?;
                let len = row.get::<_, i64>(4).max(0) as u64;
                artifact.content = match artifact.index.as_ref().map(|i| i.ranges.get(page)) {
                    None => client
                        .query_one("SELECT content FROM artifacts WHERE id = $1", &[&id])
                        .await?
                        .get(0),
                    Some(None) => Vec::new(),
                    Some(Some(range)) => {
                        if range.start > len || range.end > len {
                            return Err(self.say(format!(
                                "artifact {id}: its page index names bytes {}..{}, but it holds {len}",
                                range.start, range.end
                            )));
                        }
                        // `substring` counts from 1; the page alone crosses the network.
                        let (from, count) = (
                            range.start as i64 + 1,
                            range.end.saturating_sub(range.start) as i64,
                        );
                        client
                            .query_one(
                                "SELECT substring(content FROM $2::bigint::int FOR $3::bigint::int) FROM artifacts WHERE id = $1",
                                &[&id, &from, &count],
                            )
                            .await?
                            .get(0)
                    }
                };
                Ok(Some(artifact))
            })
        })
    }

    fn cache_get<'a>(&'a self, key: &'a str, at_us: i64) -> StoreFuture<'a, Option<CacheEntry>> {
        Box::pin(async move {
            attempt!(self, |client| {
                let statement = client
                    .prepare_cached(
                        "SELECT tool, scope, value, created_us, expires_us FROM cache \
                         WHERE key = $1 AND created_us < $2 AND expires_us > $2",
                    )
                    .await?;
                let Some(row) = client.query_opt(&statement, &[&key, &at_us]).await? else {
                    return Ok(None);
                };
                let (tool, scope, value): (String, String, String) =
                    (row.get(0), row.get(1), row.get(2));
                let value = serde_json::from_str(&value).map_err(|e| {
                    self.say(format!(
                        "the cached result of `{tool}` under {key} does not parse ({e}); prune the store's cache with `toolscript prune`"
                    ))
                })?;
                Ok(Some(CacheEntry::new(
                    key.to_string(),
                    tool,
                    scope,
                    value,
                    row.get(3),
                    row.get(4),
                )))
            })
        })
    }

    fn cache_put(&self, entries: Vec<CacheEntry>) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            attempt!(self, |client| {
                let tx = client.transaction().await?;
                let insert = tx
                    .prepare_cached(
                        "INSERT INTO cache (key, tool, scope, value, created_us, expires_us) \
                         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (key) DO UPDATE SET \
                         tool = excluded.tool, scope = excluded.scope, value = excluded.value, \
                         created_us = excluded.created_us, expires_us = excluded.expires_us",
                    )
                    .await?;
                for entry in &entries {
                    tx.execute(
                        &insert,
                        &[
                            &entry.key,
                            &entry.tool,
                            &entry.scope,
                            &entry.value.to_string(),
                            &entry.created_us,
                            &entry.expires_us,
                        ],
                    )
                    .await?;
                }
                tx.commit().await?;
                Ok(())
            })
        })
    }

    fn cache_drop(&self, drops: Vec<CacheDrop>) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            attempt!(self, |client| {
                let tx = client.transaction().await?;
                let mut dropped = 0;
                for drop in &drops {
                    dropped += match &drop.scope {
                        Some(scope) => {
                            tx.execute(
                                "DELETE FROM cache WHERE tool = $1 AND scope = $2",
                                &[&drop.tool, scope],
                            )
                            .await?
                        }
                        None => {
                            tx.execute("DELETE FROM cache WHERE tool = $1", &[&drop.tool])
                                .await?
                        }
                    };
                }
                tx.commit().await?;
                Ok(dropped)
            })
        })
    }

    fn put_plan(&self, plan: StoredPlan) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            attempt!(self, |client| {
                client
                    .execute(
                        "INSERT INTO plans (plan_id, created_ms, expires_ms, applied_run, body, tenant, made_by) \
                         VALUES ($1, $2, $3, NULL, $4, $5, $6) \
                         ON CONFLICT (plan_id) DO UPDATE SET created_ms = excluded.created_ms, \
                         expires_ms = excluded.expires_ms, body = excluded.body \
                         WHERE plans.applied_run IS NULL",
                        &[
                            &plan.plan_id,
                            &plan.created_ms,
                            &plan.expires_ms,
                            &plan.body,
                            &plan.tenant,
                            &plan.made_by,
                        ],
                    )
                    .await?;
                Ok(())
            })
        })
    }

    fn plan<'a>(&'a self, plan_id: &'a str) -> StoreFuture<'a, Option<StoredPlan>> {
        Box::pin(async move {
            attempt!(self, |client| {
                rows::plan(&client, "plan_id", plan_id).await
            })
        })
    }

    fn plan_of_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<StoredPlan>> {
        Box::pin(async move {
            attempt!(self, |client| {
                rows::plan(&client, "applied_run", run_id).await
            })
        })
    }

    fn claim_plan<'a>(
        &'a self,
        plan_id: &'a str,
        run_id: &'a str,
    ) -> StoreFuture<'a, Option<String>> {
        Box::pin(async move {
            attempt!(self, |client| {
                let tx = client.transaction().await?;
                let taken = tx
                    .execute(
                        "UPDATE plans SET applied_run = $2 WHERE plan_id = $1 AND applied_run IS NULL",
                        &[&plan_id, &run_id],
                    )
                    .await?;
                let other = if taken == 1 {
                    None
                } else {
                    tx.query_opt(
                        "SELECT applied_run FROM plans WHERE plan_id = $1",
                        &[&plan_id],
                    )
                    .await?
                    .and_then(|row| row.get::<_, Option<String>>(0))
                    .or_else(|| Some(String::new()))
                };
                tx.commit().await?;
                Ok(other)
            })
        })
    }

    fn release_plan<'a>(&'a self, plan_id: &'a str, run_id: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            attempt!(self, |client| {
                client
                    .execute(
                        "UPDATE plans SET applied_run = NULL WHERE plan_id = $1 AND applied_run = $2",
                        &[&plan_id, &run_id],
                    )
                    .await?;
                Ok(())
            })
        })
    }
}
