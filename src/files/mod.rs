//! The built-in file tools (`fs_read`, `fs_write`, `fs_edit`, `fs_list`, `fs_glob`,
//! `fs_search`, ...) over one folder, the root, in a jail that no path or symlink leaves.
//!
//! Every open goes through the root's directory handle and is resolved beneath it; walks open
//! each folder from its parent's handle. There is no check of a name followed by an open of
//! that name: a symlink or folder swapped during a call can only lead to another file of the
//! root, and anything that would resolve outside fails with `permission_denied`. See
//! `docs/files.md`.

mod jail;
mod ops;
mod walk;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};

use crate::error::{Error, ToolError};
use crate::guard::PathArg;
use crate::tool::{Effect, RegistryBuilder, Tool};
use jail::{Hidden, Jail};

/// The default prefix of the file tools' names.
pub const DEFAULT_PREFIX: &str = "fs_";

/// The default cap of one `fs_read`, in bytes: 1 MiB.
pub const DEFAULT_MAX_BYTES: usize = 1 << 20;

/// The file tools over one folder. Build the tools with [`Files::tools`], or add them to a
/// registry with [`RegistryBuilder::files`].
///
/// # Examples
///
/// ```
/// # fn main() -> Result<(), toolscript::Error> {
/// use toolscript::{files::Files, Registry};
/// let dir = std::env::temp_dir();
/// let registry = Registry::builder()
///     .files(Files::new(&dir).prefix("repo_").hidden(|path: &str| path.ends_with(".env")))
///     .build()?;
/// assert!(registry.specs().any(|s| s.name == "repo_read"));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
#[must_use]
pub struct Files {
    /// The folder the tools work in: nothing outside it is reachable.
    root: PathBuf,
    /// Put before each tool's name (`fs_` gives `fs_read`).
    prefix: String,
    /// The most bytes one `fs_read` returns.
    max_bytes: usize,
    /// Paths the tools never show nor touch.
    hidden: Hidden,
}

impl std::fmt::Debug for Files {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Files")
            .field("root", &self.root)
            .field("prefix", &self.prefix)
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

impl Files {
    /// The file tools over `root`, named `fs_...`, reading at most 1 MiB a call, hiding
    /// nothing. The folder is opened when the tools are built.
    pub fn new(root: impl Into<PathBuf>) -> Files {
        Files {
            root: root.into(),
            prefix: DEFAULT_PREFIX.to_string(),
            max_bytes: DEFAULT_MAX_BYTES,
            hidden: Arc::new(|_: &str| false),
        }
    }

    /// Sets the prefix of the tools' names (`fs_` by default; may be empty).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Files {
        self.prefix = prefix.into();
        self
    }

    /// Sets the most bytes one `fs_read` returns (the rest is cut, and `truncated` is true).
    pub fn max_bytes(mut self, bytes: usize) -> Files {
        self.max_bytes = bytes;
        self
    }

    /// Hides paths from the tools: given a path relative to the root (`/`-separated, no
    /// leading `./`), returns whether it is hidden. Listing, globbing and searching never show
    /// a hidden path nor enter a hidden folder; a call that names one (or a symlink to one, or
    /// a path inside a hidden folder) fails with `permission_denied`.
    pub fn hidden(mut self, hidden: impl Fn(&str) -> bool + Send + Sync + 'static) -> Files {
        self.hidden = Arc::new(hidden);
        self
    }

    /// As [`Files::hidden`], with a shared predicate.
    pub fn hidden_shared(mut self, hidden: Arc<dyn Fn(&str) -> bool + Send + Sync>) -> Files {
        self.hidden = hidden;
        self
    }

    /// The root folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The tools, over a handle of the root opened now: the jail is the folder as it is at
    /// this moment, even if its path is later given to another folder.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the root cannot be opened as a folder.
    pub fn tools(&self) -> Result<Vec<Tool>, Error> {
        let dir = cap_std::fs::Dir::open_ambient_dir(&self.root, cap_std::ambient_authority())
            .map_err(|source| Error::Io {
                path: self.root.clone(),
                source,
            })?;
        let jail = Arc::new(Jail {
            dir,
            hidden: Arc::clone(&self.hidden),
            max_bytes: self.max_bytes,
        });
        Ok(SPECS.iter().map(|spec| self.tool(spec, &jail)).collect())
    }

