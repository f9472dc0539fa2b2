//! Command tools in manifests: a `[[tool]]` table with `kind = "command"` runs a program
//! (`crate::commands`) instead of a script.
//!
//! ```toml
//! [[tool]]
//! kind = "command"
//! name = "test"
//! description = "Runs the tests whose name matches a filter."
//! argv = ["cargo", "test", "--", "{filter}"]
//! cwd = "."                   # relative to the manifest's folder, the command's root
//! env_pass = ["PATH", "HOME"] # default ["PATH"]
//! env = { CARGO_TERM_COLOR = "never" }
//! timeout_ms = 120000
//! max_output_bytes = 65536
//! effect = "read"             # default "write"
//! read_paths = ["~/.cargo", "~/.rustup"] # read and executed under Landlock
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use super::ToolEntry;
use crate::tool::Tool;

/// Refuses a command tool's fields on a script tool.
pub(super) fn refuse_fields(entry: &ToolEntry) -> Result<(), String> {
    let c = entry;
    let given = [
        ("argv", c.argv.is_some()),
        ("cwd", c.cwd.is_some()),
        ("env_pass", c.env_pass.is_some()),
        ("env", c.env.is_some()),
        ("max_output_bytes", c.max_output_bytes.is_some()),
        ("read_paths", c.read_paths.is_some()),
    ];
    match given.iter().find(|(_, set)| *set) {
        Some((field, _)) => Err(format!(
            "tool `{}`: `{field}` belongs to a command tool: add `kind = \"command\"`",
            entry.name
        )),
        None => Ok(()),
    }
}

/// The command tool a `[[tool]]` table with a `kind` declares; its root is the folder of the
/// manifest `file`.
pub(super) fn build(entry: ToolEntry, file: &Path) -> Result<Tool, String> {
    let name = entry.name;
    match entry.kind.as_deref() {
        Some("command") => {}
        other => {
            return Err(format!(
                "tool `{name}`: unknown `kind` {:?}: `\"command\"` declares a command tool, and a script tool has no `kind`",
                other.unwrap_or_default()
            ))
        }
    }
    let script_only = [
        ("script", entry.script.is_some()),
        ("nested", !entry.nested.is_empty()),
        ("latency_ms", entry.latency_ms != 0),
        ("output", entry.output.is_some()),
    ];
    if let Some((field, _)) = script_only.iter().find(|(_, set)| *set) {
        return Err(format!(
            "tool `{name}`: a command tool has no `{field}` (it runs `argv`)"
        ));
    }
    let Some(argv) = entry.argv else {
        return Err(format!(
            "tool `{name}`: a command tool needs `argv`: its program and arguments, with `{{name}}` for the call's arguments"
        ));
    };
    let root = super::folder_of(file);
    build_tool(
        name,
        root,
        argv,
        Options {
            cwd: entry.cwd,
            env_pass: entry.env_pass,
            env: entry.env.unwrap_or_default(),
            timeout_ms: entry.timeout_ms,
            max_output_bytes: entry.max_output_bytes,
            read_paths: entry.read_paths.unwrap_or_default(),
            effect: entry.effect,
            description: entry.description,
            input: entry.input,
            retries: entry.retries,
            allow_repeat: entry.allow_repeat,
            approval: entry.approval,
            result: entry.result,
            speculate: entry.speculate,
        },
    )
}

/// What a command tool's table sets besides its name, root and argv.
#[cfg_attr(not(feature = "commands"), allow(dead_code))]
struct Options {
    cwd: Option<String>,
    env_pass: Option<Vec<String>>,
    env: BTreeMap<String, crate::secrets::EnvValue>,
    timeout_ms: Option<u64>,
    max_output_bytes: Option<usize>,
    read_paths: Vec<String>,
    effect: Option<crate::tool::Effect>,
    description: String,
    input: Option<serde_json::Value>,
    retries: u32,
    allow_repeat: bool,
    approval: crate::tool::Approval,
    result: crate::policy::ResultPolicy,
    speculate: Option<bool>,
}

#[cfg(feature = "commands")]
fn build_tool(name: String, root: &Path, argv: Vec<String>, o: Options) -> Result<Tool, String> {
    let mut builder = crate::commands::command_tool(&name, root, argv).description(o.description);
    if let Some(cwd) = o.cwd {
        builder = builder.cwd(cwd);
    }
    if let Some(pass) = o.env_pass {
        builder = builder.env_pass(pass);
    }
    for (k, v) in o.env {
        builder = builder.env(k, v);
    }
    if let Some(ms) = o.timeout_ms {
        builder = builder.timeout(std::time::Duration::from_millis(ms));
    }
    if let Some(bytes) = o.max_output_bytes {
        builder = builder.max_output_bytes(bytes);
    }
    for path in o.read_paths {
        builder = builder.read_beneath(expand_home(&path, root));
    }
    if let Some(effect) = o.effect {
        builder = builder.effect(effect);
    }
    if let Some(input) = o.input {
        builder = builder.input_schema(input);
    }
    let mut tool = builder.build().map_err(|e| e.to_string())?;
    // The dispatch path's settings every tool has.
    tool.spec.retries = o.retries;
    tool.spec.allow_repeat = o.allow_repeat;
    tool.spec.approval = o.approval;
    tool.spec.result = o.result;
    tool.spec.speculate = o.speculate.unwrap_or(true);
    Ok(tool)
}

