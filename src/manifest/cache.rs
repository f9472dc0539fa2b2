//! The cache settings of a manifest: `cache_ttl_s`, `cache_scope` and `invalidates` on a
//! `[[tool]]`, and per-tool tables on an `[[mcp]]` server
//! (`cache = { get_rate = { ttl_s = 60, scope = "args.account" } }`,
//! `invalidates = { set_rate = ["get_rate"] }`). What the settings may say (a cache on a read
//! only, scope paths its input schema can have, `invalidates` naming tools that exist) is the
//! registry's rule, reported with the manifest's file and line.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::mcp::McpServerSpec;
use crate::tool::ToolSpec;

/// A scope: one path, or a list of them.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum Scope {
    One(String),
    Many(Vec<String>),
}

impl Scope {
    fn paths(self) -> Vec<String> {
        match self {
            Scope::One(path) => vec![path],
            Scope::Many(paths) => paths,
        }
    }
}

/// One tool's table under an `[[mcp]]` server's `cache`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CacheTable {
    ttl_s: f64,
    scope: Option<Scope>,
}

/// A TTL in seconds as a duration: positive and finite, or what to write instead.
fn ttl(seconds: f64, what: &str) -> Result<Duration, String> {
    if seconds.is_finite() && seconds > 0.0 && seconds < 1e12 {
        Ok(Duration::from_secs_f64(seconds))
    } else {
        Err(format!(
            "{what} must be a number of seconds greater than zero (it is {seconds})"
        ))
    }
}

/// Sets a `[[tool]]`'s cache settings on its spec.
pub(super) fn apply_to_tool(
    spec: &mut ToolSpec,
    ttl_s: Option<f64>,
    scope: Option<Scope>,
    invalidates: Vec<String>,
) -> Result<(), String> {
    if let Some(seconds) = ttl_s {
        spec.cache_ttl = Some(ttl(
            seconds,
            &format!("tool `{}`: `cache_ttl_s`", spec.name),
        )?);
    }
    spec.cache_scope = scope.map(Scope::paths).unwrap_or_default();
    spec.invalidates = invalidates;
    Ok(())
}

/// Sets an `[[mcp]]` server's cache tables on its spec, by the server's tool names.
pub(super) fn apply_to_server(
    spec: &mut McpServerSpec,
    cache: BTreeMap<String, CacheTable>,
    invalidates: BTreeMap<String, Vec<String>>,
) -> Result<(), String> {
    for (tool, table) in cache {
        let ttl = ttl(table.ttl_s, &format!("`cache` of `{tool}`: `ttl_s`"))?;
        spec.cache_ttl.insert(tool.clone(), ttl);
        if let Some(scope) = table.scope {
            spec.cache_scope.insert(tool, scope.paths());
        }
    }
    spec.invalidates = invalidates;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_are_positive_finite_seconds() {
        assert_eq!(ttl(1.5, "x").unwrap(), Duration::from_millis(1500));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e13] {
            let e = ttl(bad, "`cache_ttl_s`").unwrap_err();
            assert!(e.contains("greater than zero"), "{bad}: {e}");
        }
    }
}