    fn tool(&self, spec: &Spec, jail: &Arc<Jail>) -> Tool {
        let description = spec
            .description
            .replace("{max}", &self.max_bytes.to_string());
        let jail = Arc::clone(jail);
        let op = spec.op;
        Tool::builder(format!("{}{}", self.prefix, spec.name), spec.effect)
            .description(description)
            .input_schema(spec.schema())
            .paths(spec.paths.iter().map(|(arg, access)| match access {
                Access::Read => PathArg::read(*arg),
                Access::Write => PathArg::write(*arg),
            }))
            .handler(move |args: Value| {
                let jail = Arc::clone(&jail);
                async move {
                    // File work blocks: it runs on tokio's blocking threads, never on the
                    // workers that drive the run.
                    tokio::task::spawn_blocking(move || op(&jail, &args))
                        .await
                        .map_err(|e| {
                            ToolError::internal(format!("the file operation failed: {e}"))
                        })?
                }
            })
    }
}

impl RegistryBuilder {
    /// Adds the file tools of `files` (`fs_read`, `fs_write`, ...; see `docs/files.md`).
    /// A name they share with another tool is a registry error, as any duplicate name.
    ///
    /// When the root cannot be opened, [`RegistryBuilder::build`] fails with [`Error::Io`].
    pub fn files(self, files: Files) -> Self {
        match files.tools() {
            Ok(tools) => self.tools(tools),
            Err(error) => self.fail(error),
        }
    }
}

/// What a tool does with a file it names (the guard's [`crate::guard::Access`], in a table).
#[derive(Clone, Copy)]
enum Access {
    Read,
    Write,
}

/// One file tool: its name without the prefix, effect, arguments and body.
struct Spec {
    name: &'static str,
    effect: Effect,
    description: &'static str,
    /// The arguments: name, JSON Schema, whether required.
    args: &'static [(&'static str, &'static str, bool)],
    /// The arguments that name files.
    paths: &'static [(&'static str, Access)],
    op: fn(&Jail, &Value) -> Result<Value, ToolError>,
}

impl Spec {
    fn schema(&self) -> Value {
        let mut properties = serde_json::Map::new();
        let mut required = Vec::new();
        for (name, schema, needed) in self.args {
            let (kind, description) = schema.split_once(':').unwrap_or((schema, ""));
            let mut property = match kind {
                "line" => json!({"type": "integer", "minimum": 1}),
                _ => json!({"type": "string"}),
            };
            property["description"] = Value::String(description.trim().to_string());
            properties.insert((*name).to_string(), property);
            if *needed {
                required.push(*name);
            }
        }
        json!({
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": false,
        })
    }
}

const PATH: (&str, &str, bool) = (
    "path",
    "string: a path relative to the root, `/`-separated (no `..`, not absolute)",
    true,
);
const CONTENT: (&str, &str, bool) = ("content", "string: the text to write", true);

