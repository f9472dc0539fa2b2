//! `serve --http --auth FILE`: bearer tokens, their rights, and the tenants they belong to.
//!
//! The file lists tokens by the SHA-256 of their text (never the text), each with a tenant and
//! rights (`run`, `read`, `approve`), and settings per tenant: limits, as in `[limits]`, a cap on
//! runs at once, and whether a token alone in its tenant may approve its own runs' calls. A
//! request's token is hashed and its digest compared with every listed one in constant time.
//! See docs/serving.md.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use toml::Spanned;

use crate::engine::Limits;

/// How many hex digits of a token's SHA-256 name it in the store (which token started a run).
const PREFIX: usize = 12;

/// What a token may do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Rights {
    pub(crate) run: bool,
    pub(crate) read: bool,
    pub(crate) approve: bool,
}

/// A right, as the file and errors name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Right {
    Run,
    Read,
    Approve,
}

impl Right {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Right::Run => "run",
            Right::Read => "read",
            Right::Approve => "approve",
        }
    }
}

impl Rights {
    /// Whether these rights allow `right` (`run` allows reading too).
    pub(crate) fn allow(self, right: Right) -> bool {
        match right {
            Right::Run => self.run,
            Right::Read => self.read || self.run,
            Right::Approve => self.approve,
        }
    }
}

/// A tenant's settings.
#[derive(Clone, Debug)]
pub(crate) struct Tenant {
    /// The limits its runs run under: the server's, with the keys the file sets.
    pub(crate) limits: Vec<(String, f64)>,
    /// Its runs (and plans) at once, at most.
    pub(crate) max_concurrent_runs: Option<usize>,
    /// Whether a token alone in the tenant may approve its own runs' calls.
    pub(crate) self_approve: bool,
}

/// One token of the file.
#[derive(Clone, Debug)]
struct Token {
    digest: [u8; 32],
    tenant: String,
    rights: Rights,
}

/// Who made a request: the tenant and rights of its token, and the token's name in the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Caller {
    pub(crate) tenant: String,
    /// The first hex digits of the token's SHA-256.
    pub(crate) token: String,
    pub(crate) rights: Rights,
    /// Whether it may decide the calls of runs it started itself: it is the only token of its
    /// tenant, and the tenant says `self_approve = true`.
    pub(crate) may_self_approve: bool,
}

/// The tokens and tenants of an auth file.
#[derive(Clone, Debug)]
pub struct Auth {
    tokens: Vec<Token>,
    pub(crate) tenants: BTreeMap<String, Tenant>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    token: Vec<Spanned<TokenEntry>>,
    #[serde(default)]
    tenant: BTreeMap<String, Spanned<BTreeMap<String, Spanned<toml::Value>>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    sha256: Spanned<String>,
    tenant: Spanned<String>,
    can: Spanned<Vec<Spanned<String>>>,
}

