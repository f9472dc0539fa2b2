//! Canonical JSON in its two forms, and SHA-256.
//!
//! - **The key form** ([`key_json`]): object keys sorted by their UTF-8 bytes, numbers as
//!   `serde_json` writes them (`3.0` stays `3.0`). It is what identifies a call: the read
//!   ledger's and the repeat guard's keys, [`Call::args_key`](crate::dispatch::Call), the
//!   journal's keys and whatever else the store keeps for a paused run to match on resume, and
//!   the text of stored artifacts. It never changes: a run paused by an earlier version must
//!   find its keys again. It was also the canonical form of receipt format 1, and still checks
//!   those receipts.
//! - **The receipt form** ([`jcs_sha256`]): RFC 8785, the JSON Canonicalization Scheme (keys
//!   sorted by UTF-16 code units, numbers in ECMAScript's shortest form: `3.0` is `3`, `1e21` is
//!   `1e+21`, `-0.0` is `0`), written by the `canon-json` crate straight into the hasher, with
//!   one documented exception: an integer the value holds exactly (an `i64` or `u64`) is
//!   written as its exact decimal digits. Within ±2^53 that is what JCS writes; beyond, JCS
//!   would write the nearest double, which two different integers share, so two calls that
//!   differ only there would get one digest. The digits keep the form injective and still a
//!   JSON number. Receipt format 2 hashes with it, so that any JCS implementation recomputes a
//!   receipt's hashes.

use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

mod hex;
pub use hex::Hex;
pub(crate) use hex::{DraftDigest, LaterValue};

/// Writes `value` in the key form of canonical JSON: object keys sorted by their UTF-8 bytes,
/// no insignificant whitespace, numbers as `serde_json` writes them.
///
/// This is the form that identifies a call and that the store of durable runs keeps: frozen,
/// so that runs paused before an upgrade still match their keys on resume. Receipts hash
/// [`jcs_sha256`] instead.
///
/// Sorting is done here rather than relied on from `serde_json::Map`, whose order depends on a
/// feature flag that any crate in the build may turn on.
pub(crate) fn key_json(value: &Value) -> String {
    // Room for the usual call's arguments or result without growing the text several times.
    let mut out = String::with_capacity(64);
    write_canonical(value, &mut out);
    out
}

/// [`key_json`], shared: written into this thread's buffer, then copied once into its `Arc`
/// (a `String` made into an `Arc<str>` is copied anyway, and its buffer freed).
pub(crate) fn key_json_shared(value: &Value) -> Arc<str> {
    with_key_form(value, |text| Arc::from(text))
}

