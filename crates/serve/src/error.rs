//! The API's errors: the library's typed errors with an HTTP status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use stepwell::core::Error;

/// An error answer: `{"error": {"code", "message", "field"?, ...}}` with a
/// status that fits the code.
#[derive(Debug)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The body's `error` object.
    pub detail: Value,
}

impl ApiError {
    /// An error with `status`, `code` and `message`.
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            detail: json!({"code": code, "message": message.into()}),
        }
    }

    /// `400 invalid_input` about `field`.
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::BAD_REQUEST, "invalid_input", message);
        e.detail["field"] = json!(field);
        e
    }

    /// `404 not_found`.
    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", what)
    }

    /// `500 internal`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// The HTTP status of a reason code.
    pub fn status_of(code: &str) -> StatusCode {
        match code {
            "run_not_found"
            | "automation_not_found"
            | "unknown_workflow"
            | "unknown_version"
            | "not_found"
            | "occurrence_not_found"
            | "connection_not_found"
            | "snapshot_not_found" => StatusCode::NOT_FOUND,
            "stale_resume"
            | "conflict"
            | "identity_conflict"
            | "revision_conflict"
            | "quarantined"
            | "upgrade_incompatible"
            | "not_forkable"
            | "connection_disabled" => StatusCode::CONFLICT,
            "invalid_input"
            | "invalid_definition"
            | "invalid_request"
            | "unsupported_feature"
            | "unknown_trigger_source"
            | "invalid_command"
            | "invalid_state"
            | "component_load_failed"
            | "history_unavailable"
            | "invalid_connection"
            | "connection_required"
            | "connection_source_mismatch" => StatusCode::BAD_REQUEST,
            "connection_secret_unavailable" | "busy" => StatusCode::SERVICE_UNAVAILABLE,
            "unauthorized" => StatusCode::UNAUTHORIZED,
            "payload_too_large" => StatusCode::PAYLOAD_TOO_LARGE,
            "command_rejected" | "trigger_failed" | "trigger_source_unavailable" => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let code = e.reason_code();
        let mut detail = match &e {
            Error::Extension(x) => x.to_json(),
            _ => json!({}),
        };
        detail["code"] = json!(code);
        // The code is a field of its own: the message says the rest.
        let text = e.to_string();
        let message = text
            .strip_prefix(code)
            .and_then(|m| m.strip_prefix(": "))
            .unwrap_or(&text);
        // ... and so is the field.
        let message = match &e {
            Error::InvalidInput { field, .. } => message
                .strip_prefix(field.as_str())
                .and_then(|m| m.strip_prefix(": "))
                .unwrap_or(message),
            _ => message,
        };
        detail["message"] = json!(message);
        match &e {
            Error::InvalidInput { field, .. } => detail["field"] = json!(field),
            Error::IdentityConflict { field, .. } => detail["field"] = json!(field),
            Error::Flow(f) => {
                detail["file"] = json!(f.path.display().to_string());
                if !f.field.is_empty() {
                    detail["field"] = json!(f.field);
                }
            }
            Error::RunNotFound { run_id }
            | Error::StaleResume { run_id, .. }
            | Error::Conflict { run_id, .. }
            | Error::Quarantined { run_id, .. } => detail["run_id"] = json!(run_id),
            _ => {}
        }
        let status = match &e {
            // A store that cannot be read or written is the server's fault;
            // a lost race on it is a conflict.
            Error::Store(s) if s.is_conflict() => StatusCode::CONFLICT,
            Error::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
            _ => ApiError::status_of(code),
        };
        if status.is_server_error() {
            tracing::error!(code, error = %e, "request failed");
        }
        ApiError { status, detail }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response =
            (self.status, axum::Json(json!({ "error": self.detail }))).into_response();
        // A busy server says when to try again.
        if self.detail["code"] == "server_busy" || self.detail["code"] == "busy" {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        response
    }
}
