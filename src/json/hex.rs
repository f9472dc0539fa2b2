//! [`Hex`]: a digest as receipts write it, kept without an allocation.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The bytes a [`Hex`] keeps inline: a SHA-256 in hex (64), a keyed one (`hmac:` and 64).
const INLINE: usize = 72;

/// A digest as a receipt holds it: SHA-256 as lowercase hex, a keyed digest (`hmac:` and hex),
/// or, for a value that cannot be hashed, the reason (`unhashable: …`). It reads as a `str`
/// (it dereferences to one, and compares with `str` and `String`), and is written as a JSON
/// string.
///
/// Up to 72 bytes are kept inline: a call's receipt holds three or four digests, and
/// allocating each was a tenth of the cost of a call that takes no time.
#[derive(Clone)]
pub struct Hex(Repr);

#[derive(Clone)]
enum Repr {
    /// `plain`: no byte of the text needs escaping in a JSON string (always so for a digest).
    Inline {
        len: u8,
        plain: bool,
        bytes: [u8; INLINE],
    },
    Heap(Box<str>),
}

impl Hex {
    /// `text`, inline when it fits.
    pub fn new(text: &str) -> Hex {
        match u8::try_from(text.len()) {
            Ok(len) if text.len() <= INLINE => {
                let mut bytes = [0u8; INLINE];
                bytes[..text.len()].copy_from_slice(text.as_bytes());
                Hex(Repr::Inline {
                    len,
                    plain: super::is_plain(text.as_bytes()),
                    bytes,
                })
            }
            _ => Hex(Repr::Heap(text.into())),
        }
    }

    /// 32 bytes (a SHA-256) as lowercase hex, written in place.
    pub(crate) fn digest(bytes: &[u8; 32]) -> Hex {
        let mut digits = [0u8; INLINE];
        for (pair, b) in digits.chunks_exact_mut(2).zip(bytes) {
            pair.copy_from_slice(&super::HEX_PAIRS[usize::from(*b)]);
        }
        Hex(Repr::Inline {
            len: 64,
            plain: true,
            bytes: digits,
        })
    }

    /// The text's bytes, without the check of their being UTF-8 that [`Hex::as_str`] makes.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, bytes, .. } => &bytes[..usize::from(*len)],
            Repr::Heap(text) => text.as_bytes(),
        }
    }

    /// Whether no byte of the text needs escaping in a JSON string: known when it was made.
    pub(crate) fn is_plain(&self) -> bool {
        match &self.0 {
            Repr::Inline { plain, .. } => *plain,
            Repr::Heap(text) => super::is_plain(text.as_bytes()),
        }
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            // Only ever copied from a `str`, whole: always UTF-8.
            Repr::Inline { len, bytes, .. } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
            Repr::Heap(text) => text,
        }
    }

    /// Whether it is empty (a receipt's `hash` before the receipt is sealed).
    pub fn is_empty(&self) -> bool {
        self.as_bytes().is_empty()
    }
}

/// A digest as a call's draft receipt holds it until the receipt is made: a SHA-256's 32
/// bytes, written as hex only then (by whoever hashes the receipt: for most runs a task on
/// another core), a digest's text (a keyed one, or why a value cannot be hashed), or what is to
/// be hashed, shared with the run, and hashed only then. Less than half the size of a [`Hex`]:
/// a run keeps each call's draft until that task comes.
#[derive(Debug, Clone)]
pub(crate) enum DraftDigest {
    Sha256([u8; 32]),
    Text(Box<Hex>),
    /// The SHA-256 of this text, a value's JCS text (a call's arguments' key form, when it is
    /// theirs: see [`super::jcs_value_digest_keyed`]).
    OfText(std::sync::Arc<str>),
    /// The SHA-256 of the JCS text of this shared value (a call's outcome, whose value is its
    /// result): only ever made of one that has a value.
    OfValue(std::sync::Arc<dyn LaterValue>),
}

