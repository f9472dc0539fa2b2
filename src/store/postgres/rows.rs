//! The PostgreSQL store's statements that more than one method uses, and how its rows become
//! records: a run, a journal's entries, an artifact, a plan, a page of the list of runs, a
//! prune.

use std::sync::Arc;

use deadpool_postgres::{GenericClient, Transaction};
use tokio_postgres::error::SqlState;
use tokio_postgres::Row;

use super::super::journal::{decode_outcome, encode_outcome, ApprovedRead};
use super::super::{
    now_us, Fence, JournalRows, JournaledWrite, Lease, PageIndex, PendingCall, PruneRule, Pruned,
    ReadAt, ReadRow, RunPage, RunQuery, RunRecord, RunStatus, RunSummary, StoredArtifact,
    StoredPlan, Verdict, WriteState,
};
use super::NOW_MS;
use crate::error::Error;

/// What a transaction's body returns when it fails: a database call's error (which may be run
/// again), or the store's own.
pub(super) enum Oops {
    Db(tokio_postgres::Error),
    Store(Error),
}

impl From<tokio_postgres::Error> for Oops {
    fn from(e: tokio_postgres::Error) -> Oops {
        Oops::Db(e)
    }
}

impl From<Error> for Oops {
    fn from(e: Error) -> Oops {
        Oops::Store(e)
    }
}

/// Whether the server aborted the transaction for a conflict with another: run it again.
pub(super) fn retryable(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(code) if *code == SqlState::T_R_SERIALIZATION_FAILURE
            || *code == SqlState::T_R_DEADLOCK_DETECTED
    )
}

/// The database's clock now, in ms since the Unix epoch.
pub(super) async fn db_now(tx: &Transaction<'_>) -> Result<i64, tokio_postgres::Error> {
    let now = tx.prepare_cached(&format!("SELECT {NOW_MS}")).await?;
    Ok(tx.query_one(&now, &[]).await?.get(0))
}

/// Records that `run_id` refers to the artifact `id`: it stays while the run is kept.
pub(super) async fn refer(
    tx: &Transaction<'_>,
    run_id: &str,
    id: &str,
) -> Result<(), tokio_postgres::Error> {
    tx.execute(
        "INSERT INTO artifact_refs (run_id, artifact_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        &[&run_id, &id],
    )
    .await
    .map(drop)
}

/// Records that `run_id` refers to every stored artifact whose id `text` holds; a run of a
/// tenant only to those its tenant already has.
pub(super) async fn refer_to_ids_in(
    tx: &Transaction<'_>,
    run_id: &str,
    text: &str,
    tenant: Option<&str>,
) -> Result<(), tokio_postgres::Error> {
    let ids: Vec<&str> = artifact_ids_in(text).collect();
    if ids.is_empty() {
        return Ok(());
    }
    let statement = tx
        .prepare_cached(
            "INSERT INTO artifact_refs (run_id, artifact_id) \
             SELECT $1, id FROM artifacts WHERE id = $2 AND ($3::text IS NULL OR EXISTS \
             (SELECT 1 FROM runs WHERE tenant = $3 AND run_id = artifacts.run_id \
              UNION SELECT 1 FROM artifact_refs r JOIN runs USING (run_id) \
              WHERE r.artifact_id = artifacts.id AND runs.tenant = $3)) \
             ON CONFLICT DO NOTHING",
        )
        .await?;
    for id in ids {
        tx.execute(&statement, &[&run_id, &id, &tenant]).await?;
    }
    Ok(())
}

/// The words of `text` that may be artifact ids: runs of exactly 32 lowercase hex digits (as
/// the SQLite store reads them).
fn artifact_ids_in(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !matches!(c, '0'..='9' | 'a'..='f'))
        .filter(|word| word.len() == 32)
}

const SELECT_RUN: &str = "SELECT run_id, script_name, script, catalog_sha256, mode, status, \
                          lease_owner, started_ms, updated_ms, pending, outcome, input, catalog, \
                          input_artifact, lease_host, lease_token, lease_expires_ms, \
                          lease_since_ms, tenant, started_by, context_digest FROM runs \
                          WHERE run_id = $1";

