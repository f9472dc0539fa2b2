//! The guard: what every call may touch. A call passes a chain of policies in the dispatch
//! path, right after its tool is resolved (see `docs/guard.md`).

mod commands;
mod paths;
mod view;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::effect::Effect;
use paths::{AccessRules, Globs, PathRules};

pub use commands::CommandRules;
pub use paths::DEFAULT_FORBIDDEN;
pub use view::{Access, Argv, CommandLine, GuardView, PathArg};

/// The command rules as a policy, over the argv of a call that starts a program (the
/// program found through this process's `PATH`, which a command tool passes on by default).
/// Like the path rules' allow lists, `allow` is the list of what may run: a command line no
/// rule names is denied when the list is not empty.
#[derive(Debug)]
struct CommandPolicy {
    rules: CommandRules,
    root: PathBuf,
    allow: Vec<String>,
}

impl Policy for CommandPolicy {
    fn may_ask(&self, _tool: &str, starts_a_program: bool) -> bool {
        starts_a_program && self.rules.may_ask()
    }

    fn decide(&self, call: &CallView<'_>) -> Decision {
        let Some(argv) = call.argv else {
            return Decision::Pass;
        };
        let path = std::env::var("PATH").ok();
        match self.rules.decide(argv, &self.root, path.as_deref()) {
            Decision::Pass if !self.allow.is_empty() => Decision::Deny {
                rule: "commands.allow".to_string(),
                reason: format!(
                    "{:?} is under none of commands.allow {:?}",
                    argv.argv, self.allow
                ),
            },
            decided => decided,
        }
    }
}

/// A predicate over a path relative to the root: whether listings leave it out.
pub type Hider = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// What a policy says of a call. The first answer of a chain that is not [`Decision::Pass`]
/// decides; when every policy passes, the guard's default does.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// The call goes on.
    Allow,
    /// The call fails with `permission_denied`.
    Deny {
        /// The rule that decided, as a person finds it in a manifest: `forbidden "**/.env*"`,
        /// `write.deny "**/*.lock"`, `commands.deny "rm *"`, a rule's name.
        rule: String,
        /// Why, in words, with the path or argv as the guard saw it.
        reason: String,
    },
    /// A person decides: the run pauses (the script's calls), or the call is denied where a
    /// run cannot pause.
    Ask {
        /// The rule that asks.
        rule: String,
        /// Why.
        reason: String,
    },
    /// This policy has nothing to say: the next one decides.
    Pass,
}

/// A call as the guard sees it: what a policy decides on. Policies are pure functions of it,
/// so the scout evaluates them as the executor would.
#[derive(Debug)]
#[non_exhaustive]
pub struct CallView<'a> {
    /// The tool's name.
    pub tool: &'a str,
    /// Its effect.
    pub effect: Effect,
    /// The call's arguments.
    pub args: &'a Value,
    /// The files the call names, as written, with what the tool does to each.
    pub paths: &'a [(String, Access)],
    /// The command line it starts, for a tool that starts a program.
    pub argv: Option<&'a Argv>,
}

/// A policy of the guard's chain: decides on a call, or passes.
pub trait Policy: Send + Sync + std::fmt::Debug {
    /// What this policy says of `call`.
    fn decide(&self, call: &CallView<'_>) -> Decision;

    /// Whether this policy may ask a person about some call of `tool` (`starts_a_program`:
    /// whether the tool's calls have a command line). The scout starts nothing past a call
    /// that may ask; a policy that cannot tell says `true`, the default.
    fn may_ask(&self, tool: &str, starts_a_program: bool) -> bool {
        let _ = (tool, starts_a_program);
        true
    }
}

/// A decision a rule or the guard's default makes: `allow`, `ask` or `deny`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Ruling {
    /// The call goes on.
    #[default]
    Allow,
    /// A person decides.
    Ask,
    /// The call is refused.
    Deny,
}

/// A rule over any tool: by name glob, a condition over `args`, a decision.
#[derive(Clone, Debug)]
pub struct Rule {
    tools: Globs,
    when: Option<Condition>,
    decision: Ruling,
    name: String,
    reason: String,
}

