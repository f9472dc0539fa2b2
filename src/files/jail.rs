//! The jail: a directory handle that every file operation goes through, and the paths a call
//! may give it.
//!
//! Every open is relative to the root's handle and resolved beneath it (cap-std: `openat2`
//! with `RESOLVE_BENEATH` where the kernel has it, else a walk of one component at a time
//! with `O_NOFOLLOW`), so no path, symlink or folder swapped during a call reaches outside.
//! Paths are also checked as text first, so that the error says what was wrong: `..`, an
//! absolute path, `~` and NUL never reach the file system.

use std::io;
use std::sync::Arc;

use cap_std::fs::Dir;
use serde_json::Value;

use crate::error::{ErrorKind, ToolError};

/// Whether a path, relative to the root and `/`-separated, is hidden from the file tools.
pub(crate) type Hidden = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// The root's handle, the hidden predicate and the size cap of a read.
pub(crate) struct Jail {
    pub(crate) dir: Dir,
    pub(crate) hidden: Hidden,
    pub(crate) max_bytes: usize,
}

/// A path inside the root, checked as text: `/`-separated components, none of them empty,
/// `.` or `..`; the empty string is the root itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Rel(String);

impl Rel {
    /// The root.
    pub(crate) fn root() -> Rel {
        Rel(String::new())
    }

    /// The path as the file system calls take it (`.` for the root).
    pub(crate) fn fs(&self) -> &str {
        if self.0.is_empty() {
            "."
        } else {
            &self.0
        }
    }

    /// The path as results show it (empty for the root).
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// The folder holding it (`None` for the root and for a name in the root).
    pub(crate) fn parent(&self) -> Option<Rel> {
        self.0.rfind('/').map(|i| Rel(self.0[..i].to_string()))
    }

    /// This folder's entry `name`.
    pub(crate) fn join(&self, name: &str) -> Rel {
        if self.0.is_empty() {
            Rel(name.to_string())
        } else {
            Rel(format!("{}/{name}", self.0))
        }
    }
}

/// Checks a path a call gives, as text: relative, without `..`, `~` or NUL. `./a//b/` is `a/b`;
/// the empty string and `.` are the root.
///
/// # Errors
///
/// `permission_denied` for a path that would leave the root (`..`, absolute, `~`),
/// `invalid_input` for a NUL byte.
pub(crate) fn parse(path: &str) -> Result<Rel, ToolError> {
    if path.contains('\0') {
        return Err(ToolError::invalid_input(format!(
            "`{}` holds a NUL byte: no file is named so",
            path.escape_debug()
        )));
    }
    if path.starts_with('/') || path.starts_with('\\') || has_drive(path) {
        return Err(escape(
            path,
            "it is absolute; the file tools take paths relative to their root",
        ));
    }
    if path.starts_with('~') {
        return Err(escape(
            path,
            "`~` is not expanded; the file tools take paths relative to their root",
        ));
    }
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                return Err(escape(
                    path,
                    "`..` is refused anywhere in a path; name the file from the root",
                ))
            }
            _ => parts.push(part),
        }
    }
    Ok(Rel(parts.join("/")))
}

/// `C:...`: a Windows drive, absolute or relative to that drive's folder.
fn has_drive(path: &str) -> bool {
    let bytes = path.as_bytes();
    bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':'
}

/// The error of a path that would leave the root.
pub(crate) fn escape(path: &str, why: &str) -> ToolError {
    ToolError::new(
        ErrorKind::PermissionDenied,
        format!("`{path}` is outside the file tools' root: {why}"),
    )
    .with_next_action("use a path relative to the root, inside it")
}

/// A file system error, with its kind and the path as the call gave it.
pub(crate) fn io_error(path: &str, error: &io::Error) -> ToolError {
    match error.kind() {
        io::ErrorKind::NotFound => ToolError::not_found(format!("`{path}` does not exist"))
            .with_next_action("list the folder (fs_list) or glob for the file (fs_glob)"),
        io::ErrorKind::PermissionDenied => ToolError::new(
            ErrorKind::PermissionDenied,
            format!("`{path}`: refused, it leads outside the root or the system denies access ({error})"),
        )
        .with_next_action("use a path inside the root that does not go through a symlink out of it"),
        io::ErrorKind::AlreadyExists => {
            ToolError::new(ErrorKind::Conflict, format!("`{path}` already exists"))
                .with_next_action("choose another path, or delete the existing one first")
        }
        io::ErrorKind::NotADirectory => ToolError::invalid_input(format!(
            "`{path}`: a part of the path is a file, not a folder"
        )),
        io::ErrorKind::IsADirectory => ToolError::invalid_input(format!(
            "`{path}` is a folder, not a file: list it with fs_list"
        )),
        io::ErrorKind::DirectoryNotEmpty => ToolError::new(
            ErrorKind::Conflict,
            format!("`{path}` is a folder that is not empty: delete its files first"),
        ),
        io::ErrorKind::InvalidInput | io::ErrorKind::InvalidFilename => {
            ToolError::invalid_input(format!("`{path}`: {error}"))
        }
        _ => ToolError::new(ErrorKind::Failed, format!("`{path}`: {error}")),
    }
}