thread_local! {
    /// The buffer the key form is written into when only a copy of it or its digest is kept
    /// (a call's key, a result's digest): kept from one call to the next.
    static TEXT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// The most this thread's buffer keeps between calls: a large value's text is freed after use,
/// so that it does not stay allocated (and counted against the memory budget) for the life
/// of a long-lived thread.
const KEPT_TEXT: usize = 16 << 10;

/// `f` of `value`'s key form, written into this thread's buffer.
fn with_key_form<T>(value: &Value, f: impl FnOnce(&str) -> T) -> T {
    TEXT.with_borrow_mut(|out| {
        out.clear();
        write_canonical(value, out);
        let result = f(out);
        if out.capacity() > KEPT_TEXT {
            *out = String::new();
        }
        result
    })
}

/// SHA-256, as lowercase hex, of `value` in the receipt form of canonical JSON: RFC 8785 (JCS),
/// integers held exactly written as their exact digits (see the module's docs). The text is
/// written into one buffer, then hashed: a formatter writes a few bytes at a time, and a
/// hasher's bookkeeping per write costs more than the bytes.
///
/// Only for values whose map keys are strings (a [`Value`], a receipt): `canon-json` cannot
/// write another key. A value JCS cannot write at all (a float that is not finite) gets
/// `unhashable: ` and the reason instead of a digest, which no hash check accepts.
pub(crate) fn jcs_sha256<T: Serialize + ?Sized>(value: &T) -> String {
    // Most objects arrive with their keys already in JCS order (a receipt's fields are declared
    // so; a `Value`'s map is sorted by UTF-8 bytes, the same order unless keys mix characters
    // beyond U+FFFF with ones from U+E000 up): those are streamed as they come. The crate's
    // formatter, which buffers and sorts every object, writes the rest.
    let mut text = Vec::with_capacity(512);
    let mut serializer = serde_json::Serializer::with_formatter(&mut text, InOrder::default());
    let streamed = value.serialize(&mut serializer);
    if streamed.is_ok() {
        return sha256_hex(&text);
    }
    if streamed
        .as_ref()
        .err()
        .and_then(serde_json::Error::io_error_kind)
        != Some(UNSORTED)
    {
        return unhashable(streamed);
    }
    text.clear();
    let mut serializer =
        serde_json::Serializer::with_formatter(&mut text, canon_json::CanonicalFormatter::new());
    match value.serialize(&mut serializer) {
        Ok(()) => sha256_hex(&text),
        sorted => unhashable(sorted),
    }
}

/// Whether `value` is written by the streaming formatter, its objects' keys all in JCS order.
#[cfg(test)]
pub(crate) fn streams_in_jcs_order<T: Serialize + ?Sized>(value: &T) -> bool {
    let mut serializer =
        serde_json::Serializer::with_formatter(std::io::sink(), InOrder::default());
    value.serialize(&mut serializer).is_ok()
}

fn unhashable(outcome: Result<(), serde_json::Error>) -> String {
    match outcome {
        Ok(()) => "unhashable".to_owned(),
        Err(e) => format!("unhashable: {e}"),
    }
}

/// The error [`InOrder`] stops with when an object's keys are not in JCS order.
const UNSORTED: std::io::ErrorKind = std::io::ErrorKind::Other;

/// A JCS formatter for objects whose keys come in JCS order (UTF-16 code units, ascending):
/// `canon-json`'s formatter writes the floats (in ECMAScript's shortest form), `serde_json`'s
/// compact one every other scalar (its strings and integers are JCS's), and the objects are
/// written as they come instead of buffered and sorted. It checks the order of every
/// key and stops with [`UNSORTED`] at the first one out of it, so that the caller starts over
/// with the crate's formatter: it never writes text that is not JCS. A key that is not a string
/// stops it with another error (neither formatter can write one).
#[derive(Default)]
struct InOrder {
    /// Writes floats (its object stack stays empty, so it writes straight to the writer).
    numbers: canon_json::CanonicalFormatter,
    /// For each open object: the key written last (none yet for an empty one).
    last: Vec<Option<String>>,
    /// The key being written, unescaped; `None` outside keys.
    key: Option<String>,
    /// A key's buffer, reused for the next.
    spare: String,
}

impl InOrder {
    fn not_in_key(&self) -> std::io::Result<()> {
        match self.key {
            None => Ok(()),
            Some(_) => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "a map key that is not a string",
            )),
        }
    }
}

/// Delegates a scalar to `canon-json`'s formatter (`numbers`: floats, whose form JCS fixes) or
/// to `serde_json`'s compact one (`compact`: everything else, which it writes as JCS does, and
/// faster: `canon-json`'s goes through a writer of its own at every call); refused inside a
/// key.
macro_rules! scalar {
    ($via:ident $f:ident $(, $t:ty)?) => {
        fn $f<W: ?Sized + std::io::Write>(&mut self, writer: &mut W $(, value: $t)?) -> std::io::Result<()> {
            self.not_in_key()?;
            scalar!(@call $via self writer $f $(, value as $t)?)
        }
    };
    (@call numbers $self:ident $writer:ident $f:ident $(, $v:expr)?) => {
        $self.numbers.$f($writer $(, $v)?)
    };
    (@call compact $self:ident $writer:ident $f:ident $(, $v:expr)?) => {
        serde_json::ser::CompactFormatter.$f($writer $(, $v)?)
    };
}

