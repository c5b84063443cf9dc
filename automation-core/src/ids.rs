//! The automation layer's identifiers: fixed names and deterministic UUIDs
//! (version 5, SHA-1), so every host derives the same ids for the same
//! automation, occurrence and attempt, and a replayed step finds what the
//! first attempt created.

use serde_json::Value;
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// The namespace of automation ids.
pub const AUTOMATION_NAMESPACE: Uuid = Uuid::from_u128(0x4a0d5a4e_6f1c_5b8e_9a53_2f7c1e0b9d61);
/// The controller bundle's id.
pub const CONTROLLER_BUNDLE_ID: &str = "abstractframework.automation-controller";
/// The controller bundle's version.
pub const CONTROLLER_BUNDLE_VERSION: &str = "1.0.0";
/// The controller's flow id inside its bundle.
pub const CONTROLLER_FLOW_ID: &str = "controller";
/// `<bundle id>@<version>`.
pub const CONTROLLER_BUNDLE_REF: &str = "abstractframework.automation-controller@1.0.0";
/// The workflow id of every controller run.
pub const CONTROLLER_WORKFLOW_ID: &str = "abstractframework.automation-controller@1.0.0:controller";
/// The `schema_version` of `automation.*` ledger records.
pub const RECORD_SCHEMA_VERSION: u32 = 1;

/// The automation id of creation request `request_id` of `tenant`'s `user`:
/// `uuid5(AUTOMATION_NAMESPACE, "<tenant>:<user>:<request_id>")`. The
/// controller run has the same id.
pub fn automation_id(tenant: &str, user: &str, request_id: &str) -> String {
    let name = format!("{tenant}:{user}:{request_id}");
    Uuid::new_v5(&AUTOMATION_NAMESPACE, name.as_bytes()).to_string()
}

/// `uuid5(<automation id as namespace>, name)`; an automation id that is
/// not a UUID is hashed as text under the automation namespace first (the
/// ids this module makes are always UUIDs).
fn child_uuid(automation_id: &str, name: &str) -> String {
    let ns = Uuid::parse_str(automation_id)
        .unwrap_or_else(|_| Uuid::new_v5(&AUTOMATION_NAMESPACE, automation_id.as_bytes()));
    Uuid::new_v5(&ns, name.as_bytes()).to_string()
}

/// The trigger binding minted by `revision` (1 at creation, then each
/// revision that changes the trigger): `uuid5(id, "binding:<revision>")`.
pub fn binding_id(automation_id: &str, revision: u64) -> String {
    child_uuid(automation_id, &format!("binding:{revision}"))
}

/// What an occurrence was fired by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OccurrenceKind<'a> {
    /// The trigger: occurrence `index` admitted under definition `revision`.
    Scheduled {
        /// The definition's revision at admission.
        revision: u64,
        /// The occurrence's index (1, 2, ...).
        index: u64,
    },
    /// A `run_now` command.
    Manual {
        /// The command's id.
        command_id: &'a str,
    },
}

/// The run id of `attempt` of an occurrence: `uuid5(id, "<revision>:<index>")`
/// or `uuid5(id, "manual:<command_id>")` for attempt 1, with `":a<n>"`
/// appended for attempt n ≥ 2. (Commands refuse an empty command id, so a
/// manual occurrence always has one.)
pub fn occurrence_run_id(automation_id: &str, kind: OccurrenceKind<'_>, attempt: u32) -> String {
    let mut name = match kind {
        OccurrenceKind::Scheduled { revision, index } => format!("{revision}:{index}"),
        OccurrenceKind::Manual { command_id } => format!("manual:{command_id}"),
    };
    if attempt >= 2 {
        name.push_str(&format!(":a{attempt}"));
    }
    child_uuid(automation_id, &name)
}

/// The session every controller lives in: `automation:<id>`.
pub fn automation_session_id(automation_id: &str) -> String {
    format!("automation:{automation_id}")
}

/// The controller's one wait key (timers and commands): `automation:<id>:wake`.
pub fn wake_wait_key(automation_id: &str) -> String {
    format!("automation:{automation_id}:wake")
}

/// A discussion's root run id and session id:
/// `uuid5(id, "discuss:<request_id>")` and `discussion-session:<run id>`.
pub fn discussion_ids(automation_id: &str, request_id: &str) -> (String, String) {
    let run_id = child_uuid(automation_id, &format!("discuss:{request_id}"));
    let session = format!("discussion-session:{run_id}");
    (run_id, session)
}

/// The key of ledger record `name` (`automation.admitted`):
/// `automation:<name without "automation.">:<id>:<discriminator>`.
pub fn record_key(name: &str, automation_id: &str, discriminator: &str) -> String {
    let short = name.strip_prefix("automation.").unwrap_or(name);
    format!("automation:{short}:{automation_id}:{discriminator}")
}

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