/// The error of a hidden path: as if it were outside.
fn hidden_error(path: &str) -> ToolError {
    ToolError::new(
        ErrorKind::PermissionDenied,
        format!("`{path}` is hidden from the file tools"),
    )
    .with_next_action("work with other files; this one is not for scripts")
}

impl Jail {
    /// Whether `rel`, or a folder holding it, is hidden.
    pub(crate) fn is_hidden(&self, rel: &str) -> bool {
        if rel.is_empty() {
            return false;
        }
        if (self.hidden)(rel) {
            return true;
        }
        rel.match_indices('/')
            .any(|(i, _)| (self.hidden)(&rel[..i]))
    }

    /// Checks a path a call gives: as text, then against the hidden predicate, both as given
    /// and as the jail resolves it (a symlink inside the root to a hidden file is hidden too).
    /// A path that does not exist yet is checked through its nearest existing folder.
    ///
    /// # Errors
    ///
    /// As [`parse`]; `permission_denied` for a hidden path.
    pub(crate) fn check(&self, path: &str) -> Result<Rel, ToolError> {
        self.check_as(path, true)
    }

    /// As [`Jail::check`], for a call on the entry itself (a symlink is deleted or moved, not
    /// what it points at): only its folder is resolved.
    pub(crate) fn check_entry(&self, path: &str) -> Result<Rel, ToolError> {
        self.check_as(path, false)
    }

    fn check_as(&self, path: &str, follow: bool) -> Result<Rel, ToolError> {
        let rel = parse(path)?;
        if self.is_hidden(rel.as_str()) {
            return Err(hidden_error(path));
        }
        let (mut probe, mut rest) = match (follow, rel.parent()) {
            (true, _) => (Some(rel.clone()), String::new()),
            (false, parent) => (
                Some(parent.unwrap_or_else(Rel::root)),
                rel.as_str()
                    .rsplit('/')
                    .next()
                    .unwrap_or_default()
                    .to_string(),
            ),
        };
        // The resolved path, through the handle: it never leaves the root. A swap after this
        // check can only point at another file inside the root; the guard's own rules and this
        // check both see names, the jail alone sees handles.
        while let Some(at) = probe {
            match self.dir.canonicalize(at.fs()) {
                Ok(resolved) => {
                    let mut resolved = resolved.to_string_lossy().replace('\\', "/");
                    if resolved == "." {
                        resolved.clear();
                    }
                    if !rest.is_empty() {
                        if !resolved.is_empty() {
                            resolved.push('/');
                        }
                        resolved.push_str(&rest);
                    }
                    if resolved != rel.as_str() && self.is_hidden(&resolved) {
                        return Err(hidden_error(path));
                    }
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound && !at.is_root() => {
                    let name = at.as_str().rsplit('/').next().unwrap_or_default();
                    rest = if rest.is_empty() {
                        name.to_string()
                    } else {
                        format!("{name}/{rest}")
                    };
                    probe = Some(at.parent().unwrap_or_else(Rel::root));
                }
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                    return Err(io_error(path, &e))
                }
                // The operation itself reports the rest (not a folder, a loop, ...).
                Err(_) => break,
            }
        }
        Ok(rel)
    }
}

/// The string argument `name` of a call, or `invalid_input`.
pub(crate) fn string_arg<'a>(args: &'a Value, name: &str) -> Result<&'a str, ToolError> {
    args.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| ToolError::invalid_input(format!("`{name}` must be a string")))
}

/// The optional string argument `name` of a call.
pub(crate) fn optional_string<'a>(
    args: &'a Value,
    name: &str,
) -> Result<Option<&'a str>, ToolError> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ToolError::invalid_input(format!(
            "`{name}` must be a string"
        ))),
    }
}

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
pub(crate) fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_checked_as_text() {
        for (given, want) in [
            ("", ""),
            (".", ""),
            ("./a//b/", "a/b"),
            ("a/./b", "a/b"),
            ("a b/c~", "a b/c~"),
            ("...", "..."),
            ("..a/b..", "..a/b.."),
        ] {
            assert_eq!(parse(given).unwrap().as_str(), want, "{given}");
        }
        for refused in [
            "..",
            "a/../b",
            "a/..",
            "/etc/passwd",
            "~",
            "~/x",
            "~root",
            "\\x",
            "C:x",
        ] {
            let e = parse(refused).unwrap_err();
            assert_eq!(e.kind, ErrorKind::PermissionDenied, "{refused}");
            assert!(e.message.contains(refused), "{}", e.message);
        }
        assert_eq!(parse("a\0b").unwrap_err().kind, ErrorKind::InvalidInput);
    }

    #[test]
    fn a_cut_ends_on_a_character() {
        assert_eq!(cut("héllo", 2), "h");
        assert_eq!(cut("héllo", 3), "hé");
        assert_eq!(cut("hi", 9), "hi");
        assert_eq!(cut("é", 0), "");
    }

    #[test]
    fn parents_and_joins() {
        let rel = parse("a/b/c").unwrap();
        assert_eq!(rel.parent().unwrap().as_str(), "a/b");
        assert_eq!(parse("a").unwrap().parent(), None);
        assert_eq!(Rel::root().join("x").join("y").as_str(), "x/y");
        assert_eq!(Rel::root().fs(), ".");
    }
}
