//! Automations as a kernel plugin: the controller's effects, its embedded
//! workflow (an id no bundle may define and no caller may start), and the
//! anchoring of a discussion's runs to the discussion's root.

use super::{controller_effects, controller_workflow, CONTROLLER_WORKFLOW_ID};
use crate::triggers::TriggerState;
use stepwell_runtime::core::plugin::{ChildStart, Install, Plugin, Reserved, RunStart};
use stepwell_runtime::core::{Error, Result};
use stepwell_runtime::flow::Workflow;
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
