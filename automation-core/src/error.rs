//! The automation layer's one error type.

use serde_json::{json, Value};

/// A domain failure: a wire reason code (`invalid_definition`,
/// `unsupported_feature`, `unknown_trigger_source`, `identity_conflict`,
/// `automation_not_found`, ...), a message, and the offending field when
/// there is one (`trigger.config.every`, `policy.retry.max_attempts`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason_code}: {}{message}", field.as_deref().map(|f| format!("{f}: ")).unwrap_or_default())]
pub struct AutomationError {
    /// The reason code.
    pub reason_code: String,
    /// What is wrong, for a person.
    pub message: String,
    /// The field, dotted (`notify.channels[1]`), if one is at fault.
    pub field: Option<String>,
}

impl AutomationError {
    /// An error with `reason_code` about `field`.
    pub fn new(reason_code: &str, field: Option<&str>, message: impl Into<String>) -> Self {
        AutomationError {
            reason_code: reason_code.to_string(),
            message: message.into(),
            field: field.map(str::to_string),
        }
    }

    /// `invalid_definition` about `field`.
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        Self::new("invalid_definition", Some(field), message)
    }

    /// `unsupported_feature` about `field`.
    pub fn unsupported(field: &str, message: impl Into<String>) -> Self {
        Self::new("unsupported_feature", Some(field), message)
    }

    /// The wire form: `{"reason_code", "message", "field"?}`.
    pub fn to_json(&self) -> Value {
        let mut v = json!({ "reason_code": self.reason_code, "message": self.message });
        if let Some(f) = &self.field {
            v["field"] = json!(f);
        }
        v
    }
}

/// The reason codes of the automation layer, as `'static` strings (for
/// the host's `Error::reason_code`); an unknown one reads `automation_error`.
pub fn static_reason_code(code: &str) -> &'static str {
    const CODES: [&str; 21] = [
        "invalid_definition",
        "unsupported_feature",
        "unknown_trigger_source",
        "identity_conflict",
        "automation_not_found",
        "invalid_request",
        "invalid_state",
        "revision_conflict",
        "invalid_command",
        "trigger_failed",
        "trigger_registry_error",
        "controller_seam",
        "conflict",
        "invalid_input",
        "occurrence_not_found",
        "connection_not_found",
        "connection_required",
        "connection_source_mismatch",
        "connection_disabled",
        "invalid_connection",
        "connection_secret_unavailable",
    ];
    CODES
        .iter()
        .find(|c| **c == code)
        .copied()
        .unwrap_or("automation_error")
}

/// An automation's failure as a runtime error: its reason code is one of
/// the codes the API knows ([`crate::static_reason_code`]); its detail
/// names its own code.
impl stepwell_model::ExtensionError for AutomationError {
    fn reason_code(&self) -> &'static str {
        crate::static_reason_code(&self.reason_code)
    }

    fn to_json(&self) -> serde_json::Value {
        AutomationError::to_json(self)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
