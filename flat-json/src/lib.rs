//! A JSON object of plain scalars (`{"i":5}`, `{"done":true,"name":"Ada"}`),
//! read without serde's visitor machinery, or not at all.
//!
//! serde_json reads such an object through its generic deserializer, which
//! made reading a node's one-key vars patch a twentieth of a whole
//! in-memory step of the stepwell host, and reading a step's vars in the
//! guest SDK as much again. [`read_flat_object`] takes only text it can
//! read exactly as serde_json would, and gives up on anything else
//! (escapes, floats, nesting, big or negative-zero numbers, bad syntax):
//! the caller then reads the text with serde_json, which accepts or refuses
//! it as it always did.
//!
//! ```
//! use stepwell_flat_json::read_flat_object;
//! let map = read_flat_object(r#"{"i": 5, "name": "Ada"}"#).unwrap();
//! assert_eq!(map["i"], 5);
//! assert!(read_flat_object(r#"{"i": 5.5}"#).is_none()); // serde_json's to read
//! ```

use serde_json::{Map, Value};

/// The digits an integer may have here: 18 fit both `u64` and `i64`.
const MAX_DIGITS: usize = 18;

/// Why [`read_object`] found no object.
#[derive(Debug)]
pub enum NotAnObject {
    /// The text is not JSON.
    Json(serde_json::Error),
    /// The text is JSON of another kind: this value.
    Other(Value),
}

/// `text` as a JSON object, as `serde_json::from_str` reads it: a flat one
/// by [`read_flat_object`], any other by serde_json.
pub fn read_object(text: &str) -> Result<Map<String, Value>, NotAnObject> {
    if let Some(map) = read_flat_object(text) {
        return Ok(map);
    }
    match serde_json::from_str(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(NotAnObject::Other(other)),
        Err(e) => Err(NotAnObject::Json(e)),
    }
}

/// `text` as a JSON object of plain scalars, or `None` when it is not one
/// this reader takes (then `serde_json::from_str` decides).
///
/// Whatever it returns, `serde_json::from_str::<Value>(text)` returns as
/// `Value::Object` too (a later key replaces an earlier one of the same
/// name, as there).
pub fn read_flat_object(text: &str) -> Option<Map<String, Value>> {
    let b = text.as_bytes();
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(b, i + 1);
    let mut map = Map::new();
    if b.get(i) == Some(&b'}') {
        return at_end(b, i + 1).then_some(map);
    }
    loop {
        let (key, next) = plain_string(text, i)?;
        // serde_json with its `raw_value` feature (which a dependency may
        // turn on) reads an object keyed `$serde_json::private::RawValue`
        // as the JSON in its string: such keys are left to it.
        if key.starts_with('$') {
            return None;
        }
        i = skip_ws(b, next);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(b, i + 1);
        let (value, next) = scalar(text, i)?;
        map.insert(key.to_string(), value);
        i = skip_ws(b, next);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => return at_end(b, i + 1).then_some(map),
            _ => return None,
        }
    }
}

/// The index of the first byte at or after `i` that is not JSON
/// whitespace.
fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// Whether only whitespace follows `i`.
fn at_end(b: &[u8], i: usize) -> bool {
    skip_ws(b, i) == b.len()
}

/// The string that starts at `i` (its opening quote) and the index after
/// its closing quote, if it has no escape and no control character.
fn plain_string(text: &str, i: usize) -> Option<(&str, usize)> {
    let b = text.as_bytes();
    if b.get(i) != Some(&b'"') {
        return None;
    }
    let mut j = i + 1;
    loop {
        match *b.get(j)? {
            b'"' => return Some((&text[i + 1..j], j + 1)),
            b'\\' | 0..=0x1f => return None,
            _ => j += 1,
        }
    }
}

/// The scalar that starts at `i` and the index after it: `true`, `false`,
/// `null`, a plain string, or an integer of at most 18 digits (not `-0`).
fn scalar(text: &str, i: usize) -> Option<(Value, usize)> {
    let b = text.as_bytes();
    let word = |w: &str, v: Value| b[i..].starts_with(w.as_bytes()).then(|| (v, i + w.len()));
    match *b.get(i)? {
        b't' => word("true", Value::Bool(true)),
        b'f' => word("false", Value::Bool(false)),
        b'n' => word("null", Value::Null),
        b'"' => plain_string(text, i).map(|(s, next)| (Value::String(s.to_string()), next)),
        b'-' | b'0'..=b'9' => integer(b, i),
        _ => None,
    }
}