impl Auth {
    /// Reads the auth file at `path`.
    ///
    /// # Errors
    ///
    /// A message naming the file, and the line of what is wrong in it.
    pub fn load(path: &Path) -> Result<Auth, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the auth file {}: {e}", path.display()))?;
        Auth::parse(&text, &path.display().to_string())
    }

    /// Reads an auth file's text; `name` names it in errors.
    ///
    /// # Errors
    ///
    /// A message naming the file, and the line of what is wrong in it.
    pub fn parse(text: &str, name: &str) -> Result<Auth, String> {
        let at = |span: std::ops::Range<usize>, what: String| {
            let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
            format!("{name}, line {line}: {what}")
        };
        let file: File = toml::from_str(text).map_err(|e| match e.span() {
            Some(span) => at(span, e.message().to_string()),
            None => format!("{name}: {}", e.message()),
        })?;
        let mut tenants = BTreeMap::new();
        for (tenant, table) in file.tenant {
            tenants.insert(
                tenant.clone(),
                tenant_settings(&tenant, table.into_inner(), &at)?,
            );
        }
        let mut tokens: Vec<Token> = Vec::new();
        for entry in file.token {
            let span = entry.span();
            let entry = entry.into_inner();
            let digest = digest_of_hex(entry.sha256.get_ref())
                .map_err(|why| at(entry.sha256.span(), why))?;
            if tokens.iter().any(|t| t.digest == digest) {
                return Err(at(
                    entry.sha256.span(),
                    "this token is listed twice: list each token once".to_string(),
                ));
            }
            let tenant = entry.tenant.get_ref().trim().to_string();
            if tenant.is_empty() {
                return Err(at(
                    entry.tenant.span(),
                    "`tenant` is empty: name the tenant".into(),
                ));
            }
            let mut rights = Rights::default();
            for right in entry.can.get_ref() {
                match right.get_ref().as_str() {
                    "run" => rights.run = true,
                    "read" => rights.read = true,
                    "approve" => rights.approve = true,
                    other => {
                        return Err(at(
                            right.span(),
                            format!(
                                "unknown right `{other}`: the rights are run, read and approve"
                            ),
                        ))
                    }
                }
            }
            if rights == Rights::default() {
                return Err(at(
                    span,
                    "this token has no rights: give `can` some of run, read and approve".into(),
                ));
            }
            tenants.entry(tenant.clone()).or_insert(Tenant {
                limits: Vec::new(),
                max_concurrent_runs: None,
                self_approve: false,
            });
            tokens.push(Token {
                digest,
                tenant,
                rights,
            });
        }
        if tokens.is_empty() {
            return Err(format!(
                "{name}: no `[[token]]`: list at least one token (its sha256, tenant and rights)"
            ));
        }
        Ok(Auth { tokens, tenants })
    }

    /// The caller a bearer token stands for, if the file lists it. Every listed digest is
    /// compared, each in constant time, so that the time taken says nothing of the token.
    pub(crate) fn caller(&self, token: &str) -> Option<Caller> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for entry in &self.tokens {
            if same(&entry.digest, &digest) {
                found = Some(entry);
            }
        }
        let entry = found?;
        let alone = self
            .tokens
            .iter()
            .filter(|t| t.tenant == entry.tenant)
            .count()
            == 1;
        let self_approve = self
            .tenants
            .get(&entry.tenant)
            .is_some_and(|t| t.self_approve);
        Some(Caller {
            tenant: entry.tenant.clone(),
            token: hex(&digest)[..PREFIX].to_string(),
            rights: entry.rights,
            may_self_approve: alone && self_approve,
        })
    }

    /// Each tenant's limits: `base` with the keys its table sets.
    ///
    /// # Errors
    ///
    /// A message naming the tenant and the key that `Limits::set` refused.
    pub(crate) fn limits_of(&self, base: &Limits) -> Result<BTreeMap<String, Limits>, String> {
        let mut all = BTreeMap::new();
        for (name, tenant) in &self.tenants {
            if tenant.limits.is_empty() {
                continue;
            }
            let mut limits = base.clone();
            for (key, value) in &tenant.limits {
                limits
                    .set(key, *value)
                    .map_err(|e| format!("[tenant.{name}]: {e}"))?;
            }
            all.insert(name.clone(), limits);
        }
        Ok(all)
    }
}

/// A tenant's table: `max_concurrent_runs`, `self_approve`, and limits.
fn tenant_settings(
    name: &str,
    table: BTreeMap<String, Spanned<toml::Value>>,
    at: &dyn Fn(std::ops::Range<usize>, String) -> String,
) -> Result<Tenant, String> {
    let mut tenant = Tenant {
        limits: Vec::new(),
        max_concurrent_runs: None,
        self_approve: false,
    };
    for (key, value) in table {
        let span = value.span();
        let value = value.into_inner();
        match key.as_str() {
            "self_approve" => {
                tenant.self_approve = value.as_bool().ok_or_else(|| {
                    at(
                        span.clone(),
                        format!("[tenant.{name}] `self_approve` is true or false"),
                    )
                })?;
            }
            "max_concurrent_runs" => {
                let n = value.as_integer().filter(|n| *n >= 1).ok_or_else(|| {
                    at(
                        span.clone(),
                        format!(
                            "[tenant.{name}] `max_concurrent_runs` is a whole number, at least 1"
                        ),
                    )
                })?;
                tenant.max_concurrent_runs = Some(usize::try_from(n).unwrap_or(usize::MAX));
            }
            key => {
                let number = match &value {
                    toml::Value::Integer(n) => *n as f64,
                    toml::Value::Float(x) => *x,
                    _ => {
                        return Err(at(
                            span,
                            format!(
                                "[tenant.{name}] `{key}` is a number (a limit, as in [limits])"
                            ),
                        ))
                    }
                };
                // Checked now, so that a wrong key or value is named with its line.
                Limits::default()
                    .set(key, number)
                    .map_err(|e| at(span.clone(), format!("[tenant.{name}]: {e}")))?;
                tenant.limits.push((key.to_string(), number));
            }
        }
    }
    Ok(tenant)
}

