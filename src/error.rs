//! Errors: the kind of a failed call, the error a tool reports, the error a run reports, and the
//! library's own error for everything that stops a runtime from being built.

use std::fmt;
use std::path::PathBuf;

/// Declares [`ErrorKind`] and its stable strings from one list, so that the variants, their
/// strings and the parser can never disagree.
macro_rules! error_kinds {
    ($($(#[doc = $doc:literal])* $variant:ident => $text:literal,)*) => {
        /// What went wrong, as a stable string used in scripts (`e.kind`), JSON output and
        /// receipts.
        ///
        /// The breaker counts only the kinds that say a tool is unhealthy
        /// ([`ErrorKind::counts_as_failure`]); the caller's own mistakes (`invalid_input`,
        /// `not_found`, ...) never open it.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum ErrorKind {
            $($(#[doc = $doc])* $variant,)*
            /// A kind named by a tool itself (`throw #{kind: "rate_limited", ...}` in a script
            /// tool). Its name is on the error ([`ToolError::kind_name`]), so that the kind stays
            /// a plain value every failed call can copy.
            Custom,
        }

        impl ErrorKind {
            /// Every kind the runtime itself names, in declaration order.
            pub(crate) const BUILT_IN: &'static [ErrorKind] = &[$(ErrorKind::$variant,)*];

            /// The stable string for this kind; `custom` for [`ErrorKind::Custom`], whose own
            /// name is on its error.
            pub fn as_str(&self) -> &'static str {
                match self {
                    $(ErrorKind::$variant => $text,)*
                    ErrorKind::Custom => "custom",
                }
            }
        }
    };
}

error_kinds! {
    /// No tool has that name.
    UnknownTool => "unknown_tool",
    /// A composite called a tool it did not declare.
    PermissionDenied => "permission_denied",
    /// A non-read call was repeated with identical arguments in one run.
    RepeatedCall => "repeated_call",
    /// The run's budget (calls, in-flight calls, wall clock) is spent.
    BudgetExceeded => "budget_exceeded",
    /// The tool's circuit breaker is open: it failed repeatedly and is cooling down.
    CircuitOpen => "circuit_open",
    /// The arguments do not match the tool's input schema.
    InvalidInput => "invalid_input",
    /// The tool's result does not match its output schema (the value itself is never shown).
    InvalidOutput => "invalid_output",
    /// The tool did not answer within its timeout.
    Timeout => "timeout",
    /// A non-read call whose outcome is unknown: its body started, then it timed out or its
    /// future was dropped. It may or may not have taken effect, so it is never retried.
    AmbiguousOutcome => "ambiguous_outcome",
    /// The tool panicked or failed in a way it did not describe.
    Internal => "internal",
    /// The tool, or what it talks to, is temporarily unavailable.
    Unavailable => "unavailable",
    /// The tool looked for something that does not exist.
    NotFound => "not_found",
    /// The tool refused because of the state of what it manages (a refund already issued, say).
    Conflict => "conflict",
    /// The tool failed and said why in its message, without a more specific kind.
    Failed => "failed",
    /// The call was cancelled before its body started, or a read nobody needed any more
    /// (a speculative read when the run ended, a read whose caller gave up).
    Cancelled => "cancelled",
    /// The script does not compile.
    InvalidScript => "invalid_script",
    /// The script hit one of its [`Limits`](crate::Limits).
    LimitExceeded => "limit_exceeded",
    /// The script failed on its own: a type error, an undefined variable, an uncaught `throw`.
    ScriptError => "script_error",
    /// A person rejected the call (a tool that needs approval); the message gives the reason.
    Rejected => "rejected",
    /// The run is paused at a call that waits for a person's decision: an approval, or the
    /// settling of a call whose outcome was lost. Not an error of the script: `resume` goes on.
    Paused => "paused",
    /// The run is in the fixture sandbox: a non-read call is refused without reaching its
    /// tool. Catchable, not recoverable.
    SideEffectBlocked => "side_effect_blocked",
    /// The run answers reads from a fixtures file, and the file has no answer for this read
    /// (its tool, arguments and occurrence).
    FixtureMissing => "fixture_missing",
    /// A tool that says `plan = "stop"` ended a plan at its first call: what the script does
    /// after it depends on what it really does. Not catchable.
    PlanIncomplete => "plan_incomplete",
}

impl ErrorKind {
    /// Parses a kind string; an unknown but well-formed one is [`ErrorKind::Custom`] (whose
    /// name [`ToolError::with_kind_name`] keeps).
    ///
    /// Returns `None` for a string that is not a lowercase identifier (`^[a-z][a-z0-9_]*$`) of
    /// at most 64 bytes.
    pub fn parse(kind: &str) -> Option<ErrorKind> {
        if let Some(k) = ErrorKind::BUILT_IN.iter().find(|k| k.as_str() == kind) {
            return Some(*k);
        }
        let mut chars = kind.chars();
        let well_formed = chars.next().is_some_and(|c| c.is_ascii_lowercase())
            && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            && kind.len() <= 64;
        well_formed.then_some(ErrorKind::Custom)
    }

    /// Whether this outcome counts as a failure of the tool for its circuit breaker.
    pub fn counts_as_failure(&self) -> bool {
        matches!(
            self,
            ErrorKind::Timeout
                | ErrorKind::AmbiguousOutcome
                | ErrorKind::Internal
                | ErrorKind::InvalidOutput
                | ErrorKind::Unavailable
        )
    }

    /// Whether the same call may succeed later without changing it.
    pub fn default_recoverable(&self) -> bool {
        matches!(
            self,
            ErrorKind::Timeout | ErrorKind::Unavailable | ErrorKind::CircuitOpen
        )
    }

    /// Whether this error is the runtime's refusal of a speculative call rather than the tool's
    /// answer: the executor then makes the call itself instead of claiming the outcome. (A
    /// timeout is one too where a nested call waited for a slot: see `RunContext::claim`.)
    pub(crate) fn is_speculation_refusal(&self) -> bool {
        matches!(
            self,
            ErrorKind::BudgetExceeded
                | ErrorKind::LimitExceeded
                | ErrorKind::CircuitOpen
                | ErrorKind::Cancelled
        )
    }

    /// Whether an automatic retry (for tools with `retries > 0`) may help.
    pub(crate) fn is_retryable(&self) -> bool {
        matches!(self, ErrorKind::Timeout | ErrorKind::Unavailable)
    }

    fn default_next_action(&self) -> Option<&'static str> {
        Some(match self {
            ErrorKind::UnknownTool => "call one of the tools the catalog lists",
            ErrorKind::PermissionDenied => "call only the tools this composite declares as nested",
            ErrorKind::RepeatedCall => "reuse the result of the first identical call",
            ErrorKind::BudgetExceeded => "make fewer tool calls, or return what you have",
            ErrorKind::CircuitOpen => "the tool is failing; use another tool or try again later",
            ErrorKind::InvalidInput => "fix the arguments to match the tool's input schema",
            ErrorKind::InvalidOutput => "the tool is misbehaving; do not rely on it in this run",
            ErrorKind::Timeout => "retry later or ask for less in one call",
            ErrorKind::AmbiguousOutcome => {
                "do not make this call again: check whether it took effect first (with a read), \
                 or ask a person"
            }
            ErrorKind::Unavailable => "retry later",
            ErrorKind::NotFound => "check the identifier; look it up with a search tool first",
            ErrorKind::InvalidScript => "fix the syntax error at the reported line and column",
            ErrorKind::LimitExceeded => "do less work in one script: fewer loops, smaller values",
            ErrorKind::Rejected => "do not make this call; go on without it or ask a person why",
            ErrorKind::SideEffectBlocked => {
                "the run is a fixture sandbox: go on without this call, or run without --sandbox"
            }
            ErrorKind::FixtureMissing => {
                "record the read again (run --record), or run without --fixtures to call the tool"
            }
            _ => return None,
        })
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A limit a run reached: which one, and the value it had. The library's words name the
/// [`Limits`](crate::Limits) field; a front end words it in its own terms ([`RunError::to_json_naming`]):
/// the command line as a flag (`--max-calls`), the MCP server as the key of its manifest.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct LimitReached {
    /// The limit's key, one of [`Limits::KEYS`](crate::Limits::KEYS) (`max_calls`,
    /// `timeout_s`, ...).
    pub key: &'static str,
    /// The value the run had for it (seconds for `timeout_s`).
    pub value: f64,
}

impl LimitReached {
    /// The field of [`Limits`](crate::Limits) that holds this limit: the key, but `timeout`
    /// for `timeout_s`.
    pub fn field(&self) -> &'static str {
        match self.key {
            "timeout_s" => "timeout",
            key => key,
        }
    }

    /// The library's own name for the limit: `Limits::max_calls`.
    pub(crate) fn library_name(&self) -> String {
        format!("Limits::{}", self.field())
    }

    /// What the library adds to an error's message to name the limit: ` (Limits::max_calls)`.
    pub(crate) fn named_in_message(&self) -> String {
        format!(" ({})", self.library_name())
    }
}

/// The error of one tool call: what a tool body returns, and what a script catches.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolError {
    /// What went wrong.
    pub kind: ErrorKind,
    /// A sentence for the model that wrote the script.
    pub message: String,
    /// The tool that failed, filled in by the dispatch path.
    pub tool: Option<String>,
    /// Whether the same call may succeed later unchanged.
    pub recoverable: bool,
    /// A hint for the model's next step.
    pub suggested_next_action: Option<String>,
    /// The limit the run reached, for the `budget_exceeded` and `limit_exceeded` errors the
    /// runtime raises: data, so that each front end can say how to raise it.
    pub limit: Option<LimitReached>,
    /// The name of an [`ErrorKind::Custom`] kind; `None` for every other kind. Kept beside the
    /// kind, so that only a tool's own kind costs an allocation.
    pub(crate) custom_kind: Option<Box<str>>,
}

