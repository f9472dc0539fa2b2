//! `[files]` in a manifest: the built-in file tools over a folder (see `docs/files.md`).

use std::path::Path;

use serde::Deserialize;

use crate::error::Error;
use crate::tool::Tool;

/// A `[files]` table.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
// Without the `files` feature the table is parsed (its keys checked) and refused as a whole.
#[cfg_attr(not(feature = "files"), allow(dead_code))]
pub(super) struct FilesEntry {
    /// The folder the tools work in, relative to the manifest's folder (`.` by default).
    root: Option<String>,
    /// The prefix of the tools' names (`fs_` by default).
    prefix: Option<String>,
    /// The most bytes one read returns (1 MiB by default).
    max_bytes: Option<u64>,
}

/// The file tools a `[files]` table of the manifest `file` declares. `error` makes a manifest
/// error at the table's line.
#[cfg(feature = "files")]
pub(super) fn tools(
    entry: &FilesEntry,
    file: &Path,
    hidden: crate::guard::Hider,
    error: impl Fn(String) -> Error,
) -> Result<Vec<Tool>, Error> {
    let root = root_of(entry, file);
    let mut files = crate::files::Files::new(&root).hidden_shared(hidden);
    if let Some(prefix) = &entry.prefix {
        files = files.prefix(prefix.clone());
    }
    if let Some(bytes) = entry.max_bytes {
        let bytes = usize::try_from(bytes)
            .ok()
            .filter(|b| *b >= 1)
            .ok_or_else(|| error("`[files]` `max_bytes` must be at least 1".to_string()))?;
        files = files.max_bytes(bytes);
    }
    files.tools().map_err(|e| {
        error(format!(
            "`[files]` `root`: `{}` cannot be opened as a folder ({})",
            root.display(),
            match e {
                Error::Io { source, .. } => source.to_string(),
                other => other.to_string(),
            }
        ))
    })
}

/// The folder a `[files]` table of the manifest `file` names.
pub(super) fn root_of(entry: &FilesEntry, file: &Path) -> std::path::PathBuf {
    super::folder_of(file).join(entry.root.as_deref().unwrap_or("."))
}

/// Without the `files` feature, a `[files]` table is an error that says so.
#[cfg(not(feature = "files"))]
pub(super) fn tools(
    _entry: &FilesEntry,
    _file: &Path,
    _hidden: crate::guard::Hider,
    error: impl Fn(String) -> Error,
) -> Result<Vec<Tool>, Error> {
    Err(error(
        "`[files]`: this toolscript was built without the `files` feature".to_string(),
    ))
}
