//! The guard's command rules: `commands = {allow, ask, deny}`, patterns over a call's parsed
//! argv, that no wrapper, path or shell gets around.
//!
//! A call's argv is read as layers: the command itself, and, for each known wrapper (`env`,
//! `nice`, `timeout`, `sudo`, `xargs`, `busybox`, ...), the command it runs, down to the last.
//! Each layer's program is resolved to its real file (through `PATH`, then canonicalized), so
//! that `rm`, `/bin/rm` and `/usr/bin/rm` are one program. A layer that runs a command line
//! the guard cannot read — a shell, an interpreter given code (`python -c`), `find -exec`,
//! `git -c`, a wrapper with an option it does not know — is a *runner*: it is denied unless a
//! rule matches it, so that only a rule that names it lets it through.
//!
//! # Order
//!
//! 1. A layer matched by a `deny` rule: denied.
//! 2. A runner layer that no rule matches: denied.
//! 3. A layer matched by an `ask` rule: a person decides.
//! 4. Every layer matched by an `allow` rule: allowed.
//! 5. Otherwise the rules pass, and the guard's default decides.
//!
//! `deny` and `ask` match loosely (a program matches by its real file or by its name; an
//! argument `xargs` adds later may be anything), `allow` strictly (the real file, and every
//! argument that may come is covered by the pattern).

use std::path::{Path, PathBuf};

use super::{Argv, Decision};

/// The command rules of a guard: patterns a call's argv is matched against.
#[derive(Clone, Debug, Default)]
pub struct CommandRules {
    deny: Vec<Rule>,
    ask: Vec<Rule>,
    allow: Vec<Rule>,
}

/// One pattern: a program and one glob per argument.
#[derive(Clone, Debug)]
struct Rule {
    /// The pattern as written, to name it in decisions.
    text: String,
    /// The program as written: a name looked up in `PATH`, or a path.
    program: String,
    /// One glob per argument.
    args: Vec<String>,
    /// A trailing `*`: any further arguments (zero or more).
    rest: bool,
}

/// How strictly a rule matches a layer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `deny` and `ask`: whatever may be the rule's command is.
    Loose,
    /// `allow`: only what surely is the rule's command is.
    Strict,
}

/// One argument of a layer: known, or filled in when the command runs (`xargs`, `find -exec
/// {}`).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Arg {
    Known(String),
    Unknown,
}

/// A program as the guard knows it.
#[derive(Clone, Debug, Default)]
struct Program {
    /// The real file, when it resolves; with the applet's name for a multi-call binary
    /// (`busybox`), whose applets are one file.
    real: Option<(PathBuf, Option<String>)>,
    /// The names it goes by: as invoked, and its real file's (not a multi-call binary's).
    names: Vec<String>,
}

/// One command of a call: the program, its arguments, and whether more may be added.
#[derive(Clone, Debug)]
struct Layer {
    program: Program,
    /// The program as the call wrote it.
    written: String,
    args: Vec<Arg>,
    /// More arguments are added when it runs (`xargs`).
    open: bool,
    /// Why it runs a command line the guard cannot read, when it does.
    runner: Option<String>,
    /// Why what it runs cannot be told (an option of a wrapper the guard does not know): such
    /// a layer is denied whatever the rules.
    unreadable: Option<String>,
}

/// Multi-call binaries: one file, many programs, chosen by the name invoked.
/// (`rustup` is one too: `cargo` and `rustc` are links to it.)
const MULTI_CALL: &[&str] = &["busybox", "toybox", "coreutils", "rustup", "uutils"];

/// Shells: whatever they run is a command line the guard cannot read.
const SHELLS: &[&str] = &[
    "sh", "bash", "dash", "ash", "zsh", "ksh", "mksh", "pdksh", "oksh", "yash", "csh", "tcsh",
    "fish", "rbash", "pwsh", "nu", "elvish", "xonsh", "rc", "es",
];

/// Interpreters: code they are given runs anything.
const INTERPRETERS: &[&str] = &[
    "python",
    "pypy",
    "perl",
    "ruby",
    "node",
    "nodejs",
    "deno",
    "bun",
    "php",
    "lua",
    "luajit",
    "tclsh",
    "wish",
    "expect",
    "rscript",
    "r",
    "julia",
    "awk",
    "gawk",
    "mawk",
    "nawk",
    "osascript",
    "guile",
    "racket",
    "sbcl",
    "ghci",
    "runghc",
    "irb",
    "jshell",
    "groovy",
    "scala",
    "kotlin",
];

/// Programs that run a command they are given in a form the guard does not unwrap.
const RUNNERS: &[&str] = &[
    "watch",
    "script",
    "su",
    "runuser",
    "sg",
    "parallel",
    "nsenter",
    "unshare",
    "systemd-run",
    "strace",
    "ltrace",
    "gdb",
    "valgrind",
    "at",
    "batch",
    "tmux",
    "screen",
    "firejail",
    "bwrap",
    "setpriv",
    "prlimit",
    "numactl",
    "faketime",
    "eatmydata",
    "fakeroot",
    "cgexec",
    "torsocks",
    "proxychains",
    "proxychains4",
    "catchsegv",
    "pkexec",
    "ssh",
    "make",
    "sed",
];

impl CommandRules {
    /// Whether some command may be asked about: there are `ask` rules.
    pub(crate) fn may_ask(&self) -> bool {
        !self.ask.is_empty()
    }