impl ToolError {
    /// A new error of `kind` with the kind's default recoverability and hint. A
    /// [`ErrorKind::Custom`] kind made here is named `custom`; [`ToolError::with_kind_name`]
    /// names one.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> ToolError {
        ToolError {
            recoverable: kind.default_recoverable(),
            suggested_next_action: kind.default_next_action().map(str::to_string),
            kind,
            message: message.into(),
            tool: None,
            limit: None,
            custom_kind: None,
        }
    }

    /// A new error whose kind is given by its string: a built-in kind, or a tool's own
    /// (`rate_limited`).
    ///
    /// Returns `None` for a kind that is not a lowercase identifier (see [`ErrorKind::parse`]).
    pub fn with_kind_name(kind: &str, message: impl Into<String>) -> Option<ToolError> {
        let parsed = ErrorKind::parse(kind)?;
        let mut error = ToolError::new(parsed, message);
        if parsed == ErrorKind::Custom {
            error.custom_kind = Some(kind.into());
        }
        Some(error)
    }

    /// A `budget_exceeded` or `limit_exceeded` error of the run's `limit`: `message` says what
    /// the run may do, without naming the limit (each front end names it its way).
    pub(crate) fn limit(
        kind: ErrorKind,
        message: impl Into<String>,
        limit: LimitReached,
    ) -> ToolError {
        ToolError {
            limit: Some(limit),
            ..ToolError::new(kind, message)
        }
    }

    /// The kind's stable string, as scripts (`e.kind`), JSON and receipts show it: a tool's own
    /// kind by its name.
    pub fn kind_name(&self) -> &str {
        match &self.custom_kind {
            Some(name) if self.kind == ErrorKind::Custom => name,
            _ => self.kind.as_str(),
        }
    }

    /// The message, with the limit the run reached (if any) named by `name`.
    pub fn message_naming(&self, name: impl Fn(&LimitReached) -> String) -> String {
        match &self.limit {
            Some(limit) => format!("{} ({})", self.message, name(limit)),
            None => self.message.clone(),
        }
    }

    /// The message in the library's words: a limit is named as its [`Limits`](crate::Limits)
    /// field.
    pub(crate) fn full_message(&self) -> String {
        self.message_naming(LimitReached::library_name)
    }

    /// `not_found`, for a tool body.
    pub fn not_found(message: impl Into<String>) -> ToolError {
        ToolError::new(ErrorKind::NotFound, message)
    }

    /// `unavailable`, for a tool body: retried when the tool has `retries > 0`.
    pub fn unavailable(message: impl Into<String>) -> ToolError {
        ToolError::new(ErrorKind::Unavailable, message)
    }

    /// `invalid_input`, for a tool body that checks more than its schema says.
    pub fn invalid_input(message: impl Into<String>) -> ToolError {
        ToolError::new(ErrorKind::InvalidInput, message)
    }

    /// `internal`, for a tool body that failed in a way it cannot describe better.
    pub fn internal(message: impl Into<String>) -> ToolError {
        ToolError::new(ErrorKind::Internal, message)
    }

    /// Replaces the hint.
    pub fn with_next_action(mut self, action: impl Into<String>) -> ToolError {
        self.suggested_next_action = Some(action.into());
        self
    }

    /// Replaces the recoverability.
    pub fn with_recoverable(mut self, recoverable: bool) -> ToolError {
        self.recoverable = recoverable;
        self
    }

    pub(crate) fn for_tool(mut self, tool: &str) -> ToolError {
        if self.tool.is_none() {
            self.tool = Some(tool.to_string());
        }
        self
    }
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.tool {
            Some(tool) => write!(
                f,
                "{} in `{}`: {}",
                self.kind_name(),
                tool,
                self.full_message()
            ),
            None => write!(f, "{}: {}", self.kind_name(), self.full_message()),
        }
    }
}

