//! The file tools' bodies: blocking work on the jail's handle, each returning the tool's
//! result as JSON. `mod.rs` runs them off the async workers.

use std::io::{BufRead, BufReader, Read, Write};
use std::ops::ControlFlow;
use std::time::UNIX_EPOCH;

use cap_std::fs::{Dir, OpenOptions};
use serde_json::{json, Value};

use super::jail::{cut, io_error, optional_string, string_arg, Jail, Rel};
use super::walk::{walk, Kind};
use crate::error::{ErrorKind, ToolError};

/// The most entries `fs_list` returns.
pub(crate) const MAX_LIST: usize = 2_000;
/// The most paths `fs_glob` returns.
pub(crate) const MAX_GLOB: usize = 1_000;
/// The most matching lines `fs_search` returns.
pub(crate) const MAX_MATCHES: usize = 200;
/// The longest line of a match shown, in bytes (longer ones are cut).
pub(crate) const MAX_LINE: usize = 400;
/// The most entries a walk visits before it stops (and says `truncated`).
pub(crate) const MAX_VISITED: usize = 200_000;
/// Files larger than this are not searched (`skipped` counts them).
pub(crate) const MAX_SEARCH_FILE: u64 = 8 << 20;
/// The largest file `fs_edit` edits.
pub(crate) const MAX_EDIT: u64 = 64 << 20;

/// A path that must not be the root (a file to read, write or delete).
fn not_root(rel: &Rel, path: &str) -> Result<(), ToolError> {
    if rel.is_root() {
        return Err(ToolError::invalid_input(format!(
            "`{path}` is the root folder itself; name a file inside it"
        )));
    }
    Ok(())
}

/// A 1-based line number argument.
fn line_arg(args: &Value, name: &str) -> Result<Option<u64>, ToolError> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Ok(Some(n)),
            _ => Err(ToolError::invalid_input(format!(
                "`{name}` must be a line number, 1 or more"
            ))),
        },
    }
}

/// `fs_read`.
pub(crate) fn read(jail: &Jail, args: &Value) -> Result<Value, ToolError> {
    let path = string_arg(args, "path")?;
    let rel = jail.check(path)?;
    not_root(&rel, path)?;
    let start = line_arg(args, "start_line")?;
    let end = line_arg(args, "end_line")?;
    if let (Some(s), Some(e)) = (start, end) {
        if e < s {
            return Err(ToolError::invalid_input(format!(
                "`end_line` ({e}) is before `start_line` ({s})"
            )));
        }
    }
    let file = jail.dir.open(rel.fs()).map_err(|e| io_error(path, &e))?;
    let meta = file.metadata().map_err(|e| io_error(path, &e))?;
    if meta.is_dir() {
        return Err(ToolError::invalid_input(format!(
            "`{path}` is a folder, not a file: list it with fs_list"
        )));
    }
    let max = jail.max_bytes;
    let mut reader = BufReader::new(file);
    let first = start.unwrap_or(1);
    let (bytes, truncated) = if start.is_none() && end.is_none() {
        let mut bytes = Vec::new();
        (&mut reader)
            .take(max as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| io_error(path, &e))?;
        let truncated = bytes.len() > max;
        (bytes, truncated)
    } else {
        // Skip to the first line without keeping what is skipped.
        let mut line = 1;
        while line < first {
            let buf = reader.fill_buf().map_err(|e| io_error(path, &e))?;
            if buf.is_empty() {
                break;
            }
            match buf.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    reader.consume(i + 1);
                    line += 1;
                }
                None => {
                    let n = buf.len();
                    reader.consume(n);
                }
            }
        }
        let mut bytes = Vec::new();
        let mut truncated = false;
        let mut at = first;
        while end.is_none_or(|e| at <= e) {
            let before = bytes.len();
            let n = (&mut reader)
                .take((max + 1 - before) as u64)
                .read_until(b'\n', &mut bytes)
                .map_err(|e| io_error(path, &e))?;
            if n == 0 {
                break;
            }
            if bytes.len() > max {
                truncated = true;
                break;
            }
            at += 1;
        }
        (bytes, truncated)
    };
    let text = String::from_utf8_lossy(&bytes);
    let text = cut(&text, max);
    let lines = text.matches('\n').count() as u64 + u64::from(!text.ends_with('\n'));
    let lines = if text.is_empty() { 0 } else { lines };
    Ok(json!({
        "path": rel.as_str(),
        "text": text,
        "bytes": text.len(),
        "size": meta.len(),
        "truncated": truncated,
        "start_line": first,
        "end_line": first + lines - 1,
    }))
}

