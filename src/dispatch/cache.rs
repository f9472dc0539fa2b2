//! The cache of reads across runs, as the dispatch path uses it: the key of a cached read's
//! call, the lookup that answers it without reaching the tool (a step after the budget's charge
//! and before the breaker), the entry a successful result leaves, and the entries an
//! invalidating call drops.
//!
//! A run sees the entries made before it started and not expired then: never one made during
//! the run (its own reads included), so that a sequential and a speculative run of one script
//! read the same entries whatever the order their calls land in. Only the drops of the run's
//! own invalidating calls change what it sees, and they land before the call returns, hence
//! before the epoch that follows it (where the scout's next reads start).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::{Call, RunContext};
use crate::json::{key_json, sha256_hex};
use crate::store::{now_us, CacheDrop, CacheEntry, MemoryCache, Store};
use crate::sync::lock;
use crate::tool::{ScopePath, ToolSpec};

/// The largest result kept, in bytes of JSON: a larger one is answered each time by its tool.
pub(crate) const MAX_ENTRY_BYTES: usize = 1 << 20;

/// The in-memory cache's size, all entries together, in bytes of JSON.
pub(crate) const MEMORY_CACHE_BYTES: usize = 64 << 20;

/// Whether a successful result may be cached: never one that holds a secret or a redacted
/// value, nor any of a tool with redaction paths.
pub(crate) fn may_cache(ctx: &RunContext, tool: &ToolSpec, value: &Value) -> bool {
    !redacts(ctx, tool) && !ctx.masks().holds(value)
}

/// Whether the tool has redaction paths: its calls are never cached.
fn redacts(ctx: &RunContext, tool: &ToolSpec) -> bool {
    ctx.registry.tool_redacts(&tool.name, None)
}

/// Where a runtime keeps its cached reads.
#[derive(Clone, Debug)]
pub(crate) enum Backend {
    /// In its store of runs.
    Store(Arc<dyn Store>),
    /// In memory, shared by the runtime's runs.
    Memory(Arc<MemoryCache>),
}

/// One run's view of the cache.
#[derive(Debug)]
pub(crate) struct RunCache {
    backend: Backend,
    /// Whether the run reads and keeps entries; without, its invalidating calls still drop
    /// theirs (`--no-cache`).
    reads: bool,
    /// When the run started, in microseconds since the Unix epoch: it sees the entries made
    /// before.
    started_us: i64,
    /// SHA-256 of each tool's definition fingerprint, by name: part of every key, so that a
    /// changed tool misses.
    prints: Arc<HashMap<String, String>>,
    /// Hits the run used.
    hits: AtomicU64,
    /// Bumped by each invalidating call: a read that started before one keeps no entry (its
    /// result may predate the change).
    generation: AtomicU64,
    /// Entries to keep in the store, written together (one transaction) at the run's end or
    /// before a drop.
    pending: Mutex<Vec<CacheEntry>>,
    /// What the run's invalidating calls dropped: no entry they name answers the run, even
    /// if the backend failed to drop it.
    dropped: Mutex<Vec<CacheDrop>>,
}

/// A cached read's call: its key and scope.
#[derive(Clone, Debug)]
pub(crate) struct Lookup {
    key: String,
    scope: String,
    /// The run's invalidation count when the call started.
    generation: u64,
}

/// A hit: the cached result and how old it is.
pub(crate) struct Hit {
    pub(crate) value: Value,
    pub(crate) age_ms: f64,
}

impl RunCache {
    /// The view of a run starting now; `no_cache`: it neither reads nor keeps entries.
    pub(crate) fn new(
        backend: Backend,
        prints: Arc<HashMap<String, String>>,
        no_cache: bool,
    ) -> RunCache {
        RunCache {
            backend,
            reads: !no_cache,
            started_us: now_us(),
            prints,
            hits: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            pending: Mutex::default(),
            dropped: Mutex::default(),
        }
    }

    /// Hits the run used so far.
    pub(crate) fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Counts `n` hits the run used.
    pub(crate) fn count_hits(&self, n: u64) {
        self.hits.fetch_add(n, Ordering::Relaxed);
    }

    /// Writes the entries the run has left so far, so that a run that ended has left them.
    pub(crate) async fn flush(&self) {
        let pending = std::mem::take(&mut *lock(&self.pending));
        if let (Backend::Store(store), false) = (&self.backend, pending.is_empty()) {
            if let Err(e) = store.cache_put(pending).await {
                tracing::warn!(error = %e, "cached reads could not be kept");
            }
        }
    }
}

/// The scope value of `spec`'s calls with `args` in the run: the values at its scope paths, as
/// canonical JSON; `None` where a path cannot be read from `args` (an argument missing).
fn scope_of(
    spec: &ToolSpec,
    args: &Value,
    context: Option<&Value>,
    strict: bool,
) -> Option<String> {
    let mut values = Vec::with_capacity(spec.cache_scope.len());
    for text in &spec.cache_scope {
        let path = ScopePath::parse(text).ok()?;
        let value = path.value_in(args, context);
        if strict && value.is_null() && matches!(path, ScopePath::Args(_)) {
            return None;
        }
        values.push(value);
    }
    Some(key_json(&Value::Array(values)))
}

