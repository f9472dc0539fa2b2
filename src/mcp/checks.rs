//! The `Host` and `Origin` checks of `serve --http` (against DNS rebinding), made before a
//! request reaches rmcp, so that a refusal costs no session place and no body read, and so that
//! a flood of refused requests is logged at most once a second. rmcp makes the same checks
//! again, with the same lists; these match what it matches (a name with any port, or a
//! `name:port`; an origin's scheme, host and port, `:*` for any port).

use hyper::header::{HeaderMap, HOST, ORIGIN};
use hyper::Uri;

/// A host and port, as compared: the host lowercase and without IPv6 brackets.
#[derive(Debug, PartialEq, Eq)]
struct Authority {
    host: String,
    port: Option<u16>,
}

fn authority(text: &str) -> Option<Authority> {
    let parsed: hyper::http::uri::Authority = text.trim().parse().ok()?;
    if parsed.as_str().contains('@') {
        return None;
    }
    Some(Authority {
        host: parsed.host().trim_matches(['[', ']']).to_ascii_lowercase(),
        port: parsed.port_u16(),
    })
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Two `Host` headers or more.
    TwoHosts,
    /// No `Host`, or one that is not an authority.
    BadHost,
    /// A `Host` not on the list.
    ForeignHost,
    /// An `Origin` that is not on the list, or not an origin.
    ForeignOrigin,
}

impl Refusal {
    /// The HTTP status and the text of the answer.
    pub(crate) fn answer(self) -> (u16, &'static str) {
        match self {
            Refusal::TwoHosts => (400, "bad request: more than one Host header\n"),
            Refusal::BadHost => (400, "bad request: a missing or malformed Host header\n"),
            Refusal::ForeignHost => (
                403,
                "forbidden: this Host is not allowed (the server accepts loopback names, its \
                 address, and the names given with --allow-host)\n",
            ),
            Refusal::ForeignOrigin => (
                403,
                "forbidden: this Origin is not allowed (the server accepts loopback origins, its \
                 address, and the origins given with --allow-origin)\n",
            ),
        }
    }
}

/// Checks a request's `Host` against `hosts` (entries `name` or `name:port`) and its `Origin`,
/// if it has one, against `origins` (entries `scheme://host:port`, `scheme://host:*`, `null`).
pub(crate) fn check(
    uri: &Uri,
    headers: &HeaderMap,
    hosts: &[String],
    origins: &[String],
) -> Result<(), Refusal> {
    let mut all = headers.get_all(HOST).iter();
    let host = match (all.next(), all.next()) {
        (Some(_), Some(_)) => return Err(Refusal::TwoHosts),
        (Some(host), None) => host.to_str().ok().and_then(authority),
        (None, _) => uri.authority().and_then(|a| authority(a.as_str())),
    }
    .ok_or(Refusal::BadHost)?;
    if !hosts.iter().any(|allowed| host_matches(&host, allowed)) {
        return Err(Refusal::ForeignHost);
    }
    if let Some(origin) = headers.get(ORIGIN) {
        let origin = origin.to_str().map_err(|_| Refusal::ForeignOrigin)?;
        if !origins
            .iter()
            .any(|allowed| origin_matches(origin, allowed))
        {
            return Err(Refusal::ForeignOrigin);
        }
    }
    Ok(())
}

fn host_matches(host: &Authority, allowed: &str) -> bool {
    let allowed = authority(allowed).unwrap_or_else(|| Authority {
        host: allowed.trim().trim_matches(['[', ']']).to_ascii_lowercase(),
        port: None,
    });
    allowed.host == host.host && allowed.port.is_none_or(|port| host.port == Some(port))
}

/// An origin: `null`, or a scheme and an authority (no path but `/`).
fn parse_origin(text: &str) -> Option<(String, Authority)> {
    let uri: Uri = text.trim().parse().ok()?;
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let authority = authority(uri.authority()?.as_str())?;
    matches!(uri.path(), "" | "/").then_some((scheme, authority))
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

fn origin_matches(origin: &str, allowed: &str) -> bool {
    if allowed.eq_ignore_ascii_case("null") || origin.trim().eq_ignore_ascii_case("null") {
        return allowed.eq_ignore_ascii_case("null") && origin.trim().eq_ignore_ascii_case("null");
    }
    let Some((scheme, host)) = parse_origin(origin) else {
        return false;
    };
    let (allowed, any_port) = match allowed.strip_suffix(":*") {
        Some(base) => (base, true),
        None => (allowed, false),
    };
    let Some((allowed_scheme, allowed_host)) = parse_origin(allowed) else {
        return false;
    };
    if scheme != allowed_scheme || host.host != allowed_host.host {
        return false;
    }
    any_port || host.port.or(default_port(&scheme)) == allowed_host.port.or(default_port(&scheme))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, value.parse().unwrap());
        }
        map
    }

    fn run(pairs: &[(&'static str, &str)]) -> Result<(), Refusal> {
        let hosts = ["localhost", "127.0.0.1", "::1", "api.example.com:8443"].map(String::from);
        let origins = [
            "http://localhost:*",
            "http://[::1]:*",
            "https://app.example.com:443",
        ]
        .map(String::from);
        check(&Uri::from_static("/mcp"), &headers(pairs), &hosts, &origins)
    }

    #[test]
    fn hosts() {
        assert_eq!(run(&[("host", "localhost:8080")]), Ok(()));
        assert_eq!(run(&[("host", "LOCALHOST")]), Ok(()));
        assert_eq!(run(&[("host", "[::1]:9")]), Ok(()));
        assert_eq!(run(&[("host", "api.example.com:8443")]), Ok(()));
        assert_eq!(
            run(&[("host", "api.example.com:443")]),
            Err(Refusal::ForeignHost)
        );
        assert_eq!(run(&[("host", "evil.example")]), Err(Refusal::ForeignHost));
        assert_eq!(
            run(&[("host", "localhost.evil.example")]),
            Err(Refusal::ForeignHost)
        );
        assert_eq!(run(&[("host", "user@localhost")]), Err(Refusal::BadHost));
        assert_eq!(run(&[]), Err(Refusal::BadHost));
        assert_eq!(
            run(&[("host", "localhost"), ("host", "localhost")]),
            Err(Refusal::TwoHosts)
        );
    }

    #[test]
    fn origins() {
        let with = |origin: &str| run(&[("host", "localhost"), ("origin", origin)]);
        assert_eq!(with("http://localhost:3000"), Ok(()));
        assert_eq!(with("http://localhost"), Ok(()));
        assert_eq!(with("http://[::1]:5173"), Ok(()));
        assert_eq!(with("https://app.example.com"), Ok(()));
        assert_eq!(with("https://APP.example.com:443"), Ok(()));
        for foreign in [
            "https://localhost:3000",
            "https://app.example.com:8443",
            "http://app.example.com",
            "http://evil.example",
            "null",
            "not an origin",
            "http://localhost:3000/path",
            "http://user@localhost:3000",
        ] {
            assert_eq!(with(foreign), Err(Refusal::ForeignOrigin), "{foreign}");
        }
    }

    #[test]
    fn null_matches_only_null() {
        assert!(origin_matches("null", "null"));
        assert!(!origin_matches("null", "http://localhost:*"));
        assert!(!origin_matches("http://localhost", "null"));
    }
}