/// A run and its fencing token, if the store has it; with `lock`, its row locked until the
/// transaction ends.
pub(super) async fn run(
    tx: &Transaction<'_>,
    run_id: &str,
    lock: bool,
    location: &str,
) -> Result<Option<(RunRecord, i64)>, Oops> {
    let sql = if lock {
        format!("{SELECT_RUN} FOR UPDATE")
    } else {
        SELECT_RUN.to_string()
    };
    let select = tx.prepare_cached(&sql).await?;
    let Some(row) = tx.query_opt(&select, &[&run_id]).await? else {
        return Ok(None);
    };
    let say = |m: String| Oops::Store(Error::store(location, m, None));
    let id: String = row.get(0);
    let shown = super::super::shown_run_id(&id);
    let mut input: Option<String> = row.get(11);
    if let Some(artifact) = row.get::<_, Option<String>>(13) {
        let content: Option<Vec<u8>> = tx
            .query_opt("SELECT content FROM artifacts WHERE id = $1", &[&artifact])
            .await?
            .map(|r| r.get(0));
        let Some(content) = content else {
            return Err(say(format!(
                "run {shown}: its input was kept as the artifact {artifact}, which the store no longer has"
            )));
        };
        input = Some(String::from_utf8(content).map_err(|_| {
            say(format!(
                "run {shown}: its input artifact {artifact} is not UTF-8 text"
            ))
        })?);
    }
    let token: i64 = row.get(15);
    let lease = row.get::<_, Option<String>>(6).map(|owner| Lease {
        owner,
        host: row.get::<_, Option<String>>(14).unwrap_or_default(),
        token: token.max(0) as u64,
        expires_ms: row.get::<_, Option<i64>>(16).unwrap_or(0),
        since_ms: row.get::<_, Option<i64>>(17).unwrap_or(0),
    });
    fn name<T: serde::de::DeserializeOwned>(
        id: &str,
        field: &str,
        text: String,
    ) -> Result<T, String> {
        RunRecord::parse_field(id, field, &text, false)
    }
    fn json<T: serde::de::DeserializeOwned>(
        id: &str,
        field: &str,
        text: Option<String>,
    ) -> Result<Option<T>, String> {
        text.map(|t| RunRecord::parse_field(id, field, &t, true))
            .transpose()
    }
    let parsed = (|| {
        Ok::<_, String>(RunRecord {
            mode: name(&id, "mode", row.get(4))?,
            status: name(&id, "status", row.get(5))?,
            pending: json(&id, "pending", row.get(9))?,
            outcome: json(&id, "outcome", row.get(10))?,
            input: json(&id, "input", input)?,
            catalog: json(&id, "catalog", row.get(12))?,
            run_id: id.clone(),
            script_name: row.get(1),
            script: row.get(2),
            catalog_sha256: row.get(3),
            lease,
            started_ms: row.get(7),
            updated_ms: row.get(8),
            tenant: row.get(18),
            started_by: row.get(19),
            context_digest: row.get(20),
        })
    })();
    parsed.map(|record| Some((record, token))).map_err(say)
}

/// What the store holds of a run's lease, against the fence of a write.
pub(super) enum Held {
    /// The store has no such run.
    Gone,
    /// The fence is the run's newest lease, and the run is running: renewed (when asked to).
    Renewed(Lease),
    /// The fence is the run's newest lease, but the run has paused or ended.
    Released,
    /// A newer owner took the run: its lease.
    Newer(Lease),
}

/// Checks `fence` against the run's lease, its row locked for the rest of `tx`; when it holds
/// and the run is running, renews it for `ttl_ms` by the database's clock (none when 0).
pub(super) async fn held(
    tx: &Transaction<'_>,
    run_id: &str,
    fence: &Fence,
    ttl_ms: i64,
) -> Result<Held, tokio_postgres::Error> {
    let select = tx
        .prepare_cached(
            "SELECT status, lease_owner, lease_host, lease_token, lease_expires_ms, \
             lease_since_ms FROM runs WHERE run_id = $1 FOR UPDATE",
        )
        .await?;
    let row = tx.query_opt(&select, &[&run_id]).await?;
    let Some(row) = row else {
        return Ok(Held::Gone);
    };
    let status: String = row.get(0);
    let mut lease = Lease {
        owner: row
            .get::<_, Option<String>>(1)
            .unwrap_or_else(|| "an unknown owner".into()),
        host: row
            .get::<_, Option<String>>(2)
            .unwrap_or_else(|| "an unknown host".into()),
        token: row.get::<_, i64>(3).max(0) as u64,
        expires_ms: row.get::<_, Option<i64>>(4).unwrap_or(0),
        since_ms: row.get::<_, Option<i64>>(5).unwrap_or(0),
    };
    if lease.token != fence.token {
        return Ok(Held::Newer(lease));
    }
    if status != RunStatus::Running.as_str() {
        return Ok(Held::Released);
    }
    if ttl_ms > 0 {
        let renew = tx
            .prepare_cached(&format!(
                "UPDATE runs SET lease_expires_ms = {NOW_MS} + $2 WHERE run_id = $1 \
                 RETURNING lease_expires_ms"
            ))
            .await?;
        lease.expires_ms = tx.query_one(&renew, &[&run_id, &ttl_ms]).await?.get(0);
    }
    Ok(Held::Renewed(lease))
}

