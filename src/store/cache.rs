//! Cached reads as the store keeps them, and the in-memory cache a runtime without a store
//! keeps instead (shared by the runs of one process, so `serve` shares it across runs).
//!
//! An entry is found by its key alone (the dispatch path makes it from the tool, its
//! definition, the canonical arguments and the scope value), and dropped by tool and scope.
//! Times are microseconds since the Unix epoch: a run sees the entries made before it started,
//! and never one made by itself.

use std::collections::{BTreeSet, HashMap};

use serde_json::Value;

use crate::sync::lock;

/// One cached result of a read.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct CacheEntry {
    /// SHA-256 of what identifies the call: tool, definition, arguments and scope value.
    pub key: String,
    /// The tool's name: what an invalidating call drops by.
    pub tool: String,
    /// The scope value's canonical JSON: what an invalidating call drops in.
    pub scope: String,
    /// The result.
    pub value: Value,
    /// When it was made, in microseconds since the Unix epoch.
    pub created_us: i64,
    /// When it stops answering, in microseconds since the Unix epoch.
    pub expires_us: i64,
}

impl CacheEntry {
    /// An entry of `tool`'s result `value` under `key`, in `scope`, made at `created_us`.
    pub fn new(
        key: String,
        tool: String,
        scope: String,
        value: Value,
        created_us: i64,
        expires_us: i64,
    ) -> CacheEntry {
        CacheEntry {
            key,
            tool,
            scope,
            value,
            created_us,
            expires_us,
        }
    }

    /// Whether a run that started at `at_us` may use it: made before that, and not expired
    /// then.
    pub fn answers_at(&self, at_us: i64) -> bool {
        self.created_us < at_us && at_us < self.expires_us
    }
}

/// What an invalidating call drops: the entries of `tool`, in `scope` when it is known (`None`
/// drops them all).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheDrop {
    /// The cached read's name.
    pub tool: String,
    /// The scope value's canonical JSON.
    pub scope: Option<String>,
}

impl CacheDrop {
    /// Drops `tool`'s entries in `scope` (all of them with `None`).
    pub fn new(tool: String, scope: Option<String>) -> CacheDrop {
        CacheDrop { tool, scope }
    }

    /// Whether this drop takes `entry`.
    pub fn names(&self, entry: &CacheEntry) -> bool {
        self.tool == entry.tool && self.scope.as_ref().is_none_or(|s| *s == entry.scope)
    }
}

/// Microseconds since the Unix epoch.
pub(crate) fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// The in-memory cache: bounded by its total size in bytes of JSON, the oldest entries going
/// first when a new one does not fit; expired entries go whenever one is added.
#[derive(Debug)]
pub(crate) struct MemoryCache {
    entries: std::sync::Mutex<Entries>,
    max_bytes: usize,
}

#[derive(Debug, Default)]
struct Entries {
    by_key: HashMap<String, (CacheEntry, usize)>,
    /// The keys by age, oldest first: what a full cache gives up.
    by_age: BTreeSet<(i64, String)>,
    bytes: usize,
}

impl Entries {
    fn remove(&mut self, key: &str) {
        if let Some((entry, size)) = self.by_key.remove(key) {
            self.by_age.remove(&(entry.created_us, entry.key));
            self.bytes -= size;
        }
    }
}

impl MemoryCache {
    /// A cache of at most `max_bytes` of results.
    pub(crate) fn new(max_bytes: usize) -> MemoryCache {
        MemoryCache {
            entries: std::sync::Mutex::default(),
            max_bytes,
        }
    }

    /// The entry under `key` that a run started at `at_us` may use.
    pub(crate) fn get(&self, key: &str, at_us: i64) -> Option<CacheEntry> {
        let entries = lock(&self.entries);
        let (entry, _) = entries.by_key.get(key)?;
        entry.answers_at(at_us).then(|| entry.clone())
    }

