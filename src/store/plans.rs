//! Plans in the SQLite store: the `plans` table (schema 8). A plan is kept whole as JSON; the
//! store reads only its id, its times and the run that applied it.

use rusqlite::{params, Connection, OptionalExtension};

use super::StoredPlan;

/// Keeps `plan` (a plan with its id already kept is replaced, unless a run applied it).
pub(super) fn put(conn: &Connection, plan: &StoredPlan) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT INTO plans (plan_id, created_ms, expires_ms, applied_run, body) \
         VALUES (?1, ?2, ?3, NULL, ?4) \
         ON CONFLICT (plan_id) DO UPDATE SET created_ms = excluded.created_ms, \
         expires_ms = excluded.expires_ms, body = excluded.body WHERE applied_run IS NULL",
        params![plan.plan_id, plan.created_ms, plan.expires_ms, plan.body],
    )
    .map(drop)
}

/// The plan whose `column` (`plan_id` or `applied_run`) is `value`.
pub(super) fn get(
    conn: &Connection,
    column: &str,
    value: &str,
) -> rusqlite::Result<Option<StoredPlan>> {
    let column = match column {
        "applied_run" => "applied_run",
        _ => "plan_id",
    };
    conn.query_row(
        &format!(
            "SELECT plan_id, created_ms, expires_ms, applied_run, body FROM plans WHERE {column} = ?1"
        ),
        [value],
        |r| {
            Ok(StoredPlan {
                plan_id: r.get(0)?,
                created_ms: r.get(1)?,
                expires_ms: r.get(2)?,
                applied_run: r.get(3)?,
                body: r.get(4)?,
            })
        },
    )
    .optional()
}

/// Gives plan `plan_id` to run `run_id`, or names the run that has it.
pub(super) fn claim(
    conn: &mut Connection,
    plan_id: &str,
    run_id: &str,
) -> rusqlite::Result<Option<String>> {
    let tx = conn.transaction()?;
    let taken = tx.execute(
        "UPDATE plans SET applied_run = ?2 WHERE plan_id = ?1 AND applied_run IS NULL",
        params![plan_id, run_id],
    )?;
    let other = if taken == 1 {
        None
    } else {
        tx.query_row(
            "SELECT applied_run FROM plans WHERE plan_id = ?1",
            [plan_id],
            |r| r.get::<_, Option<String>>(0),
        )
        .optional()?
        .flatten()
        .or_else(|| Some(String::new()))
    };
    tx.commit()?;
    Ok(other)
}

/// Takes plan `plan_id` back from run `run_id`.
pub(super) fn release(conn: &Connection, plan_id: &str, run_id: &str) -> rusqlite::Result<()> {
    conn.execute(
        "UPDATE plans SET applied_run = NULL WHERE plan_id = ?1 AND applied_run = ?2",
        params![plan_id, run_id],
    )
    .map(drop)
}