/// Refuses a fenced write to a run a newer owner took, or that the store no longer has.
pub(super) fn refuse_unheld(
    held: &Held,
    location: &str,
    run_id: &str,
    fence: &Fence,
) -> Result<(), Oops> {
    match held {
        Held::Newer(now) => Err(Oops::Store(super::super::lease::fenced(
            location,
            run_id,
            now,
            fence.token,
        ))),
        Held::Gone => Err(Oops::Store(Error::store(
            location,
            format!(
                "the run {} is no longer in the store (it was removed while its lease had expired); this process stops: it makes no further non-read call or write of the run",
                super::super::shown_run_id(run_id)
            ),
            None,
        ))),
        Held::Renewed(_) | Held::Released => Ok(()),
    }
}

const SELECT_WRITE: &str = "SELECT seq, tool, args, approved, retry, intent, outcome, processes, \
                            run_id, approved_rule FROM writes WHERE run_id = $1";

/// A row of `writes`; processes that do not parse are an error naming the run.
fn read_write(row: &Row) -> Result<JournaledWrite, String> {
    let run_id: String = row.get(8);
    Ok(JournaledWrite {
        seq: row.get::<_, i64>(0) as u64,
        tool: row.get(1),
        args: row.get(2),
        state: WriteState {
            approved: row.get(3),
            retry: row.get(4),
            intent: row.get(5),
        },
        outcome: row
            .get::<_, Option<String>>(6)
            .map(|text| decode_outcome(&text)),
        approved_rule: row.get(9),
        processes: row
            .get::<_, Option<String>>(7)
            .map(|text| RunRecord::parse_field(&run_id, "processes", &text, true))
            .transpose()?,
    })
}

/// The journal's entry of call `seq`, if it has one.
pub(super) async fn write_at(
    tx: &Transaction<'_>,
    run_id: &str,
    seq: u64,
) -> Result<Option<JournaledWrite>, Oops> {
    let row = tx
        .query_opt(
            &format!("{SELECT_WRITE} AND seq = $2"),
            &[&run_id, &(seq as i64)],
        )
        .await?;
    row.map(|r| read_write(&r))
        .transpose()
        .map_err(|why| Oops::Store(Error::store("the store", why, None)))
}

/// Writes a non-read call's row, unless the stored one has an outcome; the rows changed.
pub(super) async fn upsert_write(
    tx: &Transaction<'_>,
    run_id: &str,
    write: &JournaledWrite,
) -> Result<u64, tokio_postgres::Error> {
    let statement = tx
        .prepare_cached(
            "INSERT INTO writes (run_id, seq, tool, args, approved, retry, intent, outcome, processes, approved_rule) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
             ON CONFLICT (run_id, seq) DO UPDATE SET tool = excluded.tool, args = excluded.args, \
             approved = excluded.approved, retry = excluded.retry, intent = excluded.intent, \
             outcome = excluded.outcome, processes = excluded.processes, \
             approved_rule = excluded.approved_rule WHERE writes.outcome IS NULL",
        )
        .await?;
    tx.execute(
        &statement,
        &[
            &run_id,
            &(write.seq as i64),
            &write.tool,
            &write.args,
            &write.state.approved,
            &write.state.retry,
            &write.state.intent,
            &write.outcome.as_ref().map(encode_outcome),
            &write
                .processes
                .as_ref()
                .and_then(|p| serde_json::to_string(p).ok()),
            &write.approved_rule,
        ],
    )
    .await
}

