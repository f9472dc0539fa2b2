//! Path rules: which files a call may name. A name is checked as written and as it resolves
//! inside the root (every symbolic link on its way followed, each one checked), so a link
//! inside the root to a forbidden file is denied as the file itself is.

use std::path::{Component, Path, PathBuf};

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use super::{Access, Decision};

/// The files no call may name, whatever the other rules say: version control's folder, keys,
/// environment files and credentials.
pub const DEFAULT_FORBIDDEN: &[&str] = &[
    ".git/**",
    "**/.env*",
    "**/*.pem",
    "**/*.key",
    "**/id_rsa*",
    "**/secrets/**",
    "**/.npmrc",
    "**/.yarnrc",
    "**/*.crt",
];

/// Links followed in one name before it is refused (a loop, or a chain built to tire the
/// guard).
const MAX_LINKS: usize = 40;

/// A list of globs with the text of each, to name the one that matched.
#[derive(Clone, Debug)]
pub(crate) struct Globs {
    set: GlobSet,
    texts: Vec<String>,
}

impl Globs {
    /// Compiles `globs`; `fold` matches without regard to case (deny lists: a variant in case
    /// of a denied name is denied too, whatever the file system does with case).
    pub(crate) fn new(globs: &[String], fold: bool) -> Result<Globs, String> {
        let mut set = GlobSetBuilder::new();
        for g in globs {
            let glob = GlobBuilder::new(g)
                .literal_separator(true)
                .case_insensitive(fold)
                .backslash_escape(true)
                .build()
                .map_err(|e| format!("the glob {g:?} is not valid: {e}"))?;
            set.add(glob);
        }
        Ok(Globs {
            set: set
                .build()
                .map_err(|e| format!("the globs could not be compiled: {e}"))?,
            texts: globs.to_vec(),
        })
    }

    /// The first glob that matches `path`.
    pub(crate) fn first(&self, path: &str) -> Option<&str> {
        self.set
            .matches(path)
            .into_iter()
            .min()
            .map(|i| self.texts[i].as_str())
    }

    /// The first glob that matches `path`, one of its folders, or anything inside it (a
    /// folder holding only denied files is denied: its listing would name them).
    pub(crate) fn covering(&self, path: &str) -> Option<&str> {
        let mut at = path;
        loop {
            if let Some(g) = self.first(at).or_else(|| self.first(&format!("{at}/_"))) {
                return Some(g);
            }
            match at.rfind('/') {
                Some(i) => at = &at[..i],
                None => return None,
            }
        }
    }

    pub(crate) fn texts(&self) -> &[String] {
        &self.texts
    }
}

/// Allow and deny globs for one kind of access.
#[derive(Clone, Debug)]
pub(crate) struct AccessRules {
    allow: Globs,
    deny: Globs,
}

impl AccessRules {
    pub(crate) fn new(allow: &[String], deny: &[String]) -> Result<AccessRules, String> {
        Ok(AccessRules {
            allow: Globs::new(allow, false)?,
            deny: Globs::new(deny, true)?,
        })
    }
}

/// The path rules of a guard.
#[derive(Clone, Debug)]
pub(crate) struct PathRules {
    /// The jail, absolute and with its links resolved.
    pub(crate) root: PathBuf,
    pub(crate) forbidden: Globs,
    pub(crate) read: AccessRules,
    pub(crate) write: AccessRules,
}

impl PathRules {
    /// Whether a call may `access` the file named `name`: [`Decision::Deny`] naming the rule,
    /// or [`Decision::Pass`].
    pub(crate) fn check(&self, name: &str, access: Access) -> Decision {
        let deny = |rule: String, why: String| Decision::Deny {
            rule,
            reason: format!("{name:?}: {why}"),
        };
        let names = match self.resolve(name) {
            Ok(names) => names,
            Err(why) => return deny("root".to_string(), why),
        };
        let (rules, kind) = match access {
            Access::Read => (&self.read, "read"),
            Access::Write => (&self.write, "write"),
        };
        for seen in &names {
            if let Some(g) = self.forbidden.covering(seen) {
                return deny(format!("forbidden {g:?}"), format!("{seen} is forbidden"));
            }
            if let Some(g) = rules.deny.covering(seen) {
                return deny(format!("{kind}.deny {g:?}"), format!("{seen} is denied"));
            }
        }
        for seen in &names {
            if rules.allow.first(seen).is_none() {
                return deny(
                    format!("{kind}.allow"),
                    format!(
                        "{seen} is under none of {kind}.allow {:?}",
                        rules.allow.texts
                    ),
                );
            }
        }
        Decision::Pass
    }

