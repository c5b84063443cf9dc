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

/// Property tests: random texts and values, each checked against serde_json
/// (the reader's oracle) or Rust's own integer parsing.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn config() -> ProptestConfig {
        ProptestConfig {
            cases: 256,
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    /// A JSON scalar as text: mostly what the flat reader takes (and
    /// near misses: `-0`, `01`), else integers at and past the 64-bit
    /// bounds, floats, strings with escapes and non-ASCII.
    fn scalar_text() -> impl Strategy<Value = String> {
        let near = prop_oneof![
            "-?(0|[1-9][0-9]{0,18})",
            Just("-0".to_string()),
            "-?0[0-9]",
            "-?[1-9][eE.][+-]?[0-9]",
            Just("true".to_string()),
            Just("false".to_string()),
            Just("null".to_string()),
            "\"[a-z é]{0,6}\"",
        ];
        let far = prop_oneof![
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            "-?[0-9]{15,30}",
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| format!("{f:e}")),
            "-?[0-9]{1,4}\\.[0-9]{1,6}",
            "[a-zA-Zé€ \\\\\"/\\t]{0,12}".prop_map(|s| serde_json::to_string(&s).unwrap()),
            "\"[a-z]{0,4}(\\\\u00[0-9a-f]{2}|\\\\n)?\"",
        ];
        prop_oneof![4 => near, 1 => far]
    }

    /// A flat object as text (keys may repeat), then maybe damaged: cut
    /// short, or a byte put in.
    fn object_text() -> impl Strategy<Value = String> {
        let pair = ("[a-z_$]{0,6}", scalar_text(), "[ \\n]{0,2}");
        (
            prop::collection::vec(pair, 0..8),
            0u8..4,
            any::<prop::sample::Index>(),
            "[{}\\[\\],:\"0-9a ]",
        )
            .prop_map(|(pairs, damage, at, byte)| {
                let body: Vec<String> = pairs
                    .iter()
                    .map(|(k, v, ws)| format!("{ws}\"{k}\"{ws}:{ws}{v}{ws}"))
                    .collect();
                let text = format!("{{{}}}", body.join(","));
                let cut = at.index(text.len().max(1));
                let cut = (0..=cut)
                    .rev()
                    .find(|i| text.is_char_boundary(*i))
                    .unwrap_or(0);
                match damage {
                    0 => text[..cut].to_string(),
                    1 => format!("{}{byte}{}", &text[..cut], &text[cut..]),
                    _ => text,
                }
            })
    }

    /// Any text, mostly of JSON's own characters.
    fn any_text() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "[{}\\[\\]\":,0-9a-z\\\\ .eE+\\-]{0,40}",
            object_text(),
        ]
    }

    /// A JSON scalar value, small integers often (so that flat objects the
    /// reader takes are common).
    fn scalar() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1_000_000i64..1_000_000).prop_map(Value::from),
            any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
                .map(Value::Number)),
            any::<String>().prop_map(Value::String),
            "[a-z ]{0,8}".prop_map(Value::String),
        ]
    }

    /// An object key: plain, `$`-led, or any text.
    fn key() -> impl Strategy<Value = String> {
        prop_oneof![3 => "[a-z_]{0,6}", 1 => "\\$[a-z]{0,4}", 1 => any::<String>()]
    }

    /// Any JSON value, nested a few levels, objects flat half the time.
    fn value() -> impl Strategy<Value = Value> {
        let flat = prop::collection::btree_map(key(), scalar(), 0..8)
            .prop_map(|m| Value::Object(m.into_iter().collect()));
        let nested = scalar().prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(key(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        });
        prop_oneof![flat, nested]
    }

    /// Whether serde_json's text of `v` is one the flat reader takes: an
    /// object of plain keys (not `$`-led) and of `null`, booleans, plain
    /// strings and integers of at most 18 digits.
    fn flat_readable(v: &Value) -> bool {
        let plain = |s: &str| !s.chars().any(|c| c == '"' || c == '\\' || c < ' ');
        let Value::Object(map) = v else { return false };
        map.iter().all(|(k, v)| {
            plain(k)
                && !k.starts_with('$')
                && match v {
                    Value::Null | Value::Bool(_) => true,
                    Value::String(s) => plain(s),
                    Value::Number(n) => {
                        !n.is_f64() && n.to_string().trim_start_matches('-').len() <= 18
                    }
                    _ => false,
                }
        })
    }

    proptest! {
        #![proptest_config(config())]

        /// No text makes a reader panic, and `read_object` says what
        /// serde_json says: the same object, the same other value, or an
        /// error; whatever the flat reader takes, serde_json reads the same.
        #[test]
        fn any_text_is_read_as_serde_json_reads_it(text in any_text()) {
            let _ = find_inexact_integer(&text);
            let oracle = serde_json::from_str::<Value>(&text);
            if let Some(flat) = read_flat_object(&text) {
                let full = oracle.as_ref().map_err(|e| {
                    TestCaseError::fail(format!("took {text:?}, serde_json: {e}"))
                })?;
                prop_assert_eq!(&Value::Object(flat), full, "{}", text);
            }
            match (read_object(&text), oracle) {
                (Ok(map), Ok(Value::Object(full))) => prop_assert_eq!(map, full),
                (Err(NotAnObject::Other(v)), Ok(full)) => {
                    prop_assert!(!full.is_object());
                    prop_assert_eq!(v, full);
                }
                (Err(NotAnObject::Json(_)), Err(_)) => {}
                (got, want) => prop_assert!(false, "{text:?}: {got:?}, serde_json {want:?}"),
            }
        }

        /// What serde_json writes of any value reads back as that value,
        /// compact or pretty; the flat reader takes exactly the flat objects
        /// of plain keys, strings and integers of up to 18 digits, and
        /// declines nesting, floats, escapes, `$` keys and longer integers.
        #[test]
        fn serde_json_text_reads_back(v in value()) {
            for text in [v.to_string(), serde_json::to_string_pretty(&v).unwrap()] {
                match (read_object(&text), &v) {
                    (Ok(map), Value::Object(want)) => prop_assert_eq!(&map, want),
                    (Err(NotAnObject::Other(got)), want) if !want.is_object() => {
                        prop_assert_eq!(&got, want)
                    }
                    (got, _) => prop_assert!(false, "{text}: {got:?}"),
                }
                let flat = read_flat_object(&text);
                prop_assert_eq!(flat.is_some(), flat_readable(&v), "{}", text);
                if let Some(flat) = flat {
                    prop_assert_eq!(Value::Object(flat), v.clone());
                }
                // serde_json writes only integers that fit 64 bits, and
                // floats with a fraction or an exponent.
                prop_assert_eq!(find_inexact_integer(&text), None);
            }
        }

        /// The scan finds an integer literal exactly when one fits neither
        /// i64 nor u64, and names the first such.
        #[test]
        fn the_integer_scan_finds_exactly_what_does_not_fit(
            ints in prop::collection::vec("-?[1-9][0-9]{0,24}|0", 1..6),
        ) {
            let text = format!("{{\"a\":[{}],\"b\":1.5e300}}", ints.join(","));
            let inexact: Vec<&String> = ints
                .iter()
                .filter(|n| n.parse::<i64>().is_err() && n.parse::<u64>().is_err())
                .collect();
            let found = find_inexact_integer(&text);
            prop_assert_eq!(found.is_some(), !inexact.is_empty(), "{}", text);
            if let Some(found) = found {
                prop_assert_eq!(&found.literal, inexact[0]);
                prop_assert_eq!(found.path, format!(
                    "a[{}]",
                    ints.iter().position(|n| n == inexact[0]).unwrap()
                ));
            }
        }

        /// An integer no 64 bits hold, after any value (whose strings may
        /// hold digits, quotes and escapes), is found where it is.
        #[test]
        fn an_inexact_integer_is_found_past_any_value(
            v in value(),
            big in "-?[1-9][0-9]{20,30}",
        ) {
            let text = format!("[{v},{big}]");
            let found = find_inexact_integer(&text);
            prop_assert_eq!(
                found,
                Some(InexactInteger { path: "[1]".into(), literal: big })
            );
        }
    }

    /// Nesting as deep as any, every depth to 400: serde_json's depth limit
    /// (127 levels) holds through `read_object`, the flat reader takes
    /// nothing nested, and nothing overflows the stack.
    #[test]
    fn depth_is_serde_json_s_to_limit() {
        for depth in 0..400 {
            let text = format!("{{\"a\":{}1{}}}", "[".repeat(depth), "]".repeat(depth));
            assert_eq!(find_inexact_integer(&text), None);
            assert_eq!(read_flat_object(&text).is_some(), depth == 0);
            // The object and `depth` arrays: 127 levels at most.
            assert_eq!(read_object(&text).is_ok(), depth < 127, "depth {depth}");
        }
    }
}