    /// Rules from the patterns of `allow`, `ask` and `deny`: each a program followed by one
    /// glob per argument (`*`, `?`, `[..]`), separated by spaces; a trailing `*` matches any
    /// further arguments, none included.
    ///
    /// # Errors
    ///
    /// A pattern that is empty, whose program is a glob, or whose glob is malformed, named
    /// with its list.
    pub fn new(allow: &[String], ask: &[String], deny: &[String]) -> Result<CommandRules, String> {
        let parse = |list: &str, patterns: &[String]| {
            patterns
                .iter()
                .map(|p| Rule::parse(p).map_err(|e| format!("commands.{list} \"{p}\": {e}")))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(CommandRules {
            deny: parse("deny", deny)?,
            ask: parse("ask", ask)?,
            allow: parse("allow", allow)?,
        })
    }

    /// Whether there are no rules at all.
    pub fn is_empty(&self) -> bool {
        self.deny.is_empty() && self.ask.is_empty() && self.allow.is_empty()
    }

    /// What the rules say of a call that runs `argv` in `root` (its `cwd` is relative to
    /// `root`), with `path_env` the `PATH` the command will see (a usual system `PATH` when
    /// `None`). [`Decision::Pass`] when no rule decides.
    pub fn decide(&self, argv: &Argv, root: &Path, path_env: Option<&str>) -> Decision {
        let Some(first) = argv.argv.first() else {
            return Decision::Deny {
                rule: "commands".into(),
                reason: "the argv is empty".into(),
            };
        };
        let cwd = root.join(&argv.cwd);
        let path_env = path_env.unwrap_or(DEFAULT_PATH);
        let resolver = Resolver {
            cwd: &cwd,
            path_env,
            root,
        };
        let args = argv.argv[1..].iter().cloned().map(Arg::Known).collect();
        let layers = unwrap(&resolver, first, args, false);
        let shown = |layer: &Layer| show(layer, &layers);
        for layer in &layers {
            if let Some(rule) = self
                .deny
                .iter()
                .find(|r| r.matches(&resolver, layer, Mode::Loose))
            {
                return Decision::Deny {
                    rule: format!("commands.deny \"{}\"", rule.text),
                    reason: format!("the command {} is denied", shown(layer)),
                };
            }
        }
        if let Some((layer, why)) = layers
            .iter()
            .find_map(|l| l.unreadable.as_ref().map(|why| (l, why)))
        {
            return Decision::Deny {
                rule: "commands (built in: commands the guard cannot read)".into(),
                reason: format!("{} {why}: what it runs cannot be told", shown(layer)),
            };
        }
        for layer in &layers {
            let Some(why) = &layer.runner else { continue };
            let named = self
                .ask
                .iter()
                .any(|r| r.matches(&resolver, layer, Mode::Loose))
                || self
                    .allow
                    .iter()
                    .any(|r| r.matches(&resolver, layer, Mode::Strict));
            if !named {
                return Decision::Deny {
                    rule: "commands (built in: shells and programs that run others)".into(),
                    reason: format!(
                        "{} {why}: the guard cannot read what it runs, and no rule names it",
                        shown(layer)
                    ),
                };
            }
        }
        for layer in &layers {
            if let Some(rule) = self
                .ask
                .iter()
                .find(|r| r.matches(&resolver, layer, Mode::Loose))
            {
                return Decision::Ask {
                    rule: format!("commands.ask \"{}\"", rule.text),
                    reason: format!("the command {} needs a person's approval", shown(layer)),
                };
            }
        }
        let allowed = layers.iter().all(|layer| {
            self.allow
                .iter()
                .any(|r| r.matches(&resolver, layer, Mode::Strict))
        });
        if allowed {
            Decision::Allow
        } else {
            Decision::Pass
        }
    }
}

/// The `PATH` looked through when the command's is not known.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A layer as the guard saw it, in its call: `["/usr/bin/rm", "-rf", "x"]` (in `env nice rm
/// -rf x`).
fn show(layer: &Layer, layers: &[Layer]) -> String {
    let program = match &layer.program.real {
        Some((path, None)) => path.display().to_string(),
        Some((path, Some(applet))) => format!("{} {applet}", path.display()),
        None => layer.written.clone(),
    };
    let mut parts = vec![format!("{program:?}")];
    parts.extend(layer.args.iter().map(|a| match a {
        Arg::Known(s) => format!("{s:?}"),
        Arg::Unknown => "<any>".to_string(),
    }));
    if layer.open {
        parts.push("<more>".into());
    }
    let mut out = format!("[{}]", parts.join(", "));
    if layers.len() > 1 {
        let outer = &layers[0];
        let mut words = vec![outer.written.clone()];
        words.extend(outer.args.iter().map(|a| match a {
            Arg::Known(s) => s.clone(),
            Arg::Unknown => "<any>".into(),
        }));
        out.push_str(&format!(" (in `{}`)", words.join(" ")));
    }
    out
}

/// Looks programs up as the command will.
struct Resolver<'a> {
    cwd: &'a Path,
    path_env: &'a str,
    /// The guard's root: a rule's relative program path is relative to it.
    root: &'a Path,
}