/// Journals a person's approval of a read (one already journaled is kept as it is).
pub(super) async fn approve_read(
    tx: &Transaction<'_>,
    run_id: &str,
    read: &ApprovedRead,
) -> Result<u64, tokio_postgres::Error> {
    let insert = tx
        .prepare_cached(
            "INSERT INTO approved_reads (run_id, epoch, tool, args, n, rule) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
        )
        .await?;
    tx.execute(
        &insert,
        &[
            &run_id,
            &(read.epoch as i64),
            &read.tool,
            &read.args,
            &(read.n as i64),
            &read.rule,
        ],
    )
    .await
}

/// Journals a person's decision on the read a paused run waits at, as SQLite's store does:
/// `false`, and nothing written, when the journal already holds its outcome or an approval.
pub(super) async fn decide_read(
    tx: &Transaction<'_>,
    run_id: &str,
    pending: &PendingCall,
    at: ReadAt,
    verdict: &Verdict,
) -> Result<bool, tokio_postgres::Error> {
    let args = pending.journal_args();
    let (epoch, n) = (at.epoch as i64, at.occurrence as i64);
    for table in ["reads", "approved_reads"] {
        let known = tx
            .query_opt(
                &format!(
                    "SELECT 1 FROM {table} WHERE run_id = $1 AND epoch = $2 AND tool = $3 AND args = $4 AND n = $5"
                ),
                &[&run_id, &epoch, &pending.tool, &args, &n],
            )
            .await?;
        if known.is_some() {
            return Ok(false);
        }
    }
    let approve = |rule: Option<String>| {
        ApprovedRead::new(
            at.epoch,
            pending.tool.clone(),
            args.clone(),
            at.occurrence,
            rule,
        )
    };
    match verdict {
        Verdict::Approve => approve_read(tx, run_id, &approve(None)).await?,
        Verdict::ApproveRule(rule) => {
            approve_read(tx, run_id, &approve(Some(rule.clone()))).await?
        }
        Verdict::Reject(error) => {
            tx.execute(
                "INSERT INTO reads (run_id, epoch, tool, args, n, outcome) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
                &[
                    &run_id,
                    &epoch,
                    &pending.tool,
                    &args,
                    &n,
                    &encode_outcome(&Err(error.clone())),
                ],
            )
            .await?
        }
        Verdict::Done | Verdict::Retry => return Ok(false),
    };
    Ok(true)
}

/// A run's journal, whole.
pub(super) async fn load_journal(tx: &Transaction<'_>, run_id: &str) -> Result<JournalRows, Oops> {
    let writes = tx
        .query(&format!("{SELECT_WRITE} ORDER BY seq"), &[&run_id])
        .await?
        .iter()
        .map(read_write)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|why| Oops::Store(Error::store("the store", why, None)))?;
    let reads = tx
        .query(
            "SELECT epoch, tool, args, n, outcome FROM reads WHERE run_id = $1",
            &[&run_id],
        )
        .await?
        .iter()
        .map(|row| ReadRow {
            epoch: row.get::<_, i64>(0) as u64,
            tool: row.get(1),
            args: row.get(2),
            n: row.get::<_, i64>(3) as u64,
            outcome: Arc::new(decode_outcome(row.get::<_, &str>(4))),
        })
        .collect();
    let approved_reads = tx
        .query(
            "SELECT epoch, tool, args, n, rule FROM approved_reads WHERE run_id = $1",
            &[&run_id],
        )
        .await?
        .iter()
        .map(|row| {
            ApprovedRead::new(
                row.get::<_, i64>(0) as u64,
                row.get::<_, String>(1),
                row.get::<_, String>(2),
                row.get::<_, i64>(3) as u64,
                row.get(4),
            )
        })
        .collect();
    let mut rows = JournalRows::new(writes, reads);
    rows.approved_reads = approved_reads;
    Ok(rows)
}

/// An artifact's row (`page_tokens, policy, run_id, page_index`), without its content.
pub(super) fn artifact_row(row: &Row, id: &str, location: &str) -> Result<StoredArtifact, Oops> {
    let index = match row.get::<_, Option<Vec<u8>>>(3) {
        None => None,
        Some(bytes) => Some(PageIndex::decode(&bytes).ok_or_else(|| {
            Oops::Store(Error::store(
                location,
                format!("the page index of artifact {id} does not decode"),
                None,
            ))
        })?),
    };
    Ok(StoredArtifact {
        content: Vec::new(),
        page_tokens: row.get::<_, i64>(0).max(1) as usize,
        policy: row.get(1),
        run_id: row.get(2),
        index,
    })
}