impl serde_json::ser::Formatter for InOrder {
    scalar!(compact write_null);
    scalar!(compact write_bool, bool);
    scalar!(compact write_i8, i8);
    scalar!(compact write_i16, i16);
    scalar!(compact write_i32, i32);
    scalar!(compact write_i64, i64);
    scalar!(compact write_i128, i128);
    scalar!(compact write_u8, u8);
    scalar!(compact write_u16, u16);
    scalar!(compact write_u32, u32);
    scalar!(compact write_u64, u64);
    scalar!(compact write_u128, u128);
    scalar!(numbers write_f32, f32);
    fn write_f64<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        value: f64,
    ) -> std::io::Result<()> {
        self.not_in_key()?;
        match thousandths(value) {
            Some((text, len)) => writer.write_all(&text[..len]),
            None => self.numbers.write_f64(writer, value),
        }
    }
    scalar!(numbers write_number_str, &str);
    scalar!(compact begin_array);
    scalar!(compact end_array);
    scalar!(compact begin_array_value, bool);
    scalar!(compact end_array_value);

    fn begin_string<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        serde_json::ser::CompactFormatter.begin_string(writer)
    }

    fn end_string<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        serde_json::ser::CompactFormatter.end_string(writer)
    }

    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        if let Some(key) = &mut self.key {
            key.push_str(fragment);
        }
        serde_json::ser::CompactFormatter.write_string_fragment(writer, fragment)
    }

    fn write_char_escape<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        escape: serde_json::ser::CharEscape,
    ) -> std::io::Result<()> {
        use serde_json::ser::CharEscape;
        if let Some(key) = &mut self.key {
            key.push(match escape {
                CharEscape::Quote => '"',
                CharEscape::ReverseSolidus => '\\',
                CharEscape::Solidus => '/',
                CharEscape::Backspace => '\u{8}',
                CharEscape::FormFeed => '\u{c}',
                CharEscape::LineFeed => '\n',
                CharEscape::CarriageReturn => '\r',
                CharEscape::Tab => '\t',
                CharEscape::AsciiControl(byte) => char::from(byte),
            });
        }
        serde_json::ser::CompactFormatter.write_char_escape(writer, escape)
    }

    fn write_raw_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        _writer: &mut W,
        _fragment: &str,
    ) -> std::io::Result<()> {
        // Raw JSON has its own key order: the crate's formatter parses and sorts it.
        Err(std::io::Error::new(UNSORTED, "raw JSON"))
    }

    fn begin_object<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.not_in_key()?;
        self.last.push(None);
        writer.write_all(b"{")
    }

    fn end_object<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.last.pop();
        writer.write_all(b"}")
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        let mut key = std::mem::take(&mut self.spare);
        key.clear();
        self.key = Some(key);
        if first {
            Ok(())
        } else {
            writer.write_all(b",")
        }
    }

    fn end_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        _writer: &mut W,
    ) -> std::io::Result<()> {
        let key = self.key.take().unwrap_or_default();
        let Some(last) = self.last.last_mut() else {
            return Err(std::io::Error::new(UNSORTED, "a key outside an object"));
        };
        if let Some(previous) = last {
            // Below U+E000 (every key of a receipt) UTF-16 sorts as UTF-8 does, bytewise.
            let order = if key_sorts_as_utf8(previous) && key_sorts_as_utf8(&key) {
                previous.as_bytes().cmp(key.as_bytes())
            } else {
                previous.encode_utf16().cmp(key.encode_utf16())
            };
            if order != std::cmp::Ordering::Less {
                return Err(std::io::Error::new(UNSORTED, "keys out of JCS order"));
            }
        }
        if let Some(previous) = last.replace(key) {
            self.spare = previous;
        }
        Ok(())
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b":")
    }

    fn end_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        _writer: &mut W,
    ) -> std::io::Result<()> {
        Ok(())
    }
}