/// The lookup of `call`, when its tool is cached and the run uses the cache.
pub(crate) fn lookup_of(ctx: &RunContext, spec: &ToolSpec, call: &Call) -> Option<Lookup> {
    let cache = ctx.cache.as_ref().filter(|c| c.reads)?;
    spec.cache_ttl?;
    // A call whose arguments hold a secret or a redacted value is neither looked up nor kept:
    // its key and scope would be kept beside the entry.
    if redacts(ctx, spec) || ctx.masks().holds_text(&call.args_key) {
        return None;
    }
    let context = ctx.context.as_deref();
    let scope = scope_of(spec, &call.args, context, false)?;
    let print = cache.prints.get(&spec.name).map_or("", String::as_str);
    let key = sha256_hex(format!(
        "{}\n{print}\n{}\n{scope}",
        spec.name, call.args_key
    ));
    Some(Lookup {
        key,
        scope,
        generation: cache.generation.load(Ordering::SeqCst),
    })
}

/// The entry that answers `lookup` in this run, if any. A cache that cannot be read is a miss:
/// the tool answers instead.
pub(crate) async fn find(ctx: &RunContext, lookup: &Lookup) -> Option<Hit> {
    let cache = ctx.cache.as_ref()?;
    let entry = match &cache.backend {
        Backend::Memory(memory) => memory.get(&lookup.key, cache.started_us),
        Backend::Store(store) => match store.cache_get(&lookup.key, cache.started_us).await {
            Ok(entry) => entry,
            Err(e) => {
                tracing::warn!(error = %e, "the cache could not be read: the tool answers");
                None
            }
        },
    }?;
    let dropped = lock(&cache.dropped).iter().any(|d| d.names(&entry));
    if dropped {
        return None;
    }
    Some(Hit {
        value: entry.value,
        age_ms: (now_us() - entry.created_us).max(0) as f64 / 1e3,
    })
}

/// Leaves the successful result of a read that missed for later runs, unless the run made an
/// invalidating call since the read started, or the result is too large or may not be kept.
/// An entry for the store is written with the run's others, at its end (or before a drop).
pub(crate) fn remember(ctx: &RunContext, spec: &ToolSpec, lookup: Lookup, value: &Value) {
    let (Some(cache), Some(ttl)) = (ctx.cache.as_ref(), spec.cache_ttl) else {
        return;
    };
    if cache.generation.load(Ordering::SeqCst) != lookup.generation || !may_cache(ctx, spec, value)
    {
        return;
    }
    let size = value.to_string().len();
    if size > MAX_ENTRY_BYTES {
        return;
    }
    let created_us = now_us();
    let ttl_us = i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX);
    let entry = CacheEntry::new(
        lookup.key,
        spec.name.clone(),
        lookup.scope,
        value.clone(),
        created_us,
        created_us.saturating_add(ttl_us),
    );
    match &cache.backend {
        Backend::Memory(memory) => memory.put(entry, size),
        Backend::Store(_) => lock(&cache.pending).push(entry),
    }
}

/// What a call of `spec` (not a read) with `args` drops when it completes: the entries of each
/// tool it invalidates, in the scope those tools' paths read from `args` and the run's context,
/// or all of them where `args` lacks one of the paths.
pub(crate) fn drops_of(ctx: &RunContext, spec: &ToolSpec, args: &Value) -> Vec<CacheDrop> {
    if ctx.cache.is_none() {
        return Vec::new();
    }
    let context = ctx.context.as_deref();
    spec.invalidates
        .iter()
        .filter_map(|name| ctx.registry.get(name))
        .map(|read| {
            let scope = scope_of(&read.spec, args, context, true)
                .filter(|_| !read.spec.cache_scope.is_empty());
            CacheDrop::new(read.spec.name.clone(), scope)
        })
        .collect()
}

/// Drops `drops` before the invalidating call returns, so that no later read of the run (the
/// scout's included) is answered by them.
pub(crate) async fn invalidate(ctx: &RunContext, drops: Vec<CacheDrop>) {
    if let Some(dropping) = begin_drops(ctx, drops) {
        dropping.await;
    }
}

/// [`invalidate`] for a call abandoned while its body ran (it may have taken effect): the run
/// stops reading the entries at once, and the store drops them in the background.
pub(crate) fn invalidate_abandoned(ctx: &RunContext, drops: Vec<CacheDrop>) {
    if let (Some(dropping), Ok(runtime)) = (
        begin_drops(ctx, drops),
        tokio::runtime::Handle::try_current(),
    ) {
        runtime.spawn(dropping);
    }
}

/// The drops' effect on the run (none of their entries answers it any more, none of its
/// unwritten ones is written) and on the in-memory cache, at once; the store's part as a
/// future.
fn begin_drops(
    ctx: &RunContext,
    drops: Vec<CacheDrop>,
) -> Option<futures::future::BoxFuture<'static, ()>> {
    let cache = ctx.cache.as_ref()?;
    if drops.is_empty() {
        return None;
    }
    cache.generation.fetch_add(1, Ordering::SeqCst);
    lock(&cache.dropped).extend(drops.iter().cloned());
    lock(&cache.pending).retain(|entry| !drops.iter().any(|d| d.names(entry)));
    let store = match &cache.backend {
        Backend::Memory(memory) => {
            drops.iter().for_each(|d| {
                memory.drop_entries(d);
            });
            return None;
        }
        Backend::Store(store) => Arc::clone(store),
    };
    Some(Box::pin(async move {
        if let Err(e) = store.cache_drop(drops).await {
            tracing::warn!(error = %e, "cached reads could not be dropped");
        }
    }))
}