/// Creates the folders above `rel`, through the handle.
fn make_parents(jail: &Jail, rel: &Rel, path: &str) -> Result<(), ToolError> {
    if let Some(parent) = rel.parent() {
        jail.dir.create_dir_all(parent.fs()).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                ToolError::invalid_input(format!(
                    "`{path}`: a part of its folder is not a folder (a file, or a symlink that does not lead to a folder inside the root)"
                ))
            } else {
                io_error(path, &e)
            }
        })?;
    }
    Ok(())
}

/// `fs_write`.
pub(crate) fn write(jail: &Jail, args: &Value) -> Result<Value, ToolError> {
    let path = string_arg(args, "path")?;
    let content = string_arg(args, "content")?;
    let rel = jail.check(path)?;
    not_root(&rel, path)?;
    make_parents(jail, &rel, path)?;
    let (mut file, created) = match jail
        .dir
        .open_with(rel.fs(), OpenOptions::new().write(true).create_new(true))
    {
        Ok(file) => (file, true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => (
            jail.dir
                .open_with(rel.fs(), OpenOptions::new().write(true).truncate(true))
                .map_err(|e| io_error(path, &e))?,
            false,
        ),
        Err(e) => return Err(io_error(path, &e)),
    };
    file.write_all(content.as_bytes())
        .map_err(|e| io_error(path, &e))?;
    Ok(json!({"path": rel.as_str(), "bytes": content.len(), "created": created}))
}

/// `fs_append`.
pub(crate) fn append(jail: &Jail, args: &Value) -> Result<Value, ToolError> {
    let path = string_arg(args, "path")?;
    let content = string_arg(args, "content")?;
    let rel = jail.check(path)?;
    not_root(&rel, path)?;
    make_parents(jail, &rel, path)?;
    let mut file = jail
        .dir
        .open_with(rel.fs(), OpenOptions::new().append(true).create(true))
        .map_err(|e| io_error(path, &e))?;
    file.write_all(content.as_bytes())
        .map_err(|e| io_error(path, &e))?;
    let size = file.metadata().map_err(|e| io_error(path, &e))?.len();
    Ok(json!({"path": rel.as_str(), "bytes": content.len(), "size": size}))
}

/// Where `needle` occurs in `haystack`, overlapping occurrences counted: at most two.
fn occurrences(haystack: &[u8], needle: &[u8]) -> Vec<usize> {
    let mut found = Vec::new();
    let mut from = 0;
    while found.len() < 2 && from + needle.len() <= haystack.len() {
        match haystack[from..]
            .windows(needle.len())
            .position(|w| w == needle)
        {
            Some(i) => {
                found.push(from + i);
                from += i + 1;
            }
            None => break,
        }
    }
    found
}

/// `fs_edit`.
pub(crate) fn edit(jail: &Jail, args: &Value) -> Result<Value, ToolError> {
    let path = string_arg(args, "path")?;
    let old = string_arg(args, "old_text")?;
    let new = string_arg(args, "new_text")?;
    if old.is_empty() {
        return Err(ToolError::invalid_input(
            "`old_text` is empty: give the exact text to replace",
        ));
    }
    let rel = jail.check(path)?;
    not_root(&rel, path)?;
    let mut file = jail
        .dir
        .open_with(rel.fs(), OpenOptions::new().read(true).write(true))
        .map_err(|e| io_error(path, &e))?;
    let meta = file.metadata().map_err(|e| io_error(path, &e))?;
    if meta.is_dir() {
        return Err(ToolError::invalid_input(format!(
            "`{path}` is a folder, not a file"
        )));
    }
    if meta.len() > MAX_EDIT {
        return Err(ToolError::invalid_input(format!(
            "`{path}` is {} bytes, more than fs_edit takes ({MAX_EDIT}); write it whole with fs_write",
            meta.len()
        )));
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| io_error(path, &e))?;
    let found = occurrences(&bytes, old.as_bytes());
    let at = match found.as_slice() {
        [at] => *at,
        [] => {
            return Err(ToolError::new(
                ErrorKind::Conflict,
                format!("`old_text` does not occur in `{path}`: nothing was changed"),
            )
            .with_next_action(
                "read the file (fs_read) and copy the exact text, whitespace included",
            ))
        }
        _ => {
            return Err(ToolError::new(
                ErrorKind::Conflict,
                format!("`old_text` occurs more than once in `{path}`: nothing was changed"),
            )
            .with_next_action(
                "give more of the surrounding text in `old_text`, so that it occurs once",
            ))
        }
    };
    let mut out = Vec::with_capacity(bytes.len() - old.len() + new.len());
    out.extend_from_slice(&bytes[..at]);
    out.extend_from_slice(new.as_bytes());
    out.extend_from_slice(&bytes[at + old.len()..]);
    // Through the same handle: the file edited is the file read.
    file.set_len(0).map_err(|e| io_error(path, &e))?;
    std::io::Seek::rewind(&mut file).map_err(|e| io_error(path, &e))?;
    file.write_all(&out).map_err(|e| io_error(path, &e))?;
    let line = bytes[..at].iter().filter(|&&b| b == b'\n').count() + 1;
    Ok(json!({"path": rel.as_str(), "line": line, "size": out.len()}))
}

/// The handle of the folder `rel` (the root's own for the root).
fn open_dir(jail: &Jail, rel: &Rel, path: &str) -> Result<Dir, ToolError> {
    if rel.is_root() {
        return jail.dir.try_clone().map_err(|e| io_error(path, &e));
    }
    jail.dir.open_dir(rel.fs()).map_err(|e| io_error(path, &e))
}

/// `fs_list`.
pub(crate) fn list(jail: &Jail, args: &Value) -> Result<Value, ToolError> {
    let path = optional_string(args, "path")?.unwrap_or("");
    let rel = jail.check(path)?;
    let dir = open_dir(jail, &rel, path)?;
    let mut entries = Vec::new();
    for entry in dir.entries().map_err(|e| io_error(path, &e))? {
        let Ok(entry) = entry else { continue };
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if jail.is_hidden(rel.join(&name).as_str()) {
            continue;
        }
        let Ok(file_type) = entry.file_type() else {
            continue;
        };
        let kind = Kind::of(file_type);
        let size = match kind {
            Kind::File => entry.metadata().ok().map(|m| m.len()),
            _ => None,
        };
        entries.push((name, kind, size));
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let truncated = entries.len() > MAX_LIST;
    entries.truncate(MAX_LIST);
    let entries: Vec<Value> = entries
        .into_iter()
        .map(|(name, kind, size)| match size {
            Some(size) => json!({"name": name, "kind": kind.as_str(), "size": size}),
            None => json!({"name": name, "kind": kind.as_str()}),
        })
        .collect();
    Ok(json!({"path": rel.as_str(), "entries": entries, "truncated": truncated}))
}

/// A glob pattern's folder: its leading components without a glob character.
fn literal_prefix(pattern: &str) -> (Rel, &str) {
    let mut end = 0;
    for (i, _) in pattern.match_indices('/') {
        if pattern[..i].contains(['*', '?', '[', '{', '\\']) {
            break;
        }
        end = i;
    }
    if end == 0 {
        return (Rel::root(), pattern);
    }
    match super::jail::parse(&pattern[..end]) {
        Ok(rel) => (rel, &pattern[end + 1..]),
        Err(_) => (Rel::root(), pattern),
    }
}

fn bad_glob(pattern: &str, e: impl std::fmt::Display) -> ToolError {
    ToolError::invalid_input(format!("`{pattern}` is not a glob pattern: {e}"))
}

/// `fs_glob`.
pub(crate) fn glob(jail: &Jail, args: &Value) -> Result<Value, ToolError> {
    let pattern = string_arg(args, "pattern")?;
    // The pattern is a path too: checked as one (`..`, absolute, `~`).
    let checked = super::jail::parse(pattern)?;
    if checked.is_root() {
        return Err(ToolError::invalid_input(
            "the pattern is empty: give one such as `**/*.rs`",
        ));
    }
    let matcher = globset::GlobBuilder::new(checked.as_str())
        .literal_separator(true)
        .build()
        .map_err(|e| bad_glob(pattern, e))?
        .compile_matcher();
    let (start, _) = literal_prefix(checked.as_str());
    if jail.is_hidden(start.as_str()) {
        return Ok(json!({"pattern": pattern, "paths": [], "truncated": false}));
    }
    let dir = match open_dir(jail, &start, start.as_str()) {
        Ok(dir) => dir,
        Err(e) if e.kind == ErrorKind::NotFound || e.kind == ErrorKind::InvalidInput => {
            return Ok(json!({"pattern": pattern, "paths": [], "truncated": false}))
        }
        Err(e) => return Err(e),
    };
    let mut paths = Vec::new();
    let mut visited = 0;
    let mut truncated = false;
    walk(jail, &start, dir, &mut |entry| {
        visited += 1;
        if visited > MAX_VISITED {
            truncated = true;
            return ControlFlow::Break(());
        }
        if matcher.is_match(entry.rel.as_str()) {
            if paths.len() == MAX_GLOB {
                truncated = true;
                return ControlFlow::Break(());
            }
            paths.push(entry.rel.as_str().to_string());
        }
        ControlFlow::Continue(true)
    });
    Ok(json!({"pattern": pattern, "paths": paths, "truncated": truncated}))
}

/// `fs_stat`.
pub(crate) fn stat(jail: &Jail, args: &Value) -> Result<Value, ToolError> {
    let path = string_arg(args, "path")?;
    let rel = jail.check(path)?;
    let link = match jail.dir.symlink_metadata(rel.fs()) {
        Ok(meta) => meta.is_symlink(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(json!({"path": rel.as_str(), "exists": false}))
        }
        Err(e) => return Err(io_error(path, &e)),
    };
    let meta = match jail.dir.metadata(rel.fs()) {
        Ok(meta) => meta,
        // A symlink to nothing: it exists, as a link.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && link => {
            return Ok(
                json!({"path": rel.as_str(), "exists": true, "kind": "symlink", "symlink": true}),
            )
        }
        Err(e) => return Err(io_error(path, &e)),
    };
    let kind = if meta.is_dir() {
        Kind::Dir
    } else if meta.is_file() {
        Kind::File
    } else {
        Kind::Other
    };
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.into_std().duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs());
    Ok(json!({
        "path": rel.as_str(),
        "exists": true,
        "kind": kind.as_str(),
        "size": meta.len(),
        "modified": modified,
        "readonly": meta.permissions().readonly(),
        "symlink": link,
    }))
}