/// SHA-256, as lowercase hex, of `value` in the receipt form of canonical JSON: a receipt's
/// `args_sha256` of its call's arguments, its `result_sha256` of the result.
pub fn jcs_value_sha256(value: &Value) -> String {
    jcs_value_digest(value).into_hex().into()
}

/// [`jcs_value_sha256`], as a draft receipt keeps it (a receipt's result digest).
pub(crate) fn jcs_value_digest(value: &Value) -> DraftDigest {
    // The key form's text is the receipt form's when the value has no float and no key with a
    // character from U+E000 up (below it, UTF-8 and UTF-16 sort alike), and it is written
    // several times faster: most arguments and results are such values.
    if key_form_is_jcs(value) {
        with_key_form(value, |text| {
            DraftDigest::Sha256(Sha256::digest(text).into())
        })
    } else {
        Hex::from(jcs_sha256(value)).into()
    }
}

/// As [`jcs_value_sha256`], for a value whose key form is already written (`key`, which must
/// be [`key_json`] of `value`): a call's arguments, whose key form identifies the call. When
/// that text is the value's JCS text, it is hashed later, by whoever makes the receipt.
pub(crate) fn jcs_value_digest_keyed(value: &Value, key: &Arc<str>) -> DraftDigest {
    if key_form_is_jcs(value) {
        DraftDigest::OfText(Arc::clone(key))
    } else {
        Hex::from(jcs_sha256(value)).into()
    }
}

/// Appends `text` as JCS writes a string: between quotes as it is when nothing in it needs
/// escaping, else escaped as `serde_json` escapes (JCS's escapes).
pub(crate) fn push_jcs_string(text: &str, out: &mut Vec<u8>) {
    if is_plain(text.as_bytes()) {
        push_quoted(text.as_bytes(), out);
    } else {
        // Writing into a `Vec` cannot fail, and a `str` always serialises.
        let _ = serde_json::to_writer(&mut *out, text);
    }
}

/// [`push_jcs_string`] of a digest, known to need no escaping when it was made, and written
/// without its bytes being checked again (a digest's hex digits are most of a receipt's text).
pub(crate) fn push_jcs_hex(hex: &Hex, out: &mut Vec<u8>) {
    if hex.is_plain() {
        push_quoted(hex.as_bytes(), out);
    } else {
        push_jcs_string(hex, out);
    }
}

/// `text` between quotes.
fn push_quoted(text: &[u8], out: &mut Vec<u8>) {
    out.reserve(text.len() + 2);
    out.push(b'"');
    out.extend_from_slice(text);
    out.push(b'"');
}

/// Appends JCS's text of `value` when it is a whole number of thousandths below 2^42 in size
/// (see [`thousandths`]); `false`, with `out` untouched, for any other float.
pub(crate) fn push_jcs_thousandths(value: f64, out: &mut Vec<u8>) -> bool {
    match thousandths(value) {
        Some((text, len)) => {
            out.extend_from_slice(&text[..len]);
            true
        }
        None => false,
    }
}

/// JCS's text of `value` when it is a whole number of thousandths below 2^42 in size (a
/// receipt's milliseconds, most prices): its digits, a point and at most three decimals, without
/// trailing zeros, which is ECMAScript's shortest form, since doubles there are closer together
/// than half a thousandth; `None` for any other float, which `canon-json` writes. As bytes in a
/// buffer, and their length.
fn thousandths(value: f64) -> Option<([u8; 24], usize)> {
    let scaled = (value * 1000.0).round();
    // A NaN is not below the bound either: `is_finite` first, then the size.
    if !value.is_finite() || value.abs() >= 4.0e12 || scaled / 1000.0 != value {
        return None;
    }
    let mut out = [0u8; 24];
    let mut len = 0;
    let mut push = |bytes: &[u8]| {
        out[len..len + bytes.len()].copy_from_slice(bytes);
        len += bytes.len();
    };
    // Below 2^42 · 1000 < 2^52: exact as an integer.
    let k = scaled as i64;
    if k < 0 {
        push(b"-");
    }
    let (whole, mut fraction) = (k.unsigned_abs() / 1000, k.unsigned_abs() % 1000);
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = whole;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    push(&digits[at..]);
    if fraction != 0 {
        let mut digits = [b'0'; 3];
        for d in digits.iter_mut().rev() {
            *d = b'0' + (fraction % 10) as u8;
            fraction /= 10;
        }
        let used = 3 - digits.iter().rev().take_while(|&&d| d == b'0').count();
        push(b".");
        push(&digits[..used]);
    }
    Some((out, len))
}