/// The file tools, in the order the catalog shows them.
const SPECS: &[Spec] = &[
    Spec {
        name: "read",
        effect: Effect::Read,
        description: "Reads a text file under the root. Returns #{path, text, bytes, size, truncated, start_line, end_line}: `text` holds at most {max} bytes (then `truncated` is true), `bytes` its length, `size` the file's; `start_line`/`end_line` the lines `text` covers (1-based, inclusive). Give `start_line`/`end_line` to read only those lines. Bytes that are not UTF-8 read as U+FFFD.",
        args: &[
            PATH,
            ("start_line", "line: the first line to read, from 1", false),
            ("end_line", "line: the last line to read, inclusive", false),
        ],
        paths: &[("path", Access::Read)],
        op: ops::read,
    },
    Spec {
        name: "write",
        effect: Effect::Idempotent,
        description: "Writes a file under the root, replacing its content; creates it and its missing parent folders. Returns #{path, bytes, created}.",
        args: &[PATH, CONTENT],
        paths: &[("path", Access::Write)],
        op: ops::write,
    },
    Spec {
        name: "append",
        effect: Effect::Write,
        description: "Appends text to a file under the root; creates it and its missing parent folders. Returns #{path, bytes, size}: the bytes appended and the file's size after.",
        args: &[PATH, ("content", "string: the text to append", true)],
        paths: &[("path", Access::Write)],
        op: ops::append,
    },
    Spec {
        name: "edit",
        effect: Effect::Write,
        description: "Replaces the text `old_text` by `new_text` in a file under the root. `old_text` must occur exactly once (overlaps counted), else the call fails with kind `conflict` and changes nothing. Returns #{path, line, size}: the line where `old_text` began and the file's new size.",
        args: &[
            PATH,
            (
                "old_text",
                "string: the exact text to replace, whitespace included",
                true,
            ),
            ("new_text", "string: the text to put in its place", true),
        ],
        paths: &[("path", Access::Write)],
        op: ops::edit,
    },
    Spec {
        name: "list",
        effect: Effect::Read,
        description: "Lists a folder under the root (the root when `path` is absent or \"\"). Returns #{path, entries, truncated}: entries sorted by name, each #{name, kind, size?} with kind \"file\", \"dir\", \"symlink\" or \"other\" and size for files; at most 2000.",
        args: &[(
            "path",
            "string: the folder, relative to the root; the root when absent",
            false,
        )],
        paths: &[("path", Access::Read)],
        op: ops::list,
    },
    Spec {
        name: "glob",
        effect: Effect::Read,
        description: "Finds paths under the root matching a glob (`*` and `?` stay within one folder, `**` crosses folders, `{a,b}` and `[..]` work): `src/**/*.rs`, `*.md`. Skips what `.gitignore` files ignore, `.git`, and symlinked folders. Returns #{pattern, paths, truncated}: sorted paths from the root, at most 1000.",
        args: &[(
            "pattern",
            "string: the glob, relative to the root, such as `src/**/*.rs`",
            true,
        )],
        paths: &[],
        op: ops::glob,
    },
    Spec {
        name: "stat",
        effect: Effect::Read,
        description: "Tells whether a path under the root exists and what it is. Returns #{path, exists} and, when it exists, #{kind, size, modified, readonly, symlink}: kind \"file\", \"dir\" or \"other\" (of the target, for a symlink), modified in seconds since 1970.",
        args: &[PATH],
        paths: &[("path", Access::Read)],
        op: ops::stat,
    },
    Spec {
        name: "search",
        effect: Effect::Read,
        description: "Searches files under the root for lines matching a regex (Rust syntax; `(?i)` for any case). `path` narrows it to a folder or one file; `glob` to files whose name (or, with a `/`, whose path) matches. Skips what `.gitignore` files ignore, `.git`, binary files and files over 8 MiB. Returns #{pattern, matches, files_searched, files_skipped, truncated}: at most 200 matches, each #{path, line, text} (text cut at 400 bytes).",
        args: &[
            ("pattern", "string: a regex matched against each line", true),
            (
                "path",
                "string: the folder or file to search, relative to the root; the root when absent",
                false,
            ),
            ("glob", "string: only files matching this glob, such as `*.rs`", false),
        ],
        paths: &[("path", Access::Read)],
        op: ops::search,
    },
    Spec {
        name: "delete",
        effect: Effect::Idempotent,
        description: "Deletes a file, a symlink (never its target) or an empty folder under the root. Returns #{path, deleted}: deleted is false when nothing was there.",
        args: &[PATH],
        paths: &[("path", Access::Write)],
        op: ops::delete,
    },
    Spec {
        name: "move",
        effect: Effect::Write,
        description: "Moves or renames a file or folder under the root; creates the destination's missing parent folders. Fails with kind `conflict` when the destination exists. Returns #{source, destination}.",
        args: &[
            ("source", "string: the path to move, relative to the root", true),
            (
                "destination",
                "string: its new path, relative to the root",
                true,
            ),
        ],
        paths: &[("source", Access::Write), ("destination", Access::Write)],
        op: ops::rename,
    },
];

#[cfg(test)]
mod tests;