impl Resolver<'_> {
    /// The program `written` is: its real file, where it resolves, and its names.
    fn program(&self, written: &str) -> Program {
        let found = if written.contains('/') {
            Some(self.cwd.join(written))
        } else {
            // An empty entry is the current folder, as `execvp` reads it.
            self.path_env
                .split(':')
                .map(|d| if d.is_empty() { "." } else { d })
                .map(|d| self.cwd.join(d).join(written))
                .find(|p| p.is_file())
        };
        self.identify(written, found)
    }

    /// A rule's program: found through the absolute folders of `PATH` alone, so that a file
    /// the call's folder holds is never taken for the program a rule names; a relative path
    /// is relative to the root.
    fn rule_program(&self, written: &str) -> Program {
        let found = if written.contains('/') {
            Some(self.root.join(written))
        } else {
            self.path_env
                .split(':')
                .filter(|d| d.starts_with('/'))
                .map(|d| Path::new(d).join(written))
                .find(|p| p.is_file())
        };
        self.identify(written, found)
    }

    /// The program `written`, found at `found`.
    fn identify(&self, written: &str, found: Option<PathBuf>) -> Program {
        let invoked = base_name(written);
        let real = found.and_then(|p| std::fs::canonicalize(p).ok());
        let mut names = vec![invoked.clone()];
        let real = real.map(|path| {
            let real_name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if MULTI_CALL.contains(&real_name.as_str()) && real_name != invoked {
                (path, Some(invoked.clone()))
            } else {
                if real_name != invoked {
                    names.push(real_name);
                }
                (path, None)
            }
        });
        Program { real, names }
    }
}

/// The last component of a program's path.
fn base_name(program: &str) -> String {
    program.rsplit('/').next().unwrap_or(program).to_string()
}

/// A name without a version suffix: `python3.12` is `python`, `lua5.4` is `lua`.
fn family(name: &str) -> String {
    name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.' || c == '-')
        .to_ascii_lowercase()
}

impl Rule {
    fn parse(text: &str) -> Result<Rule, String> {
        let mut words: Vec<String> = text.split_whitespace().map(str::to_string).collect();
        if words.is_empty() {
            return Err("the pattern is empty: it starts with a program".into());
        }
        let program = words.remove(0);
        if program.contains(['*', '?', '[']) {
            return Err("the program is a name or a path, not a glob".into());
        }
        let rest = words.last().is_some_and(|w| w == "*");
        if rest {
            words.pop();
        }
        for w in &words {
            glob_match(w, "").map_err(|e| format!("`{w}`: {e}"))?;
        }
        Ok(Rule {
            text: text.split_whitespace().collect::<Vec<_>>().join(" "),
            program,
            args: words,
            rest,
        })
    }

    fn matches(&self, resolver: &Resolver<'_>, layer: &Layer, mode: Mode) -> bool {
        self.matches_program(resolver, &layer.program, mode) && self.matches_args(layer, mode)
    }

    fn matches_program(&self, resolver: &Resolver<'_>, program: &Program, mode: Mode) -> bool {
        let mine = resolver.rule_program(&self.program);
        if let (Some(a), Some(b)) = (&mine.real, &program.real) {
            if a == b {
                return true;
            }
        }
        match mode {
            Mode::Strict => false,
            // A rule written as a bare name names that program wherever it lives; a path
            // names its file, and its file's name.
            Mode::Loose => mine.names.iter().any(|n| program.names.contains(n)),
        }
    }

    fn matches_args(&self, layer: &Layer, mode: Mode) -> bool {
        let args = &layer.args;
        for (i, arg) in args.iter().enumerate() {
            let Some(glob) = self.args.get(i) else {
                // More arguments than globs: only a trailing `*` takes them.
                return self.rest;
            };
            let ok = match arg {
                Arg::Known(s) => glob_match(glob, s).unwrap_or(false),
                Arg::Unknown => mode == Mode::Loose || glob == "*",
            };
            if !ok {
                return false;
            }
        }
        if args.len() < self.args.len() {
            // Fewer: the rule's command only if more may come and `deny`/`ask` is asking.
            return layer.open && mode == Mode::Loose;
        }
        // As many: arguments added later must be covered too.
        !layer.open || self.rest
    }
}

/// Whether `text` matches the glob `pattern` (`*`, `?`, `[abc]`, `[a-z]`, `[!x]`).
///
/// # Errors
///
/// An unclosed `[`.
fn glob_match(pattern: &str, text: &str) -> Result<bool, String> {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // Checked once up front so that a malformed pattern is an error whatever the text.
    let mut i = 0;
    while i < p.len() {
        if p[i] == '[' {
            let close = class_end(&p, i).ok_or("an unclosed `[`")?;
            i = close;
        }
        i += 1;
    }
    Ok(glob_at(&p, &t))
}

/// The index of the `]` closing the class opened at `open`.
fn class_end(p: &[char], open: usize) -> Option<usize> {
    let mut j = open + 1;
    if matches!(p.get(j), Some('!' | '^')) {
        j += 1;
    }
    // A `]` first in the class is a member.
    if p.get(j) == Some(&']') {
        j += 1;
    }
    while j < p.len() {
        if p[j] == ']' {
            return Some(j);
        }
        j += 1;
    }
    None
}