/// Whether a key's characters are all below U+E000, where UTF-16 and UTF-8 sort alike.
fn key_sorts_as_utf8(key: &str) -> bool {
    key.bytes().all(|b| b < 0xEE)
}

/// Whether `value`'s key form and receipt form are the same text (see [`jcs_value_sha256`]).
fn key_form_is_jcs(value: &Value) -> bool {
    match value {
        Value::Number(n) => !n.is_f64(),
        Value::Array(items) => items.iter().all(key_form_is_jcs),
        Value::Object(map) => map
            .iter()
            .all(|(key, item)| key_sorts_as_utf8(key) && key_form_is_jcs(item)),
        Value::Null | Value::Bool(_) | Value::String(_) => true,
    }
}

/// `value` in the receipt form of canonical JSON (RFC 8785, integers held exactly written as
/// their exact digits; see the module's docs), as text.
///
/// # Errors
///
/// A `serde_json` error if the value cannot be written as JCS; a [`Value`] always can (its
/// floats are finite, its keys strings).
pub fn jcs(value: &Value) -> Result<String, serde_json::Error> {
    let mut out = Vec::with_capacity(128);
    let mut serializer =
        serde_json::Serializer::with_formatter(&mut out, canon_json::CanonicalFormatter::new());
    value.serialize(&mut serializer)?;
    // The formatter writes UTF-8 only; a failure here would be its bug, reported as an error.
    String::from_utf8(out).map_err(|e| serde::ser::Error::custom(e.to_string()))
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            out.push('{');
            // A map whose keys come sorted (serde_json's default) is written as it is; only
            // another order is copied out and sorted first.
            if map.keys().is_sorted() {
                write_entries(map.iter(), out);
            } else {
                let mut entries: Vec<_> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                write_entries(entries.into_iter(), out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::String(text) => write_string(text, out),
        Value::Number(n) => {
            // Integers (most numbers of arguments and results) by `itoa`, as `serde_json`
            // writes them, without going through `fmt`.
            if let Some(n) = n.as_u64() {
                out.push_str(itoa::Buffer::new().format(n));
            } else if let Some(n) = n.as_i64() {
                out.push_str(itoa::Buffer::new().format(n));
            } else {
                use std::fmt::Write;
                // `Number`'s `Display` is its JSON; written in place, without a string of
                // its own.
                let _ = write!(out, "{n}");
            }
        }
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Null => out.push_str("null"),
    }
}

/// A map's entries, in the order given, separated by commas.
fn write_entries<'a>(entries: impl Iterator<Item = (&'a String, &'a Value)>, out: &mut String) {
    for (i, (key, item)) in entries.enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(key, out);
        out.push(':');
        write_canonical(item, out);
    }
}

/// A JSON string: as it is between quotes when nothing in it needs escaping (the usual case
/// for keys and identifiers), else escaped by serde_json.
fn write_string(text: &str, out: &mut String) {
    if is_plain(text.as_bytes()) {
        out.push('"');
        out.push_str(text);
        out.push('"');
    } else {
        out.push_str(&Value::String(text.to_string()).to_string());
    }
}