impl std::error::Error for ToolError {}

/// The error a run ends with: a tool error that was not caught, or the script's own failure,
/// with the position of the call site or statement where it happened.
#[derive(Clone, Debug, PartialEq)]
pub struct RunError {
    /// What went wrong: the tool's error, or the script's own in the same shape.
    pub error: ToolError,
    /// 1-based line of the failing call or statement, where known.
    pub line: Option<usize>,
    /// 1-based column of the failing call or statement, where known.
    pub column: Option<usize>,
}

impl std::ops::Deref for RunError {
    type Target = ToolError;

    /// A run's error reads as the tool error it holds (`e.kind`, `e.message`), with a
    /// position besides.
    fn deref(&self) -> &ToolError {
        &self.error
    }
}

impl std::ops::DerefMut for RunError {
    fn deref_mut(&mut self) -> &mut ToolError {
        &mut self.error
    }
}

impl RunError {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> RunError {
        RunError::from_tool(ToolError::new(kind, message), None, None)
    }

    pub(crate) fn from_tool(
        error: ToolError,
        line: Option<usize>,
        column: Option<usize>,
    ) -> RunError {
        RunError {
            error,
            line,
            column,
        }
    }

    /// The JSON form of the error, as in `run --json`; absent fields are left out. A limit is
    /// named as its [`Limits`](crate::Limits) field.
    pub fn to_json(&self) -> serde_json::Value {
        self.report(LimitReached::library_name).to_json()
    }