/// A shared value a draft's digest is taken of when its receipt is made: a call's outcome.
pub(crate) trait LaterValue: Send + Sync + std::fmt::Debug {
    /// The value, if there is one.
    fn later_value(&self) -> Option<&serde_json::Value>;
}

impl DraftDigest {
    /// The digest as a receipt writes it.
    pub(crate) fn into_hex(self) -> Hex {
        match self {
            DraftDigest::Sha256(bytes) => Hex::digest(&bytes),
            DraftDigest::Text(text) => *text,
            DraftDigest::OfText(text) => super::sha256_digest(text.as_bytes()),
            DraftDigest::OfValue(shared) => {
                shared.later_value().map_or_else(Hex::default, |value| {
                    super::jcs_value_digest(value).into_hex()
                })
            }
        }
    }
}

impl From<Hex> for DraftDigest {
    fn from(text: Hex) -> DraftDigest {
        DraftDigest::Text(Box::new(text))
    }
}

impl Default for Hex {
    fn default() -> Hex {
        Hex::new("")
    }
}

impl std::ops::Deref for Hex {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Hex {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl std::borrow::Borrow<str> for Hex {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for Hex {
    fn from(text: &str) -> Hex {
        Hex::new(text)
    }
}

impl From<String> for Hex {
    fn from(text: String) -> Hex {
        Hex::new(&text)
    }
}

impl From<Hex> for String {
    fn from(hex: Hex) -> String {
        hex.as_str().to_string()
    }
}

impl PartialEq for Hex {
    fn eq(&self, other: &Hex) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Hex {}

impl std::hash::Hash for Hex {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl PartialOrd for Hex {
    fn partial_cmp(&self, other: &Hex) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Hex {
    fn cmp(&self, other: &Hex) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl PartialEq<str> for Hex {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Hex {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for Hex {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<Hex> for String {
    fn eq(&self, other: &Hex) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<Hex> for &str {
    fn eq(&self, other: &Hex) -> bool {
        *self == other.as_str()
    }
}

impl fmt::Debug for Hex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Hex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Hex {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Hex {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Hex, D::Error> {
        let text = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        Ok(Hex::new(&text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Short and long texts read back as they were, compare with `str` and `String` either
    /// way, and go through JSON as strings.
    #[test]
    fn texts_of_every_length_read_back_and_round_trip() {
        for len in [0, 1, 63, 64, 69, 71, 72, 73, 255, 256, 1000] {
            let text: String = "ab9é".chars().cycle().take(len).collect();
            let hex = Hex::new(&text);
            assert_eq!(hex.as_str(), text);
            assert_eq!(hex, text);
            assert_eq!(text, hex);
            assert_eq!(hex, text.as_str());
            assert_eq!(hex.is_empty(), text.is_empty());
            let json = serde_json::to_string(&hex).unwrap();
            assert_eq!(json, serde_json::to_string(&text).unwrap());
            let back: Hex = serde_json::from_str(&json).unwrap();
            assert_eq!(back, hex);
            assert_eq!(format!("{hex:?}"), format!("{text:?}"));
            assert_eq!(hex.to_string(), text);
        }
        assert_ne!(Hex::new("a"), Hex::new("b"));
        assert!(Hex::default().is_empty());
    }

    /// A digest written in place is the hex `sha256_hex` writes; a text's JSON string, as a
    /// receipt writes it, is `serde_json`'s whether or not the text needs escaping, inline or
    /// not.
    #[test]
    fn digests_and_texts_are_written_as_json_strings() {
        for text in [
            "",
            "abc",
            "a\"b",
            "tab\t",
            &"x".repeat(80),
            &"\"".repeat(80),
        ] {
            let digest = crate::json::sha256_digest(text);
            assert_eq!(digest, crate::json::sha256_hex(text));
            assert!(digest.is_plain());
            let hex = Hex::new(text);
            let mut out = Vec::new();
            crate::json::push_jcs_hex(&hex, &mut out);
            assert_eq!(out, serde_json::to_vec(text).unwrap(), "{text:?}");
            assert_eq!(hex.as_bytes(), text.as_bytes());
        }
    }
}