/// Whether no byte of `text` needs escaping in a JSON string (a control character, `"` or
/// `\`). Eight bytes are looked at a time, as one word: a string of a receipt or a call's
/// arguments is mostly digests and names, and byte by byte this was 2 k instructions a call.
pub(super) fn is_plain(text: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    const fn has_zero(w: u64) -> bool {
        w.wrapping_sub(ONES) & !w & HIGHS != 0
    }
    let plain = |b: &u8| *b >= 0x20 && *b != b'"' && *b != b'\\';
    let mut words = text.chunks_exact(8);
    for chunk in &mut words {
        let w = u64::from_ne_bytes(chunk.try_into().expect("chunks of eight bytes"));
        // A byte under 0x20 (found exactly: none is when the test is false), a `"`, a `\`.
        let suspect = w.wrapping_sub(ONES * 0x20) & !w & HIGHS != 0
            || has_zero(w ^ (ONES * u64::from(b'"')))
            || has_zero(w ^ (ONES * u64::from(b'\\')));
        // The word tests may flag a plain word; never the other way round.
        if suspect && !chunk.iter().all(plain) {
            return false;
        }
    }
    words.remainder().iter().all(plain)
}

/// SHA-256 of `text` (or of any bytes), as lowercase hex.
pub(crate) fn sha256_hex(text: impl AsRef<[u8]>) -> String {
    hex32(Sha256::digest(text.as_ref()).into())
}

/// HMAC-SHA-256 of `text` under `key`, as lowercase hex.
pub(crate) fn hmac_sha256_hex(key: &[u8; 32], text: impl AsRef<[u8]>) -> String {
    use hmac::Mac;
    // Any key length is valid for HMAC.
    let mut mac = <hmac::Hmac<Sha256> as hmac::Mac>::new_from_slice(key)
        .expect("HMAC takes a key of any length");
    mac.update(text.as_ref());
    hex32(mac.finalize().into_bytes().into())
}

/// 32 bytes as lowercase hex.
fn hex32(bytes: [u8; 32]) -> String {
    String::from(Hex::digest(&bytes))
}

/// [`sha256_hex`], kept inline (a receipt's digests).
pub(crate) fn sha256_digest(text: impl AsRef<[u8]>) -> Hex {
    Hex::digest(&Sha256::digest(text.as_ref()).into())
}

/// The two lowercase hex digits of every byte, looked up once rather than computed twice a
/// byte (every digest goes through [`Hex::digest`]).
pub(super) static HEX_PAIRS: [[u8; 2]; 256] = {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut pairs = [[0u8; 2]; 256];
    let mut i = 0;
    while i < 256 {
        pairs[i] = [HEX[i >> 4], HEX[i & 0xf]];
        i += 1;
    }
    pairs
};

