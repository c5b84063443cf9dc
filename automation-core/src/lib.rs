//! The automation controller's decisions, with no I/O: shared by the
//! stepwell host (which creates automations, applies commands and runs the
//! controller's host effects) and the controller's WebAssembly nodes
//! (`flows/automation-controller/nodes`, which decide every transition).
//!
//! What is here is pure: the identifiers (deterministic UUIDs), the
//! reference's timestamp and duration spellings, canonical JSON and
//! request digests, the definition (validation, revisions, the initial
//! state, the retry backoff), trigger envelopes in CloudEvents names, the
//! frozen inputs of an admitted occurrence ([`build_prepared`]), what an
//! occurrence's end means ([`plan_outcome`]), and what each controller node
//! decides from the definition, the state, `now` and the answers of the
//! host effects it asked for ([`node`]). The host effects and their
//! answers are the [`protocol`].
//!
//! The behaviour is the reference implementation's (abstractruntime
//! 0.13.0); `docs/automations.md` in the stepwell repository is the
//! user's guide.
//!
//! ```
//! use stepwell_automation_core::{automation_id, occurrence_run_id, OccurrenceKind};
//!
//! let id = automation_id("local", "local", "memory-watch");
//! assert_eq!(id, "34f631d4-0bf3-5fea-a282-70c1b1d5b24b");
//! let child = occurrence_run_id(&id, OccurrenceKind::Scheduled { revision: 1, index: 2 }, 1);
//! assert_eq!(child, "1a852a72-f109-5b94-be0b-3a5dada8b537");
//! ```

pub mod admission;
pub mod definition;
pub mod envelope;
mod error;
pub mod event_frame;
pub mod history;
pub mod ids;
pub mod node;
pub mod occurrence;
pub mod outcome;
pub mod protocol;
pub mod time;

pub use admission::{admitted_envelope, build_prepared, Admitting};
pub use definition::{
    backoff_delay, build_definition, initial_state, revise_definition, stored_trigger_state,
    trigger_changed, trigger_state_of, validate_context, validate_email_recipients,
    validate_notify, validate_policy, validate_target, validate_untrusted_input_tools,
    TriggerCheck, DEFAULT_RETRY, DEFINITION_SCHEMA_VERSION, NOTIFY_BODY_MAX, NOTIFY_TITLE_MAX,
    SHARED_TRIGGER_KEYS, TITLE_MAX,
};
pub use envelope::{
    binding_source_uri, ensure_cloudevent_attributes, event_type, occurrence_origin,
    occurrence_vars, prompt_header, to_cloudevent, DATACONTENTTYPE, SPECVERSION,
};
pub use error::{static_reason_code, AutomationError};
pub use ids::{
    automation_id, automation_session_id, binding_id, canonical_json, discussion_ids,
    occurrence_run_id, record_key, request_digest, wake_wait_key, OccurrenceKind,
    AUTOMATION_NAMESPACE, CONTROLLER_BUNDLE_ID, CONTROLLER_BUNDLE_REF, CONTROLLER_BUNDLE_VERSION,
    CONTROLLER_FLOW_ID, CONTROLLER_WORKFLOW_ID, RECORD_SCHEMA_VERSION,
};
pub use occurrence::{
    definition_ends, plan_dispatch, plan_outcome, plan_wait_locally, wait_after_prepare,
    wake_payload, WaitPlan,
};
pub use outcome::{
    complete_occurrence, normalize_occurrence_output, notify_payload, ChildView, Completion,
    OccurrenceOutcome, NOTIFY_DEFAULT_BODY_MAX,
};
pub use protocol::{
    Commit, Entry, Observed, Park, Planned, TriggerAnswer, TriggerCall, TriggerWait,
};
pub use time::{format_timestamp, parse_duration, parse_timestamp, respell, MAX_DURATION_SECONDS};

/// Whether a value is set: present and neither `null` nor `false`.
pub(crate) fn set(v: Option<&serde_json::Value>) -> bool {
    !matches!(
        v,
        None | Some(serde_json::Value::Null) | Some(serde_json::Value::Bool(false))
    )
}

/// An object's map (anything else is an empty map).
pub(crate) fn into_map(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    match v {
        serde_json::Value::Object(m) => m,
        _ => serde_json::Map::new(),
    }
}