    /// The names `name` goes by inside the root: as written (made relative and normalised),
    /// then as each link on its way resolves. An error when any of them is outside the root.
    pub(crate) fn resolve(&self, name: &str) -> Result<Vec<String>, String> {
        if name.contains('\0') {
            return Err("a name holds a NUL byte".to_string());
        }
        if name.starts_with('~') {
            return Err("`~` is not expanded: name files relative to the root".to_string());
        }
        if name.is_empty() {
            return Err("the name is empty".to_string());
        }
        let path = Path::new(name);
        let relative = if path.is_absolute() {
            path.strip_prefix(&self.root)
                .map_err(|_| format!("outside the root {}", self.root.display()))?
        } else {
            path
        };
        let mut parts = normalise(relative)
            .ok_or_else(|| format!("it climbs out of the root {}", self.root.display()))?;
        let mut names = vec![parts.join("/")];
        // Follow the links on the way, from the root down.
        let mut links = 0;
        let mut i = 0;
        while i < parts.len() {
            let here: PathBuf = parts[..=i].iter().fold(self.root.clone(), |p, c| p.join(c));
            let Ok(meta) = std::fs::symlink_metadata(&here) else {
                break;
            };
            if !meta.file_type().is_symlink() {
                i += 1;
                continue;
            }
            links += 1;
            if links > MAX_LINKS {
                return Err(format!("more than {MAX_LINKS} links on its way"));
            }
            let target = std::fs::read_link(&here)
                .map_err(|e| format!("the link {} cannot be read: {e}", parts[..=i].join("/")))?;
            let base: Vec<String> = if target.is_absolute() {
                let inside = target.strip_prefix(&self.root).map_err(|_| {
                    format!(
                        "the link {} leads outside the root, to {}",
                        parts[..=i].join("/"),
                        target.display()
                    )
                })?;
                normalise(inside).ok_or("a link climbs out of the root")?
            } else {
                let mut joined: PathBuf = parts[..i].iter().collect();
                joined.push(&target);
                normalise(&joined).ok_or_else(|| {
                    format!(
                        "the link {} leads outside the root, to {}",
                        parts[..=i].join("/"),
                        target.display()
                    )
                })?
            };
            let mut next = base;
            next.extend_from_slice(&parts[i + 1..]);
            parts = next;
            names.push(parts.join("/"));
            i = 0;
        }
        for n in &mut names {
            if n.is_empty() {
                ".".clone_into(n);
            }
        }
        Ok(names)
    }
}

/// The components of a relative path with `.` and `..` applied; `None` when `..` climbs out.
fn normalise(path: &Path) -> Option<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(s) => out.push(s.to_string_lossy().into_owned()),
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop()?;
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(root: &Path) -> PathRules {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        PathRules {
            root: root.canonicalize().unwrap(),
            forbidden: Globs::new(&s(DEFAULT_FORBIDDEN), true).unwrap(),
            read: AccessRules::new(&s(&["**"]), &[]).unwrap(),
            write: AccessRules::new(&s(&["src/**", "out/**"]), &s(&["**/*.lock"])).unwrap(),
        }
    }

    fn denied_by(d: Decision) -> String {
        match d {
            Decision::Deny { rule, .. } => rule,
            other => panic!("not denied: {other:?}"),
        }
    }

    #[test]
    fn escapes_are_denied_before_any_rule() {
        let dir = tempfile::tempdir().unwrap();
        let r = rules(dir.path());
        for name in [
            "../x",
            "src/../../x",
            "/etc/passwd",
            "~/x",
            "~root/x",
            "a\0b",
            "/proc/self/root/etc/passwd",
            "",
        ] {
            assert_eq!(denied_by(r.check(name, Access::Read)), "root", "{name:?}");
        }
        let inside = format!("{}/src/a.rs", r.root.display());
        assert_eq!(r.check(&inside, Access::Write), Decision::Pass);
        assert_eq!(r.check("src/./b/../a.rs", Access::Write), Decision::Pass);
    }

    #[test]
    fn forbidden_names_are_denied_in_any_case_and_through_links() {
        let dir = tempfile::tempdir().unwrap();
        let r = rules(dir.path());
        for name in [
            ".env",
            "a/.env.local",
            ".ENV",
            "A/.Env",
            ".git",
            ".git/config",
            "x/Secrets/k",
            "k.PEM",
        ] {
            assert!(
                denied_by(r.check(name, Access::Read)).starts_with("forbidden"),
                "{name}"
            );
        }
        std::fs::write(dir.path().join(".env"), "S=1").unwrap();
        std::fs::create_dir(dir.path().join("src")).unwrap();
        std::os::unix::fs::symlink("../.env", dir.path().join("src/config")).unwrap();
        std::os::unix::fs::symlink(dir.path().join(".git"), dir.path().join("g")).unwrap();
        assert_eq!(
            denied_by(r.check("src/config", Access::Read)),
            "forbidden \"**/.env*\""
        );
        assert_eq!(
            denied_by(r.check("g/config", Access::Read)),
            "forbidden \".git/**\""
        );
        std::os::unix::fs::symlink("/etc", dir.path().join("etc")).unwrap();
        assert_eq!(denied_by(r.check("etc/passwd", Access::Read)), "root");
        std::os::unix::fs::symlink("loop", dir.path().join("loop")).unwrap();
        assert_eq!(denied_by(r.check("loop/x", Access::Read)), "root");
    }

    #[test]
    fn writes_go_only_where_write_allows_and_deny_wins() {
        let dir = tempfile::tempdir().unwrap();
        let r = rules(dir.path());
        assert_eq!(r.check("src/main.rs", Access::Write), Decision::Pass);
        assert_eq!(r.check("README.md", Access::Read), Decision::Pass);
        assert_eq!(
            denied_by(r.check("README.md", Access::Write)),
            "write.allow"
        );
        assert_eq!(
            denied_by(r.check("src/Cargo.LOCK", Access::Write)),
            "write.deny \"**/*.lock\""
        );
    }
}
