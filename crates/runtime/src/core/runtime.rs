//! The runtime: the API over the durable step loop (`start`, `run`, `tick`,
//! `resume`, `respond`, `cancel_run`, reads). The step machine is in
//! `step.rs`, the driver in `driver.rs`, snapshots in `snapshots.rs`, ledger
//! subscriptions in `feed.rs`, the run transaction in `txn.rs`.
//!
//! Every transition obeys one ordering law: the ledger records of a
//! transition are appended before (or together with) the run save that
//! makes it true, and the save is the commit point ([`Store::commit`]). A
//! crash leaves the ledger ahead of the state, never behind it. Every save
//! is fenced by the run's version and lease ([`crate::store`]): a writer
//! that lost a race changes nothing.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use parking_lot::RwLock;
use serde_json::{json, Map, Value};

use super::clock::{format_time, Clock, SystemClock};
use super::config::{RuntimeConfig, StartOptions};
use super::feed::Subscriber;
use super::keys::{
    caused_resume_key, effect_key, identity_mismatch, is_host_owned, runtime_vars, terminal_key,
};
use super::locks::RunLocks;
use super::model::{RunState, RunStatus, StepRecord, StepStatus, WaitReason};
use super::plugin::{Extensions, Install, Plugin, Plugins, RunStart};
use super::txn::LeaseKeeper;
use super::{Error, Result};
use crate::effects::{EffectHandler, EffectRegistry};
use crate::flow::{template, Workflow};
use crate::store::{Fence, LeaseAfter, RunQuery, Store};
use crate::wasm::WasmEngine;

/// Seeds `vars._limits` key by key with `defaults` (a caller's `_limits`
/// keeps what it sets), and applies an operator's
/// `_limits.max_iterations_ceiling`: a declared `max_iterations` above it
/// refuses the start (the reference's text), a run that declares none gets
/// `min(default, ceiling)`.
fn seed_limits(vars: &mut Map<String, Value>, defaults: Value) -> Result<()> {
    let limits = vars
        .entry("_limits")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(limits) = limits.as_object_mut() else {
        return Err(Error::invalid("vars._limits", "must be a JSON object"));
    };
    let declared = limits.get("max_iterations").cloned();
    if let Value::Object(d) = defaults {
        for (k, v) in d {
            limits.entry(k).or_insert(v);
        }
    }
    // Numbers as Python's int() reads them: floats and digit strings too.
    let number = |v: &Value| {
        v.as_f64()
            .or_else(|| v.as_str()?.trim().parse::<f64>().ok())
            .filter(|f| f.is_finite())
            .map(|f| f.trunc() as i64)
    };
    let ceiling = limits
        .get("max_iterations_ceiling")
        .and_then(number)
        .filter(|c| *c > 0);
    if let Some(ceiling) = ceiling {
        if let Some(d) = declared
            .as_ref()
            .filter(|d| !d.is_null() && number(d).is_none())
        {
            return Err(Error::invalid(
                "vars._limits.max_iterations",
                format!("must be a whole number, got {d}"),
            ));
        }
        match declared.as_ref().and_then(number) {
            Some(n) if n > ceiling => {
                return Err(Error::invalid(
                    "vars._limits.max_iterations",
                    format!(
                        "workflow declares max_iterations={n} above the operator ceiling {ceiling} - raise the ceiling (gateway console / max_iterations_ceiling) or lower the workflow's declared value; refusing at start, never truncating mid-run"
                    ),
                ))
            }
            Some(_) => {}
            None => {
                let default = limits
                    .get("max_iterations")
                    .and_then(Value::as_i64)
                    .unwrap_or(20);
                limits.insert("max_iterations".into(), json!(default.min(ceiling)));
            }
        }
    }
    Ok(())
}

/// What one attempt at a resume came to (see [`Runtime::resume_held`]).
pub(super) enum Attempt {
    /// Done: the run's state, and whether this resume did it (`false`: the
    /// event it delivers had resumed the run before).
    Done(Box<RunState>, bool),
    /// Nothing written: the remembered state it started from is out of
    /// date; do it again from the stored state.
    Stale,
    /// Nothing written: do it again under the run's lease, claimed first.
    /// The wait's effect runs external work when it is resumed (its hook
    /// asked for the lease), or the optimistic commit lost to another
    /// holder's lease on an unchanged run.
    ClaimFirst,
}

/// What one resume asks ([`Runtime::resume_at`]), for each of its holds.
#[derive(Clone, Copy)]
pub(super) struct Resume<'a> {
    pub run_id: &'a str,
    pub wait_key: Option<&'a str>,
    /// The payload's size as JSON, checked.
    pub size: usize,
    /// The event that caused it, if one did.
    pub cause: Option<&'a str>,
    pub depth: u32,
    /// Whether the run is ticked on after the resume.
    pub tick: bool,
}

