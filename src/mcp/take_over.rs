//! `serve --http --take-over`: the instance sweeps the store for running runs whose lease
//! expired (their owner died, or stalled past its lease) and resumes each, so that the runs of
//! an instance that went away end on the others without a client asking. A run started with a
//! per-run context is left to a caller that can give the context again; a tenant's run is
//! resumed on that tenant's runtime, within its cap on runs at once, and a run of a tenant this
//! instance does not serve is left alone. Two instances that sweep at once take each run once:
//! the store's take is a transaction, and the second is refused as busy.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::server::Server;
use crate::runtime::{RunOptions, Runtime};

/// Expired runs taken over per sweep at most: the rest wait for the next sweep.
const SWEEP_BATCH: usize = 64;

/// Sweeps every half lease (the store's `lease_s`; an expired run has waited a whole one) until
/// `stop` is cancelled.
pub(super) async fn sweep_until(server: Server, stop: CancellationToken) {
    let Some(store) = server.runtime.store().cloned() else {
        tracing::warn!("--take-over does nothing: the server has no store of runs");
        return;
    };
    let every = (store.lease_ttl() / 2).max(Duration::from_millis(50));
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let tasks = tokio_util::task::TaskTracker::new();
    loop {
        tokio::select! {
            _ = ticks.tick() => sweep(&server, &tasks).await,
            () = stop.cancelled() => break,
        }
    }
    // The runs taken over go on to their end (or their next pause) as a client's would: a
    // stopping server waits for them as it waits for its connections.
    tasks.close();
    tasks.wait().await;
}

/// One sweep: each expired run this instance may resume is resumed on a task of its own.
async fn sweep(server: &Server, tasks: &tokio_util::task::TaskTracker) {
    let Some(store) = server.runtime.store() else {
        return;
    };
    let expired = match store.expired_runs(SWEEP_BATCH).await {
        Ok(ids) => ids,
        Err(e) => {
            tracing::warn!(error = %e.report(), "--take-over could not list the expired runs");
            return;
        }
    };
    for run_id in expired {
        let record = match store.run(&run_id).await {
            Ok(Some(record)) => record,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(run = %run_id, error = %e.report(), "--take-over could not read a run");
                continue;
            }
        };
        if record.context_digest.is_some() {
            tracing::debug!(run = %run_id, "left to a caller that gives its per-run context again");
            continue;
        }
        let Some((runtime, slot)) = runtime_for(server, record.tenant.as_deref()) else {
            continue;
        };
        tasks.spawn(async move {
            let _slot = slot;
            match runtime.resume(&run_id, None, RunOptions::default()).await {
                Ok(outcome) => tracing::info!(
                    run = %run_id,
                    status = outcome.status().as_str(),
                    "took over a run whose lease had expired"
                ),
                // Another instance took it first, or it ended meanwhile.
                Err(e) => tracing::debug!(run = %run_id, error = %e.report(), "not taken over"),
            }
        });
    }
}

/// The runtime a run of `tenant` (`None`: no tenant) resumes on, and the slot it holds among
/// its tenant's runs; `None` when this instance does not run it now.
fn runtime_for(
    server: &Server,
    tenant: Option<&str>,
) -> Option<(Arc<Runtime>, Option<super::auth::Slot>)> {
    match (tenant, &server.tenancy) {
        (None, _) => Some((Arc::clone(&server.runtime), None)),
        (Some(tenant), Some(tenancy)) => tenancy.take_over_slot(tenant),
        (Some(tenant), None) => {
            tracing::debug!(tenant, "a tenant's run is left to an instance with --auth");
            None
        }
    }
}
