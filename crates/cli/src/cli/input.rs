//! Reading the JSON and times given as arguments.

use serde_json::{Map, Value};
use stepwell::Error;

/// The time `text` names (RFC 3339), or now.
pub(crate) fn parse_time_arg(
    field: &str,
    text: Option<String>,
) -> Result<chrono::DateTime<chrono::Utc>, Error> {
    match text {
        None => Ok(chrono::Utc::now()),
        Some(t) => stepwell::core::clock::parse_time(&t).map_err(|m| Error::InvalidInput {
            field: field.into(),
            message: m,
        }),
    }
}

/// `text` as JSON, refusing integers that would change.
pub(crate) fn parse_json(field: &str, text: &str) -> Result<Value, Error> {
    stepwell::core::config::check_exact_integers(field, text)?;
    serde_json::from_str(text).map_err(|e| Error::InvalidInput {
        field: field.into(),
        message: format!("is not JSON: {e}"),
    })
}

/// `text` as a JSON object, refusing integers that would change.
pub(crate) fn parse_object(field: &str, text: &str) -> Result<Map<String, Value>, Error> {
    stepwell::core::config::check_exact_integers(field, text)?;
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(Error::InvalidInput {
            field: field.into(),
            message: "must be a JSON object".into(),
        }),
        Err(e) => Err(Error::InvalidInput {
            field: field.into(),
            message: format!("is not JSON: {e}"),
        }),
    }
}