/// The 32 bytes of a SHA-256 written as 64 hex digits.
fn digest_of_hex(text: &str) -> Result<[u8; 32], String> {
    let text = text.trim();
    let bad = || {
        format!(
            "`sha256` must be the 64 hex digits of the token's SHA-256 (e.g. `printf %s TOKEN | \
             sha256sum`), not {} characters",
            text.chars().count()
        )
    };
    if text.len() != 64 || !text.is_ascii() {
        return Err(bad());
    }
    let mut digest = [0u8; 32];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(digest)
}

/// Whether two digests are equal, in a time that does not depend on where they differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bearer token of an `Authorization` header's value, if it is one.
pub(crate) fn bearer(value: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(value).ok()?.trim();
    let (scheme, token) = text.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The caller of a request, from its one `Authorization` header; or why there is none.
pub(crate) fn caller_of(auth: &Auth, headers: &hyper::HeaderMap) -> Result<Caller, &'static str> {
    let mut values = headers.get_all(hyper::header::AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Err("no token");
    };
    if values.next().is_some() {
        return Err("two Authorization headers");
    }
    let token = bearer(value.as_bytes()).ok_or("the Authorization header is not `Bearer TOKEN`")?;
    auth.caller(token)
        .ok_or("the token is not one this server lists")
}

/// How many runs each has going, shared by every request.
#[derive(Debug, Default)]
pub(crate) struct Running {
    counts: std::sync::Mutex<BTreeMap<String, usize>>,
}

/// A run counted against its tenant's cap until dropped.
pub(crate) struct Slot {
    running: Arc<Running>,
    tenant: String,
}