/// Glob matching with backtracking over the last `*` (linear in practice).
fn glob_at(p: &[char], t: &[char]) -> bool {
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        let step = match p.get(pi) {
            Some('*') => {
                star = Some((pi, ti));
                pi += 1;
                continue;
            }
            Some('?') => Some(pi + 1),
            Some('[') => {
                let end = class_end(p, pi).unwrap_or(p.len() - 1);
                in_class(&p[pi + 1..end], t[ti]).then_some(end + 1)
            }
            Some(c) => (*c == t[ti]).then_some(pi + 1),
            None => None,
        };
        match step {
            Some(next) => {
                pi = next;
                ti += 1;
            }
            None => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

fn in_class(class: &[char], c: char) -> bool {
    let (negated, class) = match class.first() {
        Some('!' | '^') => (true, &class[1..]),
        _ => (false, class),
    };
    let mut found = false;
    let mut i = 0;
    while i < class.len() {
        if i + 2 < class.len() && class[i + 1] == '-' {
            found |= class[i] <= c && c <= class[i + 2];
            i += 3;
        } else {
            found |= class[i] == c;
            i += 1;
        }
    }
    found != negated
}

/// How a wrapper's options are read: those that take a value, and flags.
struct Options {
    /// Short options taking a value (`-n 5`, `-n5`).
    short_value: &'static str,
    /// Short flags.
    short_flag: &'static str,
    /// Long options taking a value (`--signal KILL`, `--signal=KILL`).
    long_value: &'static [&'static str],
    /// Long flags.
    long_flag: &'static [&'static str],
}

/// Where a wrapper's command starts after its options, or why it cannot be known.
enum Parsed {
    /// The index of the first argument after the options, and the options seen (short
    /// letters and long names).
    At(usize, Vec<String>),
    Unknown(String),
}

fn parse_options(args: &[Arg], spec: &Options) -> Parsed {
    let mut seen = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let Arg::Known(a) = &args[i] else {
            return Parsed::Unknown("has an argument filled in when it runs".into());
        };
        if a == "--" {
            return Parsed::At(i + 1, seen);
        }
        if a == "-" || !a.starts_with('-') {
            return Parsed::At(i, seen);
        }
        if let Some(long) = a.strip_prefix("--") {
            let (name, attached) = match long.split_once('=') {
                Some((n, _)) => (n, true),
                None => (long, false),
            };
            if spec.long_value.contains(&name) {
                i += if attached { 1 } else { 2 };
            } else if spec.long_flag.contains(&name) && !attached {
                i += 1;
            } else {
                return Parsed::Unknown(format!("has an option the guard does not know (`{a}`)"));
            }
            seen.push(name.to_string());
            continue;
        }
        let letters: Vec<char> = a[1..].chars().collect();
        let mut consumed = 1;
        for (k, c) in letters.iter().enumerate() {
            seen.push(c.to_string());
            if spec.short_value.contains(*c) {
                if k + 1 == letters.len() {
                    consumed = 2;
                }
                break;
            }
            if !spec.short_flag.contains(*c) {
                return Parsed::Unknown(format!("has an option the guard does not know (`{a}`)"));
            }
        }
        i += consumed;
    }
    Parsed::At(i.min(args.len()), seen)
}

/// The layers of a command: itself, then what each wrapper runs.
fn unwrap(resolver: &Resolver<'_>, written: &str, args: Vec<Arg>, open: bool) -> Vec<Layer> {
    let mut layers = Vec::new();
    let mut next = Some((written.to_string(), args, open, true));
    // Each step takes at least the program off the argv, so this ends; the bound is a guard
    // against a very long chain all the same.
    while let Some((written, args, open, resolvable)) = next.take() {
        if layers.len() > 64 {
            if let Some(last) = layers.last_mut() {
                let last: &mut Layer = last;
                last.unreadable = Some("wraps too many commands".into());
            }
            break;
        }
        let mut program = resolver.program(&written);
        if !resolvable {
            // Its name alone: `deny` and `ask` still see it, `allow` cannot vouch for it.
            program.real = None;
        }
        let mut layer = Layer {
            program,
            written,
            args,
            open,
            runner: None,
            unreadable: None,
        };
        let (inner, extra) = step(&mut layer);
        for (w, a) in extra {
            layers.extend(unwrap(resolver, &w, a, false));
        }
        layers.push(layer);
        next = inner;
    }
    layers
}

/// What one layer runs: the next layer (a wrapper's command), and commands it runs besides
/// (`find -exec`). Marks the layer a runner where what it runs cannot be read.
/// The next layer: its program as written, its arguments, whether more are added, and whether
/// its program is found where the guard looks.
type Inner = Option<(String, Vec<Arg>, bool, bool)>;

fn step(layer: &mut Layer) -> (Inner, Vec<(String, Vec<Arg>)>) {
    let names: Vec<String> = layer.program.names.iter().map(|n| family(n)).collect();
    let applet_names: Vec<String> = match &layer.program.real {
        Some((_, Some(applet))) => vec![family(applet)],
        _ => Vec::new(),
    };
    let is = |list: &[&str]| {
        names
            .iter()
            .chain(&applet_names)
            .any(|n| list.contains(&n.as_str()))
    };
    let name = names
        .iter()
        .chain(&applet_names)
        .find(|n| WRAPPERS.contains(&n.as_str()) || n.as_str() == "find" || n.as_str() == "git")
        .cloned()
        .unwrap_or_default();
    if is(SHELLS) {
        layer.runner = Some("is a shell".into());
        return (None, Vec::new());
    }
    if is(INTERPRETERS) {
        layer.runner = Some("is an interpreter".into());
        return (None, Vec::new());
    }
    if is(RUNNERS) {
        layer.runner = Some("runs commands it is given".into());
        return (None, Vec::new());
    }
    let args = layer.args.clone();
    match name.as_str() {
        "find" => (None, find_commands(layer)),
        "git" => {
            git(layer);
            (None, Vec::new())
        }
        "" => (None, Vec::new()),
        wrapper => match wrapper_command(wrapper, &args, layer.open) {
            Ok(inner) => (inner, Vec::new()),
            Err(Refusal::Runner(why)) => {
                layer.runner = Some(why);
                (None, Vec::new())
            }
            Err(Refusal::RunnerOver(why, inner)) => {
                layer.runner = Some(why);
                (inner, Vec::new())
            }
            Err(Refusal::Unreadable(why)) => {
                layer.unreadable = Some(why);
                (None, Vec::new())
            }
        },
    }
}

