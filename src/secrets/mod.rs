//! Secrets: values a manifest (or the library's caller) names and says where to fetch from —
//! an environment variable, a file, a command's output — that tools use and the model never
//! sees. A script cannot name a secret; tools reach them (an MCP server's or a command tool's
//! environment, a Rust tool's [`ToolContext::secret`](crate::ToolContext::secret)). Each is
//! fetched once, when first needed, and from then on masked by value ([`Mask`]) in everything a
//! run keeps or hands back.

mod mask;
mod redact;

pub(crate) use mask::Masks;
pub use mask::{process_mask, Mask, MIN_MASKED_LEN};
pub use redact::{RedactPath, Side, REDACTED};

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::sync::lock;

/// How long a secret's command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a secret comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SecretSource {
    /// An environment variable of toolscript's process.
    Env(String),
    /// A file's content (one trailing newline removed).
    File(PathBuf),
    /// A command's standard output (one trailing newline removed): `["pass", "show", "x"]`.
    Command(Vec<String>),
    /// A value the library's caller holds already.
    Value(String),
}

impl SecretSource {
    /// Where it comes from, as a person reads it (never the value).
    pub fn describe(&self) -> String {
        match self {
            SecretSource::Env(var) => format!("the environment variable `{var}`"),
            SecretSource::File(path) => format!("the file `{}`", path.display()),
            SecretSource::Command(argv) => format!("the command `{}`", argv.join(" ")),
            SecretSource::Value(_) => "a value given by the program".to_string(),
        }
    }

    async fn fetch(&self) -> Result<String, String> {
        let mut text = match self {
            SecretSource::Env(var) => std::env::var(var).map_err(|e| match e {
                std::env::VarError::NotPresent => "it is not set".to_string(),
                std::env::VarError::NotUnicode(_) => "it is not UTF-8".to_string(),
            })?,
            SecretSource::File(path) => tokio::fs::read_to_string(path)
                .await
                .map_err(|e| format!("it cannot be read: {e}"))?,
            SecretSource::Command(argv) => run(argv).await?,
            SecretSource::Value(value) => value.clone(),
        };
        if text.ends_with('\n') {
            text.pop();
            if text.ends_with('\r') {
                text.pop();
            }
        }
        if text.len() < MIN_MASKED_LEN {
            return Err(format!(
                "its value is {} bytes long: a secret must be at least {MIN_MASKED_LEN} bytes, or it could not be told apart where it must be masked",
                text.len()
            ));
        }
        Ok(text)
    }
}

/// Runs a secret's command (in toolscript's environment: it is the operator's command, not a
/// model's) and gives its standard output.
async fn run(argv: &[String]) -> Result<String, String> {
    let Some((program, args)) = argv.split_first() else {
        return Err("its command is empty".to_string());
    };
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(COMMAND_TIMEOUT, command.output())
        .await
        .map_err(|_| format!("its command did not finish within {COMMAND_TIMEOUT:?}"))?
        .map_err(|e| format!("its command cannot be started: {e}"))?;
    if !output.status.success() {
        // Its error output is the command's own words about why it failed, not the secret;
        // it is cut short all the same.
        let said: String = String::from_utf8_lossy(&output.stderr)
            .trim()
            .chars()
            .take(200)
            .collect();
        return Err(format!("its command failed ({}): {said}", output.status));
    }
    String::from_utf8(output.stdout).map_err(|_| "its command's output is not UTF-8".to_string())
}

/// A fetch shared by every caller that needs the secret at once.
type Fetch = Arc<tokio::sync::OnceCell<Arc<str>>>;

