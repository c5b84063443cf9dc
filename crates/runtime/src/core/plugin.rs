//! How a feature plugs into the kernel. The kernel (the runtime, the step
//! machine, the store, the sandbox) knows no feature built on it: tools,
//! LLM calls, trigger sources and automations each come as a [`Plugin`]
//! the builder is given ([`crate::RuntimeBuilder::plugin`]).
//!
//! A plugin may, when the runtime is built, add effect kinds and keep state
//! of its own (an [extension](Install::extension) any code holding the
//! runtime can read back by type, [`crate::Runtime::extension`]); it may
//! reserve workflow ids and embed their workflows; and it may adjust the
//! vars of every new run before the run exists, in two phases: first every
//! plugin's [`Plugin::prepare_run`] (values brought from elsewhere, such as
//! a discussion's workspace), then every plugin's [`Plugin::seal_run`]
//! (snapshots derived from the final values, such as the frozen workspace
//! scope).
//!
//! ```
//! use std::sync::Arc;
//! use stepwell_runtime::core::plugin::{Install, Plugin, RunStart};
//! use stepwell_runtime::{MemoryStore, Runtime};
//!
//! /// Stamps every new run with the team that owns this host.
//! struct Team(&'static str);
//!
//! impl Plugin for Team {
//!     fn name(&self) -> &'static str {
//!         "team"
//!     }
//!     fn install(&self, cx: &mut Install<'_>) -> stepwell_runtime::Result<()> {
//!         cx.set_extension(Arc::new(self.0.to_string()));
//!         Ok(())
//!     }
//!     fn prepare_run(&self, _rt: &Runtime, run: &mut RunStart<'_>) -> stepwell_runtime::Result<()> {
//!         run.vars.insert("team".into(), self.0.into());
//!         Ok(())
//!     }
//! }
//!
//! # fn main() -> stepwell_runtime::Result<()> {
//! let rt = Runtime::builder(Arc::new(MemoryStore::new()))
//!     .plugin(Arc::new(Team("payments")))
//!     .build()?;
//! assert_eq!(rt.extension::<String>().as_deref().map(String::as_str), Some("payments"));
//! # Ok(()) }
//! ```

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::config::RuntimeConfig;
use super::model::RunState;
use super::runtime::Runtime;
use super::Result;
use crate::effects::{EffectHandler, EffectRegistry};
use crate::flow::Workflow;
use crate::store::Store;
use crate::wasm::WasmEngine;

/// A feature built on the kernel. Every method but [`Plugin::name`] has a
/// default that does nothing.
pub trait Plugin: Send + Sync + 'static {
    /// The plugin's name: a builder keeps one plugin per name (a second
    /// one of the same name replaces the first, in its place).
    fn name(&self) -> &'static str;

    /// Adds the plugin's effects and state when the runtime is built.
    /// Plugins install in the order the builder was given them, so one may
    /// read the extensions of those before it.
    fn install(&self, cx: &mut Install<'_>) -> Result<()> {
        let _ = cx;
        Ok(())
    }

    /// Why `workflow_id` is the plugin's own, if it is: a bundle may not
    /// define it and a caller may not start its runs (the plugin creates
    /// them itself).
    fn reserves(&self, workflow_id: &str) -> Option<Reserved> {
        let _ = workflow_id;
        None
    }

    /// The workflow `workflow_id` the plugin embeds, if it is one of its
    /// own (loaded once, then registered).
    fn embedded_workflow(&self, rt: &Runtime, workflow_id: &str) -> Option<Result<Workflow>> {
        let _ = (rt, workflow_id);
        None
    }

    /// First phase of a new run's start: may change its vars and its
    /// `_runtime` from elsewhere. Nothing is stored yet.
    fn prepare_run(&self, rt: &Runtime, run: &mut RunStart<'_>) -> Result<()> {
        let _ = (rt, run);
        Ok(())
    }

    /// Second phase, after every plugin's [`Plugin::prepare_run`]: derives
    /// what the run keeps from its final vars.
    fn seal_run(&self, rt: &Runtime, run: &mut RunStart<'_>) -> Result<()> {
        let _ = (rt, run);
        Ok(())
    }

    /// A child a flow starts (`start_subworkflow`), before it exists: what
    /// it inherits of its parent (in its vars), or why it is refused
    /// (`Err((field, message))`, the effect's `invalid_effect` failure).
    fn prepare_child(
        &self,
        child: &mut ChildStart<'_>,
    ) -> std::result::Result<(), (String, String)> {
        let _ = child;
        Ok(())
    }

    /// The deployed versions this plugin's own records name and will
    /// start runs on (an automation's pinned target, say): `(workflow id,
    /// version)`. A prune keeps them.
    fn pinned_versions(&self, rt: &Runtime) -> Result<Vec<(String, u32)>> {
        let _ = rt;
        Ok(Vec::new())
    }

    /// The `vars._meta` sections that belong to a run's identity: an
    /// explicit-id start repeated with another value of one is refused
    /// (`identity_conflict`).
    fn identity_meta(&self) -> &'static [&'static str] {
        &[]
    }

    /// Whether `child`, an ended run that `parent` started (a run of a
    /// workflow this plugin reserves, which may never end: an automation's
    /// controller), may go before its parent: retention then treats it as
    /// the root of a tree of its own and deletes it once it is old enough
    /// ([`crate::core::retention`]). Say yes only for what the plugin will
    /// never read again. The default: no (a child goes with its parent).
    fn releases_child(&self, rt: &Runtime, parent: &RunState, child: &RunState) -> bool {
        let _ = (rt, parent, child);
        false
    }

    /// How retention may compact the ledger of `run`, a run of a workflow
    /// this plugin reserves (which may never end: an automation's
    /// controller), behind a checkpoint ([`crate::core::compaction`]).
    /// The default: `None`, the ledger stays whole.
    fn ledger_compaction(&self, rt: &Runtime, run: &RunState) -> Option<LedgerCompaction> {
        let _ = (rt, run);
        None
    }

    /// Whether records keyed `key` may be carried in a checkpoint (see
    /// [`LedgerCompaction::carry_prefixes`]): only then does
    /// [`crate::Runtime::find_records`] look for them there. The default:
    /// no.
    fn carries_key(&self, key: &str) -> bool {
        let _ = key;
        false
    }

    /// The event-inbox streams `run` (a run of a workflow this plugin
    /// reserves) still reads, each with the seq it has read through:
    /// retention drops no event of a stream after the smallest cursor of
    /// its readers. The default: none (it reads no stream).
    fn event_cursors(&self, rt: &Runtime, run: &RunState) -> Vec<(String, u64)> {
        let _ = (rt, run);
        Vec::new()
    }
}

