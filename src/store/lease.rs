//! Who owns a running run: a **lease**, never a process id.
//!
//! A run that runs is held by one owner (a random id per process, with its host's name for
//! messages) until its lease expires. The owner renews it at a third of its time to live while
//! the run is live, and lets it go when the run ends or pauses. Each take-over of a run (a
//! resume) adds one to the run's **fencing token** (a new run has token 1), and every write of
//! the run's journal and status carries the token it was taken with: the store refuses one
//! whose token is older than the run's, so that an owner that stalled (stopped, paused, cut
//! off) and lost its run never writes again. Nothing here reads `/proc` or a process id: a run
//! is live while its lease is, on any platform, from any machine that shares the store.

use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use super::{now_ms, Journal, Store};
use crate::error::Error;

/// The lease's time to live when none is set.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// The environment variable that sets the lease's time to live, in seconds, when no
/// `--lease-s` is given.
pub const LEASE_ENV: &str = "TOOLSCRIPT_LEASE_S";

/// The shortest lease (a renewal every third of it must stay possible).
const MIN_LEASE: Duration = Duration::from_millis(100);

/// A run's lease, as the store holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lease {
    /// The owner's id: random, one per process.
    pub owner: String,
    /// The owner's host name, for messages.
    pub host: String,
    /// The fencing token: 1 when the run was created, one more with each take-over.
    pub token: u64,
    /// When the lease expires, in milliseconds since the Unix epoch, unless renewed.
    pub expires_ms: i64,
    /// When the owner took the run (created it, or took it over).
    pub since_ms: i64,
}

impl Lease {
    /// A lease of `claim`'s owner with `token`, from `since_ms` to `expires_ms`.
    pub fn new(claim: &Claim, token: u64, since_ms: i64, expires_ms: i64) -> Lease {
        Lease {
            owner: claim.owner.clone(),
            host: claim.host.clone(),
            token,
            expires_ms,
            since_ms,
        }
    }

    /// Whether the lease still holds at `now_ms`.
    pub fn live_at(&self, now_ms: i64) -> bool {
        self.expires_ms > now_ms
    }

    /// Whether the lease still holds now.
    pub fn is_live(&self) -> bool {
        self.live_at(now_ms())
    }

    /// The owner as messages show it: `OWNER on HOST`.
    pub fn holder(&self) -> String {
        format!("{} on {}", self.owner, self.host)
    }

    /// What this lease's writes carry.
    pub fn fence(&self) -> Fence {
        Fence {
            owner: self.owner.clone(),
            token: self.token,
        }
    }
}

/// A running run's lease as a list of runs shows it (`toolscript runs --json`, MCP's
/// `list_runs`): who holds it, its fencing token, when it expires, and whether it still holds
/// (a run whose lease has expired is resumed by the next `resume`).
#[derive(
    Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[non_exhaustive]
pub struct LeaseListing {
    /// The owner's id (random, one per process).
    pub owner: String,
    /// The owner's host.
    pub host: String,
    /// The fencing token.
    pub token: u64,
    /// When the lease expires unless renewed, as a UTC date and time.
    pub expires: String,
    /// Whether it still holds: `false` means its owner stopped renewing it (it died, or
    /// stalled), and a resume takes the run.
    pub live: bool,
}

impl LeaseListing {
    /// The listing of a running run's `lease`.
    pub fn of(lease: &Lease) -> LeaseListing {
        LeaseListing {
            owner: lease.owner.clone(),
            host: lease.host.clone(),
            token: lease.token,
            expires: super::record::utc(lease.expires_ms),
            live: lease.is_live(),
        }
    }
}

/// Who creates or takes a run: an owner id and its host.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Claim {
    /// The owner's id.
    pub owner: String,
    /// The owner's host name.
    pub host: String,
    /// A live lease this same owner holds is taken anyway: the owner knows it no longer runs
    /// the run (its run was dropped before its end was recorded).
    pub retake_own: bool,
}

impl Claim {
    /// A claim of `owner` on `host`.
    pub fn new(owner: impl Into<String>, host: impl Into<String>) -> Claim {
        Claim {
            owner: owner.into(),
            host: host.into(),
            retake_own: false,
        }
    }

    /// This process's claim: its random owner id and its host's name.
    pub fn this_process() -> Claim {
        let (owner, host) = this_owner();
        Claim::new(owner.clone(), host.clone())
    }

    /// The claim, taking a live lease that the same owner holds.
    pub fn retaking_own(mut self) -> Claim {
        self.retake_own = true;
        self
    }
}

/// What a write of a run carries: the lease's owner and fencing token. The store refuses the
/// write when the run was taken with a newer token since.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Fence {
    /// The owner that writes.
    pub owner: String,
    /// The token it took the run with.
    pub token: u64,
}

impl Fence {
    /// The fence of `owner`'s lease with `token`.
    pub fn new(owner: impl Into<String>, token: u64) -> Fence {
        Fence {
            owner: owner.into(),
            token,
        }
    }
}

/// This process's owner id (random, made once) and host name.
pub(crate) fn this_owner() -> &'static (String, String) {
    static OWNER: OnceLock<(String, String)> = OnceLock::new();
    OWNER.get_or_init(|| {
        let mut bytes = [0u8; 8];
        let id = match getrandom::fill(&mut bytes) {
            Ok(()) => bytes.iter().map(|b| format!("{b:02x}")).collect(),
            // No randomness: the clock, which two processes share only by bad luck.
            Err(_) => crate::json::sha256_hex(format!("{:?}", std::time::SystemTime::now()))[..16]
                .to_string(),
        };
        (id, host_name())
    })
}

