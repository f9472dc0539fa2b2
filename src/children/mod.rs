//! Child processes that die with toolscript, and what a resume can know of them.
//!
//! Every process toolscript starts (MCP servers, `src/mcp/client.rs`; command tools,
//! `src/commands/`) is started in a
//! process group of its own led by a [`guard`] (Unix), which kills the whole group — the
//! server and whatever it started there (`npx` → `node`) — when toolscript dies, however it
//! dies. [`ChildGuard::start`] makes the guard and keeps the child in a list of this process's
//! live children; each non-read call's intent is journaled with a [`ProcessSnapshot`] of that
//! list. A resume that finds a call whose outcome was lost asks [`still_running`] whether the
//! call might still be running: the process that made it is gone, and any child group it
//! might have reached still has a process, or cannot be checked.
//!
//! Elsewhere than Unix there is no guard: a child is killed when its handle is dropped (as
//! tokio's `kill_on_drop` does), not when toolscript is killed, and a resume says a call to it
//! may still be running.

#[cfg(unix)]
mod guard;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::sync::lock;

/// What a non-read call might reach outside this process, as it was when the call's intent
/// was journaled: the process that made the call, and its children then.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ProcessSnapshot {
    /// The process that journaled the intent.
    pub pid: u32,
    /// When that process started (Linux: clock ticks after boot, `/proc/PID/stat`), so that
    /// another process given the same pid later is not taken for it; `None` elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<u64>,
    /// Its child processes that were running.
    #[serde(default)]
    pub children: Vec<ChildRecord>,
}

/// One child process of a [`ProcessSnapshot`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ChildRecord {
    /// What it is, for messages: `MCP server `files``.
    pub name: String,
    /// Its process group, led by its guard: every process in it dies with its parent. `None`
    /// where there is no guard (not Unix).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<u32>,
    /// Its pid (0 while it is being started).
    #[serde(default)]
    pub pid: u32,
}

/// This process's live children, by a number of their own.
static LIVE: Mutex<Vec<(u64, ChildRecord)>> = Mutex::new(Vec::new());

/// A child process's guard (on Unix) and its place in the list of live children: dropping it
/// kills the child's whole group (on Unix) and takes it off the list.
#[derive(Debug)]
pub(crate) struct ChildGuard {
    id: u64,
    #[cfg(unix)]
    guard: guard::Guard,
}

impl ChildGuard {
    /// A guard for a child about to be started, called `name` in messages: on Unix, a new
    /// process group that dies with this process; start the child in [`ChildGuard::group`],
    /// then say its pid with [`ChildGuard::started`].
    ///
    /// # Errors
    ///
    /// The guard cannot be started (no process can be forked).
    #[cfg_attr(not(any(feature = "mcp", feature = "commands")), allow(dead_code))]
    pub(crate) fn start(name: &str) -> std::io::Result<ChildGuard> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        #[cfg(unix)]
        let guard = guard::Guard::start()?;
        #[cfg(unix)]
        let group = Some(guard.group());
        #[cfg(not(unix))]
        let group = None;
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let record = ChildRecord {
            name: name.to_string(),
            group,
            pid: 0,
        };
        lock(&LIVE).push((id, record));
        Ok(ChildGuard {
            id,
            #[cfg(unix)]
            guard,
        })
    }

    /// The process group to start the child in (Unix).
    #[cfg(unix)]
    #[cfg_attr(not(any(feature = "mcp", feature = "commands")), allow(dead_code))]
    pub(crate) fn group(&self) -> u32 {
        self.guard.group()
    }

    /// Records the child's pid, once it is started.
    #[cfg_attr(not(any(feature = "mcp", feature = "commands")), allow(dead_code))]
    pub(crate) fn started(&self, pid: Option<u32>) {
        if let Some(entry) = lock(&LIVE).iter_mut().find(|(id, _)| *id == self.id) {
            entry.1.pid = pid.unwrap_or(0);
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        lock(&LIVE).retain(|(id, _)| *id != self.id);
    }
}

/// How many children of this process are live (started and not yet let go).
pub(crate) fn live() -> usize {
    lock(&LIVE).len()
}

/// This process and its live children, for a call's intent.
pub(crate) fn snapshot() -> ProcessSnapshot {
    ProcessSnapshot {
        pid: std::process::id(),
        start: own_start(),
        children: lock(&LIVE).iter().map(|(_, c)| c.clone()).collect(),
    }
}

/// When this process started, read once.
fn own_start() -> Option<u64> {
    static START: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *START.get_or_init(|| start_of(std::process::id()))
}

/// The fields of `/proc/PID/stat` after the command's closing parenthesis: state (0), parent
/// (1), process group (2), ..., start time (19).
#[cfg(target_os = "linux")]
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// When the process `pid` started, in clock ticks after boot.
#[cfg(target_os = "linux")]
fn start_of(pid: u32) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

#[cfg(not(target_os = "linux"))]
fn start_of(_pid: u32) -> Option<u64> {
    None
}

/// Whether the process that took `snapshot` still runs: the same pid and start time (only
/// where start times are known: a pid alone may be another process's now).
fn maker_alive(snapshot: &ProcessSnapshot) -> bool {
    if snapshot.pid == std::process::id() {
        return snapshot.start == own_start();
    }
    match snapshot.start {
        Some(start) => start_of(snapshot.pid) == Some(start),
        None => false,
    }
}

/// What is left of a process group.
enum Left {
    /// No process (zombies aside).
    Nothing,
    /// Running processes: their pids, where they can be listed (Linux), else none.
    Running(Vec<u32>),
    /// It cannot be checked here.
    Unknown,
}