    /// The error as a run's report carries it, with the limit the run reached (if any) named
    /// by `name`: how a front end tells its reader which setting to raise.
    pub fn report(&self, name: impl Fn(&LimitReached) -> String) -> ErrorReport {
        let e = &self.error;
        ErrorReport {
            kind: e.kind_name().to_string(),
            message: e.message_naming(name),
            tool: e.tool.clone(),
            line: self.line,
            column: self.column,
            recoverable: e.recoverable,
            suggested_next_action: e.suggested_next_action.clone(),
            limit: e.limit.map(|limit| LimitReport {
                key: limit.key.to_string(),
                value: json_number(limit.value),
            }),
        }
    }
}

/// A run's error as its report carries it (`error` in `run --json` and in MCP answers): the
/// [`RunError`] with its kind as a string and its message in a front end's words. Absent
/// fields are left out.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct ErrorReport {
    /// What went wrong: `not_found`, `invalid_script`, ... or a tool's own kind.
    pub kind: String,
    /// A sentence for the model that wrote the script.
    pub message: String,
    /// The tool whose call failed, when a tool call failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// 1-based line of the failing call or statement, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub line: Option<usize>,
    /// 1-based column of the failing call or statement, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub column: Option<usize>,
    /// Whether the same call may succeed later unchanged.
    pub recoverable: bool,
    /// A hint for the model's next step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suggested_next_action: Option<String>,
    /// The limit the run reached, for `budget_exceeded` and `limit_exceeded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<LimitReport>,
}