/// Whether setting the variable `name` makes a program load or run code of the caller's
/// choosing (`LD_PRELOAD`, `BASH_ENV`, `GIT_SSH_COMMAND`, ...).
fn loads_code(name: &str) -> bool {
    const NAMES: &[&str] = &[
        "BASH_ENV",
        "ENV",
        "PYTHONSTARTUP",
        "PYTHONPATH",
        "PERL5OPT",
        "PERL5LIB",
        "RUBYOPT",
        "NODE_OPTIONS",
        "PAGER",
        "EDITOR",
        "VISUAL",
        "SHELL",
        "PROMPT_COMMAND",
        "IFS",
    ];
    NAMES.contains(&name)
        || name.starts_with("LD_")
        || name.starts_with("DYLD_")
        || name.starts_with("GIT_")
}

/// The wrappers whose command is unwrapped.
const WRAPPERS: &[&str] = &[
    "env", "nice", "nohup", "timeout", "time", "stdbuf", "command", "xargs", "sudo", "doas",
    "busybox", "toybox", "chrt", "ionice", "setsid", "taskset", "unbuffer", "flock", "chroot",
    "exec", "builtin",
];

/// Why a wrapper's command is not unwrapped.
enum Refusal {
    /// It runs a command line the guard cannot read (`env -S`, `sudo -s`): a rule may name it.
    Runner(String),
    /// Where its command starts cannot be told.
    Unreadable(String),
    /// It makes its command run other code (`env LD_PRELOAD=...`): a runner, whose command is
    /// checked as a layer all the same.
    RunnerOver(String, Inner),
}