/// How a resume holds its run (see [`Runtime::resume_held`]).
pub(super) enum Hold<'a> {
    /// Reads the run, takes the lease with the first commit.
    Taking,
    /// From a state this runtime remembers committing (`parked`), takes the
    /// lease with the first commit.
    Remembered(Box<RunState>),
    /// Claims the lease first.
    Claim,
    /// Holds the lease already (the work of the resume landed from flight).
    Claimed(Box<(super::txn::RunTxn<'a>, RunState)>),
}

/// What the resume hook of a wait's effect decided.
enum Hook {
    /// The wait's effect has no hook: the payload is written as it is.
    None,
    /// Write this (`None`: the payload).
    Written(Option<Value>),
    /// The hook runs external work: take the run's lease, then resume.
    ClaimFirst,
    /// The hook's work leaves in flight (its `started` record is written):
    /// the resume ends when it lands.
    Fly(Box<super::flying_resume::ResumeWork>),
}

/// Builds a [`Runtime`].
pub struct RuntimeBuilder {
    store: Arc<dyn Store>,
    engine: Option<WasmEngine>,
    clock: Arc<dyn Clock>,
    config: RuntimeConfig,
    offloader: Option<super::offload::Offloader>,
    effects: EffectRegistry,
    plugins: Plugins,
    metrics: Option<Arc<super::metrics::Metrics>>,
    tracer: super::trace::Tracer,
}

impl RuntimeBuilder {
    /// Adds a feature ([`super::plugin`]): its effects, its state and its
    /// hooks. A plugin of the same name as one given before replaces it.
    pub fn plugin(mut self, plugin: Arc<dyn Plugin>) -> Self {
        self.plugins.add(plugin);
        self
    }

    /// Counts this runtime's commits and resumes into `metrics` (default:
    /// counters of its own; give two runtimes the same to count together).
    pub fn metrics(mut self, metrics: Arc<super::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Keeps values larger than `threshold_bytes` (as JSON) in `artifacts`:
    /// top-level vars (except `_meta`, `_limits`, `_runtime`), a run's
    /// output, effect payloads and record results are stored as
    /// `{"$artifact": id}` and loaded back when read.
    pub fn artifacts(
        mut self,
        artifacts: Arc<dyn crate::store::ArtifactStore>,
        threshold_bytes: usize,
    ) -> Self {
        self.offloader = Some(super::offload::Offloader {
            store: artifacts,
            threshold: threshold_bytes,
            recent: Default::default(),
        });
        self
    }

    /// Where the runtime's spans go (default: [`super::trace::Tracer::off`]:
    /// no spans, at no cost). See [`super::trace`].
    pub fn tracer(mut self, tracer: super::trace::Tracer) -> Self {
        self.tracer = tracer;
        self
    }

    /// The wasm engine (default: a new engine without an on-disk cache).
    pub fn engine(mut self, engine: WasmEngine) -> Self {
        self.engine = Some(engine);
        self
    }

    /// The clock (default: the system clock). Leases always use the system
    /// clock.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The configuration.
    pub fn config(mut self, config: RuntimeConfig) -> Self {
        self.config = config;
        self
    }

    /// Adds (or replaces) an effect kind: flows can then name it, and the
    /// runtime executes it by its class (see [`crate::effects`]).
    pub fn effect(mut self, handler: Arc<dyn EffectHandler>) -> Self {
        self.effects.register(handler);
        self
    }

    /// Builds the runtime (and starts its lease-renewing thread).
    pub fn build(self) -> Result<Runtime> {
        if self.config.lease_ttl < super::config::MIN_LEASE_TTL {
            return Err(Error::InvalidInput {
                field: "lease_ttl".into(),
                message: format!(
                    "{} ms is too short: a lease is renewed every third of it, and must outlast a pause of the process (at least {} ms)",
                    self.config.lease_ttl.as_millis(),
                    super::config::MIN_LEASE_TTL.as_millis()
                ),
            });
        }
        let engine = match self.engine {
            Some(e) => e,
            None => WasmEngine::new(Default::default())?,
        };
        let mut effects = self.effects;
        let mut extensions = Extensions::default();
        let mut sealed = std::collections::BTreeSet::new();
        let mut retries = HashMap::new();
        for plugin in self.plugins.iter() {
            plugin.install(&mut Install {
                engine: &engine,
                store: &self.store,
                config: &self.config,
                effects: &mut effects,
                extensions: &mut extensions,
                sealed: &mut sealed,
                retries: &mut retries,
            })?;
        }
        let mut config = self.config;
        for (kind, policy) in retries {
            config.retries.entry(kind).or_insert(policy);
        }
        let keeper = LeaseKeeper::start(
            super::txn::new_holder_id(),
            config.lease_ttl,
            self.store.clone(),
        );
        Ok(Runtime {
            inner: Arc::new(Inner {
                store: self.store,
                engine,
                clock: self.clock,
                config,
                offloader: self.offloader,
                effects,
                plugins: self.plugins,
                extensions,
                workflows: RwLock::new(HashMap::new()),
                embedded: RwLock::new(HashMap::new()),
                locks: RunLocks::default(),
                keeper,
                parked: super::parked::Parked::default(),
                subscribers: parking_lot::Mutex::new(Vec::new()),
                metrics: self.metrics.unwrap_or_default(),
                foreign: super::foreign::Foreign::default(),
                flights: super::flight::Flights::default(),
                loaded: super::versions::Loaded::default(),
                tracer: self.tracer,
            }),
        })
    }
}

pub(crate) struct Inner {
    store: Arc<dyn Store>,
    engine: WasmEngine,
    clock: Arc<dyn Clock>,
    pub(crate) config: RuntimeConfig,
    offloader: Option<super::offload::Offloader>,
    pub(crate) effects: EffectRegistry,
    pub(crate) plugins: Plugins,
    extensions: Extensions,
    workflows: RwLock<HashMap<String, Arc<Workflow>>>,
    /// The workflows plugins embed, by their reserved ids.
    embedded: RwLock<HashMap<String, Arc<Workflow>>>,
    locks: RunLocks,
    keeper: Arc<LeaseKeeper>,
    /// States of runs this runtime parked a moment ago (see `parked`).
    pub(crate) parked: super::parked::Parked,
    pub(crate) subscribers: parking_lot::Mutex<Vec<Subscriber>>,
    /// The deployed versions this runtime loaded.
    pub(crate) loaded: super::versions::Loaded,
    metrics: Arc<super::metrics::Metrics>,
    /// Runs the driver found to be of workflows this runtime does not have.
    pub(crate) foreign: super::foreign::Foreign,
    /// Effects in flight, and the threads that settle them when they land.
    pub(crate) flights: super::flight::Flights,
    /// Where spans go (off unless the embedder gave an exporter).
    pub(crate) tracer: super::trace::Tracer,
}

impl Inner {
    /// The store (for the runtime's own threads, which hold only this).
    pub(crate) fn store_ref(&self) -> &dyn Store {
        &*self.store
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.keeper.shutdown();
    }
}

/// The durable runtime: executes runs of loaded workflows against a store.
/// Cloning is cheap and shares everything. Any number of runtimes, in any
/// number of processes, may work on one store at once.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("holder", &self.inner.keeper.holder)
            .finish_non_exhaustive()
    }
}

