//! Landlock rulesets for command tools (Linux): a program may read and write beneath its
//! root, read and execute the system's folders, and use a few devices; nothing else of the
//! file system. Where the kernel has no Landlock, no ruleset is made and the command runs
//! unconfined.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use landlock::{
    path_beneath_rules, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, ABI,
};

/// Folders a program needs to start and run, read and executed (not written).
const SYSTEM: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
    "/nix/store",
    "/proc",
    "/sys",
];

/// Devices a program may read and write.
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

/// The newest Landlock ABI asked for; an older kernel enforces what it has (best effort).
const ABI_WANTED: ABI = ABI::V5;

/// A ruleset for a program confined to `root`, with `read` folders besides the system's;
/// `Ok(None)` where this kernel has no Landlock.
///
/// # Errors
///
/// The ruleset cannot be made or a rule added (a folder that cannot be opened).
pub(super) fn ruleset(root: &Path, read: &[PathBuf]) -> Result<Option<OwnedFd>, String> {
    let all = AccessFs::from_all(ABI_WANTED);
    let read_access = AccessFs::from_read(ABI_WANTED);
    let existing = |paths: Vec<PathBuf>| -> Vec<PathBuf> {
        paths.into_iter().filter(|p| p.exists()).collect()
    };
    let system = existing(
        SYSTEM
            .iter()
            .map(PathBuf::from)
            .chain(read.iter().cloned())
            .collect(),
    );
    let devices = existing(DEVICES.iter().map(PathBuf::from).collect());
    let error = |e: landlock::RulesetError| format!("the Landlock ruleset cannot be made: {e}");
    let created = Ruleset::default()
        .handle_access(all)
        .map_err(error)?
        .create()
        .map_err(error)?
        .add_rules(path_beneath_rules([root], all))
        .map_err(error)?
        .add_rules(path_beneath_rules(system, read_access))
        .map_err(error)?
        .add_rules(path_beneath_rules(devices, AccessFs::from_file(ABI_WANTED)))
        .map_err(error)?;
    Ok(created.into())
}

/// Whether this kernel enforces Landlock: a ruleset can be made.
pub(super) fn available() -> bool {
    Ruleset::default()
        .handle_access(AccessFs::from_all(ABI::V1))
        .and_then(|r| r.create())
        .ok()
        .and_then(Option::<OwnedFd>::from)
        .is_some()
}
