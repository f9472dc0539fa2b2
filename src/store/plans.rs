//! Plans in the SQLite store: the `plans` table (schema 9; its tenant and maker, schema 10). A
//! plan is kept whole as JSON; the store reads only its id, its times, the run that applied it,
//! its tenant and the token that made it.

use rusqlite::{params, Connection, OptionalExtension};

use super::StoredPlan;

/// Keeps `plan` (a plan with its id already kept is replaced, unless a run applied it).
pub(super) fn put(conn: &Connection, plan: &StoredPlan) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT INTO plans (plan_id, created_ms, expires_ms, applied_run, body, tenant, made_by) \
         VALUES (?1, ?2, ?3, NULL, ?4, ?5, ?6) \
         ON CONFLICT (plan_id) DO UPDATE SET created_ms = excluded.created_ms, \
         expires_ms = excluded.expires_ms, body = excluded.body WHERE applied_run IS NULL",
        params![
            plan.plan_id,
            plan.created_ms,
            plan.expires_ms,
            plan.body,
            plan.tenant,
            plan.made_by
        ],
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
            "SELECT plan_id, created_ms, expires_ms, applied_run, body, tenant, made_by FROM plans \
             WHERE {column} = ?1"
        ),
        [value],
        |r| {
            Ok(StoredPlan {
                plan_id: r.get(0)?,
                created_ms: r.get(1)?,
                expires_ms: r.get(2)?,
                applied_run: r.get(3)?,
                body: r.get(4)?,
                tenant: r.get(5)?,
                made_by: r.get(6)?,
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

/// Forgets the plans that expired before `now_ms` and that no kept run applies (a run applying
/// one goes on applying it when resumed).
pub(super) fn prune(conn: &Connection, now_ms: i64) -> rusqlite::Result<usize> {
    conn.execute(
        "DELETE FROM plans WHERE expires_ms <= ?1 AND (applied_run IS NULL OR NOT EXISTS \
         (SELECT 1 FROM runs WHERE runs.run_id = plans.applied_run))",
        [now_ms],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE runs (run_id TEXT PRIMARY KEY); \
             CREATE TABLE plans (plan_id TEXT PRIMARY KEY, created_ms INTEGER NOT NULL, \
             expires_ms INTEGER NOT NULL, applied_run TEXT, body TEXT NOT NULL, tenant TEXT, \
             made_by TEXT);",
        )
        .unwrap();
        conn
    }

    #[test]
    fn a_plan_is_claimed_once_and_pruned_once_expired_and_unused() {
        let mut conn = table();
        for (id, expires) in [("a", 10), ("b", 10), ("c", 100)] {
            put(&conn, &StoredPlan::new(id.into(), 0, expires, "{}".into())).unwrap();
        }
        assert_eq!(claim(&mut conn, "a", "r1").unwrap(), None);
        assert_eq!(claim(&mut conn, "a", "r2").unwrap(), Some("r1".into()));
        assert_eq!(claim(&mut conn, "gone", "r2").unwrap(), Some(String::new()));
        assert_eq!(
            get(&conn, "applied_run", "r1").unwrap().unwrap().plan_id,
            "a"
        );
        release(&conn, "a", "r2").unwrap();
        assert_eq!(
            get(&conn, "plan_id", "a").unwrap().unwrap().applied_run,
            Some("r1".into())
        );
        conn.execute("INSERT INTO runs VALUES ('r1')", []).unwrap();
        // `a` is expired but its run is kept; `b` is expired and unused; `c` waits.
        assert_eq!(prune(&conn, 50).unwrap(), 1);
        assert!(get(&conn, "plan_id", "b").unwrap().is_none());
        conn.execute("DELETE FROM runs", []).unwrap();
        assert_eq!(prune(&conn, 50).unwrap(), 1);
        assert!(get(&conn, "plan_id", "a").unwrap().is_none());
        assert!(get(&conn, "plan_id", "c").unwrap().is_some());
    }
}