#[cfg(not(feature = "commands"))]
fn build_tool(name: String, _root: &Path, _argv: Vec<String>, _o: Options) -> Result<Tool, String> {
    Err(format!(
        "tool `{name}` is a command tool: this toolscript was built without the `commands` feature"
    ))
}

/// A `read_paths` entry as a path: `~/` is the home folder, a relative path is relative to
/// the manifest's folder.
#[cfg(feature = "commands")]
fn expand_home(path: &str, root: &Path) -> std::path::PathBuf {
    match path.strip_prefix("~/") {
        Some(rest) => std::env::var_os("HOME")
            .map(|home| Path::new(&home).join(rest))
            .unwrap_or_else(|| root.join(path)),
        None => root.join(path),
    }
}

#[cfg(all(test, feature = "commands"))]
mod tests {
    use crate::error::Error;
    use crate::manifest::Manifests;
    use serde_json::json;

    fn load(dir: &std::path::Path, text: &str) -> Result<Manifests, (Option<usize>, String)> {
        let mut m = Manifests::new();
        match m.load_str(&dir.join("m.toml"), text) {
            Ok(()) => Ok(m),
            Err(Error::Manifest { line, message, .. }) => Err((line, message)),
            Err(other) => panic!("not a manifest error: {other:?}"),
        }
    }

    #[test]
    fn a_command_table_makes_a_command_tool() {
        let dir = tempfile::tempdir().unwrap();
        let m = load(
            dir.path(),
            "[[tool]]\nkind = \"command\"\nname = \"grep\"\ndescription = \"Finds.\"\nargv = [\"grep\", \"-rn\", \"--\", \"{pattern}\", \"{path}\"]\nenv = { LC_ALL = \"C\" }\ntimeout_ms = 5000\nmax_output_bytes = 100\neffect = \"read\"\n",
        )
        .unwrap();
        let tools = m.into_tools();
        let spec = tools[0].spec();
        assert_eq!(spec.name, "grep");
        assert_eq!(spec.effect, crate::tool::Effect::Read);
        assert_eq!(spec.input_schema["required"], json!(["pattern", "path"]));
        assert!(spec.guard.command.is_some());
        // A command tool defaults to `write`.
        let m = load(
            dir.path(),
            "[[tool]]\nkind = \"command\"\nname = \"t\"\nargv = [\"true\"]\n",
        )
        .unwrap();
        assert_eq!(m.into_tools()[0].spec().effect, crate::tool::Effect::Write);
    }

    #[test]
    fn a_malformed_command_table_names_its_line_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("kind = \"command\"\nname = \"t\"\n", "needs `argv`"),
            (
                "kind = \"program\"\nname = \"t\"\nargv = [\"x\"]\n",
                "unknown `kind`",
            ),
            (
                "kind = \"command\"\nname = \"t\"\nargv = [\"x\"]\nscript = \"1\"\n",
                "no `script`",
            ),
            (
                "kind = \"command\"\nname = \"t\"\nargv = []\n",
                "starts with its program",
            ),
            (
                "kind = \"command\"\nname = \"t\"\nargv = [\"x\"]\ncwd = \"..\"\n",
                "outside the root",
            ),
            (
                "kind = \"command\"\nname = \"t\"\nargv = [\"x\"]\ncolour = 1\n",
                "colour",
            ),
            (
                "name = \"t\"\neffect = \"read\"\nscript = \"1\"\nargv = [\"x\"]\n",
                "add `kind = \"command\"`",
            ),
            (
                "name = \"t\"\neffect = \"read\"\n",
                "missing field `script`",
            ),
        ];
        for (table, expected) in cases {
            let text = format!("# a comment\n[[tool]]\n{table}");
            let (line, message) = load(dir.path(), &text).map(|_| ()).unwrap_err();
            assert!(message.contains(expected), "{table}: {message}");
            // A field unknown to every tool is named at its own line; the rest at the table's.
            let expected = if expected == "colour" { 6 } else { 2 };
            assert_eq!(line, Some(expected), "{table}: {message}");
        }
    }
}