impl Rule {
    /// A rule deciding `decision` for the tools whose names match one of `tools` (globs), for
    /// `reason` (what a person reads when it denies or asks).
    pub fn new<S: AsRef<str>>(
        tools: impl IntoIterator<Item = S>,
        decision: Ruling,
        reason: impl Into<String>,
    ) -> Result<Rule, String> {
        let tools: Vec<String> = tools.into_iter().map(|t| t.as_ref().to_string()).collect();
        if tools.is_empty() {
            return Err("a guard rule names no tools: give `tools = [\"*\"]` for all".into());
        }
        let reason = reason.into();
        Ok(Rule {
            name: format!(
                "rule {:?}",
                if reason.is_empty() {
                    tools.join(",")
                } else {
                    reason.clone()
                }
            ),
            tools: Globs::new(&tools, false)?,
            when: None,
            decision,
            reason,
        })
    }

    /// Applies the rule only to calls for which `expression` (Rhai, over `args`) is true. An
    /// expression that does not compile is an error here; one that fails on a call, or is not
    /// a boolean, denies the call.
    pub fn when(mut self, expression: &str) -> Result<Rule, String> {
        self.when = Some(Condition::new(expression)?);
        Ok(self)
    }

    /// Names the rule, as errors and pauses show it (by default its reason).
    pub fn named(mut self, name: impl Into<String>) -> Rule {
        self.name = name.into();
        self
    }
}

impl Policy for Rule {
    fn may_ask(&self, tool: &str, _starts_a_program: bool) -> bool {
        self.decision == Ruling::Ask && self.tools.first(tool).is_some()
    }

    fn decide(&self, call: &CallView<'_>) -> Decision {
        if self.tools.first(call.tool).is_none() {
            return Decision::Pass;
        }
        if let Some(when) = &self.when {
            match when.holds(call.args) {
                Ok(true) => {}
                Ok(false) => return Decision::Pass,
                Err(why) => {
                    return Decision::Deny {
                        rule: self.name.clone(),
                        reason: format!("its condition `{}` failed: {why}", when.text),
                    }
                }
            }
        }
        let reason = if self.reason.is_empty() {
            format!("`{}` matches {}", call.tool, self.name)
        } else {
            self.reason.clone()
        };
        match self.decision {
            Ruling::Allow => Decision::Allow,
            Ruling::Ask => Decision::Ask {
                rule: self.name.clone(),
                reason,
            },
            Ruling::Deny => Decision::Deny {
                rule: self.name.clone(),
                reason,
            },
        }
    }
}

/// A rule's condition: a Rhai expression over `args`, with no functions of the runtime and a
/// small operation budget.
#[derive(Clone)]
struct Condition {
    text: String,
    ast: Arc<rhai::AST>,
    engine: Arc<rhai::Engine>,
}

impl std::fmt::Debug for Condition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Condition").field(&self.text).finish()
    }
}

impl Condition {
    fn new(text: &str) -> Result<Condition, String> {
        let mut engine = rhai::Engine::new();
        engine.set_max_operations(10_000);
        engine.set_max_expr_depths(32, 32);
        engine.set_max_string_size(10_000);
        // A field the call does not have is an error, which denies: never `()`, which
        // compares false and would let a rule over a missing field pass.
        engine.set_fail_on_invalid_map_property(true);
        let ast = engine
            .compile_expression(text)
            .map_err(|e| format!("the condition `{text}` does not compile: {e}"))?;
        Ok(Condition {
            text: text.to_string(),
            ast: Arc::new(ast),
            engine: Arc::new(engine),
        })
    }

    fn holds(&self, args: &Value) -> Result<bool, String> {
        let args = rhai::serde::to_dynamic(args).map_err(|e| e.to_string())?;
        let mut scope = rhai::Scope::new();
        scope.push_constant("args", args);
        let value: rhai::Dynamic = self
            .engine
            .eval_ast_with_scope(&mut scope, &self.ast)
            .map_err(|e| e.to_string())?;
        value
            .as_bool()
            .map_err(|t| format!("it is a {t}, not a boolean"))
    }
}

/// The guard of a registry's calls: a chain of policies and a default. The default guard
/// allows every call and costs nothing.
#[derive(Clone, Debug, Default)]
pub struct Guard {
    inner: Option<Arc<Inner>>,
}

#[derive(Debug)]
struct Inner {
    root: PathBuf,
    /// The path rules: they deny or pass, never allow (a rule after them may still ask).
    paths: PathRules,
    /// The rules, the command rules, then the custom policies.
    chain: Vec<Arc<dyn Policy>>,
    /// Whether command rules exist: where they do, `run_command` may be offered.
    has_commands: bool,
    default: Ruling,
    /// The forbidden globs, for what file tools list.
    forbidden: Globs,
    /// What the guard was built from, for the catalog's fingerprint.
    summary: String,
}

