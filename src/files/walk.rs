//! Walks of a folder for `fs_glob` and `fs_search`, through directory handles only: each
//! folder is opened from its parent's handle, symlinks are never followed, hidden paths are
//! skipped (and hidden folders never entered), `.gitignore` files are read through the
//! handles and obeyed, and `.git` is never entered.

use std::io::Read;
use std::ops::ControlFlow;

use cap_std::fs::Dir;
use ignore::gitignore::{Gitignore, GitignoreBuilder};

use super::jail::{Jail, Rel};

/// The deepest a walk goes below its start.
const MAX_DEPTH: usize = 64;

/// The largest `.gitignore` read; the rest of a larger one is ignored.
const MAX_GITIGNORE: u64 = 1 << 20;

/// What a walk found: a file, a folder or a symlink (never followed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

impl Kind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::File => "file",
            Kind::Dir => "dir",
            Kind::Symlink => "symlink",
            Kind::Other => "other",
        }
    }

    pub(crate) fn of(file_type: cap_std::fs::FileType) -> Kind {
        if file_type.is_symlink() {
            Kind::Symlink
        } else if file_type.is_dir() {
            Kind::Dir
        } else if file_type.is_file() {
            Kind::File
        } else {
            Kind::Other
        }
    }
}

/// One entry a walk visits: its path from the root, its kind, and the handle of its folder.
pub(crate) struct Entry<'a> {
    pub(crate) rel: &'a Rel,
    pub(crate) name: &'a str,
    pub(crate) kind: Kind,
    pub(crate) parent: &'a Dir,
}

/// The `.gitignore` files of the folders above the one being walked, each with the folder it
/// sits in (its patterns match paths relative to that folder).
struct Ignores(Vec<(Rel, Gitignore)>);

impl Ignores {
    /// Whether the deepest `.gitignore` that has a say ignores `rel`.
    fn ignores(&self, rel: &Rel, is_dir: bool) -> bool {
        for (dir, gitignore) in self.0.iter().rev() {
            let relative = if dir.is_root() {
                rel.as_str()
            } else {
                &rel.as_str()[dir.as_str().len() + 1..]
            };
            let matched = gitignore.matched(relative, is_dir);
            if matched.is_ignore() {
                return true;
            }
            if matched.is_whitelist() {
                return false;
            }
        }
        false
    }
}

/// Reads the `.gitignore` of a folder through its handle; `None` when it has none (or it is
/// not a regular file, or does not parse).
fn gitignore(dir: &Dir) -> Option<Gitignore> {
    let meta = dir.symlink_metadata(".gitignore").ok()?;
    if !meta.is_file() {
        return None;
    }
    let mut text = String::new();
    dir.open(".gitignore")
        .ok()?
        .take(MAX_GITIGNORE)
        .read_to_string(&mut text)
        .ok()?;
    let mut builder = GitignoreBuilder::new(".");
    for line in text.lines() {
        // A bad line is skipped, as git does.
        let _ = builder.add_line(None, line);
    }
    builder.build().ok()
}

/// Walks the folder `start` (already opened as `dir`), depth first in name order, calling
/// `visit` on each entry that is not hidden, not ignored and not `.git`; a folder is entered
/// when `visit` returns `Continue(true)`. The `.gitignore` files of the folders from the root
/// down to `start` count too. Folders that cannot be read are skipped.
pub(crate) fn walk(
    jail: &Jail,
    start: &Rel,
    dir: Dir,
    visit: &mut dyn FnMut(Entry<'_>) -> ControlFlow<(), bool>,
) {
    let mut ignores = Ignores(Vec::new());
    // The `.gitignore` files above `start`, read through the handles from the root down.
    if !start.is_root() {
        let mut at = Rel::root();
        let mut handle = jail.dir.try_clone().ok();
        for part in start.as_str().split('/') {
            let Some(h) = handle.take() else { break };
            if let Some(g) = gitignore(&h) {
                ignores.0.push((at.clone(), g));
            }
            handle = h.open_dir(part).ok();
            at = at.join(part);
        }
    }
    let _ = walk_in(jail, start, &dir, &mut ignores, 0, visit);
}

fn walk_in(
    jail: &Jail,
    rel: &Rel,
    dir: &Dir,
    ignores: &mut Ignores,
    depth: usize,
    visit: &mut dyn FnMut(Entry<'_>) -> ControlFlow<(), bool>,
) -> ControlFlow<()> {
    let Ok(entries) = dir.entries() else {
        return ControlFlow::Continue(());
    };
    let mut entries: Vec<(String, Kind)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let kind = Kind::of(e.file_type().ok()?);
            Some((name, kind))
        })
        .collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let pushed = match gitignore(dir) {
        Some(g) => {
            ignores.0.push((rel.clone(), g));
            true
        }
        None => false,
    };
    let mut flow = ControlFlow::Continue(());
    for (name, kind) in entries {
        if name == ".git" && kind == Kind::Dir {
            continue;
        }
        let child = rel.join(&name);
        if jail.is_hidden(child.as_str()) || ignores.ignores(&child, kind == Kind::Dir) {
            continue;
        }
        let enter = match visit(Entry {
            rel: &child,
            name: &name,
            kind,
            parent: dir,
        }) {
            ControlFlow::Break(()) => {
                flow = ControlFlow::Break(());
                break;
            }
            ControlFlow::Continue(enter) => enter,
        };
        if enter && kind == Kind::Dir && depth < MAX_DEPTH {
            // Opened from this folder's handle, without following a symlink swapped in since
            // the entry was read: cap-std refuses to leave the root either way.
            let Ok(sub) = open_dir_nofollow(dir, &name) else {
                continue;
            };
            if walk_in(jail, &child, &sub, ignores, depth + 1, visit).is_break() {
                flow = ControlFlow::Break(());
                break;
            }
        }
    }
    if pushed {
        ignores.0.pop();
    }
    flow
}

/// Opens the folder `name` of `dir`, refusing a symlink in its place.
fn open_dir_nofollow(dir: &Dir, name: &str) -> std::io::Result<Dir> {
    let sub = dir.open_dir(name)?;
    // The entry was a folder when read; if it is a symlink now, the handle may be another
    // folder of the root (never outside it): skip it, a walk does not follow symlinks.
    if dir.symlink_metadata(name)?.is_symlink() {
        return Err(std::io::Error::other("a symlink"));
    }
    Ok(sub)
}