/// `fs_search`.
pub(crate) fn search(jail: &Jail, args: &Value) -> Result<Value, ToolError> {
    let pattern = string_arg(args, "pattern")?;
    let path = optional_string(args, "path")?.unwrap_or("");
    let filter = optional_string(args, "glob")?;
    let regex = regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| ToolError::invalid_input(format!("`pattern` is not a regex: {e}")))?;
    let filter = match filter {
        Some(g) => {
            let on_name = !g.contains('/');
            let glob = globset::GlobBuilder::new(g)
                .literal_separator(true)
                .build()
                .map_err(|e| bad_glob(g, e))?
                .compile_matcher();
            Some((glob, on_name))
        }
        None => None,
    };
    let rel = jail.check(path)?;
    let mut search = Search {
        regex: &regex,
        matches: Vec::new(),
        files: 0,
        skipped: 0,
        truncated: false,
    };
    // One file: searched whatever the filter says.
    let meta = jail
        .dir
        .metadata(rel.fs())
        .map_err(|e| io_error(path, &e))?;
    if !meta.is_dir() {
        let file = jail.dir.open(rel.fs()).map_err(|e| io_error(path, &e))?;
        search.file(rel.as_str(), file, meta.len());
    } else {
        let dir = open_dir(jail, &rel, path)?;
        let mut visited = 0;
        walk(jail, &rel, dir, &mut |entry| {
            visited += 1;
            if visited > MAX_VISITED {
                search.truncated = true;
                return ControlFlow::Break(());
            }
            if entry.kind != Kind::File {
                return ControlFlow::Continue(true);
            }
            if let Some((glob, on_name)) = &filter {
                let subject = if *on_name {
                    entry.name
                } else {
                    entry.rel.as_str()
                };
                if !glob.is_match(subject) {
                    return ControlFlow::Continue(false);
                }
            }
            let Ok(file) = entry.parent.open(entry.name) else {
                return ControlFlow::Continue(false);
            };
            let size = file.metadata().map(|m| m.len()).unwrap_or(0);
            search.file(entry.rel.as_str(), file, size);
            if search.truncated {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(false)
            }
        });
    }
    Ok(json!({
        "pattern": pattern,
        "matches": search.matches,
        "files_searched": search.files,
        "files_skipped": search.skipped,
        "truncated": search.truncated,
    }))
}