/// The plan whose `column` (`plan_id` or `applied_run`) is `value`.
pub(super) async fn plan(
    client: &impl GenericClient,
    column: &str,
    value: &str,
) -> Result<Option<StoredPlan>, Oops> {
    let column = match column {
        "applied_run" => "applied_run",
        _ => "plan_id",
    };
    let row = client
        .query_opt(
            &format!(
                "SELECT plan_id, created_ms, expires_ms, applied_run, body, tenant, made_by \
                 FROM plans WHERE {column} = $1 LIMIT 1"
            ),
            &[&value],
        )
        .await?;
    Ok(row.map(|r| StoredPlan {
        plan_id: r.get(0),
        created_ms: r.get(1),
        expires_ms: r.get(2),
        applied_run: r.get(3),
        body: r.get(4),
        tenant: r.get(5),
        made_by: r.get(6),
    }))
}

/// A page of the list of runs, newest first: one more run read than the page holds, to know
/// whether another page follows.
pub(super) async fn list_runs(
    client: &impl GenericClient,
    query: &RunQuery,
    location: &str,
) -> Result<RunPage, Oops> {
    let say = |m: String| Oops::Store(Error::store(location, m, None));
    let position = query.position().map_err(say)?;
    let mut clauses = Vec::new();
    let mut params: Vec<Box<dyn tokio_postgres::types::ToSql + Sync + Send>> = Vec::new();
    if !query.statuses.is_empty() {
        let names: Vec<String> = query
            .statuses
            .iter()
            .map(|s| s.as_str().to_string())
            .collect();
        params.push(Box::new(names));
        clauses.push(format!("status = ANY(${})", params.len()));
    }
    if let Some((ms, id)) = position {
        params.push(Box::new(ms));
        params.push(Box::new(id.to_string()));
        let (a, b) = (params.len() - 1, params.len());
        clauses.push(format!(
            "(started_ms < ${a} OR (started_ms = ${a} AND run_id COLLATE \"C\" > ${b}))"
        ));
    }
    if let Some(tenant) = &query.tenant {
        params.push(Box::new(tenant.clone()));
        clauses.push(format!("tenant = ${}", params.len()));
    }
    let filter = if clauses.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", clauses.join(" AND "))
    };
    let limit = query.limit.clamp(1, i64::MAX as usize - 1);
    let sql = format!(
        "SELECT run_id, script_name, mode, status, started_ms, pending, lease_owner, lease_host, \
         lease_token, lease_expires_ms, lease_since_ms FROM runs{filter} \
         ORDER BY started_ms DESC, run_id COLLATE \"C\" LIMIT {}",
        limit + 1
    );
    let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
        params.iter().map(|p| p.as_ref() as _).collect();
    let rows = client.query(&sql, &refs).await?;
    let mut runs = Vec::new();
    let mut more = false;
    for row in &rows {
        if runs.len() == limit {
            more = true;
            break;
        }
        let run_id: String = row.get(0);
        let status: String = row.get(3);
        let lease = row.get::<_, Option<String>>(6).map(|owner| Lease {
            owner,
            host: row.get::<_, Option<String>>(7).unwrap_or_default(),
            token: row.get::<_, i64>(8).max(0) as u64,
            expires_ms: row.get::<_, Option<i64>>(9).unwrap_or(0),
            since_ms: row.get::<_, Option<i64>>(10).unwrap_or(0),
        });
        let parsed = (|| {
            Ok::<_, String>(RunSummary {
                mode: RunRecord::parse_field(&run_id, "mode", row.get(2), false)?,
                status: RunRecord::parse_field(&run_id, "status", &status, false)?,
                pending: row
                    .get::<_, Option<&str>>(5)
                    .map(|p| RunRecord::parse_field(&run_id, "pending", p, true))
                    .transpose()?,
                lease: lease.filter(|_| status == RunStatus::Running.as_str()),
                run_id: run_id.clone(),
                script_name: row.get(1),
                started_ms: row.get(4),
            })
        })();
        runs.push(parsed.map_err(say)?);
    }
    let next = if more {
        runs.last().map(RunSummary::cursor)
    } else {
        None
    };
    Ok(RunPage { runs, next })
}

