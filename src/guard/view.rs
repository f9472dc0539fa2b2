//! How the guard reads a call: which of a tool's arguments name files, and which command line
//! a call starts. A tool declares it in its spec ([`GuardView`]); the guard derives the paths
//! and the argv from each call's arguments, before the call reaches its tool.

use serde_json::Value;

/// What a call does with a file it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Access {
    /// Reads it (or lists it): checked against the `read` rules.
    Read,
    /// Creates, changes, moves or deletes it: checked against the `write` rules.
    Write,
}

/// An argument of a tool that names a file: a string, or an array of strings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathArg {
    /// The argument's name, a top-level field of the call's arguments.
    pub arg: String,
    /// What the tool does with the file.
    pub access: Access,
}

impl PathArg {
    /// The argument `arg` names a file the tool reads.
    pub fn read(arg: impl Into<String>) -> PathArg {
        PathArg {
            arg: arg.into(),
            access: Access::Read,
        }
    }

    /// The argument `arg` names a file the tool writes.
    pub fn write(arg: impl Into<String>) -> PathArg {
        PathArg {
            arg: arg.into(),
            access: Access::Write,
        }
    }
}

/// The command line a call of a tool starts.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CommandLine {
    /// A template: each element is one argument; `{name}` in it is replaced by the call's
    /// argument `name` (a string, number or boolean), never split and never seen by a shell.
    /// A value that starts with `-` is refused unless its placeholder comes after a `--`.
    Template {
        /// The argv, with placeholders.
        argv: Vec<String>,
        /// The folder it runs in, relative to the guard's root (`.` when `None`).
        cwd: Option<String>,
    },
    /// The argv is the call's argument `argv` (an array of strings); the folder its argument
    /// `cwd`, when given.
    Given,
}

/// A call's command line as the guard sees it: the argv and the folder it runs in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Argv {
    /// The program and its arguments, as the program receives them.
    pub argv: Vec<String>,
    /// The folder it runs in, relative to the guard's root.
    pub cwd: String,
}

impl CommandLine {
    /// The argv a call with `args` runs; an error names what is wrong with the arguments.
    pub fn argv(&self, args: &Value) -> Result<Argv, String> {
        match self {
            CommandLine::Template { argv, cwd } => {
                let mut out = Vec::with_capacity(argv.len());
                let mut after_dashes = false;
                for part in argv {
                    out.push(expand(part, args, after_dashes)?);
                    after_dashes |= part == "--";
                }
                Ok(Argv {
                    argv: out,
                    cwd: cwd.clone().unwrap_or_else(|| ".".to_string()),
                })
            }
            CommandLine::Given => {
                let argv = args
                    .get("argv")
                    .and_then(Value::as_array)
                    .ok_or("`argv` must be an array of strings")?;
                let argv = argv
                    .iter()
                    .map(|a| a.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
                    .ok_or("`argv` must be an array of strings")?;
                if argv.is_empty() {
                    return Err("`argv` is empty: it starts with the program".to_string());
                }
                let cwd = match args.get("cwd") {
                    None | Some(Value::Null) => ".".to_string(),
                    Some(Value::String(c)) => c.clone(),
                    Some(_) => return Err("`cwd` must be a string".to_string()),
                };
                Ok(Argv { argv, cwd })
            }
        }
    }
}

/// One element of a template with its placeholders replaced.
fn expand(part: &str, args: &Value, after_dashes: bool) -> Result<String, String> {
    let mut out = String::with_capacity(part.len());
    let mut rest = part;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        out.push_str(&rest[..open]);
        let name = &rest[open + 1..open + close];
        let value = match args.get(name) {
            Some(Value::String(s)) => s.clone(),
            Some(v @ (Value::Number(_) | Value::Bool(_))) => v.to_string(),
            Some(_) => return Err(format!("`{name}` must be a string, number or boolean")),
            None => return Err(format!("`{name}` is missing: the command line needs it")),
        };
        if open == 0 && out.is_empty() && value.starts_with('-') && !after_dashes {
            return Err(format!(
                "`{name}` starts with `-` and would be read as an option; the template takes it only after a `--`"
            ));
        }
        if value.contains('\0') {
            return Err(format!("`{name}` holds a NUL byte"));
        }
        out.push_str(&value);
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// How the guard reads a tool's calls. Empty for a tool that names no file and starts no
/// program: only its name, effect and arguments are seen.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GuardView {
    /// The arguments that name files.
    pub paths: Vec<PathArg>,
    /// The command line a call starts, for a tool that starts a program.
    pub command: Option<CommandLine>,
}

impl GuardView {
    /// The files a call with `args` names, with what it does to each: every string of each
    /// declared argument (an argument that is absent names nothing; one that is not a string
    /// or an array of strings is an error).
    pub fn paths(&self, args: &Value) -> Result<Vec<(String, Access)>, String> {
        let mut out = Vec::new();
        for p in &self.paths {
            match args.get(&p.arg) {
                None | Some(Value::Null) => {}
                Some(Value::String(s)) => out.push((s.clone(), p.access)),
                Some(Value::Array(items)) => {
                    for item in items {
                        let s = item.as_str().ok_or_else(|| {
                            format!("`{}` names files: each must be a string", p.arg)
                        })?;
                        out.push((s.to_string(), p.access));
                    }
                }
                Some(_) => {
                    return Err(format!(
                        "`{}` names a file: it must be a string or an array of strings",
                        p.arg
                    ))
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_template_takes_each_value_as_one_argument() {
        let line = CommandLine::Template {
            argv: vec!["cargo".into(), "test".into(), "{filter}".into()],
            cwd: None,
        };
        let argv = line.argv(&json!({"filter": "; rm -rf /"})).unwrap();
        assert_eq!(argv.argv, ["cargo", "test", "; rm -rf /"]);
        assert_eq!(argv.cwd, ".");
        let err = line.argv(&json!({"filter": "--release"})).unwrap_err();
        assert!(err.contains("starts with `-`"), "{err}");
        let after = CommandLine::Template {
            argv: vec!["git".into(), "log".into(), "--".into(), "{path}".into()],
            cwd: None,
        };
        assert_eq!(
            after.argv(&json!({"path": "-x"})).unwrap().argv,
            ["git", "log", "--", "-x"]
        );
        assert!(line.argv(&json!({})).unwrap_err().contains("missing"));
    }

    #[test]
    fn paths_are_every_string_of_the_declared_arguments() {
        let view = GuardView {
            paths: vec![PathArg::read("path"), PathArg::write("to")],
            command: None,
        };
        let paths = view.paths(&json!({"path": ["a", "b"], "to": "c"})).unwrap();
        assert_eq!(
            paths,
            [
                ("a".to_string(), Access::Read),
                ("b".to_string(), Access::Read),
                ("c".to_string(), Access::Write)
            ]
        );
        assert!(view.paths(&json!({"path": 3})).is_err());
        assert!(view.paths(&json!({})).unwrap().is_empty());
    }
}