    /// Keeps `entry` (of `size` bytes), replacing one under the same key; expired entries go
    /// first, then the oldest, until it fits. One larger than the whole cache is not kept.
    pub(crate) fn put(&self, entry: CacheEntry, size: usize) {
        if size > self.max_bytes {
            return;
        }
        let mut entries = lock(&self.entries);
        entries.remove(&entry.key);
        if entries.bytes + size > self.max_bytes {
            let now = now_us();
            let expired: Vec<String> = entries
                .by_key
                .values()
                .filter(|(e, _)| e.expires_us <= now)
                .map(|(e, _)| e.key.clone())
                .collect();
            for key in expired {
                entries.remove(&key);
            }
        }
        while entries.bytes + size > self.max_bytes {
            let Some((_, oldest)) = entries.by_age.first().cloned() else {
                break;
            };
            entries.remove(&oldest);
        }
        entries.bytes += size;
        entries.by_age.insert((entry.created_us, entry.key.clone()));
        entries.by_key.insert(entry.key.clone(), (entry, size));
    }

    /// Drops what `drop` names; how many entries went.
    pub(crate) fn drop_entries(&self, drop: &CacheDrop) -> u64 {
        let mut entries = lock(&self.entries);
        let named: Vec<String> = entries
            .by_key
            .values()
            .filter(|(e, _)| drop.names(e))
            .map(|(e, _)| e.key.clone())
            .collect();
        for key in &named {
            entries.remove(key);
        }
        named.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(key: &str, tool: &str, scope: &str, created: i64) -> CacheEntry {
        CacheEntry::new(
            key.into(),
            tool.into(),
            scope.into(),
            json!(1),
            created,
            i64::MAX,
        )
    }

    #[test]
    fn an_entry_answers_runs_started_after_it_and_before_it_expires() {
        let e = CacheEntry::new("k".into(), "t".into(), "null".into(), json!(1), 10, 20);
        assert!(
            !e.answers_at(10),
            "a run never sees an entry of its own start"
        );
        assert!(e.answers_at(11));
        assert!(e.answers_at(19));
        assert!(!e.answers_at(20));
    }

    #[test]
    fn the_memory_cache_is_bounded_and_drops_the_oldest_first() {
        let cache = MemoryCache::new(10);
        cache.put(entry("a", "t", "s", 1), 4);
        cache.put(entry("b", "t", "s", 2), 4);
        cache.put(entry("c", "t", "s", 3), 4);
        assert!(cache.get("a", 100).is_none(), "the oldest went");
        assert!(cache.get("b", 100).is_some());
        assert!(cache.get("c", 100).is_some());
        cache.put(entry("huge", "t", "s", 4), 11);
        assert!(
            cache.get("huge", 100).is_none(),
            "larger than the cache: not kept"
        );
        assert!(cache.get("b", 100).is_some());
    }

    #[test]
    fn expired_entries_go_before_live_ones_and_a_replaced_entry_is_counted_once() {
        let cache = MemoryCache::new(10);
        let mut expired = entry("old", "t", "s", 1);
        expired.expires_us = 2;
        cache.put(entry("live", "t", "s", 0), 4);
        cache.put(expired, 4);
        cache.put(entry("new", "t", "s", 3), 4);
        assert!(
            cache.get("live", 100).is_some(),
            "the expired entry went first"
        );
        assert!(cache.get("new", 100).is_some());
        // Replacing an entry frees its old size.
        for _ in 0..5 {
            cache.put(entry("new", "t", "s", 4), 4);
        }
        assert!(cache.get("live", 100).is_some());
    }

    #[test]
    fn drops_are_by_tool_and_scope() {
        let cache = MemoryCache::new(1000);
        cache.put(entry("a", "rate", "\"x\"", 1), 1);
        cache.put(entry("b", "rate", "\"y\"", 1), 1);
        cache.put(entry("c", "other", "\"x\"", 1), 1);
        let n = cache.drop_entries(&CacheDrop::new("rate".into(), Some("\"x\"".into())));
        assert_eq!(n, 1);
        assert!(cache.get("a", 100).is_none());
        assert!(cache.get("b", 100).is_some());
        assert!(cache.get("c", 100).is_some());
        assert_eq!(cache.drop_entries(&CacheDrop::new("rate".into(), None)), 1);
        assert!(cache.get("b", 100).is_none());
    }
}
