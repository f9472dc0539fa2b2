//! How the PostgreSQL store reaches its server: the URL (`postgres://` or `postgresql://`)
//! read as libpq reads it where it can, the password masked wherever the URL is shown, TLS
//! through rustls (the `ring` provider, webpki's roots), and a pool of connections.

use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// How long a connection attempt waits unless the URL says `connect_timeout`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long sent data may go unacknowledged before a connection counts as dead, unless the URL
/// says `tcp_user_timeout`.
const DEAD_PEER: Duration = Duration::from_secs(60);

/// How long a connection is idle before TCP keepalives probe it, unless the URL says
/// `keepalives_idle`.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);

/// The connections a store keeps open at most unless the URL says `pool_max_size`.
const POOL_SIZE: usize = 8;

/// Whether `text` names a PostgreSQL store rather than a file.
pub fn is_postgres_url(text: &str) -> bool {
    let lower = text.get(..13).unwrap_or(text).to_ascii_lowercase();
    lower.starts_with("postgres://") || lower.starts_with("postgresql://")
}

/// `url` with its password (in the user part, or a `password=` parameter) replaced by `***`:
/// what messages, lists and logs show.
pub fn mask_url(url: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (url, None),
    };
    let mut out = match head.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = match rest.find('/') {
                Some(i) => rest.split_at(i),
                None => (rest, ""),
            };
            let authority = match authority.rsplit_once('@') {
                Some((user, host)) => match user.split_once(':') {
                    Some((name, _)) => format!("{name}:***@{host}"),
                    None => format!("{user}@{host}"),
                },
                None => authority.to_string(),
            };
            format!("{scheme}://{authority}{path}")
        }
        None => head.to_string(),
    };
    if let Some(query) = query {
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, _)) if key.eq_ignore_ascii_case("password") => format!("{key}=***"),
                _ => pair.to_string(),
            })
            .collect();
        out.push('?');
        out.push_str(&pairs.join("&"));
    }
    out
}

/// TLS as `sslmode` asks for it, libpq's way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SslMode {
    /// No TLS.
    Disable,
    /// TLS when the server offers it, its certificate not checked (libpq's default).
    Prefer,
    /// TLS or no connection, its certificate not checked (unless a root certificate is given).
    Require,
    /// TLS, the certificate checked against the roots, whatever name it holds.
    VerifyCa,
    /// TLS, the certificate checked against the roots and the host's name.
    VerifyFull,
}

impl SslMode {
    fn parse(text: &str) -> Result<SslMode, String> {
        Ok(match text {
            "disable" => SslMode::Disable,
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(format!(
                "sslmode={other} is not one of disable, allow, prefer, require, verify-ca, verify-full"
            ))
            }
        })
    }
}

/// What a URL says, once toolscript's own parameters are taken out of it.
pub(super) struct Target {
    /// The client's settings: hosts, user, password, database, timeouts.
    pub(super) config: tokio_postgres::Config,
    /// The TLS asked for.
    pub(super) ssl: SslMode,
    /// A file of PEM root certificates (`sslrootcert`), else webpki's roots.
    pub(super) root_cert: Option<String>,
    /// The most connections the pool keeps.
    pub(super) pool_size: usize,
}

/// Reads `url`: tokio-postgres's parameters, plus `sslmode` (all of libpq's), `sslrootcert`
/// and `pool_max_size`, which it does not know. Errors name the URL masked.
pub(super) fn parse(url: &str) -> Result<Target, String> {
    let (head, query) = match url.split_once('?') {
        Some((head, query)) => (head, query),
        None => (url, ""),
    };
    let (mut ssl, mut root_cert, mut pool_size) = (SslMode::Prefer, None, POOL_SIZE);
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "sslmode" => ssl = SslMode::parse(value)?,
            "sslrootcert" => root_cert = Some(value.to_string()),
            "pool_max_size" => {
                pool_size = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| {
                        format!(
                            "pool_max_size={value} is not a number of connections from 1 to 1000"
                        )
                    })?
            }
            _ => kept.push(pair),
        }
    }
    let rest = if kept.is_empty() {
        head.to_string()
    } else {
        format!("{head}?{}", kept.join("&"))
    };
    let mut config: tokio_postgres::Config = rest.parse().map_err(|e| {
        format!(
            "the URL does not parse ({e}): postgres://USER:PASSWORD@HOST:PORT/DATABASE?sslmode=..."
        )
    })?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    // A server that goes silent mid-call (a dead machine, a cut network) is noticed within
    // about a minute, not the kernel's two hours: the call fails, and the run is interrupted.
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(DEAD_PEER);
    }
    if config.get_keepalives_idle() >= Duration::from_secs(7200) {
        config.keepalives_idle(KEEPALIVE_IDLE);
    }
    if config.get_user().is_none() {
        let user = std::env::var("USER").unwrap_or_else(|_| "postgres".into());
        config.user(&user);
    }
    config.ssl_mode(match ssl {
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        _ => tokio_postgres::config::SslMode::Require,
    });
    config.application_name("toolscript");
    Ok(Target {
        config,
        ssl,
        root_cert,
        pool_size,
    })
}