/// What a plugin lets retention compact of a run's ledger
/// ([`Plugin::ledger_compaction`]).
#[derive(Debug, Clone, Default)]
pub struct LedgerCompaction {
    /// Records whose idempotency key starts with one of these are carried
    /// in the checkpoint: they are still found by key
    /// ([`crate::Runtime::find_records`]) after they are compacted away.
    pub carry_prefixes: Vec<String>,
    /// The first record carrying one of these keys stays, with every record
    /// after it (what is in progress still reads them).
    pub keep_from_keys: Vec<String>,
}

/// A child run a flow starts, as the plugins see it before it exists.
pub struct ChildStart<'a> {
    /// The run that starts it.
    pub parent: &'a RunState,
    /// Its vars as the flow gave them.
    pub vars: &'a mut Map<String, Value>,
    /// The session the flow names for it, if it names one (else it joins
    /// its parent's).
    pub session_id: Option<&'a str>,
}

/// Why a workflow id is a plugin's own (the refusals' texts).
#[derive(Debug, Clone)]
pub struct Reserved {
    /// Why a bundle may not define it.
    pub define: String,
    /// Why a caller may not start its runs.
    pub start: String,
}

/// A new run as the plugins see it before it is created.
#[derive(Debug)]
pub struct RunStart<'a> {
    /// The workflow it runs.
    pub workflow_id: &'a str,
    /// Its id.
    pub run_id: &'a str,
    /// Whether the caller chose the id (a start that may be repeated).
    pub explicit_id: bool,
    /// Its session, if any.
    pub session_id: Option<&'a str>,
    /// The run that started it, if any.
    pub parent_run_id: Option<&'a str>,
    /// Its vars as the caller gave them (without `_runtime` and `_limits`).
    pub vars: &'a mut Map<String, Value>,
    /// What the host keeps in `vars._runtime` (written after the hooks).
    pub runtime: &'a mut Map<String, Value>,
}

/// State plugins keep in a runtime, one value per type.
#[derive(Default, Clone)]
pub struct Extensions {
    values: HashMap<TypeId, Arc<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for Extensions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Extensions")
            .field("count", &self.values.len())
            .finish()
    }
}

impl Extensions {
    /// The value of type `T`, if one was set.
    pub fn get<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        let value = self.values.get(&TypeId::of::<T>())?.clone();
        value.downcast::<T>().ok()
    }

    /// Sets (or replaces) the value of type `T`.
    pub fn set<T: Any + Send + Sync>(&mut self, value: Arc<T>) {
        self.values.insert(TypeId::of::<T>(), value);
    }
}

/// What a plugin reaches while the runtime is built.
pub struct Install<'a> {
    pub(crate) engine: &'a WasmEngine,
    pub(crate) store: &'a Arc<dyn Store>,
    pub(crate) config: &'a RuntimeConfig,
    pub(crate) effects: &'a mut EffectRegistry,
    pub(crate) extensions: &'a mut Extensions,
    /// Effect kinds a plugin sealed: nothing registers them again.
    pub(crate) sealed: &'a mut std::collections::BTreeSet<String>,
    /// Retry policies of the plugins' effects, for kinds the
    /// configuration leaves out.
    pub(crate) retries: &'a mut std::collections::HashMap<String, crate::RetryPolicy>,
}

