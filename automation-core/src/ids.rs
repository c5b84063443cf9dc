//! The automation layer's identifiers: fixed names and deterministic UUIDs
//! (version 5, SHA-1), so every host derives the same ids for the same
//! automation, occurrence and attempt, and a replayed step finds what the
//! first attempt created.

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

// Canonical JSON and the creation digest are the kernel's too (an
// explicit-id start's identity): they live in the model crate.
pub use stepwell_model::json::{canonical_json, canonical_json_ascii, request_digest};
