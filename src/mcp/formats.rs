//! The MCP server's tools' arguments and answers, one type each. The input schema a tool
//! publishes is generated from its arguments' type, and its output schema from its answer's
//! (`crate::schema`); a call's arguments are checked against that schema and then read into the
//! same type, and an answer is its type serialised.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::report::RunListing;
use crate::store::RunStatus;

/// The arguments of `run_script`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RunScriptArgs {
    /// The Rhai script: the whole task, its last expression the value.
    pub(super) script: String,
    /// Dispatch every call in program order; no read starts early.
    #[serde(default)]
    pub(super) sequential: bool,
    /// Include `stats` (timings and counts) in the answer.
    #[serde(default)]
    pub(super) stats: bool,
    /// Any JSON value: the script reads it as `input` (without it, `input` is `()`).
    #[serde(default)]
    pub(super) input: Value,
}

/// The arguments of `plan_script`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct PlanScriptArgs {
    /// The Rhai script to plan: the whole task, as for `run_script`.
    pub(super) script: String,
    /// Dispatch every read in program order; no read starts early.
    #[serde(default)]
    pub(super) sequential: bool,
    /// Any JSON value: the script reads it as `input`.
    #[serde(default)]
    pub(super) input: Value,
}

/// The arguments of `apply_plan`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ApplyPlanArgs {
    /// The `plan_id` `plan_script` answered with.
    pub(super) plan_id: String,
    /// Dispatch every read in program order; no read starts early.
    #[serde(default)]
    pub(super) sequential: bool,
}

/// The arguments of `resume_run`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ResumeRunArgs {
    /// The paused run's `run_id`.
    pub(super) run_id: String,
    /// Omit only for a run whose server stopped while it ran.
    // Optional, not nullable: the schema takes a decision or no `decision` at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "DecisionArg")]
    pub(super) decision: Option<DecisionArg>,
    /// Why a call is rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub(super) reason: Option<String>,
}

/// A person's decision in `resume_run`: `approve` or `reject` a call awaiting approval; `done`
/// (it took effect) or `retry` (make it again) for a call whose outcome was lost.
// The variants carry no doc comments: with them the schema would be a `oneOf` of constants
// rather than the plain `enum` that a wrong argument's error lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum DecisionArg {
    Approve,
    #[serde(rename = "approve_rule")]
    ApproveRule,
    Reject,
    Done,
    Retry,
}

/// The arguments of `list_runs`: a filter, a page size and the cursor of the page before.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ListRunsArgs {
    /// Only runs of these statuses (every status when absent).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) status: Vec<RunStatus>,
    /// The most runs in the page: 1 to 200 (default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "u32", range(min = 1, max = 200))]
    pub(super) limit: Option<u32>,
    /// The `next_cursor` of the page before: the runs after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub(super) cursor: Option<String>,
}

/// The arguments of a tool that takes none (`describe_tools`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NoArgs {}

/// The answer of `list_runs`: a page.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(super) struct RunList {
    /// The store's runs, newest first.
    pub(super) runs: Vec<RunListing>,
    /// Give it as `cursor` for the next page; null on the last page.
    pub(super) next_cursor: Option<String>,
}

/// The answer of `read_artifact`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(super) struct ArtifactRead {
    /// One page of the artifact (page 0 when no page was asked):
    /// `{page, pages, items | entries | text | json}`.
    pub(super) artifact: Value,
}