impl Running {
    /// A slot for one more run of `tenant`, or the cap it would pass.
    pub(crate) fn enter(self: &Arc<Self>, tenant: &str, cap: Option<usize>) -> Result<Slot, usize> {
        let mut counts = crate::sync::lock(&self.counts);
        let count = counts.entry(tenant.to_string()).or_insert(0);
        if let Some(cap) = cap {
            if *count >= cap {
                return Err(cap);
            }
        }
        *count += 1;
        Ok(Slot {
            running: Arc::clone(self),
            tenant: tenant.to_string(),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = crate::sync::lock(&self.running.counts);
        if let Some(count) = counts.get_mut(&self.tenant) {
            *count = count.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(token: &str) -> String {
        hex(&Sha256::digest(token.as_bytes()))
    }

    fn file(tokens: &[(&str, &str, &str)], tenants: &str) -> String {
        let mut text = String::new();
        for (token, tenant, can) in tokens {
            text.push_str(&format!(
                "[[token]]\nsha256 = \"{}\"\ntenant = \"{tenant}\"\ncan = {can}\n",
                sha(token)
            ));
        }
        text.push_str(tenants);
        text
    }

    #[test]
    fn a_listed_token_is_its_tenant_and_rights_and_others_are_nobody() {
        let auth = Auth::parse(
            &file(
                &[
                    ("agent", "acme", "[\"run\", \"read\"]"),
                    ("boss", "acme", "[\"approve\"]"),
                ],
                "[tenant.acme]\nmax_concurrent_runs = 2\nmax_calls = 7\n",
            ),
            "auth.toml",
        )
        .unwrap();
        let agent = auth.caller("agent").unwrap();
        assert_eq!(agent.tenant, "acme");
        assert!(agent.rights.allow(Right::Run) && agent.rights.allow(Right::Read));
        assert!(!agent.rights.allow(Right::Approve));
        assert_eq!(agent.token, sha("agent")[..PREFIX]);
        assert!(!agent.may_self_approve);
        assert!(auth.caller("boss").unwrap().rights.allow(Right::Approve));
        assert!(auth.caller("agen").is_none());
        assert!(auth.caller("").is_none());
        assert_eq!(auth.tenants["acme"].max_concurrent_runs, Some(2));
        let limits = auth.limits_of(&Limits::default()).unwrap();
        assert_eq!(limits["acme"].max_calls, 7);
    }

    #[test]
    fn self_approval_needs_a_lone_token_and_the_tenant_saying_so() {
        let alone = file(
            &[("solo", "t", "[\"run\", \"approve\"]")],
            "[tenant.t]\nself_approve = true\n",
        );
        assert!(
            Auth::parse(&alone, "a")
                .unwrap()
                .caller("solo")
                .unwrap()
                .may_self_approve
        );
        let not_said = file(&[("solo", "t", "[\"run\", \"approve\"]")], "");
        assert!(
            !Auth::parse(&not_said, "a")
                .unwrap()
                .caller("solo")
                .unwrap()
                .may_self_approve
        );
        let two = file(
            &[
                ("solo", "t", "[\"run\", \"approve\"]"),
                ("other", "t", "[\"read\"]"),
            ],
            "[tenant.t]\nself_approve = true\n",
        );
        assert!(
            !Auth::parse(&two, "a")
                .unwrap()
                .caller("solo")
                .unwrap()
                .may_self_approve
        );
    }

    #[test]
    fn a_malformed_file_is_an_error_with_its_name_and_line() {
        let cases = [
            (
                "[[token]]\nsha256 = \"abc\"\ntenant = \"t\"\ncan = [\"run\"]\n",
                "line 2",
            ),
            (
                &file(&[("x", "t", "[\"run\", \"fly\"]")], "") as &str,
                "unknown right `fly`",
            ),
            (&file(&[("x", "t", "[]")], ""), "no rights"),
            (
                &file(&[("x", "t", "[\"run\"]"), ("x", "u", "[\"read\"]")], ""),
                "listed twice",
            ),
            (
                &file(&[("x", "t", "[\"run\"]")], "[tenant.t]\nmax_calls = -1\n"),
                "line 6",
            ),
            (
                &file(&[("x", "t", "[\"run\"]")], "[tenant.t]\nbogus = 1\n"),
                "unknown limit",
            ),
            (
                &file(&[("x", "t", "[\"run\"]")], "[tenant.t]\nself_approve = 1\n"),
                "true or false",
            ),
            (
                &file(
                    &[("x", "t", "[\"run\"]")],
                    "[tenant.t]\nmax_concurrent_runs = 0\n",
                ),
                "at least 1",
            ),
            ("[[token]]\nsha256 = \"", "line 2"),
            ("", "no `[[token]]`"),
            ("[[token]]\nsha256 = \"00\"\nsecret = 1\n", "line 3"),
        ];
        for (text, expected) in cases {
            let err = Auth::parse(text, "auth.toml").unwrap_err();
            assert!(err.starts_with("auth.toml"), "{err}");
            assert!(err.contains(expected), "{expected}: {err}");
        }
    }

    #[test]
    fn only_a_bearer_header_gives_a_token() {
        assert_eq!(bearer(b"Bearer abc"), Some("abc"));
        assert_eq!(bearer(b"bearer  abc "), Some("abc"));
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"Bearer"), None);
        assert_eq!(bearer(&[0xff, 0x20, 0x61]), None);
    }

    #[test]
    fn digests_compare_equal_only_when_every_byte_is() {
        let a = [7u8; 32];
        let mut b = a;
        assert!(same(&a, &b));
        b[31] ^= 1;
        assert!(!same(&a, &b));
        b = a;
        b[0] ^= 0x80;
        assert!(!same(&a, &b));
    }

    #[test]
    fn a_tenant_cap_refuses_past_it_and_frees_a_slot_when_a_run_ends() {
        let running = Arc::new(Running::default());
        let first = running.enter("t", Some(1)).unwrap();
        assert_eq!(running.enter("t", Some(1)).err(), Some(1));
        assert!(running.enter("u", Some(1)).is_ok());
        drop(first);
        assert!(running.enter("t", Some(1)).is_ok());
    }
}
