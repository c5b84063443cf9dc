//! Argument coercion, after the reference's schema-aware `coerce_arguments`
//! (abstractcore/tools/arg_coercion.py): models send `"false"` for a
//! boolean and `"10"` for an integer; those are coerced, and a value that
//! cannot be coerced is refused rather than guessed at.

use serde_json::{Map, Value};
use stepwell_guest::tool::ToolError;

use crate::text::py_repr;

/// Tokens read as `true` (case-insensitive, trimmed).
const TRUE_TOKENS: &[&str] = &["true", "1", "yes", "y", "on", "enabled"];
/// Tokens read as `false` (case-insensitive, trimmed).
const FALSE_TOKENS: &[&str] = &["false", "0", "no", "n", "off", "disabled"];

/// The Python type name of a JSON value, for error messages.
fn py_type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

/// How Python would print a scalar: `True`, `3`, `1.5`, `'text'`.
fn py_scalar_repr(v: &Value) -> String {
    match v {
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::String(s) => py_repr(s),
        Value::Number(n) => py_number_text(n),
        other => other.to_string(),
    }
}

/// Python's `str()` of a JSON number (`3`, `1.5`, `2.0`).
fn py_number_text(n: &serde_json::Number) -> String {
    match n.as_f64() {
        Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e16 => format!("{f:.1}"),
        _ => n.to_string(),
    }
}

/// Coerces a value to a boolean: booleans as they are, the integers 0 and 1,
/// and the tokens true/false/1/0/yes/no/y/n/on/off/enabled/disabled.
pub fn coerce_bool(v: &Value) -> Result<bool, String> {
    match v {
        Value::Bool(b) => Ok(*b),
        Value::String(s) => {
            let token = s.trim().to_lowercase();
            if TRUE_TOKENS.contains(&token.as_str()) {
                Ok(true)
            } else if FALSE_TOKENS.contains(&token.as_str()) {
                Ok(false)
            } else {
                Err(format!(
                    "expected a boolean but got {}; use one of true/false/1/0/yes/no/on/off",
                    py_repr(s)
                ))
            }
        }
        Value::Number(n) if n.is_i64() || n.is_u64() => match n.as_i64() {
            Some(0) => Ok(false),
            Some(1) => Ok(true),
            _ => Err(format!("expected a boolean but got integer {n}")),
        },
        other => Err(format!(
            "expected a boolean but got {}",
            py_type_name(other)
        )),
    }
}

/// Parses an integer the way Python's `int(str)` does after trimming: an
/// optional sign, digits, single underscores between digits.
fn parse_py_int(token: &str) -> Option<i64> {
    let (sign, digits) = match token.strip_prefix('-') {
        Some(rest) => (-1i64, rest),
        None => (1, token.strip_prefix('+').unwrap_or(token)),
    };
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
        || !digits.chars().all(|c| c.is_ascii_digit() || c == '_')
    {
        return None;
    }
    let plain: String = digits.chars().filter(|c| *c != '_').collect();
    plain.parse::<i64>().ok().map(|n| sign * n)
}

/// Coerces a value to an integer: integers as they are, integral floats,
/// and strings holding an integer or an integral number.
pub fn coerce_int(v: &Value) -> Result<i64, String> {
    match v {
        Value::Bool(b) => Err(format!(
            "expected an integer but got boolean {}",
            if *b { "True" } else { "False" }
        )),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                return Ok(i);
            }
            match n.as_f64() {
                Some(f) if f.fract() == 0.0 && f.abs() < 9.2e18 => Ok(f as i64),
                _ => Err(format!(
                    "expected an integer but got non-integral float {}",
                    py_number_text(n)
                )),
            }
        }
        Value::String(s) => {
            let token = s.trim();
            if let Some(i) = parse_py_int(token) {
                return Ok(i);
            }
            match token.parse::<f64>() {
                Ok(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 9.2e18 => Ok(f as i64),
                Ok(_) => Err(format!(
                    "expected an integer but got non-integral {}",
                    py_repr(s)
                )),
                Err(_) => Err(format!("expected an integer but got {}", py_repr(s))),
            }
        }
        other => Err(format!(
            "expected an integer but got {}",
            py_type_name(other)
        )),
    }
}