/// The integer at `i`: `-?(0|[1-9][0-9]*)` followed by neither a fraction
/// nor an exponent. serde_json reads `-0` as a float: left to it.
fn integer(b: &[u8], i: usize) -> Option<(Value, usize)> {
    let negative = b[i] == b'-';
    let start = i + usize::from(negative);
    let mut j = start;
    let mut n: u64 = 0;
    while let Some(d @ b'0'..=b'9') = b.get(j).copied() {
        if j - start == MAX_DIGITS {
            // A 19th digit: more than this reader takes (and `n` would
            // overflow by the 20th).
            return None;
        }
        n = n * 10 + u64::from(d - b'0');
        j += 1;
    }
    let digits = j - start;
    let leading_zero = b.get(start) == Some(&b'0');
    if digits == 0
        || digits > MAX_DIGITS
        || (leading_zero && (digits > 1 || negative))
        || matches!(b.get(j), Some(b'.' | b'e' | b'E'))
    {
        return None;
    }
    let value = if negative {
        // At most 18 digits: no overflow.
        Value::from(-(n as i64))
    } else {
        Value::from(n)
    };
    Some((value, j))
}

/// An integer literal of a JSON text that no 64-bit integer holds:
/// serde_json (without `arbitrary_precision`) would read it as the nearest
/// `f64` (`123456789012345678901234567890` as `1.2345678901234568e29`),
/// changing it without a word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InexactInteger {
    /// Where it is: object keys and array indices from the top, as
    /// `a.b[2]` (empty for the top value itself).
    pub path: String,
    /// The literal as written.
    pub literal: String,
}

/// Where one value of a JSON text is, while [`find_inexact_integer`] walks
/// it.
enum Frame {
    /// In an object: the key of the value being read, if read yet.
    Object(Option<String>),
    /// In an array: the index of the value being read.
    Array(usize),
}

