//! Tenants of `serve --http --auth`: what each of the server's tools needs of the caller's
//! token, which runs, plans and artifacts a caller may name (those of its own tenant: any other
//! is answered exactly as one that does not exist), who may decide a paused call (never the
//! token that started the run, unless it is its tenant's only token and the tenant allows it),
//! and each tenant's runtime (its limits and breakers) and cap on runs at once.

use std::collections::BTreeMap;
use std::sync::Arc;

use rmcp::model::{CallToolResult, ContentBlock, JsonObject};
use rmcp::service::RequestContext;
use rmcp::RoleServer;

use super::auth::{Auth, Caller, Right, Running, Slot};
use crate::error::{ErrorKind, RunError};
use crate::runtime::{RunOptions, Runtime};
use crate::store::Store;

/// What a server with `--auth` shares between its requests.
#[derive(Debug)]
pub(super) struct Tenancy {
    pub(super) auth: Arc<Auth>,
    /// The runtime of each tenant: same tools and store, its limits, breakers and cached
    /// reads of its own; or why it could not be made (then the tenant's calls are refused,
    /// never run on the server's runtime).
    runtimes: BTreeMap<String, Result<Arc<Runtime>, String>>,
    running: Arc<Running>,
}

impl Tenancy {
    pub(super) fn new(auth: Arc<Auth>, base: &Runtime) -> Tenancy {
        let mut limits = auth.limits_of(base.run_limits()).unwrap_or_else(|e| {
            // Every key and value was checked when the file was read: not reached.
            tracing::error!("{e}; the tenant runs under the server's limits");
            BTreeMap::new()
        });
        let runtimes = auth
            .tenants
            .keys()
            .map(|tenant| {
                let limits = limits
                    .remove(tenant)
                    .unwrap_or_else(|| base.run_limits().clone());
                let runtime = base.for_tenant(tenant, limits).map_err(|e| {
                    tracing::error!(error = %e.report(), "tenant {tenant} has no runtime");
                    e.report()
                });
                (tenant.clone(), runtime.map(Arc::new))
            })
            .collect();
        Tenancy {
            auth,
            runtimes,
            running: Arc::new(Running::default()),
        }
    }

    /// The runtime `caller`'s runs run on, or the error result that refuses the call.
    pub(super) fn runtime_of(&self, caller: &Caller) -> Result<Arc<Runtime>, CallToolResult> {
        match self.runtimes.get(&caller.tenant) {
            Some(Ok(runtime)) => Ok(Arc::clone(runtime)),
            Some(Err(why)) => Err(refusal(format!(
                "this tenant's runtime could not be made ({why}): tell the server's operator"
            ))),
            None => Err(refusal(format!(
                "tenant `{}` has no runtime: tell the server's operator",
                caller.tenant
            ))),
        }
    }

    /// The runtime of `tenant` and a slot among its runs at once, for a run that `serve
    /// --take-over` resumes; `None` when the tenant has no runtime or is at its cap (the run
    /// waits for a later sweep).
    pub(super) fn take_over_slot(&self, tenant: &str) -> Option<(Arc<Runtime>, Option<Slot>)> {
        let Some(Ok(runtime)) = self.runtimes.get(tenant) else {
            tracing::debug!(
                tenant,
                "a run of a tenant this server does not serve is left alone"
            );
            return None;
        };
        let cap = self
            .auth
            .tenants
            .get(tenant)
            .and_then(|t| t.max_concurrent_runs);
        let slot = self.running.enter(tenant, cap).ok()?;
        Some((Arc::clone(runtime), Some(slot)))
    }

    /// A slot for one more run of `caller`'s tenant, or the `unavailable` result that names
    /// its cap.
    pub(super) fn enter(&self, caller: &Caller) -> Result<Slot, CallToolResult> {
        let cap = self
            .auth
            .tenants
            .get(&caller.tenant)
            .and_then(|t| t.max_concurrent_runs);
        self.running.enter(&caller.tenant, cap).map_err(|cap| {
            let error = RunError::new(
                ErrorKind::Unavailable,
                format!(
                    "tenant `{}` has {cap} runs going, its max_concurrent_runs: try again once \
                     one has ended",
                    caller.tenant
                ),
            );
            CallToolResult::structured_error(
                serde_json::json!({"ok": false, "status": "failed", "error": error.to_json()}),
            )
        })
    }
}

/// The caller of a request: what the HTTP layer found for its token, if it ran.
pub(super) fn caller(context: &RequestContext<RoleServer>) -> Option<Caller> {
    context
        .extensions
        .get::<hyper::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Caller>())
        .cloned()
}

/// The right the tool `name` needs, given its arguments: a decision on a paused call is
/// `approve`, applying a plan too; running or resuming is `run`; reading is `read`.
pub(super) fn right_for(name: &str, arguments: Option<&JsonObject>) -> Right {
    match name {
        "resume_run" => {
            let decides = arguments
                .and_then(|a| a.get("decision"))
                .is_some_and(|d| !d.is_null());
            if decides {
                Right::Approve
            } else {
                Right::Run
            }
        }
        "apply_plan" => Right::Approve,
        "run_script" | "plan_script" => Right::Run,
        _ => Right::Read,
    }
}

/// The error result for a caller whose token lacks `right`.
pub(super) fn lacks(tool: &str, right: Right) -> CallToolResult {
    let why = match right {
        Right::Approve => " (a decision is a person's: use a token given to one)",
        _ => "",
    };
    CallToolResult::error(vec![ContentBlock::text(format!(
        "`{tool}` needs the right `{}`, which this token lacks{why}",
        right.name()
    ))])
}

