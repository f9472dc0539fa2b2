//! `[guard]` tables: what every call may touch. Several manifests merge in order: the last
//! `root` and `default` win; forbidden globs, path and command rules, and `[[guard.rule]]`s
//! add up (a later manifest never lifts an earlier one's denial).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::guard::{Guard, Rule, Ruling, DEFAULT_FORBIDDEN};

/// A `[guard]` table as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GuardEntry {
    root: Option<String>,
    default: Option<Ruling>,
    forbidden: Option<Vec<String>>,
    read: Option<AccessEntry>,
    write: Option<AccessEntry>,
    commands: Option<CommandsEntry>,
    #[serde(default)]
    rule: Vec<RuleEntry>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct AccessEntry {
    #[serde(default)]
    allow: Option<Vec<String>>,
    #[serde(default)]
    deny: Vec<String>,
}

/// `commands = { allow, ask, deny }`.
#[derive(Deserialize, Default, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub(super) struct CommandsEntry {
    #[serde(default)]
    pub(super) allow: Vec<String>,
    #[serde(default)]
    pub(super) ask: Vec<String>,
    #[serde(default)]
    pub(super) deny: Vec<String>,
}

/// A `[[guard.rule]]`.
#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct RuleEntry {
    tools: Vec<String>,
    when: Option<String>,
    decision: Ruling,
    #[serde(default)]
    reason: String,
    name: Option<String>,
}

/// The `[guard]` tables loaded so far, merged.
#[derive(Clone)]
pub(super) struct GuardConfig {
    /// The manifest that set the root, for errors.
    pub(super) file: PathBuf,
    root: PathBuf,
    default: Ruling,
    forbidden: Vec<String>,
    read_allow: Option<Vec<String>>,
    read_deny: Vec<String>,
    write_allow: Option<Vec<String>>,
    write_deny: Vec<String>,
    pub(super) commands: Option<CommandsEntry>,
    rules: Vec<Rule>,
}

/// Merges `entry` (of a manifest in `folder`) into `config`. An error names what is wrong.
pub(super) fn merge(
    config: &mut Option<GuardConfig>,
    entry: GuardEntry,
    folder: &Path,
) -> Result<(), String> {
    let c = config.get_or_insert_with(|| GuardConfig {
        file: folder.to_path_buf(),
        root: folder.to_path_buf(),
        default: Ruling::Allow,
        forbidden: DEFAULT_FORBIDDEN.iter().map(|s| s.to_string()).collect(),
        read_allow: None,
        read_deny: Vec::new(),
        write_allow: None,
        write_deny: Vec::new(),
        commands: None,
        rules: Vec::new(),
    });
    if let Some(root) = entry.root {
        c.root = folder.join(root);
        c.file = folder.to_path_buf();
    }
    if let Some(default) = entry.default {
        c.default = default;
    }
    if let Some(forbidden) = entry.forbidden {
        for glob in forbidden {
            if !c.forbidden.contains(&glob) {
                c.forbidden.push(glob);
            }
        }
    }
    let add = |allow: &mut Option<Vec<String>>, deny: &mut Vec<String>, e: AccessEntry| {
        if let Some(more) = e.allow {
            allow.get_or_insert_with(Vec::new).extend(more);
        }
        deny.extend(e.deny);
    };
    if let Some(read) = entry.read {
        add(&mut c.read_allow, &mut c.read_deny, read);
    }
    if let Some(write) = entry.write {
        add(&mut c.write_allow, &mut c.write_deny, write);
    }
    if let Some(commands) = entry.commands {
        let all = c.commands.get_or_insert_with(CommandsEntry::default);
        all.allow.extend(commands.allow);
        all.ask.extend(commands.ask);
        all.deny.extend(commands.deny);
    }
    for (i, r) in entry.rule.into_iter().enumerate() {
        let mut rule = Rule::new(&r.tools, r.decision, r.reason)
            .map_err(|e| format!("rule {}: {e}", i + 1))?;
        if let Some(when) = &r.when {
            rule = rule
                .when(when)
                .map_err(|e| format!("rule {}: {e}", i + 1))?;
        }
        if let Some(name) = r.name {
            rule = rule.named(name);
        }
        c.rules.push(rule);
    }
    Ok(())
}

impl GuardConfig {
    /// The guard. An error names a root that cannot be opened or a glob that does not compile.
    pub(super) fn build(&self) -> Result<Guard, String> {
        let all = || vec!["**".to_string()];
        let mut builder = Guard::builder(&self.root)
            .default_decision(self.default)
            .forbidden(self.forbidden.clone())
            .read(
                self.read_allow.clone().unwrap_or_else(all),
                self.read_deny.clone(),
            )
            .write(
                self.write_allow.clone().unwrap_or_else(all),
                self.write_deny.clone(),
            );
        for rule in &self.rules {
            builder = builder.rule(rule.clone());
        }
        if let Some(c) = &self.commands {
            builder = builder.commands(c.allow.clone(), c.ask.clone(), c.deny.clone());
        }
        builder.build()
    }
}