/// Removes the runs `rule` names and the artifacts no kept run refers to, in one transaction
/// (rolled back for a dry run), except a running run whose lease is live by the database's
/// clock; then `VACUUM`s when asked to.
pub(super) async fn prune(
    client: &mut deadpool_postgres::Object,
    rule: &PruneRule,
) -> Result<Pruned, Oops> {
    let size = "SELECT pg_database_size(current_database())::bigint";
    let before: i64 = client.query_one(size, &[]).await?.get(0);
    let mut pruned = Pruned {
        bytes_before: Some(before.max(0) as u64),
        ..Pruned::default()
    };
    let tx = client.transaction().await?;
    let now_us = now_us();
    pruned.cache_entries = if rule.dry_run {
        tx.query_one(
            "SELECT COUNT(*) FROM cache WHERE expires_us <= $1",
            &[&now_us],
        )
        .await?
        .get::<_, i64>(0) as u64
    } else {
        let n = tx
            .execute("DELETE FROM cache WHERE expires_us <= $1", &[&now_us])
            .await?;
        tx.execute(
            "DELETE FROM plans WHERE expires_ms <= $1 AND (applied_run IS NULL OR NOT EXISTS \
             (SELECT 1 FROM runs WHERE runs.run_id = plans.applied_run))",
            &[&super::super::now_ms()],
        )
        .await?;
        n
    };
    if !rule.statuses.is_empty() {
        let names: Vec<String> = rule
            .statuses
            .iter()
            .map(|s| s.as_str().to_string())
            .collect();
        let before_ms = rule.updated_before_ms.unwrap_or(i64::MAX);
        let candidates = tx
            .query(
                &format!(
                    "SELECT run_id, status = 'running' AND COALESCE(lease_expires_ms > {NOW_MS}, FALSE) \
                     FROM runs WHERE status = ANY($1) AND updated_ms < $2 FOR UPDATE"
                ),
                &[&names, &before_ms],
            )
            .await?;
        for row in &candidates {
            let (run_id, live): (String, bool) = (row.get(0), row.get(1));
            // A run under a live lease is never removed, whatever the rule says.
            if live {
                pruned.kept_alive += 1;
                continue;
            }
            for table in ["writes", "reads", "approved_reads", "artifact_refs", "runs"] {
                tx.execute(
                    &format!("DELETE FROM {table} WHERE run_id = $1"),
                    &[&run_id],
                )
                .await?;
            }
            pruned.runs += 1;
        }
        if pruned.runs > 0 || rule.vacuum {
            tx.execute(
                "DELETE FROM artifact_refs WHERE NOT EXISTS \
                 (SELECT 1 FROM runs WHERE runs.run_id = artifact_refs.run_id)",
                &[],
            )
            .await?;
            pruned.artifacts = tx
                .execute(
                    "DELETE FROM artifacts WHERE NOT EXISTS \
                     (SELECT 1 FROM artifact_refs r WHERE r.artifact_id = artifacts.id) \
                     AND NOT EXISTS (SELECT 1 FROM runs WHERE runs.run_id = artifacts.run_id)",
                    &[],
                )
                .await?;
        }
    }
    if rule.dry_run {
        tx.rollback().await?;
        pruned.bytes_after = pruned.bytes_before;
        return Ok(pruned);
    }
    tx.commit().await?;
    if rule.vacuum && (pruned.runs > 0 || pruned.artifacts > 0) {
        // A plain VACUUM makes the space reusable (it gives back only trailing pages).
        client
            .batch_execute("VACUUM runs, writes, reads, approved_reads, artifact_refs, artifacts, cache, plans")
            .await?;
    }
    let after: i64 = client.query_one(size, &[]).await?.get(0);
    pruned.bytes_after = Some(after.max(0) as u64);
    Ok(pruned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn artifact_ids_are_words_of_32_lowercase_hex_digits() {
        let a = "0123456789abcdef0123456789abcdef";
        let text = format!("x {a} {a}0 {}, ({a})", a.to_uppercase());
        assert_eq!(artifact_ids_in(&text).collect::<Vec<_>>(), vec![a, a]);
    }
}