/// Whether `id` is a valid run id: `[A-Za-z0-9_-]+`, at most 200 characters.
pub(crate) fn valid_run_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 200
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl Runtime {
    /// Starts building a runtime over `store`.
    pub fn builder(store: Arc<dyn Store>) -> RuntimeBuilder {
        RuntimeBuilder {
            store,
            engine: None,
            clock: Arc::new(SystemClock),
            config: RuntimeConfig::default(),
            offloader: None,
            effects: EffectRegistry::builtin(),
            plugins: Plugins::default(),
            metrics: None,
            tracer: Default::default(),
        }
    }

    /// Where this runtime's spans go (see [`super::trace`]): plugins and
    /// the server add theirs through it.
    pub fn tracer(&self) -> &super::trace::Tracer {
        &self.inner.tracer
    }

    /// What this runtime (its commits and resumes) and its engine (its
    /// guest calls) counted so far (`GET /metrics`).
    pub fn counters(&self) -> super::metrics::Counters {
        self.inner
            .metrics
            .counters(self.inner.engine.guest_counts())
    }

    /// The artifact store large values (and evidence, attachments) go
    /// to, if the runtime has one.
    pub fn artifact_store(&self) -> Option<&dyn crate::store::ArtifactStore> {
        self.inner.offloader.as_ref().map(|o| o.store.as_ref())
    }

    /// The state of type `T` a plugin keeps in this runtime
    /// ([`super::plugin::Install::set_extension`]).
    pub fn extension<T: std::any::Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.inner.extensions.get()
    }

    /// The names of this runtime's plugins, in the order they installed.
    pub fn plugins(&self) -> Vec<&'static str> {
        self.inner.plugins.names()
    }

    /// The store.
    pub fn store(&self) -> &dyn Store {
        &*self.inner.store
    }

    /// The wasm engine.
    pub fn engine(&self) -> &WasmEngine {
        &self.inner.engine
    }

    /// The configuration.
    pub fn config(&self) -> &RuntimeConfig {
        &self.inner.config
    }

    /// The effect kinds this runtime executes.
    pub fn effects(&self) -> &EffectRegistry {
        &self.inner.effects
    }

    /// The clock.
    pub fn now(&self) -> DateTime<Utc> {
        self.inner.clock.now()
    }

    /// This runtime's lease holder id (`<host>:<pid>:<random>`), as the
    /// store records it on the runs it is executing.
    pub fn holder_id(&self) -> &str {
        &self.inner.keeper.holder
    }

    pub(crate) fn locks(&self) -> &RunLocks {
        &self.inner.locks
    }

    pub(crate) fn keeper(&self) -> &LeaseKeeper {
        &self.inner.keeper
    }

    /// The workflow a plugin embeds under the reserved id `workflow_id`
    /// (loaded once, then kept apart from the registered ones, so no
    /// bundle, however it was recorded, stands in for it).
    fn embedded_workflow(&self, workflow_id: &str) -> Result<Arc<Workflow>> {
        if let Some(wf) = self.inner.embedded.read().get(workflow_id) {
            return Ok(wf.clone());
        }
        for plugin in self.inner.plugins.iter() {
            if let Some(wf) = plugin.embedded_workflow(self, workflow_id) {
                let wf = Arc::new(wf?);
                self.inner
                    .embedded
                    .write()
                    .insert(workflow_id.to_string(), wf.clone());
                return Ok(wf);
            }
        }
        Err(Error::UnknownWorkflow {
            workflow_id: workflow_id.to_string(),
        })
    }

    /// Registers an already loaded workflow (one of a reserved id is never
    /// used: that id is its plugin's).
    pub fn register(&self, workflow: Arc<Workflow>) {
        self.inner
            .workflows
            .write()
            .insert(workflow.workflow_id.clone(), workflow);
    }

    /// The workflow `workflow_id` if it has no versions: a plugin's own (a
    /// reserved id, never another bundle's) or one registered in code.
    pub(crate) fn unversioned_workflow(&self, workflow_id: &str) -> Result<Option<Arc<Workflow>>> {
        // Only reserved ids are embedded: once loaded, the plugins (and
        // the texts of their refusals) are not asked again.
        if let Some(wf) = self.inner.embedded.read().get(workflow_id) {
            return Ok(Some(wf.clone()));
        }
        if self.inner.plugins.reserved(workflow_id).is_some() {
            return self.embedded_workflow(workflow_id).map(Some);
        }
        Ok(self.inner.workflows.read().get(workflow_id).cloned())
    }

    /// Why no bundle may define `workflow_id`, if a plugin reserved it.
    pub(crate) fn plugins_reserved(&self, workflow_id: &str) -> Option<String> {
        self.inner.plugins.reserved(workflow_id).map(|r| r.define)
    }

    /// Creates a run of `workflow_id` (status `running`, at the entry node)
    /// and returns its id. `vars._limits` is filled in when absent. Does not
    /// execute anything: call [`Runtime::tick`] (or let the driver).
    pub fn start(&self, workflow_id: &str, options: StartOptions) -> Result<String> {
        self.refuse_reserved(workflow_id)?;
        let explicit = options.run_id.is_some();
        let run = self.new_run(workflow_id, options)?;
        let stored = match &self.inner.offloader {
            Some(o) => o.offload_run(&run, &run.created_at)?,
            None => None,
        };
        let (existing, created) = self
            .store()
            .create_if_absent(stored.as_ref().unwrap_or(&run))?;
        if !created {
            if !explicit {
                return Err(Error::invalid("run_id", "a generated run id collided"));
            }
            let identity = self.inner.plugins.iter().flat_map(|p| p.identity_meta());
            if let Some(field) = identity_mismatch(&existing, &run, identity) {
                return Err(Error::IdentityConflict {
                    run_id: run.run_id,
                    field: field.to_string(),
                });
            }
        }
        Ok(run.run_id)
    }

    /// Starts a run and ticks it until it waits or ends, returning the saved
    /// state (its `run_id` is the new run's id).
    ///
    /// Without an explicit run id, the run is created by the commit of its
    /// first step (one store commit instead of two), or, if that step
    /// touches other runs or the world, just before it: if the process dies
    /// during the step, the run never existed, and the caller, who never got
    /// its id, loses nothing. With an explicit id it is `start` (create if
    /// absent, identity-checked) followed by `tick`.
    pub fn run(&self, workflow_id: &str, options: StartOptions) -> Result<RunState> {
        self.refuse_reserved(workflow_id)?;
        if options.run_id.is_some() || self.inner.config.max_steps_per_tick == 0 {
            let id = self.start(workflow_id, options)?;
            return self.tick(&id);
        }
        let run = self.new_run(workflow_id, options)?;
        let mut txn = self.hold_new(&run.run_id)?;
        self.run_steps(
            &mut txn,
            run,
            self.inner.config.max_steps_per_tick,
            Vec::new(),
            0,
        )
    }

    /// Refuses to start a run of a workflow a plugin reserved (its runs
    /// are the plugin's to create).
    fn refuse_reserved(&self, workflow_id: &str) -> Result<()> {
        match self.inner.plugins.reserved(workflow_id) {
            Some(reserved) => Err(Error::invalid("workflow_id", reserved.start)),
            None => Ok(()),
        }
    }

    /// A new run of `workflow_id` (not stored). Unlike [`Runtime::start`],
    /// it does not refuse a workflow a plugin reserved: it is how that
    /// plugin creates its runs.
    #[doc(hidden)] // for features built on the kernel; not a stable API
    pub fn new_run(&self, workflow_id: &str, options: StartOptions) -> Result<RunState> {
        let parent = options
            .same_bundle_as
            .as_ref()
            .map(|(id, v)| (id.as_str(), *v));
        let (wf, workflow_version) =
            self.starting_version(workflow_id, options.workflow_version, parent)?;
        if let Some(id) = &options.run_id {
            if !valid_run_id(id) {
                return Err(Error::invalid(
                    "run_id",
                    format!("{id:?} is not a valid run id ([A-Za-z0-9_-]+, at most 200)"),
                ));
            }
        }
        let explicit = options.run_id.is_some();
        let run_id = options
            .run_id
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let mut vars = options.vars;
        for (k, v) in &vars {
            if let Some(why) = super::keys::too_deep(v, 1) {
                return Err(Error::invalid(format!("vars.{k}"), why));
            }
        }
        if let Some(key) = vars.keys().find(|k| k.starts_with("_runtime")) {
            return Err(Error::invalid(
                format!("vars.{key}"),
                "is owned by the host and cannot be set at start",
            ));
        }
        if explicit {
            seed_creation_digest(
                &mut vars,
                &wf.workflow_id,
                options.session_id.as_deref(),
                options.parent_run_id.as_deref(),
            );
        }
        let mut runtime = options.runtime;
        let mut start = RunStart {
            workflow_id: &wf.workflow_id,
            run_id: &run_id,
            explicit_id: explicit,
            session_id: options.session_id.as_deref(),
            parent_run_id: options.parent_run_id.as_deref(),
            vars: &mut vars,
            runtime: &mut runtime,
        };
        for plugin in self.inner.plugins.iter() {
            plugin.prepare_run(self, &mut start)?;
        }
        for plugin in self.inner.plugins.iter() {
            plugin.seal_run(self, &mut start)?;
        }
        self.seed_trace(options.trace_parent, &vars, &mut runtime);
        if !runtime.is_empty() {
            vars.insert("_runtime".into(), Value::Object(runtime));
        }
        seed_limits(&mut vars, self.inner.config.limits_value())?;
        let now = format_time(self.now());
        Ok(RunState {
            version: 1,
            run_id,
            workflow_id: wf.workflow_id.clone(),
            workflow_version,
            status: RunStatus::Running,
            current_node: Some(wf.entry.clone()),
            vars,
            waiting: None,
            output: None,
            error: None,
            created_at: now.clone(),
            updated_at: now,
            actor_id: options.actor_id,
            session_id: options.session_id,
            parent_run_id: options.parent_run_id,
        })
    }

    /// Exports the span of `run`'s whole life (it has just ended outside a
    /// tick: a cancel, a failure its child caused), if tracing is on.
    pub(crate) fn trace_run_end(&self, run: &RunState) {
        if self.inner.tracer.is_on() {
            let trace = super::trace::run_trace(&run.run_id, run.vars.get("_runtime"));
            self.inner.tracer.record(super::trace::run_span(trace, run));
        }
    }

    /// Keeps in a new run's `_runtime` the trace it starts in: the caller's
    /// (`parent`), else that of the span this thread is in (the step of
    /// another run that starts it), if tracing is on. An occurrence started
    /// by its controller's step only links to that step: it starts its own
    /// trace.
    fn seed_trace(
        &self,
        parent: Option<super::trace::SpanContext>,
        vars: &Map<String, Value>,
        runtime: &mut Map<String, Value>,
    ) {
        if let Some(parent) = parent {
            return super::trace::seed(runtime, parent, false);
        }
        let here = self
            .inner
            .tracer
            .is_on()
            .then(super::trace::current)
            .flatten();
        if let Some(here) = here {
            let occurrence = vars
                .get("_meta")
                .is_some_and(|m| m.get("occurrence").is_some());
            super::trace::seed(runtime, here, occurrence);
        }
    }

    /// Commits through the store, offloading large values first, and hands
    /// the records to the subscribers.
    pub(crate) fn store_commit(
        &self,
        records: Vec<StepRecord>,
        run: &RunState,
        fence: Fence<'_>,
        after: LeaseAfter,
        changed: Option<&[String]>,
    ) -> Result<()> {
        let started = std::time::Instant::now();
        let count = records.len();
        let mut span = self.inner.tracer.enter("stepwell.commit", None);
        span.attr_with("stepwell.records", || count as u64);
        match &self.inner.offloader {
            // Nobody to show the records to after: the store may keep them.
            None if !self.has_subscribers() => {
                match changed {
                    Some(keys) => self
                        .store()
                        .commit_changed(records, run, fence, after, keys)?,
                    None => self.store().commit_owned(records, run, fence, after)?,
                }
                self.inner.parked.committed(run, true);
                self.inner.metrics.commit(count, started.elapsed());
                return Ok(());
            }
            None => {
                self.store().commit(&records, run, fence, after)?;
                self.inner.parked.committed(run, true);
            }
            Some(o) => {
                let now = run.updated_at.clone();
                let stored_records = o.offload_records(&records, &now)?;
                let stored_run = o.offload_run(run, &now)?;
                self.store().commit(
                    stored_records.as_deref().unwrap_or(&records),
                    stored_run.as_ref().unwrap_or(run),
                    fence,
                    after,
                )?;
                // A state with values kept as artifacts is not remembered:
                // the store holds another form of it.
                self.inner.parked.committed(run, stored_run.is_none());
            }
        }
        self.inner.metrics.commit(count, started.elapsed());
        self.publish(&records);
        Ok(())
    }

    /// Appends records ahead of the commit that will make their transition
    /// true (the crash-ordering law's direction), if `fence` still holds.
    pub(crate) fn store_append_ahead(
        &self,
        records: &[StepRecord],
        fence: Fence<'_>,
    ) -> Result<()> {
        match &self.inner.offloader {
            None => self.store().append_ahead(records, fence)?,
            Some(o) => {
                let now = format_time(self.now());
                let stored = o.offload_records(records, &now)?;
                self.store()
                    .append_ahead(stored.as_deref().unwrap_or(records), fence)?;
            }
        }
        self.publish(records);
        Ok(())
    }

    /// The run's current state (offloaded values loaded back).
    pub fn get_state(&self, run_id: &str) -> Result<RunState> {
        self.load_run(run_id)?.ok_or_else(|| Error::RunNotFound {
            run_id: run_id.to_string(),
        })
    }

    /// The run with this id, if any (offloaded values loaded back).
    pub fn load_run_opt(&self, run_id: &str) -> Result<Option<RunState>> {
        self.load_run(run_id)
    }

    /// The run with this id, if any, offloaded values loaded back.
    pub(crate) fn load_run(&self, run_id: &str) -> Result<Option<RunState>> {
        let mut run = self.store().load_run(run_id)?;
        if let Some(r) = run.as_mut() {
            self.load_offloaded(r)?;
        }
        Ok(run)
    }

    /// Loads a stored run's offloaded values back.
    pub(crate) fn load_offloaded(&self, run: &mut RunState) -> Result<()> {
        if let Some(o) = &self.inner.offloader {
            o.load_run(run)?;
        }
        Ok(())
    }

    /// The run's ledger, oldest first (offloaded values loaded back; the
    /// stored form, with references, is what the hash chain covers). It
    /// holds the whole ledger in memory: a reader of a ledger that may be
    /// long reads it a page at a time ([`Runtime::ledger_pages`]).
    pub fn get_ledger(&self, run_id: &str) -> Result<Vec<StepRecord>> {
        if self.store().load_run(run_id)?.is_none() {
            return Err(Error::RunNotFound {
                run_id: run_id.to_string(),
            });
        }
        self.loaded_records(self.store().list_records(run_id)?)
    }

    /// The run's records ahead of its state, offloaded values loaded back.
    pub(crate) fn list_ahead(&self, run_id: &str) -> Result<Vec<StepRecord>> {
        self.loaded_records(self.store().list_ahead(run_id)?)
    }

    /// `records` as the store keeps them, with their offloaded values
    /// loaded back.
    pub(crate) fn loaded_records(&self, mut records: Vec<StepRecord>) -> Result<Vec<StepRecord>> {
        if let Some(o) = &self.inner.offloader {
            o.load_records(&mut records)?;
        }
        Ok(records)
    }

    /// Checks the run's ledger hash chain: `Ok(Ok(head))` with the hash of
    /// the newest record, or `Ok(Err(break))` naming the first record that
    /// was changed, removed or reordered.
    pub fn verify_ledger(
        &self,
        run_id: &str,
    ) -> Result<std::result::Result<Option<String>, crate::store::ChainBreak>> {
        Ok(self.check_ledger(run_id)?.verdict)
    }

    /// The runs matching `query`, oldest first (offloaded values loaded back).
    pub fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunState>> {
        let mut runs = self.store().list_runs(query)?;
        for r in &mut runs {
            self.load_offloaded(r)?;
        }
        Ok(runs)
    }

    /// Executes the run until it waits, ends, or has taken
    /// `max_steps_per_tick` steps. A waiting run whose time wait is due (or
    /// whose event deadline passed) is moved on first. Returns the saved
    /// state. A run another thread or process is executing is waited for (up
    /// to [`RuntimeConfig::lease_wait`], then [`Error::Conflict`]).
    pub fn tick(&self, run_id: &str) -> Result<RunState> {
        self.tick_with(run_id, self.inner.config.max_steps_per_tick)
    }

    /// [`Runtime::tick`] with an explicit step budget.
    pub fn tick_with(&self, run_id: &str, max_steps: u64) -> Result<RunState> {
        self.tick_at(run_id, max_steps, 0, self.inner.config.lease_wait)
    }

    /// A tick `depth` levels deep inside other runs' steps.
    pub(crate) fn tick_at(
        &self,
        run_id: &str,
        max_steps: u64,
        depth: u32,
        wait: std::time::Duration,
    ) -> Result<RunState> {
        // A cheap look first: an ended run, or one waiting on something
        // that is not due, needs no lease.
        let peek = self.get_state(run_id)?;
        if peek.status.is_terminal() || (peek.status == RunStatus::Waiting && !self.is_due(&peek)) {
            return Ok(peek);
        }
        let (mut txn, mut run) = self.claim(run_id, wait)?;
        let mut pending = Vec::new();
        if run.status == RunStatus::Waiting {
            match self.resolve_due(&mut run)? {
                Some(record) => pending.push(record),
                None => return Ok(run),
            }
        }
        if run.status.is_terminal() {
            return Ok(run);
        }
        match self.run_steps(&mut txn, run, max_steps, pending, depth) {
            Err(Error::Conflict { .. }) => {
                drop(txn);
                self.get_state(run_id)
            }
            other => other,
        }
    }

    /// Resumes the run's current wait with `payload`: checks that the run
    /// waits on `wait_key`, writes the payload to the wait's `result_key`,
    /// and continues from the wait's `resume_to_node`, committing the resume
    /// together with the first step it leads to. A wait is resumed at most
    /// once, whatever the number of threads and processes trying: a run
    /// that is not waiting, or waits on another key, gets
    /// [`Error::StaleResume`] and is left unchanged.
    pub fn resume(&self, run_id: &str, wait_key: &str, payload: Value) -> Result<RunState> {
        self.resume_at(run_id, Some(wait_key), payload, None, 0, true)
            .map(|(state, _)| state)
    }

    /// Resumes whatever wait the run is waiting on now, with `payload`: the
    /// check of the wait and the resume are one transaction, so there is no
    /// window in which another caller's resume could slip in between.
    pub fn respond(&self, run_id: &str, payload: Value) -> Result<RunState> {
        self.resume_at(run_id, None, payload, None, 0, true)
            .map(|(state, _)| state)
    }

    /// The resume behind [`Runtime::resume`] and the deliveries of effects:
    /// `cause` names the effect (of another run) that resumes, `depth` how
    /// deep inside other runs' steps this runs, `tick` whether the steps the
    /// resume leads to run now. Returns the state, and `false` if `cause`
    /// had already resumed this run (nothing was done).
    #[doc(hidden)] // for features built on the kernel; not a stable API
    pub fn resume_at(
        &self,
        run_id: &str,
        wait_key: Option<&str>,
        payload: Value,
        cause: Option<&str>,
        depth: u32,
        tick: bool,
    ) -> Result<(RunState, bool)> {
        let size = self.check_resume_payload(&payload)?;
        // Optimistic first: the resume's commit takes the lease. If that
        // commit finds the run unchanged but leased by someone else (a
        // driver looking at it), wait for the lease and do it again.
        // Before that, from the state this runtime parked the run in, if
        // it remembers it (`parked`): if that state turns out to be out of
        // date, the resume is done again from the stored one.
        let remembered = match cause {
            None => self.inner.parked.take(run_id),
            // An event's delivery decides from the run's ledger and state
            // whether it was delivered before: it reads both.
            Some(_) => None,
        };
        let resume = Resume {
            run_id,
            wait_key,
            size,
            cause,
            depth,
            tick,
        };
        let held = |payload: Value, hold: Hold| self.resume_held(resume, payload, hold);
        let guessed = match remembered {
            Some(state) => held(payload.clone(), Hold::Remembered(Box::new(state))),
            None => Ok(Attempt::Stale),
        };
        let optimistic = match guessed {
            Ok(Attempt::Stale) => held(payload.clone(), Hold::Taking),
            other => other,
        };
        let answer = match optimistic {
            // A lease another holder had when the hold began.
            Ok(Attempt::ClaimFirst) | Err(Error::Conflict { .. }) => held(payload, Hold::Claim),
            other => other,
        };
        let answer = match answer {
            Ok(Attempt::Done(state, resumed)) => Ok((*state, resumed)),
            // A hold that claimed the lease first has it.
            Ok(Attempt::ClaimFirst) => Err(Error::Conflict {
                run_id: run_id.to_string(),
                reason: "the run's lease was lost while it was resumed".into(),
            }),
            // Only a hold on a remembered state says so, and it was
            // followed by one on the stored state.
            Ok(Attempt::Stale) => Err(Error::Conflict {
                run_id: run_id.to_string(),
                reason: "the run changed while it was resumed".into(),
            }),
            Err(e) => Err(e),
        };
        if answer.is_ok() {
            self.inner.metrics.resume();
        }
        answer
    }

    /// A resume's payload, checked: its size as JSON, if it may enter the
    /// run.
    fn check_resume_payload(&self, payload: &Value) -> Result<usize> {
        let limit = self.inner.config.max_payload_bytes;
        let size = serde_json::to_vec(payload).map_or(0, |b| b.len());
        if size > limit {
            return Err(Error::invalid(
                "payload",
                format!("{size} bytes of JSON, over the limit of {limit} (RuntimeConfig::max_payload_bytes)"),
            ));
        }
        // Written under the wait's result key (at most 16 parts deep) and
        // recorded in the ledger a few levels down.
        if let Some(why) = super::keys::too_deep(payload, super::keys::MAX_RESULT_KEY_PARTS) {
            return Err(Error::invalid("payload", why));
        }
        Ok(size)
    }

    /// [`Runtime::resume_at`] with a hold that takes the lease at its first
    /// commit (optimistic: [`Hold::Taking`], [`Hold::Remembered`]) or with
    /// the lease claimed first; `size` is the payload's, checked. An
    /// optimistic hold whose first commit loses to a lease (not to a
    /// change), or whose wait's effect asks for the lease, returns
    /// [`Attempt::ClaimFirst`]. A hold on a remembered state
    /// returns [`Attempt::Stale`] if nothing was written and the state
    /// turned out (or may have turned out) to be out of date: its first
    /// commit lost to a change or a lease, or it refused the resume on a
    /// run that has changed since. A store error passes through: a commit
    /// whose outcome is unknown is never done again.
    pub(super) fn resume_held<'a>(
        &'a self,
        resume: Resume<'_>,
        payload: Value,
        hold: Hold<'a>,
    ) -> Result<Attempt> {
        let Resume {
            run_id,
            wait_key,
            size,
            cause,
            depth,
            tick,
        } = resume;
        let optimistic = matches!(hold, Hold::Taking | Hold::Remembered(_));
        let guessed = matches!(hold, Hold::Remembered(_));
        // A resume that finds it must claim the lease first is done again
        // (a second span, `claim`).
        let hold_name = match &hold {
            Hold::Taking => "take",
            Hold::Remembered(_) => "remembered",
            Hold::Claim => "claim",
            Hold::Claimed(_) => "landed",
        };
        let wait = self.inner.config.lease_wait;
        let (mut txn, mut run) = match hold {
            Hold::Remembered(state) => self.hold_taking(run_id, wait, Some(*state))?,
            Hold::Taking => self.hold_taking(run_id, wait, None)?,
            Hold::Claim => self.claim(run_id, wait)?,
            Hold::Claimed(held) => *held,
        };
        let read_version = run.version;
        let mut resume_span = match self.inner.tracer.is_on() {
            true => super::trace::run_work_span(&self.inner.tracer, "stepwell.resume", &run).0,
            false => super::trace::Span::none(),
        };
        resume_span.attr("stepwell.resume.hold", hold_name);
        // A refusal decided from a remembered state stands if the run has
        // not changed since; else the resume is done from the stored one.
        let refuse = |e: Error| -> Result<Attempt> {
            if guessed
                && !self
                    .get_state(run_id)
                    .is_ok_and(|r| r.version == read_version)
            {
                return Ok(Attempt::Stale);
            }
            Err(e)
        };
        if let Some(cause) = cause {
            // Checked in the listener's own ledger, under its lease, before
            // anything is resumed: a replayed event does not resume a
            // listener a second time, even one that waits on the key again.
            // A record of this cause that ended the very wait the run is
            // still in was never committed (a torn commit left it ahead of
            // the state): that resume did not happen.
            let current = (run.status == RunStatus::Waiting)
                .then(|| effect_key(&run))
                .flatten();
            let delivered = Runtime::find_records(self, run_id, &caused_resume_key(cause))?
                .iter()
                .any(|r| {
                    let ended = r
                        .result
                        .as_ref()
                        .and_then(|v| v["resumed"]["ends"].as_str());
                    current.is_none() || ended != current.as_deref()
                });
            if delivered {
                return Ok(Attempt::Done(Box::new(run), false));
            }
        }
        let Some(wait) = run
            .waiting
            .as_ref()
            .filter(|_| run.status == RunStatus::Waiting)
        else {
            return refuse(stale(run_id, "Run is not waiting".into()));
        };
        if let Some(key) = wait_key {
            if wait.wait_key != key {
                return refuse(stale(
                    run_id,
                    format!(
                        "wait_key mismatch: expected '{}', got '{key}'",
                        wait.wait_key
                    ),
                ));
            }
        }
        if let Some(key) = wait.result_key.as_deref().filter(|k| is_host_owned(k)) {
            return refuse(Error::invalid(
                "result_key",
                format!("the wait writes to {key:?}, which is owned by the host"),
            ));
        }
        // Load the workflow first: a resume that cannot continue is refused
        // before anything is written.
        if let Err(e) = self.workflow_of(&run) {
            return refuse(e);
        }
        // A person's answer whose work takes its time (an approved tool
        // batch) leaves it in flight when calls fly.
        let fly = cause.is_none() && depth == 0 && tick && self.inner.config.calls_in_flight;
        let hook = match self.resume_hook(&mut txn, &run, &payload, optimistic, fly) {
            Ok(hook) => hook,
            Err(e @ Error::Store(_)) => return Err(e),
            Err(e) => return refuse(e),
        };
        let written = match hook {
            Hook::None => None,
            Hook::Written(v) => v,
            Hook::ClaimFirst => return Ok(Attempt::ClaimFirst),
            Hook::Fly(work) => {
                self.fly_resume(&run, &payload, *work);
                txn.detach();
                return Ok(Attempt::Done(Box::new(run), true));
            }
        };
        let ended_key = wait.wait_key.clone();
        let record = self.end_wait_with(&mut run, payload, written, "resumed", cause);
        super::keys::count_data(&mut run, size as u64);
        if !tick && depth > 0 {
            // Left to the driver in the middle of a chain of runs setting
            // one another off: the chain's depth goes with it.
            super::keys::set_cascade_depth(&mut run, depth);
        }
        let max = if tick {
            self.inner.config.max_steps_per_tick
        } else {
            0
        };
        match self.run_steps(&mut txn, run, max, vec![record], depth) {
            Ok(state) => Ok(Attempt::Done(Box::new(state), true)),
            // Nothing landed from a remembered state: lost to a change or
            // a lease, done again from the store; a store error stands (a
            // commit whose outcome is unknown is not done again).
            Err(Error::Conflict { .. }) if guessed && txn.commits == 0 => Ok(Attempt::Stale),
            Err(e @ Error::Store(_)) if guessed => Err(e),
            Err(e) if guessed && txn.commits == 0 => {
                drop(txn);
                refuse(e)
            }
            // Lost before the resume landed: it did not happen. If the run
            // did not change (someone only holds its lease), or changed
            // but still waits on the same wait (an upgrade moved it), the
            // caller may wait for the lease and try again.
            Err(Error::Conflict { .. }) if txn.commits == 0 => {
                drop(txn);
                let now = self.get_state(run_id)?;
                let same_wait = now.status == RunStatus::Waiting
                    && now.waiting.as_ref().map(|w| &w.wait_key) == Some(&ended_key);
                if optimistic && (now.version == read_version || same_wait) {
                    Ok(Attempt::ClaimFirst)
                } else {
                    Err(stale(run_id, "Run is not waiting".into()))
                }
            }
            Err(Error::Conflict { .. }) => {
                drop(txn);
                Ok(Attempt::Done(Box::new(self.get_state(run_id)?), true))
            }
            Err(e) => Err(e),
        }
    }

    /// Cancels the run (and its unfinished children, and theirs): status
    /// `cancelled`, a `cancelled` ledger record `{"cancelled": {"by",
    /// "reason"}}`, no further step. An ended run is returned unchanged.
    /// A cancel does not wait for a run another thread or process is
    /// executing: it lands at once, and that executor's next commit finds
    /// the run changed and stops.
    pub fn cancel_run(&self, run_id: &str, reason: Option<&str>) -> Result<RunState> {
        self.cancel_run_by(run_id, reason, "api")
    }

    /// [`Runtime::cancel_run`] naming who cancels (`api`, `cli`, `driver`,
    /// ...), recorded in the ledger and in `vars._runtime.control`.
    pub fn cancel_run_by(
        &self,
        run_id: &str,
        reason: Option<&str>,
        cancelled_by: &str,
    ) -> Result<RunState> {
        let mut attempts = 0;
        let run = loop {
            let mut run = self.get_state(run_id)?;
            if run.status == RunStatus::Completed || run.status == RunStatus::Failed {
                return Ok(run);
            }
            if run.status == RunStatus::Cancelled {
                // Cancelled before; its children may not be (a crash between).
                break run;
            }
            let now = format_time(self.now());
            let reason_text = reason.unwrap_or("cancelled by request");
            let error = format!("cancelled: {reason_text}");
            let record = StepRecord {
                status: StepStatus::Cancelled,
                error: Some(error.clone()),
                result: Some(json!({ "cancelled": { "by": cancelled_by, "reason": reason } })),
                ended_at: Some(now.clone()),
                idempotency_key: Some(terminal_key(&run)),
                ..self.record(&run, run.current_node.clone(), &now)
            };
            let expected = run.version;
            run.status = RunStatus::Cancelled;
            run.error = Some(error);
            run.waiting = None;
            run.updated_at = now;
            let control = runtime_vars(&mut run)
                .entry("control")
                .or_insert_with(|| json!({}));
            if let Some(c) = control.as_object_mut() {
                c.insert("cancelled_by".into(), json!(cancelled_by));
            }
            run.version = expected + 1;
            let fence = Fence::unleased(expected);
            match self.store_commit(vec![record], &run, fence, LeaseAfter::Release, None) {
                Ok(()) => {
                    // An effect of the run in flight here stops now.
                    self.inner.flights.cancel(run_id);
                    self.trace_run_end(&run);
                    break run;
                }
                Err(Error::Store(e)) if e.is_conflict() && attempts < 20 => {
                    attempts += 1;
                    std::thread::sleep(std::time::Duration::from_millis(attempts));
                }
                Err(Error::Store(e)) if e.is_conflict() => {
                    return Err(Error::Conflict {
                        run_id: run_id.to_string(),
                        reason: e.message,
                    })
                }
                Err(e) => return Err(e),
            }
        };
        let children = self.store().list_runs(&RunQuery {
            parent_run_id: Some(run_id.to_string()),
            ..RunQuery::default()
        })?;
        for child in children.iter().filter(|c| !c.status.is_terminal()) {
            self.cancel_run_by(
                &child.run_id,
                Some(&format!("parent run {run_id} was cancelled")),
                cancelled_by,
            )?;
        }
        Ok(run)
    }

    /// Whether a waiting run's time wait (or event deadline) has come.
    pub(crate) fn is_due(&self, run: &RunState) -> bool {
        crate::store::wait_due_at(run).is_some_and(|t| t <= self.now())
    }

    /// If the waiting `run` is due (a time wait whose time came, an event
    /// wait past its deadline), ends the wait in memory and returns the
    /// record of it, for the caller to commit.
    pub(crate) fn resolve_due(&self, run: &mut RunState) -> Result<Option<StepRecord>> {
        let Some(wait) = &run.waiting else {
            return Ok(None);
        };
        let Some(until) = wait.until.as_deref() else {
            return Ok(None);
        };
        let due =
            super::clock::parse_time(until).map_err(|e| Error::invalid("waiting.until", e))?;
        if due > self.now() {
            return Ok(None);
        }
        let payload = match wait.reason {
            WaitReason::Until => json!({ "until": until }),
            WaitReason::Event => json!({ "timed_out": true }),
            _ => return Ok(None),
        };
        Ok(Some(self.end_wait(run, payload, "due", None)?))
    }

    /// Ends `run`'s wait with `payload` (in memory) and returns the ledger
    /// record of it; a run that does not wait is an error.
    #[doc(hidden)] // for features built on the kernel; not a stable API
    pub fn end_wait(
        &self,
        run: &mut RunState,
        payload: Value,
        how: &str,
        cause: Option<&str>,
    ) -> Result<StepRecord> {
        if run.waiting.is_none() {
            return Err(Error::invalid(
                "run",
                format!("run {} is not waiting: it has no wait to end", run.run_id),
            ));
        }
        Ok(self.end_wait_with(run, payload, None, how, cause))
    }

    /// [`Runtime::end_wait`] writing `written` (what the wait's effect made
    /// of the payload, see [`EffectHandler::on_resume`]) instead of the
    /// payload to the result key; the record keeps both.
    fn end_wait_with(
        &self,
        run: &mut RunState,
        payload: Value,
        written: Option<Value>,
        how: &str,
        cause: Option<&str>,
    ) -> StepRecord {
        let now = format_time(self.now());
        let wait = run.waiting.take().expect("end_wait on a waiting run");
        let value = written.clone().unwrap_or_else(|| payload.clone());
        if let Some(key) = &wait.result_key {
            template::assign(&mut run.vars, key, value.clone());
        }
        // The end of a wait completes the effect that started it: its key is
        // that effect's key plus a digest of the payload, so a resume replayed
        // with the same payload lands once, and another payload is another
        // record; a resume another run's effect caused is keyed by that
        // cause, so the effect can find it.
        let key = match cause {
            Some(c) => Some(caused_resume_key(c)),
            None => {
                let digest = {
                    use sha2::{Digest, Sha256};
                    hex::encode(&Sha256::digest(payload.to_string().as_bytes())[..8])
                };
                effect_key(run).map(|k| format!("{k}:{how}:{digest}"))
            }
        };
        let mut ended =
            json!({ "wait_key": wait.wait_key, "reason": wait.reason, "payload": payload });
        if let Some(w) = written {
            ended["result"] = w;
        }
        // Where the value went: the ledger alone rebuilds the vars (forks).
        if let Some(key) = &wait.result_key {
            ended["result_key"] = Value::String(key.clone());
        }
        if let Some(c) = cause {
            ended["cause"] = Value::String(c.to_string());
            // Which wait this ended: the effect that started it.
            ended["ends"] = json!(effect_key(run));
        }
        let record = StepRecord {
            status: StepStatus::Completed,
            result: Some(json!({ how: ended })),
            ended_at: Some(now.clone()),
            idempotency_key: key,
            ..self.record(run, run.current_node.clone(), &now)
        };
        match wait.resume_to_node {
            Some(node) => {
                run.status = RunStatus::Running;
                run.current_node = Some(node);
            }
            None => super::step::complete(run, value),
        }
        run.updated_at = now;
        record
    }

    /// Runs the resume hook of the effect that started the run's wait, if
    /// that effect has one ([`crate::effects::EffectHandler::owns_wait`], checked
    /// against the ledger so a look-alike wait of another effect gets
    /// nothing). An external effect's work runs under the run's lease
    /// ([`Hook::ClaimFirst`] when the hold has none yet) and its answer is
    /// recorded ahead of the resume's commit under `<effect key>:resumed`;
    /// a repeated resume reuses it.
    ///
    /// With `fly`, and room in flight, the work leaves in flight instead
    /// ([`Hook::Fly`]); once it lands, the resume is done again under the
    /// same lease and finds its answer in `txn.landed`.
    fn resume_hook(
        &self,
        txn: &mut super::txn::RunTxn<'_>,
        run: &RunState,
        payload: &Value,
        optimistic: bool,
        fly: bool,
    ) -> Result<Hook> {
        let Some(wait) = run.waiting.clone() else {
            return Ok(Hook::None);
        };
        // The effects that say the wait is theirs (none: the common case,
        // and no ledger read); of those, the one the ledger says started it.
        let owners = self.inner.effects.owners_of(&wait);
        if owners.is_empty() {
            return Ok(Hook::None);
        }
        let Some(key) = effect_key(run) else {
            return Ok(Hook::None);
        };
        let records = self.store().find_records(&run.run_id, &key)?;
        let started = |h: &&Arc<dyn EffectHandler>| {
            records.iter().any(|r| {
                r.status == StepStatus::Waiting
                    && r.effect.as_ref().is_some_and(|e| e.kind == h.kind())
            })
        };
        let Some(handler) = owners.into_iter().find(started).cloned() else {
            return Ok(Hook::None);
        };
        handler.check_resume(&wait, payload)?;
        let external = handler.class() == crate::effects::EffectClass::External;
        if external && optimistic {
            return Ok(Hook::ClaimFirst);
        }
        let resumed_key = format!("{key}:resumed");
        // A resume repeated after a crash: its recorded answer stands; a
        // `started` record without one means the work never finished, and
        // it runs again under that same record.
        let mut begun = false;
        if external {
            for r in self.list_ahead(&run.run_id)? {
                if r.idempotency_key.as_deref() != Some(resumed_key.as_str()) {
                    continue;
                }
                match r.status {
                    StepStatus::Completed => return Ok(Hook::Written(r.result)),
                    StepStatus::Started => {
                        // Interrupted work: some of it may have happened,
                        // so only the same answer may finish it.
                        let asked = r.effect.as_ref().map(|e| &e.payload);
                        if asked.is_some_and(|a| a != payload) {
                            return Err(Error::invalid(
                                "payload",
                                format!(
                                    "this resume was interrupted while its work ran (a crash): resume again with the same payload, {}, to finish it",
                                    asked.map(Value::to_string).unwrap_or_default()
                                ),
                            ));
                        }
                        begun = true;
                    }
                    _ => {}
                }
            }
        }
        let now = format_time(self.now());
        let base = StepRecord {
            status: StepStatus::Started,
            effect: Some(super::model::EffectRecord {
                kind: handler.kind().to_string(),
                payload: payload.clone(),
                result_key: wait.result_key.clone(),
            }),
            idempotency_key: Some(resumed_key),
            ..self.record(run, run.current_node.clone(), &now)
        };
        let landed = txn.landed.take().filter(|l| {
            l.resume.is_some() && Some(l.key.as_str()) == base.idempotency_key.as_deref()
        });
        // Decided before anything is written: a resume refused for want of
        // room leaves no record.
        let flies = landed.is_none()
            && external
            && fly
            && txn.leased()
            && self.resume_room(handler.as_ref(), &wait, payload)?;
        if external && !begun && landed.is_none() {
            txn.append_ahead(std::slice::from_ref(&base))?;
        }
        let written = match landed {
            Some(landed) => super::flying_resume::written_of(landed.outcome?)?,
            None if flies => {
                return Ok(Hook::Fly(Box::new(super::flying_resume::ResumeWork {
                    handler,
                    wait,
                    key,
                })));
            }
            None => {
                let cx = self.resume_cx(run, &key, None);
                handler.on_resume(&cx, &wait, payload)?
            }
        };
        if external {
            txn.append_ahead(&[StepRecord {
                step_id: super::keys::new_step_id(),
                status: StepStatus::Completed,
                result: written.clone(),
                ended_at: Some(format_time(self.now())),
                ..base
            }])?;
        }
        Ok(Hook::Written(written))
    }

    /// A fresh ledger record of `run` (status `completed`, attempt 1).
    pub(crate) fn record(
        &self,
        run: &RunState,
        node_id: Option<String>,
        started_at: &str,
    ) -> StepRecord {
        StepRecord {
            step_id: super::keys::new_step_id(),
            run_id: run.run_id.clone(),
            node_id,
            status: StepStatus::Completed,
            effect: None,
            result: None,
            error: None,
            started_at: started_at.to_string(),
            ended_at: None,
            attempt: 1,
            idempotency_key: None,
            prev_hash: None,
            record_hash: None,
            vars: None,
            input: None,
        }
    }
}

