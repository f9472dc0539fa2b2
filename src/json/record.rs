//! JCS text of a record — a struct of scalars, options, unit variants and records — written
//! straight from its serde derive, without `serde_json`'s machinery: a receipt is written once
//! per call, and that machinery costs more than the text.
//!
//! The writer takes what it can write exactly as JCS does and refuses the rest with
//! [`NotARecord`] (a sequence, a map, a float outside [`thousandths`](super::thousandths), a
//! field out of JCS order, a field name that is not an identifier), so that the caller writes
//! the value the general way instead. It never writes text that is not the value's JCS.

use std::fmt;

use serde::ser::{Impossible, Serialize, SerializeStruct, Serializer};

/// The value is not a record this writer takes.
#[derive(Debug)]
pub(super) struct NotARecord;

impl fmt::Display for NotARecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a record of scalars")
    }
}

impl std::error::Error for NotARecord {}

impl serde::ser::Error for NotARecord {
    fn custom<T: fmt::Display>(_: T) -> Self {
        NotARecord
    }
}

/// Writes `value`'s JCS text into `out`; on [`NotARecord`], `out` holds a part of it.
pub(super) fn write<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) -> Result<(), NotARecord> {
    value.serialize(Record { out })
}

struct Record<'a> {
    out: &'a mut Vec<u8>,
}

impl Record<'_> {
    fn integer(self, n: impl itoa::Integer) -> Result<(), NotARecord> {
        self.out
            .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        Ok(())
    }
}

/// `text` as a JSON string, escaped as JCS escapes (`serde_json`'s escapes are JCS's).
fn string(text: &str, out: &mut Vec<u8>) -> Result<(), NotARecord> {
    if super::is_plain(text.as_bytes()) {
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
        Ok(())
    } else {
        serde_json::to_writer(out, text).map_err(|_| NotARecord)
    }
}

impl<'a> Serializer for Record<'a> {
    type Ok = ();
    type Error = NotARecord;
    type SerializeSeq = Impossible<(), NotARecord>;
    type SerializeTuple = Impossible<(), NotARecord>;
    type SerializeTupleStruct = Impossible<(), NotARecord>;
    type SerializeTupleVariant = Impossible<(), NotARecord>;
    type SerializeMap = Impossible<(), NotARecord>;
    type SerializeStruct = Fields<'a>;
    type SerializeStructVariant = Impossible<(), NotARecord>;