/// The command a wrapper runs, or why it cannot be known.
fn wrapper_command(wrapper: &str, args: &[Arg], open: bool) -> Result<Inner, Refusal> {
    let none: &[&str] = &[];
    let (spec, positional) = match wrapper {
        "env" => (
            Options {
                short_value: "uCSP",
                short_flag: "i0v",
                long_value: &[
                    "unset",
                    "chdir",
                    "split-string",
                    "default-signal",
                    "ignore-signal",
                    "block-signal",
                ],
                long_flag: &[
                    "ignore-environment",
                    "null",
                    "debug",
                    "list-signal-handling",
                ],
            },
            0,
        ),
        "nice" => (
            Options {
                short_value: "n",
                short_flag: "",
                long_value: &["adjustment"],
                long_flag: none,
            },
            0,
        ),
        "nohup" | "exec" | "builtin" => (
            Options {
                short_value: "",
                short_flag: "",
                long_value: none,
                long_flag: none,
            },
            0,
        ),
        "timeout" => (
            Options {
                short_value: "sk",
                short_flag: "v",
                long_value: &["signal", "kill-after"],
                long_flag: &["preserve-status", "foreground", "verbose"],
            },
            1,
        ),
        "time" => (
            Options {
                short_value: "fo",
                short_flag: "pvaq",
                long_value: &["format", "output"],
                long_flag: &["portability", "verbose", "append", "quiet"],
            },
            0,
        ),
        "stdbuf" => (
            Options {
                short_value: "ioe",
                short_flag: "",
                long_value: &["input", "output", "error"],
                long_flag: none,
            },
            0,
        ),
        "command" => (
            Options {
                short_value: "",
                short_flag: "pvV",
                long_value: none,
                long_flag: none,
            },
            0,
        ),
        "xargs" => (
            Options {
                short_value: "adEILnPs",
                short_flag: "0rtpxo",
                long_value: &[
                    "arg-file",
                    "delimiter",
                    "eof",
                    "replace",
                    "max-lines",
                    "max-args",
                    "max-procs",
                    "max-chars",
                    "process-slot-var",
                ],
                long_flag: &[
                    "null",
                    "no-run-if-empty",
                    "verbose",
                    "interactive",
                    "exit",
                    "open-tty",
                    "show-limits",
                ],
            },
            0,
        ),
        "sudo" => (
            Options {
                short_value: "ugCDhprtUTc",
                short_flag: "AbEHkKnPSBNsi",
                long_value: &[
                    "user",
                    "group",
                    "close-from",
                    "chdir",
                    "host",
                    "prompt",
                    "role",
                    "type",
                    "other-user",
                    "command-timeout",
                ],
                long_flag: &[
                    "askpass",
                    "background",
                    "preserve-env",
                    "set-home",
                    "reset-timestamp",
                    "remove-timestamp",
                    "non-interactive",
                    "preserve-groups",
                    "stdin",
                    "bell",
                    "no-update",
                ],
            },
            0,
        ),
        "doas" => (
            Options {
                short_value: "uC",
                short_flag: "n",
                long_value: none,
                long_flag: none,
            },
            0,
        ),
        "busybox" | "toybox" => (
            Options {
                short_value: "",
                short_flag: "",
                long_value: none,
                long_flag: none,
            },
            0,
        ),
        "chrt" => (
            Options {
                short_value: "T",
                short_flag: "bdfiorRvaemPp",
                long_value: &["sched-runtime", "sched-deadline", "sched-period"],
                long_flag: &[
                    "batch",
                    "deadline",
                    "fifo",
                    "idle",
                    "other",
                    "rr",
                    "reset-on-fork",
                    "verbose",
                    "all-tasks",
                    "max",
                ],
            },
            1,
        ),
        "ionice" => (
            Options {
                short_value: "cnpPu",
                short_flag: "t",
                long_value: &["class", "classdata", "pid", "pgid", "uid"],
                long_flag: &["ignore"],
            },
            0,
        ),
        "setsid" => (
            Options {
                short_value: "",
                short_flag: "cfw",
                long_value: none,
                long_flag: &["ctty", "fork", "wait"],
            },
            0,
        ),
        "taskset" => (
            Options {
                short_value: "",
                short_flag: "acp",
                long_value: none,
                long_flag: &["all-tasks", "cpu-list", "pid"],
            },
            1,
        ),
        "unbuffer" => (
            Options {
                short_value: "",
                short_flag: "p",
                long_value: none,
                long_flag: none,
            },
            0,
        ),
        "flock" => (
            Options {
                short_value: "wE",
                short_flag: "sxunoFv",
                long_value: &["timeout", "conflict-exit-code"],
                long_flag: &[
                    "shared",
                    "exclusive",
                    "unlock",
                    "nonblock",
                    "close",
                    "no-fork",
                    "verbose",
                ],
            },
            1,
        ),
        "chroot" => (
            Options {
                short_value: "",
                short_flag: "",
                long_value: &["userspec", "groups"],
                long_flag: &["skip-chdir"],
            },
            1,
        ),
        _ => return Ok(None),
    };
    let (at, seen) = match parse_options(args, &spec) {
        Parsed::At(at, seen) => (at, seen),
        Parsed::Unknown(why) => return Err(Refusal::Unreadable(why)),
    };
    let has = |o: &str| seen.iter().any(|s| s == o);
    match wrapper {
        "env" if has("S") || has("split-string") => {
            return Err(Refusal::Runner(
                "splits a string into a command line (`env -S`)".into(),
            ))
        }
        "sudo" if has("s") || has("i") => return Err(Refusal::Runner("runs a shell".into())),
        "doas" if has("s") => return Err(Refusal::Runner("runs a shell".into())),
        "flock" if has("c") => return Err(Refusal::Runner("runs a shell".into())),
        "chrt" | "taskset" if has("p") || has("pid") => return Ok(None),
        "ionice" if has("p") || has("P") || has("u") || has("pid") || has("pgid") || has("uid") => {
            return Ok(None)
        }
        "command" if has("v") || has("V") => return Ok(None),
        _ => {}
    }
    let mut at = at;
    // Whether the next program is found where the guard looks for it: not when the wrapper
    // changes `PATH`, the folder or the root first.
    let mut resolvable = match wrapper {
        "env" => !(has("C") || has("chdir") || has("i") || has("ignore-environment")),
        "sudo" => !(has("D") || has("chdir")),
        "chroot" => false,
        _ => true,
    };
    let mut loads = None;
    if wrapper == "env" || wrapper == "sudo" {
        while let Some(Arg::Known(a)) = args.get(at) {
            let Some((name, _)) = a.split_once('=').filter(|(n, _)| !n.is_empty()) else {
                break;
            };
            if loads_code(name) && loads.is_none() {
                loads = Some(format!(
                    "sets `{name}`, which makes the command load or run other code"
                ));
            }
            resolvable &= name != "PATH";
            at += 1;
        }
    }
    // Positional arguments before the command (`timeout DURATION`, `chrt PRIORITY`).
    at += positional;
    if wrapper == "sudo" && args.get(at) == Some(&Arg::Known("--".into())) {
        at += 1;
    }
    let xargs = wrapper == "xargs";
    let inner = command_at(
        args,
        at,
        open,
        xargs,
        has("I") || has("i") || has("replace"),
        resolvable,
    )?;
    match loads {
        // A runner whose command is known all the same: it is checked too.
        Some(why) => Err(Refusal::RunnerOver(why, inner)),
        None => Ok(inner),
    }
}

/// The command a wrapper runs from `args[at]` on.
fn command_at(
    args: &[Arg],
    at: usize,
    open: bool,
    xargs: bool,
    replaces: bool,
    resolvable: bool,
) -> Result<Inner, Refusal> {
    match args.get(at) {
        None if xargs => Ok(Some(("echo".into(), Vec::new(), true, true))),
        None => Ok(None),
        Some(Arg::Unknown) => Err(Refusal::Unreadable(
            "runs a command filled in when it runs".into(),
        )),
        Some(Arg::Known(program)) => {
            let mut rest: Vec<Arg> = args[at + 1..].to_vec();
            if xargs && replaces {
                // `-I {}` puts the input into the arguments: any of them may be anything.
                rest = rest.into_iter().map(|_| Arg::Unknown).collect();
            }
            Ok(Some((program.clone(), rest, open || xargs, resolvable)))
        }
    }
}