/// The error of a run the caller may not see: word for word that of a run the store lacks.
pub(super) fn no_such_run(store: &dyn Store, run_id: &str) -> String {
    crate::Error::Resume {
        run_id: run_id.to_string(),
        message: format!("the store {} has no such run", store.location()),
    }
    .report()
}

/// The error of a plan the caller may not see: word for word that of a plan the store lacks.
pub(super) fn no_such_plan(store: &dyn Store, plan_id: &str) -> String {
    crate::Error::Plan {
        plan_id: plan_id.to_string(),
        message: format!("the store {} has no such plan", store.location()),
    }
    .report()
}

/// The error of an artifact the caller may not see: that of an artifact the store lacks.
pub(super) fn no_such_artifact(id: &str) -> String {
    crate::policy::no_artifact(id).to_string()
}

/// Whether `caller` may decide the calls of a run (or apply a plan) that the token
/// `started_by` started (made): another token may, the same one only where it alone is its
/// tenant's and the tenant says `self_approve = true`.
pub(super) fn may_decide(caller: &Caller, started_by: Option<&str>) -> Result<(), String> {
    if started_by == Some(caller.token.as_str()) && !caller.may_self_approve {
        return Err(
            "the token that started this run cannot decide its calls: a decision is a \
             person's, made out of band with another token that has the right `approve`"
                .to_string(),
        );
    }
    Ok(())
}

/// The hooks the handlers call: each a no-op without `--auth` (no caller).
impl super::server::Server {
    /// `options` with the caller's tenant and token, which the run (or plan) is kept under.
    pub(super) fn owned(&self, options: RunOptions) -> RunOptions {
        match &self.caller {
            Some(caller) => options.owner(caller.tenant.clone(), caller.token.clone()),
            None => options,
        }
    }

    /// The caller's tenant, whose runs alone a list holds.
    pub(super) fn tenant(&self) -> Option<String> {
        self.caller.as_ref().map(|c| c.tenant.clone())
    }

    /// A slot for one more run of the caller's tenant, held until the run's answer is made.
    pub(super) fn slot(&self) -> Result<Option<Slot>, CallToolResult> {
        match (&self.tenancy, &self.caller) {
            (Some(tenancy), Some(caller)) => tenancy.enter(caller).map(Some),
            _ => Ok(None),
        }
    }

    /// Whether the caller may resume `run_id` (its tenant's), and decide its call when it
    /// `decides` (not as the token that started it).
    pub(super) async fn may_resume(
        &self,
        run_id: &str,
        decides: bool,
    ) -> Result<(), CallToolResult> {
        let (Some(caller), Some(store)) = (&self.caller, self.runtime.store()) else {
            return Ok(());
        };
        let record = store.run(run_id).await.map_err(|e| refusal(e.report()))?;
        let Some(record) = record.filter(|r| r.tenant.as_deref() == Some(&caller.tenant)) else {
            return Err(refusal(no_such_run(&**store, run_id)));
        };
        if decides {
            may_decide(caller, record.started_by.as_deref()).map_err(refusal)?;
        }
        Ok(())
    }

    /// Whether the caller may apply `plan_id`: its tenant's, made by another token.
    pub(super) async fn may_apply(&self, plan_id: &str) -> Result<(), CallToolResult> {
        let (Some(caller), Some(store)) = (&self.caller, self.runtime.store()) else {
            return Ok(());
        };
        let plan = store.plan(plan_id).await.map_err(|e| refusal(e.report()))?;
        let Some(plan) = plan.filter(|p| p.tenant.as_deref() == Some(&caller.tenant)) else {
            return Err(refusal(no_such_plan(&**store, plan_id)));
        };
        may_decide(caller, plan.made_by.as_deref()).map_err(refusal)
    }

    /// Whether the caller may read the artifact `id`: one its tenant's runs made or refer to.
    pub(super) async fn may_read(&self, id: &str) -> Result<(), CallToolResult> {
        let (Some(caller), Some(store)) = (&self.caller, self.runtime.store()) else {
            return Ok(());
        };
        match store.artifact_of_tenant(id, &caller.tenant).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(refusal(no_such_artifact(id))),
            Err(e) => Err(refusal(e.report())),
        }
    }
}

fn refusal(text: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::auth::Rights;

    fn caller(token: &str, may_self_approve: bool) -> Caller {
        Caller {
            tenant: "t".into(),
            token: token.into(),
            rights: Rights::default(),
            may_self_approve,
        }
    }

    #[test]
    fn a_decision_or_a_plan_applied_needs_approve_and_a_resume_without_one_needs_run() {
        let decided: JsonObject =
            serde_json::from_str(r#"{"run_id": "r", "decision": "approve"}"#).unwrap();
        let plain: JsonObject =
            serde_json::from_str(r#"{"run_id": "r", "decision": null}"#).unwrap();
        assert_eq!(right_for("resume_run", Some(&decided)), Right::Approve);
        assert_eq!(right_for("resume_run", Some(&plain)), Right::Run);
        assert_eq!(right_for("resume_run", None), Right::Run);
        assert_eq!(right_for("apply_plan", None), Right::Approve);
        assert_eq!(right_for("run_script", None), Right::Run);
        assert_eq!(right_for("plan_script", None), Right::Run);
        for read in ["list_runs", "read_artifact", "describe_tools"] {
            assert_eq!(right_for(read, None), Right::Read);
        }
    }

    #[test]
    fn the_starting_token_decides_only_alone_and_allowed() {
        assert!(may_decide(&caller("aaa", false), Some("aaa")).is_err());
        assert!(may_decide(&caller("aaa", true), Some("aaa")).is_ok());
        assert!(may_decide(&caller("bbb", false), Some("aaa")).is_ok());
        assert!(may_decide(&caller("bbb", false), None).is_ok());
    }
}