/// A duration in seconds as a person writes it: `60`, `0.5`.
pub(crate) fn seconds(d: std::time::Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{}", s as u64)
    } else {
        format!("{s}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A value to be hashed later, as a call's outcome is.
    impl LaterValue for Value {
        fn later_value(&self) -> Option<&Value> {
            Some(self)
        }
    }

    /// A value's digest and shared key form through the thread's buffer are those of its key
    /// form written afresh; a large one's text is not kept by the thread afterwards.
    #[test]
    fn the_thread_s_buffer_gives_the_key_form_and_keeps_no_large_text() {
        let small = json!({"b": [1, 2], "a": "x"});
        let large = json!({ "text": "y".repeat(100_000), "n": 7 });
        for value in [&small, &large, &small] {
            assert_eq!(&*key_json_shared(value), key_json(value));
            assert_eq!(
                jcs_value_digest(value).into_hex(),
                sha256_hex(key_json(value))
            );
            assert!(TEXT.with_borrow(String::capacity) <= KEPT_TEXT);
        }
    }

    /// `value` as `canon-json`'s own formatter writes it (sorting every object).
    fn crate_jcs(value: &impl Serialize) -> String {
        let mut out = Vec::new();
        let mut serializer =
            serde_json::Serializer::with_formatter(&mut out, canon_json::CanonicalFormatter::new());
        value.serialize(&mut serializer).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// The word-at-a-time test agrees with the byte-by-byte one for every byte at every place
    /// of a word and of the tail, next to plain and to high bytes.
    #[test]
    fn plain_strings_are_found_a_word_at_a_time() {
        let naive = |t: &[u8]| t.iter().all(|&b| b >= 0x20 && b != b'"' && b != b'\\');
        for fill in [b'a', 0x7f, 0xff, 0x21, 0x5d] {
            for len in [1, 7, 8, 9, 16, 19] {
                for at in 0..len {
                    for b in 0..=255u8 {
                        let mut text = vec![fill; len];
                        text[at] = b;
                        assert_eq!(is_plain(&text), naive(&text), "{text:?}");
                    }
                }
            }
        }
    }

    proptest::proptest! {
        /// Numbers, booleans and null are written as `serde_json` writes them: integers of
        /// every size and sign, and floats, through their own paths.
        #[test]
        fn scalars_are_written_as_serde_json_writes_them(
            unsigned in proptest::num::u64::ANY,
            signed in proptest::num::i64::ANY,
            float in proptest::num::f64::NORMAL | proptest::num::f64::SUBNORMAL | proptest::num::f64::ZERO,
            flag in proptest::bool::ANY,
        ) {
            let value = json!([unsigned, signed, float, flag, null, u64::MAX, i64::MIN, -0.0]);
            proptest::prop_assert_eq!(key_json(&value), serde_json::to_string(&value).unwrap());
        }
    }

    #[test]
    fn keys_are_sorted_at_every_depth() {
        let v = json!({"b": 1, "a": {"d": [1, {"z": null, "y": "s"}], "c": 2.5}});
        assert_eq!(
            key_json(&v),
            r#"{"a":{"c":2.5,"d":[1,{"y":"s","z":null}]},"b":1}"#
        );
    }

    #[test]
    fn strings_are_escaped() {
        assert_eq!(key_json(&json!({"k\"": "a\nb"})), r#"{"k\"":"a\nb"}"#);
        // The fast path for strings without escapes writes what serde_json writes.
        for text in [
            "plain",
            "ünïcödé ✓",
            "del\u{7f}",
            "tab\t",
            "nul\0",
            "back\\slash",
            "",
            "q\"",
        ] {
            let value = Value::String(text.to_string());
            assert_eq!(key_json(&value), value.to_string(), "{text:?}");
        }
    }

    /// The streaming formatter writes what `canon-json` writes, or gives the value back to it:
    /// keys in JCS order and out of it, at every depth, in structs and maps, with escapes.
    #[test]
    fn streamed_jcs_is_the_crate_s_jcs() {
        fn streamed(value: &impl Serialize) -> Option<String> {
            let mut out = Vec::new();
            let mut serializer =
                serde_json::Serializer::with_formatter(&mut out, InOrder::default());
            value.serialize(&mut serializer).ok()?;
            Some(String::from_utf8(out).unwrap())
        }
        let in_order = [
            json!({"a": 1, "b": [1.0, -0.0, 1e21, {"c\n": null, "d\"": "e\u{1}"}], "é": {}}),
            json!([{"\u{e000}": 1, "\u{ff61}": 2}, 9_007_199_254_740_993_u64, "x"]),
            json!({"😀": {"z": [[]]}}),
        ];
        for value in &in_order {
            assert_eq!(
                streamed(value).as_deref(),
                Some(crate_jcs(value).as_str()),
                "{value}"
            );
            assert_eq!(jcs_sha256(value), sha256_hex(crate_jcs(value)));
        }
        // serde_json's map sorts by UTF-8: these keys are out of JCS order, and so is a struct
        // whose fields are not declared sorted.
        #[derive(Serialize)]
        struct Unsorted {
            b: u8,
            a: u8,
        }
        let out_of_order = [
            json!({"\u{ff61}": 1, "😀": 2}),
            json!([1, {"a": {"\u{e000}": 1, "\u{10000}": 2}}]),
        ];
        for value in &out_of_order {
            assert_eq!(streamed(value), None, "{value}");
            assert_eq!(jcs_sha256(value), sha256_hex(crate_jcs(value)));
        }
        assert_eq!(streamed(&Unsorted { b: 1, a: 2 }), None);
        assert_eq!(
            jcs_sha256(&Unsorted { b: 1, a: 2 }),
            sha256_hex(r#"{"a":2,"b":1}"#)
        );
        // A map with keys that are not strings is not hashed (nor does anything panic).
        let numbered: std::collections::BTreeMap<u8, u8> = [(1, 2)].into();
        assert!(jcs_sha256(&numbered).starts_with("unhashable"));
    }

    /// A value's digest is that of its JCS text whether or not it takes the key form's fast
    /// path: integers (beyond 2^53 too), floats, escapes, keys on both sides of U+E000 and
    /// beyond U+FFFF, long strings, at every depth.
    #[test]
    fn a_value_s_digest_is_that_of_its_jcs_text() {
        let values = [
            json!({"b": [1, -2, 9_007_199_254_740_993_u64, i64::MIN], "a": {"x\n\"": null}}),
            json!({"a": 1.5, "b": [3.0, -0.0, 1e21, 5e-7]}),
            json!({"\u{e000}": 1, "\u{ff61}": 2, "😀": 3, "z": [true, false]}),
            json!({"😀": {"a": "\u{1}\u{1f}\u{7f}é"}, "b": "x".repeat(3000)}),
            json!([[[[{"k": "v"}]]], "", 0, -1]),
            json!("plain"),
            json!(7),
            json!(2.5),
        ];
        for value in &values {
            let text = jcs(value).unwrap();
            assert_eq!(jcs_value_sha256(value), sha256_hex(&text), "{value}");
            let key: Arc<str> = key_json(value).into();
            assert_eq!(
                jcs_value_digest_keyed(value, &key).into_hex(),
                sha256_hex(&text)
            );
            assert_eq!(
                DraftDigest::OfValue(Arc::new(value.clone())).into_hex(),
                sha256_hex(&text),
                "hashed later, from the outcome"
            );
            assert_eq!(jcs_sha256(value), sha256_hex(&text), "{value}");
        }
        assert!(key_form_is_jcs(&values[0]) && !key_form_is_jcs(&values[1]));
        assert!(!key_form_is_jcs(&values[2]) && key_form_is_jcs(&values[4]));
    }

    /// A float written as thousandths is what `canon-json` writes (ECMAScript's shortest form),
    /// for every thousandth near the edges and a spread of others.
    #[test]
    fn thousandths_are_written_as_jcs_writes_them() {
        let mut checked = 0;
        let mut k: i64 = 1;
        let mut values = vec![
            0.0,
            -0.0,
            0.001,
            -0.001,
            0.1,
            1.0,
            3.0,
            12.5,
            1e6,
            4.0e12 - 0.001,
        ];
        while k < 4_000_000_000_000_000 {
            values.push(k as f64 / 1000.0);
            values.push(-((k + 7) as f64) / 1000.0);
            k = k * 3 + 1;
        }
        values.extend((0..2000).map(|i| f64::from(i) * 0.001 + 1_700_000_000.0));
        values.extend([0.0005, 1e-7, 1.0000001, 4.1e12, f64::MAX, 123.4567]);
        for x in values {
            let mut out = Vec::new();
            let mut serializer =
                serde_json::Serializer::with_formatter(&mut out, InOrder::default());
            x.serialize(&mut serializer).unwrap();
            assert_eq!(String::from_utf8(out).unwrap(), crate_jcs(&x), "{x}");
            checked += usize::from(thousandths(x).is_some());
        }
        assert!(checked > 2000, "{checked}");
    }

    #[test]
    fn sha256_of_empty_string() {
        assert_eq!(
            sha256_hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