impl Guard {
    /// A guard with a root (the jail of file and command tools), the default forbidden list,
    /// reads and writes allowed anywhere under the root, and default `allow`.
    pub fn builder(root: impl Into<PathBuf>) -> GuardBuilder {
        GuardBuilder {
            root: root.into(),
            default: Ruling::Allow,
            forbidden: DEFAULT_FORBIDDEN.iter().map(|s| s.to_string()).collect(),
            read: (vec!["**".into()], Vec::new()),
            write: (vec!["**".into()], Vec::new()),
            rules: Vec::new(),
            commands: Default::default(),
            policies: Vec::new(),
        }
    }

    /// Whether this guard has anything to decide (the default guard does not).
    pub fn is_active(&self) -> bool {
        self.inner.is_some()
    }

    /// Whether the guard may ask a person about some call of `tool` (whose guard view is
    /// `view`): its default asks, or a policy of its chain may. Path rules never ask.
    pub(crate) fn may_ask(&self, tool: &str, view: &GuardView) -> bool {
        let Some(inner) = &self.inner else {
            return false;
        };
        inner.default == Ruling::Ask
            || inner
                .chain
                .iter()
                .any(|policy| policy.may_ask(tool, view.command.is_some()))
    }

    /// Whether the guard has command rules (a manifest offers `run_command` only then).
    pub fn has_command_rules(&self) -> bool {
        self.inner.as_ref().is_some_and(|i| i.has_commands)
    }

    /// The jail's root, for a guard that has one.
    pub fn root(&self) -> Option<&Path> {
        self.inner.as_ref().map(|i| i.root.as_path())
    }

    /// Whether `relative` (a path under the root, '/'-separated) is forbidden: what listings
    /// of file tools leave out.
    pub fn hides(&self, relative: &str) -> bool {
        self.inner
            .as_ref()
            .is_some_and(|i| i.forbidden.covering(relative).is_some())
    }

    /// [`Guard::hides`] as a shared predicate: what the file tools' listings leave out.
    pub fn hider(&self) -> Hider {
        let guard = self.clone();
        Arc::new(move |path: &str| guard.hides(path))
    }

    /// What the guard was built from, in a stable text: part of the catalog a paused run
    /// resumes under.
    pub(crate) fn summary(&self) -> &str {
        self.inner.as_ref().map_or("", |i| i.summary.as_str())
    }

    /// The guard's decision on a call of the tool `spec` with `args`: the first policy's
    /// answer that is not [`Decision::Pass`], else the default. Arguments the tool's view
    /// cannot read (a path that is not a string) are denied.
    pub(crate) fn authorize(
        &self,
        tool: &str,
        effect: Effect,
        view: &GuardView,
        args: &Value,
    ) -> Decision {
        let Some(inner) = &self.inner else {
            return Decision::Allow;
        };
        let unreadable = |why: String| Decision::Deny {
            rule: "arguments".to_string(),
            reason: why,
        };
        let paths = match view.paths(args) {
            Ok(p) => p,
            Err(why) => return unreadable(why),
        };
        let argv = match view.command.as_ref().map(|c| c.argv(args)).transpose() {
            Ok(a) => a,
            Err(why) => return unreadable(why),
        };
        // The path rules first, with the folder a command runs in as a file it reads.
        let cwd = argv.as_ref().map(|a| (a.cwd.clone(), Access::Read));
        for (name, access) in paths.iter().chain(cwd.iter()) {
            match inner.paths.check(name, *access) {
                Decision::Pass => {}
                decided => return decided,
            }
        }
        let call = CallView {
            tool,
            effect,
            args,
            paths: &paths,
            argv: argv.as_ref(),
        };
        for policy in &inner.chain {
            match policy.decide(&call) {
                Decision::Pass => {}
                decided => return decided,
            }
        }
        match inner.default {
            Ruling::Allow => Decision::Allow,
            Ruling::Ask => Decision::Ask {
                rule: "default".to_string(),
                reason: "the guard's default is `ask`, and no rule allows this call".to_string(),
            },
            Ruling::Deny => Decision::Deny {
                rule: "default".to_string(),
                reason: "the guard's default is `deny`, and no rule allows this call".to_string(),
            },
        }
    }
}

