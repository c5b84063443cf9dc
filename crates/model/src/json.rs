//! JSON as the reference implementation (Python) writes and reads it:
//! canonical text for digests, a creation request's digest, and truth
//! values. The kernel (an explicit-id start's identity, a step's
//! `absorb`) and the automation logic share them.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Canonical JSON, for digests: keys sorted, separators `,` and `:`,
/// non-ASCII kept, numbers as Python's `json.dumps` writes them (`1e+16`,
/// `1e-05`), so a digest is the reference's digest of the same value.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out, false);
    out
}

/// [`canonical_json`] with every non-ASCII character escaped as `\uXXXX`
/// (UTF-16 surrogate pairs beyond the BMP): Python's `json.dumps(v,
/// sort_keys=True, separators=(",", ":"))` with its default `ensure_ascii`,
/// which the reference's effect digests hash.
pub fn canonical_json_ascii(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out, true);
    out
}

fn write_canonical(value: &Value, out: &mut String, ascii: bool) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(k, out, ascii);
                out.push(':');
                write_canonical(&map[k], out, ascii);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out, ascii);
            }
            out.push(']');
        }
        Value::String(s) => write_string(s, out, ascii),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => out.push_str(&i.to_string()),
            (_, Some(u), _) => out.push_str(&u.to_string()),
            (_, _, Some(f)) => out.push_str(&python_float(f)),
            _ => out.push_str(&n.to_string()),
        },
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Null => out.push_str("null"),
    }
}

fn write_string(s: &str, out: &mut String, ascii: bool) {
    // serde_json escapes exactly what Python's json.dumps(ensure_ascii=False)
    // escapes: the quote, the backslash and control characters.
    let text = serde_json::to_string(s).unwrap_or_default();
    if !ascii {
        out.push_str(&text);
        return;
    }
    // Python writes DEL as is, and every character past it as \uXXXX.
    for c in text.chars() {
        if (c as u32) < 0x80 {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
}

/// `repr(f)` of a finite Python float: the shortest digits that read back,
/// in positional notation when the decimal exponent is in -4..16 (`0.0001`,
/// `1000000000000000.0`), else in scientific notation with a sign and at
/// least two exponent digits (`1e+16`, `1.5e-05`).
fn python_float(f: f64) -> String {
    let sign = if f.is_sign_negative() { "-" } else { "" };
    let shortest = format!("{:e}", f.abs());
    // Two candidates of the shortest length can both read back (a tie);
    // CPython takes the correctly rounded one, which exact formatting at
    // that precision gives.
    let digits = shortest
        .split_once('e')
        .map_or(0, |(m, _)| m.chars().filter(char::is_ascii_digit).count());
    let exact = format!("{:.*e}", digits.saturating_sub(1), f.abs());
    let sci = if exact.parse::<f64>().ok() == Some(f.abs()) {
        exact
    } else {
        shortest
    };
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        if exp < 0 {
            let zeros = "0".repeat((-exp - 1) as usize);
            format!("{sign}0.{zeros}{digits}")
        } else {
            let point = exp as usize + 1;
            let (int, frac) = if digits.len() > point {
                (digits[..point].to_string(), digits[point..].to_string())
            } else {
                (format!("{digits:0<point$}"), "0".to_string())
            };
            format!("{sign}{int}.{frac}")
        }
    } else {
        let (esign, eabs) = if exp < 0 { ('-', -exp) } else { ('+', exp) };
        format!("{sign}{mantissa}e{esign}{eabs:02}")
    }
}

/// `sha256:<hex>` of the canonical JSON of a creation request as sent: two
/// creations with the same id and digest are one creation.
pub fn request_digest(request: &Value) -> String {
    let digest = Sha256::digest(canonical_json(request).as_bytes());
    format!("sha256:{}", hex::encode(digest))
}

/// Python's truth value of a JSON value (`None`, an absent value, is
/// false).
pub fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
    }
}

/// How deep a JSON value entering a run may nest (start vars, resume
/// payloads, guest output, effect results, with the path they are written
/// at): the stores read back up to 128 levels, and a run's state wraps its
/// values in a few more.
pub const MAX_JSON_DEPTH: usize = 64;

/// How deep `value` nests (a scalar is 1 deep), counted without recursion
/// and without looking further than `limit + 1` levels.
pub fn json_depth(value: &Value, limit: usize) -> usize {
    let mut deepest = 0;
    let mut stack: Vec<(&Value, usize)> = vec![(value, 1)];
    while let Some((v, d)) = stack.pop() {
        deepest = deepest.max(d);
        if d > limit {
            return d;
        }
        match v {
            Value::Object(m) => stack.extend(m.values().map(|c| (c, d + 1))),
            Value::Array(a) => stack.extend(a.iter().map(|c| (c, d + 1))),
            _ => {}
        }
    }
    deepest
}

/// Why `value` may not enter a run (written `extra` levels deep), if it
/// may not: it nests deeper than [`MAX_JSON_DEPTH`].
pub fn too_deep(value: &Value, extra: usize) -> Option<String> {
    let limit = MAX_JSON_DEPTH.saturating_sub(extra);
    let depth = json_depth(value, limit);
    (depth > limit).then(|| {
        format!(
            "nests more than {limit} levels deep{} (the limit is {MAX_JSON_DEPTH})",
            if extra > 0 {
                " where it is written"
            } else {
                ""
            }
        )
    })
}

/// `field.path` (`field` alone for the top value; `field[0]` for an index).
pub fn inexact_field(field: &str, path: &str) -> String {
    match path {
        "" => field.to_string(),
        p if p.starts_with('[') => format!("{field}{p}"),
        p => format!("{field}.{p}"),
    }
}

/// Why an integer no 64-bit integer holds is refused.
pub fn inexact_message(literal: &str) -> String {
    format!(
        "the integer {literal} does not fit in 64 bits and would be changed (stored as the nearest float): write it as a string, or as a float on purpose"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn python_floats() {
        for (f, text) in [
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (1e300, "1e+300"),
            (-2.5e-300, "-2.5e-300"),
            (0.1, "0.1"),
            (2.0, "2.0"),
            (123456789.125, "123456789.125"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (9999999999999998.0, "9999999999999998.0"),
            (0.00012345, "0.00012345"),
            (570_724_280_910_275.0 + 0.25, "570724280910275.2"),
        ] {
            assert_eq!(python_float(f), text, "{f}");
        }
    }

    #[test]
    fn canonical_json_sorts_and_keeps_unicode() {
        let v = json!({"b": [1, 2.5, "é\n\u{1}"], "a": {"z": null, "y": true}, "c": 1e16});
        assert_eq!(
            canonical_json(&v),
            "{\"a\":{\"y\":true,\"z\":null},\"b\":[1,2.5,\"é\\n\\u0001\"],\"c\":1e+16}"
        );
    }
}