/// The first integer literal of `text` (one without a fraction or an
/// exponent: those are floats on purpose) that fits neither `i64` nor
/// `u64`, if any. Text that is not JSON is walked as far as it goes (the
/// parser then refuses it anyway). Costs one pass over the bytes, and
/// nothing more unless 19 digits follow one another somewhere.
pub fn find_inexact_integer(text: &str) -> Option<InexactInteger> {
    let b = text.as_bytes();
    let mut run = 0;
    if !b.iter().any(|c| {
        run = if c.is_ascii_digit() { run + 1 } else { 0 };
        run >= 19
    }) {
        return None;
    }
    let mut stack: Vec<Frame> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => {
                let end = string_end(b, i);
                if let Some(Frame::Object(key @ None)) = stack.last_mut() {
                    *key = Some(text.get(i + 1..end - 1).unwrap_or_default().to_string());
                }
                i = end;
                continue;
            }
            b'{' => stack.push(Frame::Object(None)),
            b'[' => stack.push(Frame::Array(0)),
            b'}' | b']' => {
                stack.pop();
            }
            b',' => match stack.last_mut() {
                Some(Frame::Array(n)) => *n += 1,
                Some(Frame::Object(key)) => *key = None,
                None => {}
            },
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < b.len() && matches!(b[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                let literal = &text[start..i];
                let integer = !literal.contains(['.', 'e', 'E']);
                if integer && literal.parse::<i64>().is_err() && literal.parse::<u64>().is_err() {
                    return Some(InexactInteger {
                        path: path_of(&stack),
                        literal: literal.to_string(),
                    });
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Where the string starting at `b[start]` (a `"`) ends: just past its
/// closing quote (or at the end of the text).
fn string_end(b: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    b.len()
}

/// `a.b[2]` for the frames of [`find_inexact_integer`].
fn path_of(stack: &[Frame]) -> String {
    let mut path = String::new();
    for frame in stack {
        match frame {
            Frame::Object(Some(key)) => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
            }
            Frame::Object(None) => {}
            Frame::Array(n) => path.push_str(&format!("[{n}]")),
        }
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What serde_json reads, as an object.
    fn serde(text: &str) -> Option<Map<String, Value>> {
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(m)) => Some(m),
            _ => None,
        }
    }

    #[test]
    fn reads_plain_patches_as_serde_json_does() {
        for text in [
            r#"{"i":5}"#,
            r#"{}"#,
            " { } ",
            r#"{"a":true,"b":false,"c":null,"d":"x y","e":-17,"f":0}"#,
            "{\n \"i\" : 123456789012345678 ,\t\"j\":\"\"\r}\n",
            r#"{"a":1,"a":2}"#,
            r#"{"ünï":"cödé ✓"}"#,
            r#"{"n":-123456789012345678}"#,
        ] {
            let fast = read_flat_object(text);
            assert!(fast.is_some(), "not read: {text}");
            assert_eq!(fast, serde(text), "{text}");
        }
    }

    #[test]
    fn reads_any_object_and_says_why_not() {
        assert_eq!(
            read_object(r#"{"i":5}"#).unwrap(),
            serde(r#"{"i":5}"#).unwrap()
        );
        let nested = r#"{"a":{"b":[1.5]}}"#;
        assert_eq!(read_object(nested).unwrap(), serde(nested).unwrap());
        assert!(matches!(
            read_object("[1]"),
            Err(NotAnObject::Other(Value::Array(_)))
        ));
        assert!(matches!(read_object("{"), Err(NotAnObject::Json(_))));
    }

    #[test]
    fn leaves_everything_else_to_serde_json() {
        for text in [
            r#"{"a":1.5}"#,
            r#"{"a":1e3}"#,
            r#"{"a":-0}"#,
            r#"{"a":01}"#,
            r#"{"a":1234567890123456789}"#,
            r#"{"a":123456789012345678901234567890}"#,
            r#"{"a":-99999999999999999999999}"#,
            r#"{"a":"\n"}"#,
            r#"{"a\"b":1}"#,
            "{\"a\":\"\u{1}\"}",
            r#"{"a":{"b":1}}"#,
            r#"{"a":[1]}"#,
            r#"{"a":1,}"#,
            r#"{"a" 1}"#,
            r#"{"a":tru}"#,
            r#"{"a":truex}"#,
            r#"{"a":1} x"#,
            r#"{"a":-}"#,
            r#"[1]"#,
            "",
            "{",
            r#"{"a":1"#,
            r#"{a:1}"#,
            r#"{"$serde_json::private::RawValue":"7"}"#,
            r#"{"a":1,"$x":2}"#,
        ] {
            assert_eq!(read_flat_object(text), None, "read: {text}");
        }
    }

    #[test]
    fn never_reads_what_serde_json_reads_otherwise() {
        // `{` and up to five tokens from a small alphabet (1.9 million
        // texts): whatever the fast reader takes, serde_json reads the same.
        let tokens = [
            "}", ",", ":", " ", "\"k\"", "\"v\"", "1", "-2", "0", "-0", "1.0", "true", "null",
            "\"\\n\"", "{", "[]", "e5", "x",
        ];
        let mut texts = vec!["{".to_string()];
        let mut level = texts.clone();
        for _ in 0..5 {
            level = level
                .iter()
                .flat_map(|t| tokens.iter().map(move |tok| format!("{t}{tok}")))
                .collect();
            texts.extend(level.iter().cloned());
        }
        let mut read = 0;
        for text in &texts {
            if let Some(fast) = read_flat_object(text) {
                read += 1;
                assert_eq!(Some(fast), serde(text), "{text}");
            }
        }
        assert!(read > 100, "only {read} texts read");
    }
    #[test]
    fn finds_integers_no_64_bits_hold() {
        let found = |t: &str| find_inexact_integer(t).map(|f| (f.path, f.literal));
        let big = "123456789012345678901234567890";
        assert_eq!(
            found(&format!(r#"{{"a":{{"b":[1,{big}]}}}}"#)),
            Some(("a.b[1]".into(), big.into()))
        );
        assert_eq!(
            found(r#"{"n":-99999999999999999999}"#),
            Some(("n".into(), "-99999999999999999999".into()))
        );
        assert_eq!(found(big), Some((String::new(), big.into())));
        for fits in [
            r#"{"u":18446744073709551615,"i":-9223372036854775808}"#,
            r#"{"f":123456789012345678901234567890.0,"e":1234567890123456789012e3}"#,
            r#"{"s":"123456789012345678901234567890","k\"":1}"#,
            r#"{"123456789012345678901234567890":1}"#,
        ] {
            assert_eq!(found(fits), None, "{fits}");
        }
    }
}