impl ErrorReport {
    /// The report as a JSON value.
    pub fn to_json(&self) -> serde_json::Value {
        // Strings, integers and booleans always serialise: the `Null` is never reached.
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

/// A read of a field that the map did not have, which the script did not handle: the run went
/// on with `()` in its place, which most likely is not what the script meant (`p.age > 30` is
/// `false` for every map without `age`). One per place in the script, the first time it
/// happened.
#[derive(
    Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[non_exhaustive]
pub struct Warning {
    /// 1-based line of the read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub line: Option<usize>,
    /// 1-based column of the field's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub column: Option<usize>,
    /// A sentence for the model that wrote the script.
    pub message: String,
    /// The field the script read.
    pub field: String,
    /// The fields the map had, sorted (at most 20, each at most 64 characters).
    pub fields: Vec<String>,
    /// The map's field closest to the one read, when one is close.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closest: Option<String>,
}

impl Warning {
    /// The warning as one line for a person: `line L, column C: message (its fields: ...)`.
    pub fn line_text(&self) -> String {
        let at = match (self.line, self.column) {
            (Some(l), Some(c)) => format!("line {l}, column {c}: "),
            _ => String::new(),
        };
        let fields = match self.fields.len() {
            0 => String::new(),
            n => {
                let shown: Vec<&str> = self.fields.iter().take(8).map(String::as_str).collect();
                let more = if n > 8 { ", …" } else { "" };
                format!(" (its fields: {}{more})", shown.join(", "))
            }
        };
        format!("{at}{}{fields}", self.message)
    }
}

/// A limit a run reached, as its error's report carries it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct LimitReport {
    /// The limit's key, one of [`Limits::KEYS`](crate::Limits::KEYS).
    pub key: String,
    /// The value the run had for it: an integer when whole, else a number.
    #[schemars(with = "f64")]
    pub value: serde_json::Value,
}

impl RunError {
    /// The error as one line, `kind in `tool` at line:column: message`, with the limit the run
    /// reached (if any) named by `name`. [`Display`](fmt::Display) names it as the
    /// [`Limits`](crate::Limits) field.
    pub fn describe_naming(&self, name: impl Fn(&LimitReached) -> String) -> String {
        let mut out = self.kind_name().to_string();
        if let Some(tool) = &self.tool {
            out.push_str(&format!(" in `{tool}`"));
        }
        if let (Some(line), Some(column)) = (self.line, self.column) {
            out.push_str(&format!(" at {line}:{column}"));
        }
        out.push_str(": ");
        out.push_str(&self.message_naming(name));
        out
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe_naming(LimitReached::library_name))
    }
}

impl std::error::Error for RunError {}

/// A limit's value as JSON: an integer when it is whole (`max_calls`), else a float
/// (`timeout_s`).
fn json_number(value: f64) -> serde_json::Value {
    if value.fract() == 0.0 && value.abs() < 2f64.powi(53) {
        serde_json::Value::from(value as i64)
    } else {
        serde_json::Value::from(value)
    }
}

/// The outcome of one tool call, shared by everyone who waits for it or replays it: the
/// ledger's readers and the journal.
pub(crate) type Outcome = std::sync::Arc<Result<serde_json::Value, ToolError>>;