/// The TLS connector for `target`: rustls with the `ring` provider, whose certificate check
/// is the one its `sslmode` asks for.
pub(super) fn tls(target: &Target) -> Result<tokio_postgres_rustls::MakeRustlsConnect, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    match &target.root_cert {
        Some(path) => {
            use rustls::pki_types::pem::PemObject;
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("sslrootcert={path} cannot be read: {e}"))?;
            for cert in certs {
                let cert =
                    cert.map_err(|e| format!("sslrootcert={path} holds a bad certificate: {e}"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("sslrootcert={path} holds a bad certificate: {e}"))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS cannot be set up: {e}"))?;
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::clone(&provider),
    )
    .build()
    .map_err(|e| format!("TLS cannot be set up: {e}"))?;
    // libpq checks a certificate under `require` only when a root certificate is given.
    let check = match target.ssl {
        SslMode::VerifyFull => Check::Full,
        SslMode::VerifyCa => Check::Chain,
        SslMode::Require if target.root_cert.is_some() => Check::Chain,
        _ => Check::None,
    };
    let config = builder
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Verifier {
            check,
            inner: verifier,
            provider,
        }))
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// How much of a server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Nothing (`prefer`, `require`): the connection is encrypted, not authenticated.
    None,
    /// The chain to a root, not the name (`verify-ca`).
    Chain,
    /// The chain and the host's name (`verify-full`).
    Full,
}

/// The certificate check of an `sslmode`: webpki's, all or part of it.
#[derive(Debug)]
struct Verifier {
    check: Check,
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let checked =
            self.inner
                .verify_server_cert(end_entity, intermediates, server_name, ocsp, now);
        match (self.check, checked) {
            (Check::None, _) => Ok(ServerCertVerified::assertion()),
            (
                Check::Chain,
                Err(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::NotValidForName
                    | rustls::CertificateError::NotValidForNameContext { .. },
                )),
            ) => Ok(ServerCertVerified::assertion()),
            (_, checked) => checked,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The pool of connections to `target`'s server: made lazily, each connection checked when it
/// is taken again, a wait for one bounded.
pub(super) fn pool(target: Target) -> Result<deadpool_postgres::Pool, String> {
    let tls = tls(&target)?;
    let timeout = target
        .config
        .get_connect_timeout()
        .copied()
        .unwrap_or(CONNECT_TIMEOUT);
    let manager = deadpool_postgres::Manager::from_config(
        target.config,
        tls,
        deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        },
    );
    deadpool_postgres::Pool::builder(manager)
        .max_size(target.pool_size)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .create_timeout(Some(timeout + Duration::from_secs(1)))
        .wait_timeout(Some(timeout * 3))
        .build()
        .map_err(|e| format!("its pool of connections cannot be made: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_is_masked_wherever_the_url_holds_it() {
        assert_eq!(
            mask_url("postgres://me:s3cr%40t@db.example:5432/runs?sslmode=require"),
            "postgres://me:***@db.example:5432/runs?sslmode=require"
        );
        assert_eq!(
            mask_url("postgresql://db/runs?user=me&password=hunter2"),
            "postgresql://db/runs?user=me&password=***"
        );
        assert_eq!(mask_url("postgres://me@db/runs"), "postgres://me@db/runs");
        // A password holding `@` or `/`: everything up to the last `@` is the user part.
        let masked = mask_url("postgres://me:a@b/c@db/runs");
        assert!(!masked.contains("a@b"), "{masked}");
    }

    #[test]
    fn libpq_sslmodes_are_read_and_a_wrong_one_is_refused() {
        for (mode, want) in [
            ("disable", SslMode::Disable),
            ("prefer", SslMode::Prefer),
            ("require", SslMode::Require),
            ("verify-ca", SslMode::VerifyCa),
            ("verify-full", SslMode::VerifyFull),
        ] {
            let target = parse(&format!("postgres://u@h/d?sslmode={mode}")).unwrap();
            assert_eq!(target.ssl, want);
            assert!(tls(&target).is_ok());
        }
        assert_eq!(parse("postgres://u@h/d").unwrap().ssl, SslMode::Prefer);
        let e = parse("postgres://u@h/d?sslmode=always").err().unwrap();
        assert!(e.contains("sslmode=always"), "{e}");
        let e = parse("postgres://u@h/d?pool_max_size=0").err().unwrap();
        assert!(e.contains("pool_max_size"), "{e}");
        assert!(is_postgres_url("PostgreSQL://h/d") && !is_postgres_url("/tmp/postgres://x"));
    }
}