/// The host's name, for messages: `$HOSTNAME`, else `/etc/hostname`, else `unknown host`.
fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown host".into())
}

/// A lease's time to live from seconds as a person wrote them (`30`, `0.5`).
///
/// # Errors
///
/// Says what is accepted, for text that is not a number of seconds from 0.1 to a day.
pub fn parse_lease_s(text: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "the lease's time to live `{text}` is not a number of seconds from 0.1 to 86400 (fractions allowed: 0.5)"
        )
    };
    let secs: f64 = text.trim().parse().map_err(|_| bad())?;
    if !secs.is_finite() || !(MIN_LEASE.as_secs_f64()..=86_400.0).contains(&secs) {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The lease's time to live `--lease-s` gives, else `$TOOLSCRIPT_LEASE_S`, else the default.
///
/// # Errors
///
/// As [`parse_lease_s`], naming where the bad value came from.
pub fn lease_from(flag: Option<&str>) -> Result<Duration, String> {
    if let Some(text) = flag {
        return parse_lease_s(text).map_err(|e| format!("--lease-s: {e}"));
    }
    match std::env::var(LEASE_ENV) {
        Ok(text) if !text.trim().is_empty() => {
            parse_lease_s(&text).map_err(|e| format!("${LEASE_ENV}: {e}"))
        }
        _ => Ok(DEFAULT_LEASE),
    }
}

/// Why a write of a run was refused: a newer owner took the run. The message says who and
/// when, and that this process stops.
pub(crate) fn taken_over(run_id: &str, now: &Lease, mine: u64) -> String {
    format!(
        "the run {} was taken over by {} at {} (its fencing token is now {}, this process holds {mine}); this process stops: it makes no further non-read call or write of the run",
        super::shown_run_id(run_id),
        now.holder(),
        super::record::utc(now.since_ms),
        now.token,
    )
}

/// Keeps a run's lease while the run is live: renews it every third of its time to live, in
/// a task of its own, until the journal is dropped or [`Journal::release`] stops it. A
/// renewal refused because the run was taken over fails the journal, so that the run makes
/// no further call; one that fails otherwise (the store is busy) is tried again at the next
/// turn, and the lease holds meanwhile.
pub(crate) fn keep(journal: &Arc<Journal>, store: Arc<dyn Store>) -> tokio::task::JoinHandle<()> {
    let every = (store.lease_ttl() / 3).max(Duration::from_millis(10));
    let weak: Weak<Journal> = Arc::downgrade(journal);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let Some(journal) = weak.upgrade() else {
                return;
            };
            let Some(fence) = journal.fence().cloned() else {
                return;
            };
            match store.renew_lease(journal.run_id(), &fence).await {
                Ok(Renewed::Kept(_)) => {}
                Ok(Renewed::Released) => return,
                Ok(Renewed::TakenOver(now)) => {
                    let why = taken_over(journal.run_id(), &now, fence.token);
                    tracing::error!(run_id = %journal.run_id(), "{why}");
                    journal.fail(why);
                    return;
                }
                Err(e) => {
                    tracing::warn!(run_id = %journal.run_id(), error = %e.report(), "the run's lease could not be renewed; trying again");
                }
            }
        }
    })
}

/// What a renewal found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Renewed {
    /// The lease is renewed: this is it now.
    Kept(Lease),
    /// The run is no longer running under this token's owner, which let it go (it ended or
    /// paused): there is nothing to renew.
    Released,
    /// A newer owner took the run: this is its lease.
    TakenOver(Lease),
}

/// An error for a write refused by the fence.
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
pub(crate) fn fenced(location: &str, run_id: &str, now: &Lease, mine: u64) -> Error {
    Error::store(location, taken_over(run_id, now, mine), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_seconds_parse_with_fractions_and_refuse_the_rest() {
        assert_eq!(parse_lease_s("0.5").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_lease_s(" 30 ").unwrap(), Duration::from_secs(30));
        for bad in ["", "x", "-1", "0", "0.01", "NaN", "inf", "1e9"] {
            let e = parse_lease_s(bad).unwrap_err();
            assert!(e.contains("seconds from 0.1 to 86400"), "{bad}: {e}");
        }
        assert!(lease_from(Some("nope"))
            .unwrap_err()
            .starts_with("--lease-s:"));
    }

    #[test]
    fn an_owner_is_random_and_stable_within_the_process() {
        let (a, host) = this_owner();
        assert_eq!(a.len(), 16);
        assert!(!host.is_empty());
        assert_eq!(this_owner().0, *a);
        let claim = Claim::this_process();
        assert_eq!(&claim.owner, a);
        assert!(!claim.retake_own && claim.retaking_own().retake_own);
    }

    #[test]
    fn a_lease_is_live_until_it_expires() {
        let lease = Lease::new(&Claim::new("o", "h"), 3, 0, 1000);
        assert!(lease.live_at(999) && !lease.live_at(1000));
        assert_eq!(lease.fence(), Fence::new("o", 3));
        assert_eq!(lease.holder(), "o on h");
        let why = taken_over("r1", &lease, 2);
        assert!(
            why.contains("taken over by o on h at 1970-01-01T00:00:00Z"),
            "{why}"
        );
        assert!(why.contains("this process stops"), "{why}");
    }
}
