//! Secrets in recorded JSON: which keys name one, and a value with them
//! redacted. What the ledger keeps of an `llm_call` payload goes through
//! [`redact`], what it keeps of the vars a step wrote through
//! [`redact_all`].

use serde_json::{json, Value};

/// What a recorded secret reads as.
pub const REDACTED: &str = "[redacted]";

/// Whether key `k` names a secret. Stricter than the reference's rule for
/// recorded params (which this includes), as its rule for stored
/// artifacts is: a key with a part ending in `token` (not `tokens`), or
/// containing `secret` or `password`, or naming an API key,
/// `authorization` or a private key.
pub fn secret_key(k: &str) -> bool {
    // Checked for every key a step writes: no allocation, and a key
    // shorter than the shortest name (`token`) is none.
    const NAMED: [&str; 9] = [
        "api_key",
        "api-key",
        "apikey",
        "authorization",
        "password",
        "secret",
        "private_key",
        "private-key",
        "privatekey",
    ];
    if k.len() < 5 {
        return false;
    }
    let contains = |needle: &str| {
        k.as_bytes()
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
    };
    NAMED.iter().any(|s| contains(s))
        || k.split(|c: char| !c.is_ascii_alphanumeric())
            .any(|p| p.len() >= 5 && p.as_bytes()[p.len() - 5..].eq_ignore_ascii_case(b"token"))
}

/// `v` with every non-empty value under a secret key replaced by
/// [`REDACTED`], at any depth, except inside `tools`, `messages` and
/// `response_schema` (schemas and conversation, whose keys name fields,
/// not secrets): what the ledger keeps of a payload.
pub fn redact(v: &Value) -> Value {
    redact_with(v, true)
}

/// `v` with every non-empty value under a secret key replaced by
/// [`REDACTED`], at any depth and under any key: what the ledger keeps of
/// a run's vars (unlike [`redact`], which leaves conversations and
/// schemas of an `llm_call` payload whole).
pub fn redact_all(v: &Value) -> Value {
    redact_with(v, false)
}

/// [`redact`] (`exempt`: leaving `tools`, `messages` and
/// `response_schema` whole) or [`redact_all`].
fn redact_with(v: &Value, exempt: bool) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let empty = v.is_null() || v.as_str() == Some("");
                    let whole =
                        exempt && matches!(k.as_str(), "tools" | "messages" | "response_schema");
                    let v = if secret_key(k) && !empty {
                        json!(REDACTED)
                    } else if whole {
                        v.clone()
                    } else {
                        redact_with(v, exempt)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(|x| redact_with(x, exempt)).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_keys_are_named_in_any_case() {
        for k in [
            "api_key",
            "OpenAI_API_KEY",
            "Authorization",
            "hf_token",
            "accessToken",
            "session-token",
            "my_password2",
            "clientSecret",
            "private-key",
        ] {
            assert!(secret_key(k), "{k}");
        }
        for k in [
            "i",
            "max_tokens",
            "tokens",
            "prompt",
            "keys",
            "author",
            "tok",
            "x_tokenizer",
        ] {
            assert!(!secret_key(k), "{k}");
        }
    }
}