/// What is left of the group `pgid`.
fn left_of(pgid: u32) -> Left {
    #[cfg(target_os = "linux")]
    {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Left::Unknown;
        };
        let members: Vec<u32> = entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| {
                stat_fields(pid).is_some_and(|f| {
                    f.get(2).and_then(|g| g.parse::<u32>().ok()) == Some(pgid)
                        && f.first().is_some_and(|s| s != "Z" && s != "X")
                })
            })
            .collect();
        if members.is_empty() {
            Left::Nothing
        } else {
            Left::Running(members)
        }
    }
    #[cfg(all(unix, not(target_os = "linux")))]
    {
        if guard::group_exists(pgid) {
            Left::Running(Vec::new())
        } else {
            Left::Nothing
        }
    }
    #[cfg(not(unix))]
    {
        let _ = pgid;
        Left::Unknown
    }
}

/// How long a resume waits for a dead process's child groups to end before it says a call
/// may still be running: the guards kill them as soon as their parent is gone, so only a
/// machine under heavy load, or a guard that was itself killed, makes it wait this long.
pub(crate) const GROUPS_GRACE: Duration = Duration::from_secs(3);

/// Whether a call whose intent was journaled with `snapshot` (or with none, by an earlier
/// version) and whose outcome was lost might still be running: why, or `None` when every
/// process it could have reached is known to have ended. Waits up to `grace` for the groups
/// of a process that is gone to end.
pub(crate) fn still_running(snapshot: Option<&ProcessSnapshot>, grace: Duration) -> Option<String> {
    let Some(snapshot) = snapshot else {
        return Some(
            "the call was journaled by an earlier toolscript, which did not record its child processes: an MCP server it started may still be making it".into(),
        );
    };
    // The process lives: it gave the run up only once the call had ended.
    if maker_alive(snapshot) {
        return None;
    }
    let deadline = crate::sync::deadline_after(Instant::now(), grace);
    loop {
        let mut running = Vec::new();
        for child in &snapshot.children {
            let Some(group) = child.group else {
                running.push(format!(
                    "{} (pid {}) was started where toolscript cannot make it die with it, and whether it still runs cannot be checked",
                    child.name, child.pid
                ));
                continue;
            };
            match left_of(group) {
                Left::Nothing => {}
                Left::Running(pids) => running.push(format!(
                    "{} still runs (process group {group}{})",
                    child.name,
                    if pids.is_empty() {
                        String::new()
                    } else {
                        let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
                        format!(": pids {}", pids.join(", "))
                    }
                )),
                Left::Unknown => running.push(format!(
                    "{} (process group {group}) cannot be checked",
                    child.name
                )),
            }
        }
        if running.is_empty() {
            return None;
        }
        let checkable = snapshot.children.iter().all(|c| c.group.is_some());
        if !checkable || Instant::now() >= deadline {
            return Some(format!(
                "the process that made the call (pid {}) is gone, but {}: the call may still be running; wait until it has ended (or end it) before deciding",
                snapshot.pid,
                running.join("; ")
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_of_a_process_that_lives_has_ended() {
        let snapshot = snapshot();
        assert_eq!(still_running(Some(&snapshot), Duration::ZERO), None);
    }

    #[test]
    fn without_a_snapshot_a_call_may_still_run() {
        let why = still_running(None, Duration::ZERO).unwrap();
        assert!(why.contains("earlier toolscript"), "{why}");
    }

    #[test]
    fn a_dead_process_s_calls_end_with_its_groups() {
        // A process that has exited: its pid with a start time no process has.
        let gone = |children| ProcessSnapshot {
            pid: std::process::id(),
            start: Some(u64::MAX),
            children,
        };
        assert_eq!(still_running(Some(&gone(vec![])), Duration::ZERO), None);
        let unguarded = ChildRecord {
            name: "MCP server `x`".into(),
            group: None,
            pid: 42,
        };
        let why = still_running(Some(&gone(vec![unguarded])), Duration::ZERO).unwrap();
        assert!(
            why.contains("cannot be checked") && why.contains("pid 42"),
            "{why}"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_group_with_a_live_process_may_still_be_making_the_call() {
        use std::os::unix::process::CommandExt;
        let mut sleeper = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let group = sleeper.id();
        let snapshot = ProcessSnapshot {
            pid: std::process::id(),
            start: Some(u64::MAX),
            children: vec![ChildRecord {
                name: "MCP server `slow`".into(),
                group: Some(group),
                pid: group,
            }],
        };
        let why = still_running(Some(&snapshot), Duration::ZERO).unwrap();
        assert!(
            why.contains("MCP server `slow` still runs") && why.contains(&format!("pids {group}")),
            "{why}"
        );
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
        assert_eq!(still_running(Some(&snapshot), Duration::ZERO), None);
    }

    #[cfg(unix)]
    #[test]
    fn a_dropped_guard_kills_its_group() {
        use std::os::unix::process::CommandExt;
        let guard = ChildGuard::start("test").unwrap();
        let group = guard.group();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(group as i32)
            .spawn()
            .unwrap();
        guard.started(Some(child.id()));
        assert!(snapshot()
            .children
            .iter()
            .any(|c| c.group == Some(group) && c.pid == child.id()));
        drop(guard);
        // Killed by the guard: SIGKILL, not an exit of its own.
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "{status:?}");
        assert!(!snapshot().children.iter().any(|c| c.group == Some(group)));
    }
}