impl Install<'_> {
    /// The runtime's wasm engine.
    pub fn engine(&self) -> &WasmEngine {
        self.engine
    }

    /// The runtime's store.
    pub fn store(&self) -> &Arc<dyn Store> {
        self.store
    }

    /// The runtime's configuration.
    pub fn config(&self) -> &RuntimeConfig {
        self.config
    }

    /// Adds (or replaces) an effect kind; one a plugin before sealed
    /// ([`Install::sealed_effect`]) is refused.
    pub fn effect(&mut self, handler: Arc<dyn EffectHandler>) -> Result<()> {
        if self.sealed.contains(handler.kind()) {
            return Err(super::Error::invalid(
                "plugins",
                format!(
                    "the effect kind {:?} is sealed by the plugin that owns it: nothing may replace it",
                    handler.kind()
                ),
            ));
        }
        self.effects.register(handler);
        Ok(())
    }

    /// Adds an effect kind unless one of that kind is there already (the
    /// application's, given to the builder with
    /// [`crate::RuntimeBuilder::effect`], or a plugin's before this one).
    pub fn default_effect(&mut self, handler: Arc<dyn EffectHandler>) {
        if self.effects.get(handler.kind()).is_none() {
            self.effects.register(handler);
        }
    }

    /// Adds an effect kind that nothing may replace: not the application's
    /// of that kind (this one wins over it), nor a later plugin's
    /// ([`Install::effect`] refuses it). For effects whose code the
    /// plugin's own workflows trust (the automation controller's).
    pub fn sealed_effect(&mut self, handler: Arc<dyn EffectHandler>) -> Result<()> {
        self.effect(handler.clone())?;
        self.sealed.insert(handler.kind().to_string());
        Ok(())
    }

    /// The extension of type `T` a plugin before this one set.
    pub fn extension<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.extensions.get()
    }

    /// Gives the store `indexer` for the run index's attribution columns
    /// ([`crate::store::index`]): the store uses it from now on, and
    /// indexes the rows no indexer attributed. The feature that gives the
    /// columns their meaning installs one; a later one replaces it.
    pub fn index_runs(&mut self, indexer: Arc<dyn crate::store::RunIndexer>) -> Result<()> {
        Ok(self.store.set_indexer(indexer)?)
    }

    /// The retry policy of the effect `kind` when the runtime's
    /// configuration has none for it ([`crate::RuntimeConfig::retries`]).
    pub fn default_retry(&mut self, kind: &str, policy: crate::RetryPolicy) {
        self.retries.insert(kind.to_string(), policy);
    }

    /// Keeps `value` in the runtime ([`crate::Runtime::extension`]).
    pub fn set_extension<T: Any + Send + Sync>(&mut self, value: Arc<T>) {
        self.extensions.set(value);
    }
}

/// The plugins of a runtime, in the order they were given.
#[derive(Default, Clone)]
pub(crate) struct Plugins(Vec<Arc<dyn Plugin>>);

impl Plugins {
    /// Adds `plugin`, replacing (in its place) one of the same name.
    pub(crate) fn add(&mut self, plugin: Arc<dyn Plugin>) {
        match self.0.iter_mut().find(|p| p.name() == plugin.name()) {
            Some(slot) => *slot = plugin,
            None => self.0.push(plugin),
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<dyn Plugin>> {
        self.0.iter()
    }

    /// Whether the plugin that reserves `parent`'s workflow releases
    /// `child` (see [`Plugin::releases_child`]).
    pub(crate) fn releases(&self, rt: &Runtime, parent: &RunState, child: &RunState) -> bool {
        self.0.iter().any(|p| {
            p.reserves(&parent.workflow_id).is_some() && p.releases_child(rt, parent, child)
        })
    }

    /// How the plugin that reserves `run`'s workflow lets its ledger be
    /// compacted (see [`Plugin::ledger_compaction`]).
    pub(crate) fn compaction(&self, rt: &Runtime, run: &RunState) -> Option<LedgerCompaction> {
        self.0
            .iter()
            .find(|p| p.reserves(&run.workflow_id).is_some())
            .and_then(|p| p.ledger_compaction(rt, run))
    }

    /// Whether a plugin carries records keyed `key` in checkpoints.
    pub(crate) fn carries(&self, key: &str) -> bool {
        self.0.iter().any(|p| p.carries_key(key))
    }

    /// The event streams `run` reads and how far (see
    /// [`Plugin::event_cursors`]), as the plugin that reserves its workflow
    /// says.
    pub(crate) fn cursors(&self, rt: &Runtime, run: &RunState) -> Vec<(String, u64)> {
        self.0
            .iter()
            .find(|p| p.reserves(&run.workflow_id).is_some())
            .map(|p| p.event_cursors(rt, run))
            .unwrap_or_default()
    }

    /// Why `workflow_id` is reserved by a plugin, if it is.
    pub(crate) fn reserved(&self, workflow_id: &str) -> Option<Reserved> {
        self.0.iter().find_map(|p| p.reserves(workflow_id))
    }

    /// The names, in order.
    pub(crate) fn names(&self) -> Vec<&'static str> {
        self.0.iter().map(|p| p.name()).collect()
    }
}
