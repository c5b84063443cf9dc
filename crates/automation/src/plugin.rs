//! Automations as a kernel plugin: the controller's effects, its embedded
//! workflow (an id no bundle may define and no caller may start), and the
//! anchoring of a discussion's runs to the discussion's root.

use super::{controller_effects, controller_workflow, CONTROLLER_WORKFLOW_ID};
use crate::triggers::TriggerState;
use stepwell_automation_core::definition::trigger_state_of;
use stepwell_automation_core::ids::record_key;
use stepwell_runtime::core::plugin::{
    ChildStart, Install, LedgerCompaction, Plugin, Reserved, RunStart,
};
use stepwell_runtime::core::{Error, Result};
use stepwell_runtime::flow::Workflow;
use stepwell_runtime::store::connection_stream;
use stepwell_runtime::{RunState, Runtime};
use stepwell_tools::ToolCatalog;

/// The automations plugin. It needs the tools and the triggers plugins
/// installed before it.
///
/// ```
/// use std::sync::Arc;
/// use stepwell_automation::Automations;
/// use stepwell_tools::Tools;
/// use stepwell_automation::triggers::Triggers;
/// use stepwell_runtime::{MemoryStore, Runtime};
///
/// # fn main() -> stepwell_runtime::Result<()> {
/// let rt = Runtime::builder(Arc::new(MemoryStore::new()))
///     .plugin(Arc::new(Tools::new()))
///     .plugin(Arc::new(Triggers::new()))
///     .plugin(Arc::new(Automations))
///     .build()?;
/// assert_eq!(rt.plugins(), ["tools", "triggers", "automations"]);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Automations;

impl Plugin for Automations {
    fn name(&self) -> &'static str {
        "automations"
    }

    fn pinned_versions(&self, rt: &Runtime) -> Result<Vec<(String, u32)>> {
        crate::service::pinned_targets(rt)
    }

    fn install(&self, cx: &mut Install<'_>) -> Result<()> {
        let needs = |what: &str| {
            Error::invalid(
                "plugins",
                format!("the automations plugin needs the {what} plugin installed before it"),
            )
        };
        let triggers = cx
            .extension::<TriggerState>()
            .ok_or_else(|| needs("triggers"))?;
        let tools = cx
            .extension::<ToolCatalog>()
            .ok_or_else(|| needs("tools"))?;
        // The controller's own effects: nothing may replace them.
        for handler in controller_effects(triggers.catalog.clone(), tools, cx.store().clone()) {
            cx.sealed_effect(handler)?;
        }
        cx.index_runs(std::sync::Arc::new(super::AutomationIndex))
    }

    /// A child takes its parent's attribution, and may not join a session
    /// the host keeps.
    fn prepare_child(
        &self,
        child: &mut ChildStart<'_>,
    ) -> std::result::Result<(), (String, String)> {
        super::lineage::prepare_child(child)
    }

    /// An occurrence's attribution is part of its identity.
    fn identity_meta(&self) -> &'static [&'static str] {
        &["occurrence"]
    }

    /// An ended occurrence of an independent automation (in a session of
    /// its own) that is not the controller's pending one: the controller
    /// never reads it again, so retention may delete it while its
    /// automation lives on. A growing automation's occurrences stay: its
    /// history reads them. The views that show old occurrences say that a
    /// run is gone (a discussion's timeline) or show less of it
    /// (docs/history.md, Retention).
    fn releases_child(&self, _rt: &Runtime, parent: &RunState, child: &RunState) -> bool {
        let Some(occurrence) = child.vars.get("_meta").and_then(|m| m.get("occurrence")) else {
            return false;
        };
        if occurrence["role"] != "occurrence" || occurrence["session_kind"] != "occurrence" {
            return false;
        }
        let pending = parent
            .vars
            .get("_runtime")
            .and_then(|r| r.get("automation"))
            .map(|a| &a["pending_occurrence"])
            .filter(|p| p.is_object());
        let pending_run = pending.and_then(|p| p["run_id"].as_str());
        let pending_session = pending.and_then(|p| p["prepared"]["session_id"].as_str());
        child.status.is_terminal()
            && pending_run != Some(child.run_id.as_str())
            && (pending_session.is_none() || child.session_id.as_deref() != pending_session)
    }

    /// A controller's ledger goes but for its command results (carried:
    /// a repeated command is answered as before) and the records of the
    /// occurrence in progress, from its admission on.
    fn ledger_compaction(&self, _rt: &Runtime, run: &RunState) -> Option<LedgerCompaction> {
        let automation = run.vars.get("_runtime")?.get("automation")?;
        let id = &run.run_id;
        let result = record_key("automation.command_result", id, "");
        let keep_from_keys = automation["pending_occurrence"]["index"]
            .as_i64()
            .map(|index| record_key("automation.admitted", id, &index.to_string()))
            .into_iter()
            .collect();
        Some(LedgerCompaction {
            carry_prefixes: vec![format!("resumed-by:{result}"), result],
            keep_from_keys,
        })
    }

    fn carries_key(&self, key: &str) -> bool {
        const RESULT: &str = "automation:command_result:";
        key.strip_prefix("resumed-by:")
            .unwrap_or(key)
            .starts_with(RESULT)
    }

    /// The stream of the connection an event-source automation is bound
    /// to, read through its cursor; none once it is archived or ended.
    fn event_cursors(&self, _rt: &Runtime, run: &RunState) -> Vec<(String, u64)> {
        let (Some(definition), Some(state)) = (
            run.vars.get("_meta").and_then(|m| m.get("automation")),
            run.vars.get("_runtime").and_then(|r| r.get("automation")),
        ) else {
            return Vec::new();
        };
        if run.status.is_terminal() || !state["archived_at"].is_null() {
            return Vec::new();
        }
        let binding = crate::commands::binding_of(definition);
        let Some(connection) = binding.config["connection_id"].as_str() else {
            return Vec::new();
        };
        let cursor = trigger_state_of(state)["cursor_seq"].as_u64().unwrap_or(0);
        vec![(connection_stream(connection), cursor)]
    }

    fn reserves(&self, workflow_id: &str) -> Option<Reserved> {
        (workflow_id == CONTROLLER_WORKFLOW_ID).then(|| Reserved {
            define: format!("{workflow_id:?} is reserved for the automation controller the host embeds"),
            start: format!("{workflow_id} is the automation controller: its runs are created with their automation (stepwell automations create)"),
        })
    }

    fn embedded_workflow(&self, rt: &Runtime, workflow_id: &str) -> Option<Result<Workflow>> {
        (workflow_id == CONTROLLER_WORKFLOW_ID)
            .then(|| Ok(controller_workflow(rt.engine(), &rt.effects().kinds())?))
    }

    /// A root run in a discussion's session is anchored to the discussion's
    /// root (its provenance and workspace policy).
    fn prepare_run(&self, rt: &Runtime, run: &mut RunStart<'_>) -> Result<()> {
        if let (Some(session), None) = (run.session_id, run.parent_run_id) {
            crate::sessions::anchor_discussion(
                rt,
                session,
                run.explicit_id.then_some(run.run_id),
                run.vars,
                run.runtime,
            )?;
        }
        Ok(())
    }
}