/// Coerces a value to a string: strings as they are, scalars as Python
/// prints them (`3` -> `"3"`, `true` -> `"True"`); containers are refused.
pub fn coerce_string(v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Bool(_) => Ok(py_scalar_repr(v)),
        Value::Number(n) => Ok(py_number_text(n)),
        other => Err(format!("expected a string but got {}", py_type_name(other))),
    }
}

/// A call's arguments, read with coercion. A key holding JSON `null` counts
/// as absent unless a reader says otherwise.
pub struct Args<'a> {
    tool: &'a str,
    map: &'a Map<String, Value>,
}

impl<'a> Args<'a> {
    /// The arguments `map` of a call of `tool`.
    pub fn new(tool: &'a str, map: &'a Map<String, Value>) -> Self {
        Args { tool, map }
    }

    /// The value of `key` unless it is absent or `null`.
    fn value(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// Wraps a coercion failure of `key` as invalid arguments.
    fn invalid(key: &str, message: String) -> ToolError {
        ToolError::invalid(format!("argument '{key}': {message}"))
    }

    /// `key` as a string, or `None` when absent or `null`.
    pub fn string(&self, key: &str) -> Result<Option<String>, ToolError> {
        self.value(key)
            .map(|v| coerce_string(v).map_err(|m| Self::invalid(key, m)))
            .transpose()
    }

    /// `key` as a string, or `default`.
    pub fn string_or(&self, key: &str, default: &str) -> Result<String, ToolError> {
        Ok(self.string(key)?.unwrap_or_else(|| default.to_string()))
    }

    /// `key` as a string; refused when absent or `null`.
    pub fn required_string(&self, key: &str) -> Result<String, ToolError> {
        self.string(key)?
            .ok_or_else(|| ToolError::invalid(format!("{} requires {key}", self.tool)))
    }

    /// `key` as a boolean, or `None` when absent or `null`.
    pub fn bool_opt(&self, key: &str) -> Result<Option<bool>, ToolError> {
        self.value(key)
            .map(|v| coerce_bool(v).map_err(|m| Self::invalid(key, m)))
            .transpose()
    }

    /// `key` as a boolean, or `default`.
    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool, ToolError> {
        Ok(self.bool_opt(key)?.unwrap_or(default))
    }

    /// `key` as an integer, or `None` when absent or `null`.
    pub fn int_opt(&self, key: &str) -> Result<Option<i64>, ToolError> {
        self.value(key)
            .map(|v| coerce_int(v).map_err(|m| Self::invalid(key, m)))
            .transpose()
    }

    /// `key` as an integer, or `default`.
    pub fn int_or(&self, key: &str, default: i64) -> Result<i64, ToolError> {
        Ok(self.int_opt(key)?.unwrap_or(default))
    }

    /// A limit such as `head_limit`: `default` when absent, `None` (no
    /// limit, as Python's `None`) when `null`, else the integer.
    pub fn limit(&self, key: &str, default: i64) -> Result<Option<i64>, ToolError> {
        match self.map.get(key) {
            None => Ok(Some(default)),
            Some(Value::Null) => Ok(None),
            Some(v) => coerce_int(v).map(Some).map_err(|m| Self::invalid(key, m)),
        }
    }

    /// `key` as a list of names: a JSON array of scalars, a JSON array in a
    /// string, or comma-separated text; blank names are dropped.
    pub fn name_list(&self, key: &str) -> Result<Vec<String>, ToolError> {
        let items: Vec<String> = match self.value(key) {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| coerce_string(v).map_err(|m| Self::invalid(key, m)))
                .collect::<Result<Vec<String>, ToolError>>()?,
            Some(Value::String(s)) => match serde_json::from_str::<Value>(s.trim()) {
                Ok(Value::Array(items)) => {
                    items.iter().filter_map(|v| coerce_string(v).ok()).collect()
                }
                _ => s.split(',').map(str::to_string).collect(),
            },
            Some(other) => vec![coerce_string(other).map_err(|m| Self::invalid(key, m))?],
        };
        Ok(items
            .into_iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn booleans() {
        assert_eq!(coerce_bool(&json!(true)), Ok(true));
        assert_eq!(coerce_bool(&json!("false")), Ok(false));
        assert_eq!(coerce_bool(&json!(" YES ")), Ok(true));
        assert_eq!(coerce_bool(&json!("off")), Ok(false));
        assert_eq!(coerce_bool(&json!(1)), Ok(true));
        assert_eq!(coerce_bool(&json!(0)), Ok(false));
        assert_eq!(
            coerce_bool(&json!("maybe")),
            Err(
                "expected a boolean but got 'maybe'; use one of true/false/1/0/yes/no/on/off"
                    .into()
            )
        );
        assert_eq!(
            coerce_bool(&json!(5)),
            Err("expected a boolean but got integer 5".into())
        );
        assert_eq!(
            coerce_bool(&json!(1.5)),
            Err("expected a boolean but got float".into())
        );
        assert_eq!(
            coerce_bool(&json!([])),
            Err("expected a boolean but got list".into())
        );
    }

    #[test]
    fn integers() {
        assert_eq!(coerce_int(&json!(10)), Ok(10));
        assert_eq!(coerce_int(&json!("10")), Ok(10));
        assert_eq!(coerce_int(&json!(" -3 ")), Ok(-3));
        assert_eq!(coerce_int(&json!("1_000")), Ok(1000));
        assert_eq!(coerce_int(&json!("2.0")), Ok(2));
        assert_eq!(coerce_int(&json!(4.0)), Ok(4));
        assert_eq!(
            coerce_int(&json!("abc")),
            Err("expected an integer but got 'abc'".into())
        );
        assert_eq!(
            coerce_int(&json!("1.5")),
            Err("expected an integer but got non-integral '1.5'".into())
        );
        assert_eq!(
            coerce_int(&json!(1.5)),
            Err("expected an integer but got non-integral float 1.5".into())
        );
        assert_eq!(
            coerce_int(&json!(true)),
            Err("expected an integer but got boolean True".into())
        );
        assert_eq!(
            coerce_int(&json!({})),
            Err("expected an integer but got dict".into())
        );
    }

    #[test]
    fn strings() {
        assert_eq!(coerce_string(&json!("x")), Ok("x".into()));
        assert_eq!(coerce_string(&json!(3)), Ok("3".into()));
        assert_eq!(coerce_string(&json!(2.0)), Ok("2.0".into()));
        assert_eq!(coerce_string(&json!(false)), Ok("False".into()));
        assert_eq!(
            coerce_string(&json!(["a"])),
            Err("expected a string but got list".into())
        );
    }

    #[test]
    fn args_reader() {
        let map = json!({
            "a": "false", "n": "7", "z": null, "bad": "maybe",
            "dirs": "x, y,,", "list": ["p", "q"]
        });
        let map = map.as_object().unwrap();
        let args = Args::new("t", map);
        assert!(!args.bool_or("a", true).unwrap());
        assert!(args.bool_or("missing", true).unwrap());
        assert!(args.bool_or("z", true).unwrap());
        assert_eq!(args.int_or("n", 1).unwrap(), 7);
        assert_eq!(args.limit("n", 10).unwrap(), Some(7));
        assert_eq!(args.limit("z", 10).unwrap(), None);
        assert_eq!(args.limit("missing", 10).unwrap(), Some(10));
        assert_eq!(
            args.bool_or("bad", false),
            Err(ToolError::invalid(
                "argument 'bad': expected a boolean but got 'maybe'; use one of true/false/1/0/yes/no/on/off"
            ))
        );
        assert_eq!(
            args.required_string("file_path"),
            Err(ToolError::invalid("t requires file_path"))
        );
        assert_eq!(args.name_list("dirs").unwrap(), vec!["x", "y"]);
        assert_eq!(args.name_list("list").unwrap(), vec!["p", "q"]);
    }
}