/// The library's error: something that prevents a registry or runtime from being built, or a
/// receipts file from being read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tool breaks a registry rule.
    #[error("tool `{tool}`: {rule}")]
    Registry {
        /// The tool that breaks the rule.
        tool: String,
        /// The rule, stated for a person.
        rule: String,
    },
    /// A manifest cannot be read or is malformed.
    #[error("{}{}: {message}", file.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
    Manifest {
        /// The manifest file.
        file: PathBuf,
        /// The line, where one is known.
        line: Option<usize>,
        /// What is wrong.
        message: String,
        /// The error underneath (the TOML parser's, the script compiler's), if any.
        #[source]
        source: Option<Cause>,
    },
    /// A receipts file is broken: unreadable, not JSON, a bad hash or a broken chain.
    #[error("{}:{line}: {message}", file.display())]
    Receipt {
        /// The receipts file.
        file: PathBuf,
        /// The first bad line (1-based).
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// An MCP server failed to start, answered garbage, or broke the protocol.
    #[error("MCP server `{server}`: {message}")]
    Mcp {
        /// The server, as named in its manifest.
        server: String,
        /// What went wrong.
        message: String,
        /// The error underneath (starting the program, the protocol's), if any.
        #[source]
        source: Option<Cause>,
    },
    /// The store of runs cannot be opened, read or written.
    #[error("store {}: {message}", path.display())]
    Store {
        /// The store's file.
        path: PathBuf,
        /// What went wrong.
        message: String,
        /// The error underneath (the database's, the file system's), if any.
        #[source]
        source: Option<Cause>,
    },
    /// A run cannot be resumed: unknown, still running, ended, or asked for a decision it
    /// does not wait for.
    #[error("run {}: {message}", shown_run_id(run_id))]
    Resume {
        /// The run.
        run_id: String,
        /// Why not.
        message: String,
    },
    /// A plan cannot be made or applied: no store to keep it, unknown, expired, already
    /// applied, or made under another catalog.
    #[error("plan {plan_id}: {message}")]
    Plan {
        /// The plan (empty before one exists).
        plan_id: String,
        /// Why not, and what to do.
        message: String,
    },
    /// A limit's name or value is wrong (see [`Limits::set`](crate::Limits::set)).
    #[error("{0}")]
    Limit(String),
    /// A fixtures file cannot be read or is malformed.
    #[error("fixtures {}{}: {message}", file.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
    Fixture {
        /// The fixtures file.
        file: PathBuf,
        /// The bad line (1-based), where one is at fault.
        line: Option<usize>,
        /// What is wrong, and what to do.
        message: String,
    },
    /// Reading or writing a file failed.
    #[error("{}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// The error underneath an [`Error`], returned by its `source()`: an [`Error`]'s own text never
/// repeats it, and [`Error::report`] writes the two together.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

impl Error {
    /// The error and every error underneath it, each after `: `: what a person reads.
    ///
    /// ```
    /// let e = toolscript::Error::Io {
    ///     path: "a.json".into(),
    ///     source: std::io::Error::other("disk full"),
    /// };
    /// assert_eq!(e.to_string(), "a.json");
    /// assert_eq!(e.report(), "a.json: disk full");
    /// ```
    pub fn report(&self) -> String {
        report(self)
    }

    pub(crate) fn registry(tool: &str, rule: impl Into<String>) -> Error {
        Error::Registry {
            tool: tool.to_string(),
            rule: rule.into(),
        }
    }

    /// A store error naming its store, with what went wrong underneath.
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
    pub(crate) fn store(
        location: &str,
        message: impl Into<String>,
        source: impl Into<Option<Cause>>,
    ) -> Error {
        Error::Store {
            path: location.into(),
            message: message.into(),
            source: source.into(),
        }
    }

    /// An MCP error naming its server, with what went wrong underneath.
    #[cfg_attr(not(any(feature = "mcp", feature = "manifest")), allow(dead_code))]
    pub(crate) fn mcp(
        server: &str,
        message: impl Into<String>,
        source: impl Into<Option<Cause>>,
    ) -> Error {
        Error::Mcp {
            server: server.to_string(),
            message: message.into(),
            source: source.into(),
        }
    }
}

/// `error` and every error underneath it, each after `: `.
pub(crate) fn report(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}

/// The longest run id a message shows whole; a longer one is cut (a run id is a person's or a
/// model's input, and may be anything).
const SHOWN_ID: usize = 64;

/// A run id as messages show it: whole up to 64 characters, else its start and its length.
pub(crate) fn shown_run_id(run_id: &str) -> std::borrow::Cow<'_, str> {
    match run_id.char_indices().nth(SHOWN_ID) {
        None => std::borrow::Cow::Borrowed(run_id),
        Some((end, _)) => {
            std::borrow::Cow::Owned(format!("{}… ({} bytes)", &run_id[..end], run_id.len()))
        }
    }
}