/// A search's running state.
struct Search<'a> {
    regex: &'a regex::Regex,
    matches: Vec<Value>,
    files: usize,
    /// Files not searched: too large, or binary (a NUL byte in their first 8 KiB).
    skipped: usize,
    truncated: bool,
}

impl Search<'_> {
    fn file(&mut self, rel: &str, file: cap_std::fs::File, size: u64) {
        if size > MAX_SEARCH_FILE {
            self.skipped += 1;
            return;
        }
        let mut reader = BufReader::new(file.take(MAX_SEARCH_FILE));
        match reader.fill_buf() {
            Ok(head) if head[..head.len().min(8192)].contains(&0) => {
                self.skipped += 1;
                return;
            }
            Ok(_) => {}
            Err(_) => {
                self.skipped += 1;
                return;
            }
        }
        self.files += 1;
        let mut line = Vec::new();
        let mut number = 0u64;
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            number += 1;
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end_matches(['\n', '\r']);
            if self.regex.is_match(text) {
                if self.matches.len() == MAX_MATCHES {
                    self.truncated = true;
                    return;
                }
                self.matches.push(json!({
                    "path": rel,
                    "line": number,
                    "text": cut(text, MAX_LINE),
                }));
            }
        }
    }
}

/// `fs_delete`.
pub(crate) fn delete(jail: &Jail, args: &Value) -> Result<Value, ToolError> {
    let path = string_arg(args, "path")?;
    let rel = jail.check_entry(path)?;
    not_root(&rel, path)?;
    // The entry itself, not what a symlink points at: a link is removed, never its target.
    let meta = match jail.dir.symlink_metadata(rel.fs()) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(json!({"path": rel.as_str(), "deleted": false}))
        }
        Err(e) => return Err(io_error(path, &e)),
    };
    let done = if meta.is_dir() {
        jail.dir.remove_dir(rel.fs())
    } else {
        jail.dir.remove_file(rel.fs())
    };
    match done {
        Ok(()) => Ok(json!({"path": rel.as_str(), "deleted": true})),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Ok(json!({"path": rel.as_str(), "deleted": false}))
        }
        Err(e) => Err(io_error(path, &e)),
    }
}

