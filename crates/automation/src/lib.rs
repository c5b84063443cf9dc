//! Automations: a workflow fired again and again by a trigger, each firing
//! a deterministic child run (an occurrence), steered by commands.
//!
//! An automation is a controller run whose id is the automation's id; its
//! definition lives in the controller's `vars._meta.automation`, its state
//! in `vars._runtime.automation`, and every transition is an
//! `automation.*` record in its ledger. The rules with no I/O (the
//! identifiers, the reference's timestamp and duration spellings, canonical
//! JSON and digests, the definition, admissions, outcomes, and what each
//! controller node decides) are the crate `stepwell-automation-core`
//! ([`decisions`]), which the controller's WebAssembly nodes are built
//! from too; they are re-exported here. This module is the half that
//! touches the store: the controller's host effects, creation, commands,
//! queries and views.
//!
//! The behaviour is the reference implementation's (abstractruntime
//! 0.13.0); `docs/automations.md` is the user's guide.
//!
//! ```
//! use stepwell_automation::{automation_id, binding_id, occurrence_run_id, OccurrenceKind};
//!
//! let id = automation_id("local", "local", "memory-watch");
//! assert_eq!(id, "34f631d4-0bf3-5fea-a282-70c1b1d5b24b");
//! // The first binding, and the first attempt of the second scheduled
//! // occurrence of revision 1: the same ids on every host, every time.
//! assert_eq!(binding_id(&id, 1), "a5d46496-9e93-54c8-b142-587deb6b287f");
//! let child = occurrence_run_id(&id, OccurrenceKind::Scheduled { revision: 1, index: 2 }, 1);
//! assert_eq!(child, "1a852a72-f109-5b94-be0b-3a5dada8b537");
//! ```

// Every public item says what it is; every unsafe operation sits in a
// block that says why it holds (a `SAFETY:` comment).
#![deny(
    missing_docs,
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks
)]

mod commands;
mod controller;
mod decision;
mod definition;
mod discussion;
mod index;
mod lineage;
mod occurrence;
mod outcome;
mod plugin;
mod queries;
mod service;
pub mod sessions;
pub mod triggers;
mod view;

use stepwell_automation_core::{envelope, ids, time};

/// The controller's decisions with no I/O, shared with its WebAssembly
/// nodes: the crate `stepwell-automation-core` (its [`node`](decisions::node)
/// decisions and the [`protocol`](decisions::protocol) of the host effects).
pub use stepwell_automation_core as decisions;

pub use commands::{
    command_digest, command_observation, command_type, decide_command, CommandDecision,
    Observation, COMMAND_TYPES,
};
pub(crate) use controller::source_events;
pub use controller::{controller_effects, TriggerCatalog};
pub use decision::{decide, observe, Transition, Written};
pub use definition::{
    automation_status, backoff_delay, build_definition, initial_state, revise_definition,
    stored_trigger_state, trigger_changed, trigger_state_of, validate_context,
    validate_email_recipients, validate_notify, validate_policy, validate_target,
    validate_untrusted_input_tools, AutomationStatus, TriggerCheck, DEFAULT_RETRY,
    DEFINITION_SCHEMA_VERSION, NOTIFY_BODY_MAX, NOTIFY_TITLE_MAX, SHARED_TRIGGER_KEYS, TITLE_MAX,
};
pub use discussion::{
    automation_timeline_messages, start_discussion, Discussion, DiscussionRequest,
};
pub use index::{wakes_on, AutomationIndex};
pub use lineage::{check_caller_run, descendant_meta, is_host_session};
pub use occurrence::{
    definition_ends, plan_dispatch, plan_outcome, plan_wait, plan_wait_locally, trigger_wait,
    wait_after_prepare, wake_payload, WaitPlan,
};
pub use outcome::{
    child_view, complete_occurrence, current_occurrence, normalize_occurrence_output,
    notify_payload, occurrence_view, taken_occurrence_id, ChildView, Completion, OccurrenceOutcome,
    NOTIFY_DEFAULT_BODY_MAX,
};
pub use plugin::Automations;
pub use queries::{
    attention_cursor, attention_page, automation_record, automation_records, automations_cursor,
    find_record, occurrence_cursor, occurrence_page, parse_attention_cursor,
    parse_automations_cursor, parse_occurrence_cursor, AutomationRecord, ATTENTION_CURSOR_PREFIX,
    AUTOMATIONS_CURSOR_PREFIX, MAX_PAGE, OCCURRENCE_CURSOR_PREFIX,
};
pub use service::{
    apply_automation_command, create_automation, drive_until_idle, drive_until_idle_with, held,
    list_attention, list_automations, list_occurrences, pending_waits, show_automation, Command,
    Created, IdleReport, MAX_INPUT_DATA_BYTES,
};
pub use stepwell_automation_core::envelope::{
    binding_source_uri, ensure_cloudevent_attributes, event_type, occurrence_origin,
    occurrence_vars, prompt_header, to_cloudevent, DATACONTENTTYPE, SPECVERSION,
};
pub use stepwell_automation_core::ids::{
    automation_id, automation_session_id, binding_id, canonical_json, discussion_ids,
    occurrence_run_id, record_key, request_digest, wake_wait_key, OccurrenceKind,
    AUTOMATION_NAMESPACE, CONTROLLER_BUNDLE_ID, CONTROLLER_BUNDLE_REF, CONTROLLER_BUNDLE_VERSION,
    CONTROLLER_FLOW_ID, CONTROLLER_WORKFLOW_ID, RECORD_SCHEMA_VERSION,
};
pub use stepwell_automation_core::protocol::Planned;
pub use stepwell_automation_core::time::{
    format_timestamp, parse_duration, parse_timestamp, MAX_DURATION_SECONDS,
};
pub use stepwell_automation_core::{admitted_envelope, build_prepared};
pub use stepwell_automation_core::{static_reason_code, AutomationError};
pub use view::{automation_summary, get_automation, next_fire_at, HISTORY_REPLAY_MAX_TOKENS};

/// The controller's workflow (`CONTROLLER_WORKFLOW_ID`), from the flow
/// document and the node component the host embeds
/// (`flows/automation-controller/`).
pub(crate) fn controller_workflow(
    engine: &stepwell_runtime::wasm::WasmEngine,
    effects: &[String],
) -> Result<stepwell_runtime::flow::Workflow, stepwell_runtime::flow::FlowError> {
    const FLOW: &str = include_str!(env!("STEPWELL_BUILTIN_CONTROLLER_FLOW"));
    const NODES: &[u8] = include_bytes!(env!("STEPWELL_BUILTIN_CONTROLLER"));
    let mut wf = stepwell_runtime::flow::load_embedded_flow(
        std::path::Path::new("builtin:automation-controller/flow.json"),
        FLOW,
        engine,
        effects,
        &[("nodes.wasm", NODES)],
    )?;
    // Controller errors never fail the controller run (the automation
    // would end): a failing step is tried again.
    wf.steps_never_fail = true;
    Ok(wf)
}