fn stale(run_id: &str, reason: String) -> Error {
    Error::StaleResume {
        run_id: run_id.to_string(),
        reason,
    }
}

/// Gives a run started under an explicit id a creation identity when its
/// caller named none: `vars._meta.creation_digest` = `sha256:` of the
/// canonical JSON of `{workflow_id, session_id, parent_run_id, vars}` over
/// the vars as the caller passed them (before the host seeds `_runtime` and
/// `_limits`), as the reference does. Starting the same id again with other
/// vars is then an `identity_conflict`; with the same, the existing run.
fn seed_creation_digest(
    vars: &mut Map<String, Value>,
    workflow_id: &str,
    session_id: Option<&str>,
    parent_run_id: Option<&str>,
) {
    let named = vars
        .get("_meta")
        .and_then(|m| m.get("creation_digest"))
        .is_some_and(|d| !matches!(d, Value::Null) && d != "" && d != false);
    if named {
        return;
    }
    let request = serde_json::json!({
        "workflow_id": workflow_id,
        "session_id": session_id.filter(|s| !s.is_empty()),
        "parent_run_id": parent_run_id.filter(|s| !s.is_empty()),
        "vars": Value::Object(vars.clone()),
    });
    let digest = stepwell_model::json::request_digest(&request);
    let mut meta = match vars.remove("_meta") {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    meta.insert("creation_digest".into(), Value::String(digest));
    vars.insert("_meta".into(), Value::Object(meta));
}

/// What the drive loop and the effects reach other runs through.
impl crate::effects::RunPort for Runtime {
    fn start_run(&self, workflow_id: &str, options: StartOptions) -> Result<String> {
        self.start(workflow_id, options)
    }

    fn prepare_child(
        &self,
        child: &mut super::plugin::ChildStart<'_>,
    ) -> std::result::Result<(), (String, String)> {
        for plugin in self.inner.plugins.iter() {
            plugin.prepare_child(child)?;
        }
        Ok(())
    }

    fn tick_nested(&self, run_id: &str, depth: u32) -> Result<RunState> {
        self.tick_at(
            run_id,
            self.inner.config.max_steps_per_tick,
            depth,
            self.inner.config.lease_wait,
        )
    }

    fn get_run(&self, run_id: &str) -> Result<RunState> {
        self.get_state(run_id)
    }

    fn list_run_index(
        &self,
        query: &crate::store::RunIndexQuery,
    ) -> Result<Vec<crate::store::RunIndexRow>> {
        Ok(self.inner.store.list_run_index(query)?)
    }

    fn find_records(&self, run_id: &str, idempotency_key: &str) -> Result<Vec<StepRecord>> {
        Runtime::find_records(self, run_id, idempotency_key)
    }

    fn event_listeners(&self, wait_keys: &[String]) -> Result<Vec<RunState>> {
        let mut out: Vec<RunState> = Vec::new();
        for key in wait_keys {
            for run in self.store().list_runs(&RunQuery {
                status: Some(RunStatus::Waiting),
                wait_reason: Some(WaitReason::Event),
                wait_key: Some(key.clone()),
                ..RunQuery::default()
            })? {
                if !out.iter().any(|r| r.run_id == run.run_id) {
                    out.push(run);
                }
            }
        }
        Ok(out)
    }

    fn deliver(
        &self,
        run_id: &str,
        wait_key: &str,
        payload: Value,
        cause: &str,
        depth: u32,
        tick: bool,
    ) -> Result<crate::effects::Delivery> {
        use crate::effects::Delivery;
        match self.resume_at(run_id, Some(wait_key), payload, Some(cause), depth, tick) {
            Ok((state, true)) => Ok(Delivery::Resumed(state.status)),
            Ok((state, false)) => Ok(Delivery::AlreadyDelivered(state.status)),
            Err(Error::StaleResume { .. }) => Ok(Delivery::NotWaiting),
            Err(e @ Error::Store(_)) => Err(e),
            Err(e) => Ok(Delivery::Refused(e.to_string())),
        }
    }
}