/// `fs_move`.
pub(crate) fn rename(jail: &Jail, args: &Value) -> Result<Value, ToolError> {
    let source = string_arg(args, "source")?;
    let destination = string_arg(args, "destination")?;
    let from = jail.check_entry(source)?;
    let to = jail.check_entry(destination)?;
    not_root(&from, source)?;
    not_root(&to, destination)?;
    if to.as_str().starts_with(&format!("{}/", from.as_str())) {
        return Err(ToolError::invalid_input(format!(
            "`{destination}` is inside `{source}`: a folder cannot move into itself"
        )));
    }
    jail.dir
        .symlink_metadata(from.fs())
        .map_err(|e| io_error(source, &e))?;
    match jail.dir.symlink_metadata(to.fs()) {
        Ok(_) => {
            return Err(ToolError::new(
                ErrorKind::Conflict,
                format!("`{destination}` already exists: nothing was moved"),
            )
            .with_next_action("delete it first (fs_delete), or choose another destination"))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error(destination, &e)),
    }
    make_parents(jail, &to, destination)?;
    jail.dir
        .rename(from.fs(), &jail.dir, to.fs())
        .map_err(|e| io_error(&format!("{source}` -> `{destination}"), &e))?;
    Ok(json!({"source": from.as_str(), "destination": to.as_str()}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn occurrences_count_overlaps() {
        assert_eq!(occurrences(b"aaa", b"aa"), [0, 1]);
        assert_eq!(occurrences(b"abc", b"b"), [1]);
        assert!(occurrences(b"abc", b"x").is_empty());
        assert!(occurrences(b"a", b"abc").is_empty());
        assert_eq!(occurrences(b"xbxbxb", b"b").len(), 2);
    }

    #[test]
    fn a_glob_walks_from_its_literal_folder() {
        assert_eq!(literal_prefix("src/files/*.rs").0.as_str(), "src/files");
        assert_eq!(literal_prefix("src/**/x.rs").0.as_str(), "src");
        assert_eq!(literal_prefix("**/*.rs").0.as_str(), "");
        assert_eq!(literal_prefix("*.rs").0.as_str(), "");
        assert_eq!(literal_prefix("a/b").0.as_str(), "a");
        assert_eq!(literal_prefix("a[/]b/c").0.as_str(), "");
    }
}