/// `find`'s actions that run commands or delete files: each `-exec`'s command is a layer of
/// its own, with `{}` any argument; `-delete` and the `-exec` family make it a runner.
fn find_commands(layer: &mut Layer) -> Vec<(String, Vec<Arg>)> {
    let mut commands = Vec::new();
    let mut actions = Vec::new();
    let mut i = 0;
    while i < layer.args.len() {
        if let Arg::Known(a) = &layer.args[i] {
            match a.as_str() {
                "-exec" | "-execdir" | "-ok" | "-okdir" => {
                    actions.push(a.clone());
                    let start = i + 1;
                    let mut end = start;
                    while end < layer.args.len()
                        && !matches!(&layer.args[end], Arg::Known(x) if x == ";" || x == "+")
                    {
                        end += 1;
                    }
                    if let Some(Arg::Known(program)) = layer.args.get(start) {
                        let args = layer.args[(start + 1).min(end)..end]
                            .iter()
                            .map(|a| match a {
                                Arg::Known(s) if s.contains("{}") => Arg::Unknown,
                                other => other.clone(),
                            })
                            .collect();
                        commands.push((program.clone(), args));
                    }
                    i = end;
                }
                "-delete" | "-fprint" | "-fprint0" | "-fprintf" | "-fls" => actions.push(a.clone()),
                _ => {}
            }
        }
        i += 1;
    }
    if !actions.is_empty() {
        layer.runner = Some(format!(
            "runs commands or changes files ({})",
            actions.join(", ")
        ));
    }
    commands
}

