//! The controller's decisions about the occurrence in flight: the pure
//! rules are the shared crate's ([`stepwell_automation_core::occurrence`]);
//! here they read the store's runs and call the trigger sources.

use chrono::{DateTime, Utc};
use serde_json::Value;

pub use stepwell_automation_core::occurrence::*;
use stepwell_automation_core::protocol::{Planned, TriggerWait};

use super::outcome::child_view;
use super::AutomationError;
use crate::triggers::{TriggerRegistry, Wait};
use stepwell_runtime::core::model::RunState;

/// What the end of the dispatched attempt's run `child` means at `now`
/// ([`stepwell_automation_core::plan_outcome`]).
pub fn plan_outcome(
    definition: &Value,
    state: &Value,
    child: &RunState,
    now: DateTime<Utc>,
) -> Result<Option<Planned>, AutomationError> {
    stepwell_automation_core::plan_outcome(definition, state, &child_view(child), now)
}

/// A source's `prepare` answer in the controller's terms.
pub fn trigger_wait(wait: Wait) -> TriggerWait {
    match wait {
        Wait::Until { until } => TriggerWait::Until { until },
        Wait::Idle => TriggerWait::Idle,
        Wait::Exhausted => TriggerWait::Exhausted,
    }
}

/// What the controller's `wait` node decides at `now`:
/// [`plan_wait_locally`], else [`wait_after_prepare`] on the bound
/// source's `prepare` answer (from `triggers`) for the persisted cursor.
pub fn plan_wait(
    definition: &Value,
    state: &Value,
    now: DateTime<Utc>,
    triggers: &TriggerRegistry,
) -> Result<WaitPlan, AutomationError> {
    if let Some(plan) = plan_wait_locally(definition, state, now) {
        return Ok(plan);
    }
    let wait = super::controller::prepare(definition, state, now, triggers, &[])?;
    Ok(wait_after_prepare(&trigger_wait(wait), now))
}