/// The secrets of a registry: where each comes from, and those fetched so far.
#[derive(Default)]
pub struct Secrets {
    sources: BTreeMap<String, SecretSource>,
    fetched: Mutex<BTreeMap<String, Fetch>>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets")
            .field("names", &self.sources.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Secrets {
    /// Secrets with these sources, none fetched yet.
    pub fn new(sources: BTreeMap<String, SecretSource>) -> Secrets {
        Secrets {
            sources,
            fetched: Mutex::default(),
        }
    }

    /// The names of the secrets.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.sources.keys().map(String::as_str)
    }

    /// Whether a secret has this name.
    pub fn has(&self, name: &str) -> bool {
        self.sources.contains_key(name)
    }

    /// The environment variables of toolscript's process that are secrets' sources: never
    /// passed on to a server or a command that does not name the secret.
    pub fn env_vars(&self) -> impl Iterator<Item = &str> {
        self.sources.values().filter_map(|s| match s {
            SecretSource::Env(var) => Some(var.as_str()),
            _ => None,
        })
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    /// The secret `name`'s value, fetched the first time it is asked for (one fetch for every
    /// caller at once), and masked from then on: in this process's log output and in every
    /// run's output.
    ///
    /// # Errors
    ///
    /// Why it cannot be had: no secret has that name, or its source fails. The error never
    /// holds the value.
    pub async fn get(&self, name: &str) -> Result<Arc<str>, String> {
        let Some(source) = self.sources.get(name) else {
            let known: Vec<&str> = self.names().collect();
            return Err(format!(
                "no secret is named `{name}` (the secrets: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            ));
        };
        let cell = Arc::clone(lock(&self.fetched).entry(name.to_string()).or_default());
        // Only a value is kept: a source that failed (a locked agent, a timeout) is asked
        // again next time.
        let fetched = cell
            .get_or_try_init(|| async {
                let value = source.fetch().await.map_err(|why| {
                    format!(
                        "the secret `{name}` (from {}) cannot be had: {why}",
                        source.describe()
                    )
                })?;
                process_mask().add(&value, &format!("[secret:{name}]"));
                Ok::<Arc<str>, String>(Arc::from(value))
            })
            .await?;
        Ok(Arc::clone(fetched))
    }
}

/// An environment value of a server or a command: given as it is, or a secret's.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
#[non_exhaustive]
pub enum EnvValue {
    /// The value itself.
    Plain(String),
    /// `{ secret = "NAME" }`: the secret's value, fetched when the process starts.
    Secret {
        /// The secret's name.
        secret: String,
    },
}

impl From<&str> for EnvValue {
    fn from(value: &str) -> EnvValue {
        EnvValue::Plain(value.to_string())
    }
}

impl From<String> for EnvValue {
    fn from(value: String) -> EnvValue {
        EnvValue::Plain(value)
    }
}

/// An environment with its secrets fetched.
///
/// # Errors
///
/// The first secret that cannot be had, naming the variable.
pub async fn resolve_env(
    env: &BTreeMap<String, EnvValue>,
    secrets: &Secrets,
) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (key, value) in env {
        let value = match value {
            EnvValue::Plain(value) => value.clone(),
            EnvValue::Secret { secret } => secrets
                .get(secret)
                .await
                .map_err(|why| format!("`{key}`: {why}"))?
                .to_string(),
        };
        out.insert(key.clone(), value);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_source_is_fetched_once_and_masked() {
        let dir = tempfile::TempDir::new().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "file-secret-value\n").unwrap();
        let secrets = Secrets::new(BTreeMap::from([
            ("F".to_string(), SecretSource::File(file.clone())),
            (
                "C".to_string(),
                SecretSource::Command(vec!["echo".into(), "command-secret".into()]),
            ),
            ("V".to_string(), SecretSource::Value("given-value".into())),
            (
                "E".to_string(),
                SecretSource::Env("TOOLSCRIPT_TEST_UNSET_VAR".into()),
            ),
            ("S".to_string(), SecretSource::Value("ab".into())),
        ]));
        assert_eq!(&*secrets.get("F").await.unwrap(), "file-secret-value");
        std::fs::write(&file, "changed\n").unwrap();
        assert_eq!(
            &*secrets.get("F").await.unwrap(),
            "file-secret-value",
            "fetched once"
        );
        assert_eq!(&*secrets.get("C").await.unwrap(), "command-secret");
        assert_eq!(&*secrets.get("V").await.unwrap(), "given-value");
        let e = secrets.get("E").await.unwrap_err();
        assert!(
            e.contains("TOOLSCRIPT_TEST_UNSET_VAR") && e.contains("not set"),
            "{e}"
        );
        let e = secrets.get("S").await.unwrap_err();
        assert!(e.contains("at least") && !e.contains("ab\""), "{e}");
        let e = secrets.get("nope").await.unwrap_err();
        assert!(e.contains("C, E, F, S, V"), "{e}");
        assert_eq!(process_mask().text("x command-secret y"), "x [secret:C] y");
    }
}