/// `git` runs configured commands: `-c` and `--config-env` can set any of them (a pager, an
/// alias with `!`, `core.sshCommand`), and some subcommands run commands they are given.
fn git(layer: &mut Layer) {
    let mut subcommand = None;
    let mut i = 0;
    while i < layer.args.len() {
        let Arg::Known(a) = &layer.args[i] else {
            layer.runner = Some("has an argument filled in when it runs".into());
            return;
        };
        if a == "-c"
            || a.starts_with("--config-env")
            || a.starts_with("--exec-path")
            || a.starts_with("-c") && a.len() > 2
        {
            layer.runner = Some(format!(
                "sets its configuration on the command line (`{a}`)"
            ));
            return;
        }
        if subcommand.is_none() {
            if a == "-C" || a == "--git-dir" || a == "--work-tree" || a == "--namespace" {
                i += 2;
                continue;
            }
            if !a.starts_with('-') {
                subcommand = Some(a.clone());
            }
        } else if matches!(
            a.as_str(),
            "--exec" | "-x" | "--upload-pack" | "--receive-pack" | "-u" | "--extcmd" | "--tool"
        ) || a.starts_with("--exec=")
            || a.starts_with("--upload-pack=")
            || a.starts_with("--receive-pack=")
            || a.starts_with("--extcmd=")
        {
            layer.runner = Some(format!("runs a command it is given (`{a}`)"));
            return;
        }
        i += 1;
    }
    if let Some(sub) = subcommand {
        if matches!(
            sub.as_str(),
            "filter-branch"
                | "difftool"
                | "mergetool"
                | "bisect"
                | "submodule"
                | "daemon"
                | "instaweb"
                | "archimport"
                | "cvsimport"
                | "svn"
                | "p4"
                | "send-email"
        ) {
            layer.runner = Some(format!("runs commands it is given (`git {sub}`)"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(allow: &[&str], ask: &[&str], deny: &[&str]) -> CommandRules {
        let s = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        CommandRules::new(&s(allow), &s(ask), &s(deny)).unwrap()
    }

    fn decide(rules: &CommandRules, argv: &[&str]) -> Decision {
        let argv = Argv {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            cwd: ".".into(),
        };
        let path = std::env::var("PATH").ok();
        rules.decide(&argv, Path::new("/"), path.as_deref())
    }

    #[test]
    fn globs_match_one_argument() {
        let cases = [
            ("*", "", true),
            ("a*c", "abbbc", true),
            ("a*c", "abbb", false),
            ("?x", "ax", true),
            ("?x", "x", false),
            ("[a-c]1", "b1", true),
            ("[!a-c]1", "b1", false),
            ("[]]", "]", true),
            ("*.rs", "src/lib.rs", true),
            ("--release", "--release", true),
        ];
        for (glob, text, expected) in cases {
            assert_eq!(glob_match(glob, text), Ok(expected), "{glob} {text}");
        }
        assert!(glob_match("[ab", "a").is_err());
    }

    #[test]
    fn malformed_patterns_are_refused_with_their_list() {
        let err = CommandRules::new(&[], &[], &["".into()]).unwrap_err();
        assert!(
            err.contains("commands.deny") && err.contains("empty"),
            "{err}"
        );
        let err = CommandRules::new(&["r* x".into()], &[], &[]).unwrap_err();
        assert!(
            err.contains("commands.allow") && err.contains("glob"),
            "{err}"
        );
        let err = CommandRules::new(&[], &["git [x".into()], &[]).unwrap_err();
        assert!(
            err.contains("commands.ask") && err.contains("unclosed"),
            "{err}"
        );
    }

    #[test]
    fn a_trailing_star_takes_the_rest_and_none() {
        let r = rules(&["cargo test *", "git status"], &["git push *"], &[]);
        assert_eq!(decide(&r, &["cargo", "test"]), Decision::Allow);
        assert_eq!(decide(&r, &["cargo", "test", "a", "b"]), Decision::Allow);
        assert_eq!(decide(&r, &["cargo", "build"]), Decision::Pass);
        assert_eq!(decide(&r, &["git", "status"]), Decision::Allow);
        assert_eq!(decide(&r, &["git", "status", "-s"]), Decision::Pass);
        match decide(&r, &["git", "push", "origin"]) {
            Decision::Ask { rule, .. } => assert_eq!(rule, "commands.ask \"git push *\""),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn deny_comes_before_ask_before_allow() {
        let r = rules(&["echo *"], &["echo *"], &["echo secret"]);
        assert!(matches!(
            decide(&r, &["echo", "secret"]),
            Decision::Deny { .. }
        ));
        assert!(matches!(decide(&r, &["echo", "hi"]), Decision::Ask { .. }));
        let r = rules(&["echo *"], &[], &[]);
        assert_eq!(decide(&r, &["echo", "hi"]), Decision::Allow);
    }

    #[test]
    fn an_allowed_command_under_a_wrapper_needs_the_wrapper_allowed() {
        let r = rules(&["echo *"], &[], &[]);
        assert_eq!(decide(&r, &["nice", "echo", "hi"]), Decision::Pass);
        let r = rules(&["echo *", "nice *"], &[], &[]);
        assert_eq!(decide(&r, &["nice", "echo", "hi"]), Decision::Allow);
        // xargs adds arguments: `echo hi *` covers them, `echo hi` does not.
        let r = rules(&["echo hi", "xargs *"], &[], &[]);
        assert_eq!(decide(&r, &["xargs", "echo", "hi"]), Decision::Pass);
        let r = rules(&["echo hi *", "xargs *"], &[], &[]);
        assert_eq!(decide(&r, &["xargs", "echo", "hi"]), Decision::Allow);
    }

    #[test]
    fn a_runner_named_by_a_rule_is_decided_by_it() {
        let r = rules(&["bash -lc *"], &[], &[]);
        assert_eq!(decide(&r, &["bash", "-lc", "ls"]), Decision::Allow);
        let r = rules(&["echo *"], &[], &[]);
        assert!(matches!(
            decide(&r, &["bash", "-lc", "echo"]),
            Decision::Deny { .. }
        ));
        // find without an action is not a runner.
        assert_eq!(decide(&r, &["find", ".", "-name", "x"]), Decision::Pass);
        // A command under `find -exec` is a layer: deny still sees it.
        let r = rules(&["find *"], &[], &["rm *"]);
        match decide(&r, &["find", ".", "-exec", "rm", "{}", ";"]) {
            Decision::Deny { rule, .. } => assert_eq!(rule, "commands.deny \"rm *\""),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn git_configuration_on_the_command_line_runs_commands() {
        let r = rules(&["git status", "git log *"], &[], &[]);
        for argv in [
            &["git", "-c", "core.pager=rm -rf x", "log"][..],
            &["git", "-ccore.pager=x", "log"],
            &["git", "--config-env=core.pager=X", "log"],
            &["git", "rebase", "--exec", "rm x"],
            &["git", "submodule", "foreach", "rm x"],
        ] {
            assert!(
                matches!(decide(&r, argv), Decision::Deny { .. }),
                "{argv:?}"
            );
        }
        assert_eq!(decide(&r, &["git", "log", "-p"]), Decision::Allow);
    }

    #[test]
    fn a_wrapper_that_changes_where_programs_are_found_is_not_vouched_for() {
        let r = rules(&["echo *", "env *"], &[], &["rm *"]);
        assert_eq!(decide(&r, &["env", "A=1", "echo", "hi"]), Decision::Allow);
        // `echo` is not the allowed file when PATH or the folder changes first.
        assert_eq!(
            decide(&r, &["env", "PATH=./bin", "echo", "hi"]),
            Decision::Pass
        );
        assert_eq!(
            decide(&r, &["env", "-C", "sub", "echo", "hi"]),
            Decision::Pass
        );
        // Deny still sees the name.
        assert!(matches!(
            decide(&r, &["env", "PATH=./bin", "rm", "x"]),
            Decision::Deny { .. }
        ));
        // Variables that load code make a runner, unless a rule names it.
        for var in ["LD_PRELOAD=./x.so", "BASH_ENV=./x", "GIT_SSH_COMMAND=rm"] {
            let r = rules(&["echo *", "env A=1 *"], &[], &[]);
            assert!(
                matches!(
                    decide(&r, &["env", var, "echo", "hi"]),
                    Decision::Deny { .. }
                ),
                "{var}"
            );
        }
        // Named, its command is still checked.
        let r = rules(&["env *"], &[], &["rm *"]);
        assert!(matches!(
            decide(&r, &["env", "LD_PRELOAD=x", "rm", "y"]),
            Decision::Deny { .. }
        ));
    }

    #[test]
    fn an_empty_path_entry_is_the_command_s_folder() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("echo"), "#!/bin/sh\n").unwrap();
        let r = rules(&["echo *"], &[], &[]);
        let argv = Argv {
            argv: vec!["echo".into(), "hi".into()],
            cwd: ".".into(),
        };
        // `./echo` is found first, and it is not the allowed `echo`.
        assert_eq!(
            r.decide(&argv, dir.path(), Some(":/usr/bin:/bin")),
            Decision::Pass
        );
        assert_eq!(
            r.decide(&argv, dir.path(), Some("/usr/bin:/bin")),
            Decision::Allow
        );
    }

    #[test]
    fn an_unknown_wrapper_option_makes_a_runner() {
        let r = rules(&["nice *"], &[], &["rm *"]);
        assert!(matches!(
            decide(&r, &["nice", "--frobnicate", "rm", "x"]),
            Decision::Deny { .. }
        ));
        assert!(matches!(
            decide(&r, &["nice", "-n", "5", "rm", "x"]),
            Decision::Deny { .. }
        ));
        assert!(matches!(
            decide(&r, &["nice", "-n5", "rm", "x"]),
            Decision::Deny { .. }
        ));
        assert_eq!(decide(&r, &["nice", "-n5", "ls"]), Decision::Pass);
    }
}