    fn serialize_bool(self, v: bool) -> Result<(), NotARecord> {
        self.out
            .extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result<(), NotARecord> {
        self.integer(v)
    }
    fn serialize_i16(self, v: i16) -> Result<(), NotARecord> {
        self.integer(v)
    }
    fn serialize_i32(self, v: i32) -> Result<(), NotARecord> {
        self.integer(v)
    }
    fn serialize_i64(self, v: i64) -> Result<(), NotARecord> {
        self.integer(v)
    }
    fn serialize_u8(self, v: u8) -> Result<(), NotARecord> {
        self.integer(v)
    }
    fn serialize_u16(self, v: u16) -> Result<(), NotARecord> {
        self.integer(v)
    }
    fn serialize_u32(self, v: u32) -> Result<(), NotARecord> {
        self.integer(v)
    }
    fn serialize_u64(self, v: u64) -> Result<(), NotARecord> {
        self.integer(v)
    }
    fn serialize_f32(self, v: f32) -> Result<(), NotARecord> {
        self.serialize_f64(f64::from(v))
    }
    fn serialize_f64(self, v: f64) -> Result<(), NotARecord> {
        let (text, len) = super::thousandths(v).ok_or(NotARecord)?;
        self.out.extend_from_slice(&text[..len]);
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), NotARecord> {
        string(v.encode_utf8(&mut [0; 4]), self.out)
    }
    fn serialize_str(self, v: &str) -> Result<(), NotARecord> {
        string(v, self.out)
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<(), NotARecord> {
        Err(NotARecord)
    }
    fn serialize_none(self) -> Result<(), NotARecord> {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), NotARecord> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), NotARecord> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), NotARecord> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<(), NotARecord> {
        string(variant, self.out)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), NotARecord> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), NotARecord> {
        Err(NotARecord)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, NotARecord> {
        Err(NotARecord)
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, NotARecord> {
        Err(NotARecord)
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, NotARecord> {
        Err(NotARecord)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, NotARecord> {
        Err(NotARecord)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, NotARecord> {
        Err(NotARecord)
    }
    fn serialize_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStruct, NotARecord> {
        self.out.push(b'{');
        Ok(Fields {
            out: self.out,
            last: None,
        })
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, NotARecord> {
        Err(NotARecord)
    }
}

/// A record's fields, each checked to come after the one before in JCS order.
struct Fields<'a> {
    out: &'a mut Vec<u8>,
    /// The name of the field written last.
    last: Option<&'static str>,
}

impl SerializeStruct for Fields<'_> {
    type Ok = ();
    type Error = NotARecord;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), NotARecord> {
        // Names of identifier characters: ASCII, so that byte order is UTF-16 order, and
        // written as they are.
        let identifier = key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !identifier || self.last.is_some_and(|last| last >= key) {
            return Err(NotARecord);
        }
        if self.last.is_some() {
            self.out.push(b',');
        }
        self.last = Some(key);
        self.out.push(b'"');
        self.out.extend_from_slice(key.as_bytes());
        self.out.extend_from_slice(b"\":");
        value.serialize(Record { out: self.out })
    }

    fn end(self) -> Result<(), NotARecord> {
        self.out.push(b'}');
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde::Serialize;

    use super::{write, NotARecord};

    #[derive(Serialize)]
    #[serde(rename_all = "snake_case")]
    enum Kind {
        Ok,
        NotOk,
    }

    #[derive(Serialize)]
    struct Inner {
        a: Option<i64>,
        b: String,
    }

    /// Fields in JCS order, as a receipt declares them.
    #[derive(Serialize)]
    struct Sorted {
        big: u64,
        f: f64,
        inner: Inner,
        kind: Kind,
        none: Option<String>,
        #[serde(skip_serializing_if = "String::is_empty")]
        skipped: String,
        text: String,
        z: bool,
    }

    #[derive(Serialize)]
    struct Unsorted {
        b: u8,
        a: u8,
    }

    #[derive(Serialize)]
    struct Renamed {
        #[serde(rename = "a\"b")]
        a: u8,
    }

    #[derive(Serialize)]
    struct WithList {
        a: Vec<u8>,
    }

    fn text_of(value: &impl Serialize) -> Result<String, NotARecord> {
        let mut out = Vec::new();
        write(value, &mut out)?;
        Ok(String::from_utf8(out).unwrap())
    }

    fn jcs_of(value: &impl Serialize) -> String {
        super::super::jcs(&serde_json::to_value(value).unwrap()).unwrap()
    }

    proptest! {
        /// Whatever it writes is the value's JCS text; what it refuses is a float JCS writes
        /// in another form.
        #[test]
        fn a_record_s_text_is_its_jcs(
            big in any::<u64>(),
            f in prop_oneof![any::<f64>().prop_filter("finite", |f| f.is_finite()), (-4_000_000i64..4_000_000).prop_map(|k| k as f64 / 1000.0)],
            a in any::<Option<i64>>(),
            b in any::<String>(),
            text in "[ -~\\n\\t\"\\\\\u{1}-\u{1f}é😀]{0,40}",
            skipped in "x?",
            z in any::<bool>(),
            ok in any::<bool>(),
        ) {
            let value = Sorted {
                big, f, inner: Inner { a, b }, kind: if ok { Kind::Ok } else { Kind::NotOk },
                none: None, skipped, text, z,
            };
            match text_of(&value) {
                Ok(text) => prop_assert_eq!(text, jcs_of(&value)),
                Err(NotARecord) => prop_assert!(super::super::thousandths(f).is_none()),
            }
        }
    }

    #[test]
    fn fields_out_of_order_and_lists_are_refused() {
        assert!(text_of(&Unsorted { b: 1, a: 2 }).is_err());
        assert!(text_of(&Renamed { a: 1 }).is_err());
        assert!(text_of(&WithList { a: vec![1] }).is_err());
        assert!(text_of(&vec![1]).is_err());
    }
}