/// Builds a [`Guard`]. The chain, in order: the path rules (forbidden, then `read`/`write`
/// deny and allow), the rules in the order added, the command rules, then custom policies.
#[derive(Debug)]
#[must_use]
pub struct GuardBuilder {
    root: PathBuf,
    default: Ruling,
    forbidden: Vec<String>,
    read: (Vec<String>, Vec<String>),
    write: (Vec<String>, Vec<String>),
    rules: Vec<Rule>,
    commands: [Vec<String>; 3],
    policies: Vec<Arc<dyn Policy>>,
}

impl GuardBuilder {
    /// The command rules: patterns over the parsed argv (see [`CommandRules`]) that allow,
    /// ask about or deny a command line (deny first, then ask, then allow).
    pub fn commands<S: Into<String>>(
        mut self,
        allow: impl IntoIterator<Item = S>,
        ask: impl IntoIterator<Item = S>,
        deny: impl IntoIterator<Item = S>,
    ) -> Self {
        let [a, q, d] = &mut self.commands;
        a.extend(allow.into_iter().map(Into::into));
        q.extend(ask.into_iter().map(Into::into));
        d.extend(deny.into_iter().map(Into::into));
        self
    }

    /// What the guard does when every policy passes.
    pub fn default_decision(mut self, default: Ruling) -> Self {
        self.default = default;
        self
    }

    /// Replaces the forbidden globs (always denied, whatever else allows).
    pub fn forbidden<S: Into<String>>(mut self, globs: impl IntoIterator<Item = S>) -> Self {
        self.forbidden = globs.into_iter().map(Into::into).collect();
        self
    }

    /// The globs reads may name (`allow`) and may not (`deny`, which wins).
    pub fn read<S: Into<String>>(
        mut self,
        allow: impl IntoIterator<Item = S>,
        deny: impl IntoIterator<Item = S>,
    ) -> Self {
        self.read = (
            allow.into_iter().map(Into::into).collect(),
            deny.into_iter().map(Into::into).collect(),
        );
        self
    }

    /// The globs writes may name (`allow`) and may not (`deny`, which wins).
    pub fn write<S: Into<String>>(
        mut self,
        allow: impl IntoIterator<Item = S>,
        deny: impl IntoIterator<Item = S>,
    ) -> Self {
        self.write = (
            allow.into_iter().map(Into::into).collect(),
            deny.into_iter().map(Into::into).collect(),
        );
        self
    }

    /// Adds a rule, after those added before.
    pub fn rule(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }

    /// Adds a custom policy, after everything else.
    pub fn policy(mut self, policy: impl Policy + 'static) -> Self {
        self.policies.push(Arc::new(policy));
        self
    }

    /// The guard; an error names a glob that does not compile or a root that does not exist.
    pub fn build(self) -> Result<Guard, String> {
        let root = self.root.canonicalize().map_err(|e| {
            format!(
                "the guard's root {} cannot be opened: {e}",
                self.root.display()
            )
        })?;
        let forbidden = Globs::new(&self.forbidden, true)?;
        let paths = PathRules {
            root: root.clone(),
            forbidden: forbidden.clone(),
            read: AccessRules::new(&self.read.0, &self.read.1)?,
            write: AccessRules::new(&self.write.0, &self.write.1)?,
        };
        let summary = serde_json::json!({
            "root": root,
            "default": self.default,
            "forbidden": self.forbidden,
            "read": self.read,
            "write": self.write,
            "rules": self.rules.iter().map(|r| serde_json::json!({
                "name": r.name, "tools": r.tools.texts(), "when": r.when.as_ref().map(|w| &w.text),
                "decision": r.decision, "reason": r.reason,
            })).collect::<Vec<_>>(),
            "commands": self.commands,
            "policies": self.policies.iter().map(|p| format!("{p:?}")).collect::<Vec<_>>(),
        })
        .to_string();
        let mut chain: Vec<Arc<dyn Policy>> = Vec::new();
        chain.extend(
            self.rules
                .into_iter()
                .map(|r| Arc::new(r) as Arc<dyn Policy>),
        );
        let [allow, ask, deny] = &self.commands;
        let has_commands = !(allow.is_empty() && ask.is_empty() && deny.is_empty());
        if has_commands {
            chain.push(Arc::new(CommandPolicy {
                rules: CommandRules::new(allow, ask, deny)?,
                root: root.clone(),
                allow: allow.clone(),
            }));
        }
        chain.extend(self.policies);
        Ok(Guard {
            inner: Some(Arc::new(Inner {
                root,
                paths,
                chain,
                has_commands,
                default: self.default,
                forbidden,
                summary,
            })),
        })
    }
}
