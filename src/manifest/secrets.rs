//! `[secrets]` in a manifest: where each secret comes from. Each manifest's table adds names;
//! a name declared twice is an error (one secret, one source).
//!
//! ```toml
//! [secrets]
//! API_TOKEN = { env = "ACME_TOKEN" }
//! DB_PASSWORD = { file = "secrets/db" }          # relative to the manifest's folder
//! SIGNING_KEY = { command = ["pass", "show", "acme/signing"] }
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::secrets::SecretSource;

/// One secret's source, as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SecretEntry {
    env: Option<String>,
    file: Option<String>,
    command: Option<Vec<String>>,
}

impl SecretEntry {
    /// The source, with a file relative to `folder`.
    pub(super) fn source(self, name: &str, folder: &Path) -> Result<SecretSource, String> {
        let source = match (self.env, self.file, self.command) {
            (Some(var), None, None) if !var.is_empty() => SecretSource::Env(var),
            (None, Some(file), None) if !file.is_empty() => {
                SecretSource::File(folder.join(file))
            }
            (None, None, Some(argv)) if !argv.is_empty() && !argv[0].is_empty() => {
                SecretSource::Command(argv)
            }
            _ => {
                return Err(format!(
                    "`{name}` takes exactly one source: `{{ env = \"VAR\" }}`, `{{ file = \"path\" }}` or `{{ command = [\"program\", \"arg\"] }}`, none of them empty"
                ))
            }
        };
        Ok(source)
    }
}

/// Adds a manifest's secrets to those declared so far.
pub(super) fn merge(
    sources: &mut BTreeMap<String, SecretSource>,
    entries: BTreeMap<String, SecretEntry>,
    folder: &Path,
) -> Result<(), String> {
    for (name, entry) in entries {
        if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            || name.is_empty()
        {
            return Err(format!(
                "`{name}`: a secret's name is letters, digits, `_` and `-`"
            ));
        }
        if sources.contains_key(&name) {
            return Err(format!(
                "`{name}` is declared twice: one secret has one source"
            ));
        }
        let source = entry.source(&name, folder)?;
        sources.insert(name, source);
    }
    Ok(())
}
