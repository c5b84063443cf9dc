//! The durable step loop: `start`, `tick`, `resume`, `cancel_run`, and the
//! driver pass that moves due and finished waits along.
//!
//! Every transition obeys one ordering law: the ledger records of a
//! transition are appended before the run save that makes it true, and the
//! save is the commit point ([`Store::commit`]). A crash leaves the ledger
//! ahead of the state, never behind it.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use parking_lot::RwLock;
use serde_json::{json, Map, Value};

use super::clock::{format_time, Clock, SystemClock};
use super::locks::{RunLockGuard, RunLocks};
use super::model::{
    EffectRecord, EffectRequest, RunState, RunStatus, StepPlan, StepRecord, StepStatus, WaitReason,
};
use super::{Error, Result};
use crate::effects::{self, subworkflow, EffectContext, Outcome};
use crate::flow::{self, template, Bundle, Node, NodeKind, Workflow};
use crate::store::{RunQuery, Store};
use crate::wasm::{vars_json, NodeCall, WasmEngine};

/// Defaults written into a new run's `vars._limits` (the reference
/// runtime's keys), and the runtime's own bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeConfig {
    /// The most node steps one `tick` executes before returning a still
    /// running run (a later tick continues).
    pub max_steps_per_tick: u64,
    /// `_limits.max_iterations`.
    pub max_iterations: u64,
    /// `_limits.max_tokens`.
    pub max_tokens: u64,
    /// `_limits.max_history_messages` (-1 = unlimited).
    pub max_history_messages: i64,
    /// `_limits.warn_iterations_pct`.
    pub warn_iterations_pct: u64,
    /// `_limits.warn_tokens_pct`.
    pub warn_tokens_pct: u64,
    /// Retry policies for failed effects, by effect kind. An effect without
    /// one fails its run at the first failure.
    pub retries: HashMap<String, RetryPolicy>,
}

/// How a failed effect is retried: the run waits (a durable time wait, reason
/// `until`, key `retry:<node>:<attempt>`) for the backoff, then executes the
/// node again with the next attempt number; after `max_attempts` failures
/// the run fails.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, at least 1.
    pub max_attempts: u32,
    /// The wait before the second attempt.
    pub initial_backoff: std::time::Duration,
    /// Each further wait is the previous one times this (at least 1).
    pub factor: f64,
    /// No wait is longer than this.
    pub max_backoff: std::time::Duration,
}

impl RetryPolicy {
    /// The wait after failed attempt `attempt` (1 for the first).
    pub fn backoff(&self, attempt: u32) -> std::time::Duration {
        let factor = self
            .factor
            .max(1.0)
            .powi(attempt.saturating_sub(1).min(1_000) as i32);
        let secs =
            (self.initial_backoff.as_secs_f64() * factor).min(self.max_backoff.as_secs_f64());
        std::time::Duration::try_from_secs_f64(secs)
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff)
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            max_steps_per_tick: 100_000,
            max_iterations: 20,
            max_tokens: 32_768,
            max_history_messages: -1,
            warn_iterations_pct: 80,
            warn_tokens_pct: 80,
            retries: HashMap::new(),
        }
    }
}

impl RuntimeConfig {
    /// The `_limits` object a new run starts with.
    pub fn limits_value(&self) -> Value {
        json!({
            "max_iterations": self.max_iterations,
            "current_iteration": 0,
            "max_tokens": self.max_tokens,
            "max_output_tokens": null,
            "max_input_tokens": null,
            "estimated_tokens_used": 0,
            "max_history_messages": self.max_history_messages,
            "warn_iterations_pct": self.warn_iterations_pct,
            "warn_tokens_pct": self.warn_tokens_pct,
        })
    }
}

/// How a run is started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StartOptions {
    /// The run's initial vars.
    pub vars: Map<String, Value>,
    /// An explicit run id (`[A-Za-z0-9_-]+`): created only if free; the same
    /// identity returns the existing run, another is `identity_conflict`.
    pub run_id: Option<String>,
    /// Who starts the run.
    pub actor_id: Option<String>,
    /// The session the run belongs to.
    pub session_id: Option<String>,
    /// The parent run, for child runs.
    pub parent_run_id: Option<String>,
}

/// What one [`Runtime::drive_once`] pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriveReport {
    /// Runs whose due time wait or event deadline was resolved.
    pub due_resumed: Vec<String>,
    /// Running runs that were ticked (async children, interrupted runs).
    pub ticked: Vec<String>,
    /// Parents resumed (or failed) because their child ended.
    pub parents_resumed: Vec<String>,
    /// Runs the pass could not move, with why.
    pub errors: Vec<(String, String)>,
}

impl DriveReport {
    /// Whether the pass moved anything.
    pub fn moved_anything(&self) -> bool {
        !(self.due_resumed.is_empty() && self.ticked.is_empty() && self.parents_resumed.is_empty())
    }
}

/// Builds a [`Runtime`].
pub struct RuntimeBuilder {
    store: Arc<dyn Store>,
    engine: Option<WasmEngine>,
    clock: Arc<dyn Clock>,
    config: RuntimeConfig,
    offloader: Option<crate::store::artifacts::Offloader>,
}

impl RuntimeBuilder {
    /// Keeps values larger than `threshold_bytes` (as JSON) in `artifacts`:
    /// top-level vars (except `_meta`, `_limits`, `_runtime`), a run's
    /// output, effect payloads and record results are stored as
    /// `{"$artifact": id}` and loaded back when read.
    pub fn artifacts(
        mut self,
        artifacts: Arc<dyn crate::store::ArtifactStore>,
        threshold_bytes: usize,
    ) -> Self {
        self.offloader = Some(crate::store::artifacts::Offloader {
            store: artifacts,
            threshold: threshold_bytes,
        });
        self
    }

    /// The wasm engine (default: a new engine without an on-disk cache).
    pub fn engine(mut self, engine: WasmEngine) -> Self {
        self.engine = Some(engine);
        self
    }

    /// The clock (default: the system clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The configuration.
    pub fn config(mut self, config: RuntimeConfig) -> Self {
        self.config = config;
        self
    }

    /// Builds the runtime.
    pub fn build(self) -> Result<Runtime> {
        let engine = match self.engine {
            Some(e) => e,
            None => WasmEngine::new(Default::default())?,
        };
        Ok(Runtime {
            inner: Arc::new(Inner {
                store: self.store,
                engine,
                clock: self.clock,
                config: self.config,
                offloader: self.offloader,
                workflows: RwLock::new(HashMap::new()),
                locks: RunLocks::default(),
                subscribers: parking_lot::Mutex::new(Vec::new()),
            }),
        })
    }
}

struct Inner {
    store: Arc<dyn Store>,
    engine: WasmEngine,
    clock: Arc<dyn Clock>,
    config: RuntimeConfig,
    offloader: Option<crate::store::artifacts::Offloader>,
    workflows: RwLock<HashMap<String, Arc<Workflow>>>,
    locks: RunLocks,
    subscribers: parking_lot::Mutex<Vec<Subscriber>>,
}

struct Subscriber {
    run_id: Option<String>,
    sender: std::sync::mpsc::Sender<StepRecord>,
}

/// The durable runtime: executes runs of loaded workflows against a store.
/// Cloning is cheap and shares everything.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").finish_non_exhaustive()
    }
}

/// Where a step sends the run.
enum Target {
    Node(String),
    Complete(Value),
    /// No route: a waiting effect completes the run with the resume payload,
    /// a completed effect with its result.
    End,
}

fn valid_run_id(id: &str) -> bool {
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
        }
    }

    /// The store.
    pub fn store(&self) -> &dyn Store {
        &*self.inner.store
    }

    /// The wasm engine.
    pub fn engine(&self) -> &WasmEngine {
        &self.inner.engine
    }

    /// The clock.
    pub fn now(&self) -> DateTime<Utc> {
        self.inner.clock.now()
    }

    /// Takes the per-run lock that `tick` and `resume` take. Hold it around
    /// your own read-modify-save of a run so a tick cannot overwrite it.
    pub fn run_lock(&self, run_id: &str) -> RunLockGuard<'_> {
        self.inner.locks.lock(run_id)
    }

    /// Loads the bundle at `dir` (validating every flow file and compiling its
    /// components), registers its workflows, and records in the store where
    /// they come from, so another process can resume their runs. Nothing is
    /// registered or recorded if any file is invalid.
    pub fn load_bundle(&self, dir: &Path) -> Result<Bundle> {
        let bundle = flow::load_bundle(dir, &self.inner.engine)?;
        for wf in &bundle.workflows {
            self.store().put_bundle(&wf.workflow_id, &bundle.dir)?;
        }
        let mut map = self.inner.workflows.write();
        for wf in &bundle.workflows {
            map.insert(wf.workflow_id.clone(), wf.clone());
        }
        Ok(bundle)
    }

    /// Registers an already loaded workflow.
    pub fn register(&self, workflow: Arc<Workflow>) {
        self.inner
            .workflows
            .write()
            .insert(workflow.workflow_id.clone(), workflow);
    }

    /// The workflow `workflow_id`: registered, or loaded from the bundle the
    /// store recorded for it.
    pub fn workflow(&self, workflow_id: &str) -> Result<Arc<Workflow>> {
        if let Some(wf) = self.inner.workflows.read().get(workflow_id) {
            return Ok(wf.clone());
        }
        if let Some(dir) = self.store().bundle_dir(workflow_id)? {
            self.load_bundle(&dir)?;
            if let Some(wf) = self.inner.workflows.read().get(workflow_id) {
                return Ok(wf.clone());
            }
        }
        Err(Error::UnknownWorkflow {
            workflow_id: workflow_id.to_string(),
        })
    }

    /// Creates a run of `workflow_id` (status `running`, at the entry node)
    /// and returns its id. `vars._limits` is filled in when absent. Does not
    /// execute anything: call [`Runtime::tick`].
    pub fn start(&self, workflow_id: &str, options: StartOptions) -> Result<String> {
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
            if let Some(field) = identity_mismatch(&existing, &run) {
                return Err(Error::IdentityConflict {
                    run_id: run.run_id,
                    field: field.to_string(),
                });
            }
        }
        Ok(run.run_id)
    }

    /// Starts a run and ticks it until it waits or ends: [`Runtime::start`]
    /// then [`Runtime::tick`], returning the saved state (its `run_id` is the
    /// new run's id).
    ///
    /// Without an explicit run id, the run is created by the commit of its
    /// first step (one store commit instead of two): if the process dies
    /// during that step, the run never existed, and the caller, who never got
    /// its id, loses nothing. With an explicit id it is `start` (create if
    /// absent, identity-checked) followed by `tick`.
    pub fn run(&self, workflow_id: &str, options: StartOptions) -> Result<RunState> {
        // The first commit creates the run only when its first step cannot
        // touch another run (a child or a listener must never see a run that
        // is not stored): a built-in effect or complete node that does not.
        let wf = self.workflow(workflow_id)?;
        let safe_entry = wf.nodes.get(&wf.entry).is_some_and(|n| match &n.kind {
            NodeKind::Complete { .. } => true,
            NodeKind::Effect { kind, .. } => {
                !matches!(kind.as_str(), "emit_event" | "start_subworkflow")
            }
            NodeKind::Component { .. } => false,
        });
        if options.run_id.is_some() || self.inner.config.max_steps_per_tick == 0 || !safe_entry {
            let id = self.start(workflow_id, options)?;
            return self.tick(&id);
        }
        let run = self.new_run(workflow_id, options)?;
        let _lock = self.run_lock(&run.run_id);
        self.run_steps(run, self.inner.config.max_steps_per_tick, Vec::new())
    }

    /// A new run of `workflow_id` (not stored).
    fn new_run(&self, workflow_id: &str, options: StartOptions) -> Result<RunState> {
        let wf = self.workflow(workflow_id)?;
        if let Some(id) = &options.run_id {
            if !valid_run_id(id) {
                return Err(Error::invalid(
                    "run_id",
                    format!("{id:?} is not a valid run id ([A-Za-z0-9_-]+, at most 200)"),
                ));
            }
        }
        let run_id = options
            .run_id
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let mut vars = options.vars;
        if vars.contains_key("_runtime") {
            return Err(Error::invalid(
                "vars._runtime",
                "is owned by the host and cannot be set at start",
            ));
        }
        vars.entry("_limits")
            .or_insert_with(|| self.inner.config.limits_value());
        let now = format_time(self.now());
        Ok(RunState {
            run_id,
            workflow_id: wf.workflow_id.clone(),
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

    /// Subscribes to ledger records as this runtime commits them: every
    /// record of `run_id`, or of every run with `None`, in commit order,
    /// delivered after the commit returned. Records committed by other
    /// processes are not seen (poll the store for those, as
    /// `stepwell ledger --follow` does). Dropping the receiver unsubscribes.
    pub fn subscribe_ledger(&self, run_id: Option<&str>) -> std::sync::mpsc::Receiver<StepRecord> {
        let (sender, receiver) = std::sync::mpsc::channel();
        self.inner.subscribers.lock().push(Subscriber {
            run_id: run_id.map(str::to_string),
            sender,
        });
        receiver
    }

    /// Commits a transition ([`Store::commit`]) and then hands its records
    /// to the subscribers.
    fn commit(&self, records: &[StepRecord], run: &RunState) -> Result<()> {
        match &self.inner.offloader {
            None => self.store().commit(records, run)?,
            Some(o) => {
                let now = run.updated_at.clone();
                let stored_records = o.offload_records(records, &now)?;
                let stored_run = o.offload_run(run, &now)?;
                self.store().commit(
                    stored_records.as_deref().unwrap_or(records),
                    stored_run.as_ref().unwrap_or(run),
                )?;
            }
        }
        self.publish(records);
        Ok(())
    }

    /// Appends records ahead of the run save that will make their
    /// transition true (the crash-ordering law's direction).
    pub(crate) fn append_ahead(&self, records: &[StepRecord]) -> Result<()> {
        if !records.is_empty() {
            match &self.inner.offloader {
                None => self.store().append_records(records)?,
                Some(o) => {
                    let now = format_time(self.now());
                    let stored = o.offload_records(records, &now)?;
                    self.store()
                        .append_records(stored.as_deref().unwrap_or(records))?;
                }
            }
            self.publish(records);
        }
        Ok(())
    }

    /// The outcome of effect `key` as its ledger recorded it, if it ran
    /// before: a step replayed after a crash reuses it instead of executing
    /// the effect again.
    fn recorded_outcome(&self, run_id: &str, key: &str) -> Result<Option<Outcome>> {
        let Some(r) = self
            .find_records(run_id, key)?
            .into_iter()
            .find(|r| r.status != StepStatus::Started)
        else {
            return Ok(None);
        };
        Ok(match r.status {
            StepStatus::Completed => Some(Outcome::Completed(r.result.unwrap_or(Value::Null))),
            StepStatus::Waiting => r
                .result
                .and_then(|v| {
                    serde_json::from_value::<super::model::WaitState>(v["wait"].clone()).ok()
                })
                .map(|w| Outcome::Waiting(Box::new(w))),
            StepStatus::Failed => Some(Outcome::Failed(r.error.unwrap_or_default())),
            _ => None,
        })
    }

    fn publish(&self, records: &[StepRecord]) {
        let mut subscribers = self.inner.subscribers.lock();
        if !subscribers.is_empty() {
            subscribers.retain(|s| {
                records
                    .iter()
                    .filter(|r| s.run_id.as_deref().is_none_or(|id| id == r.run_id))
                    .all(|r| s.sender.send(r.clone()).is_ok())
            });
        }
    }

    /// Takes a snapshot of the run's current state into `snapshots`.
    pub fn create_snapshot(
        &self,
        snapshots: &dyn crate::store::SnapshotStore,
        run_id: &str,
        name: &str,
        description: &str,
        tags: Vec<String>,
    ) -> Result<crate::store::Snapshot> {
        let _lock = self.run_lock(run_id);
        let run = self.get_state(run_id)?;
        let snapshot = crate::store::Snapshot {
            snapshot_id: uuid::Uuid::new_v4().to_string(),
            run_id: run_id.to_string(),
            step_id: self
                .store()
                .list_records(run_id)?
                .last()
                .map(|r| r.step_id.clone()),
            name: name.to_string(),
            description: description.to_string(),
            tags,
            created_at: format_time(self.now()),
            run_state: run,
        };
        snapshots.save_snapshot(&snapshot)?;
        Ok(snapshot)
    }

    /// Restores a snapshot: its run state becomes the run's state again,
    /// under the run's lock, with a `completed` ledger record
    /// `{"restored": {"snapshot_id", "name", "step_id"}}` as evidence. The
    /// host cannot make this safe if the workflow changed since the snapshot.
    pub fn restore_snapshot(
        &self,
        snapshots: &dyn crate::store::SnapshotStore,
        snapshot_id: &str,
    ) -> Result<RunState> {
        let snapshot = snapshots.load_snapshot(snapshot_id)?.ok_or_else(|| {
            Error::invalid(
                "snapshot_id",
                format!("no snapshot with id {snapshot_id:?}"),
            )
        })?;
        let _lock = self.run_lock(&snapshot.run_id);
        let current = self.store().load_run(&snapshot.run_id)?;
        let mut run = snapshot.run_state.clone();
        let restores = [Some(&run), current.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|r| r.vars.get("_runtime")?.get("restores")?.as_u64())
            .max()
            .unwrap_or(0)
            + 1;
        runtime_vars(&mut run).insert("restores".into(), json!(restores));
        let now = format_time(self.now());
        run.updated_at = now.clone();
        let record = StepRecord {
            result: Some(json!({ "restored": {
                "snapshot_id": snapshot.snapshot_id,
                "name": snapshot.name,
                "step_id": snapshot.step_id,
            }})),
            ended_at: Some(now.clone()),
            ..self.record(&run, run.current_node.clone(), &now)
        };
        self.commit(&[record], &run)?;
        Ok(run)
    }

    /// The run's current state (offloaded values loaded back).
    pub fn get_state(&self, run_id: &str) -> Result<RunState> {
        self.load_run(run_id)?.ok_or_else(|| Error::RunNotFound {
            run_id: run_id.to_string(),
        })
    }

    /// The run with this id, if any, offloaded values loaded back.
    fn load_run(&self, run_id: &str) -> Result<Option<RunState>> {
        let mut run = self.store().load_run(run_id)?;
        if let (Some(o), Some(r)) = (&self.inner.offloader, run.as_mut()) {
            o.load_run(r)?;
        }
        Ok(run)
    }

    /// The run's ledger, oldest first (offloaded values loaded back; the
    /// stored form, with references, is what the hash chain covers).
    pub fn get_ledger(&self, run_id: &str) -> Result<Vec<StepRecord>> {
        self.get_state(run_id)?;
        let mut records = self.store().list_records(run_id)?;
        if let Some(o) = &self.inner.offloader {
            o.load_records(&mut records)?;
        }
        Ok(records)
    }

    /// The run's records carrying `key`, offloaded values loaded back.
    pub(crate) fn find_records(&self, run_id: &str, key: &str) -> Result<Vec<StepRecord>> {
        let mut records = self.store().find_records(run_id, key)?;
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
        self.get_state(run_id)?;
        Ok(crate::store::verify_chain(
            &self.store().list_records(run_id)?,
        ))
    }

    /// The runs matching `query`, oldest first (offloaded values loaded back).
    pub fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunState>> {
        let mut runs = self.store().list_runs(query)?;
        if let Some(o) = &self.inner.offloader {
            for r in &mut runs {
                o.load_run(r)?;
            }
        }
        Ok(runs)
    }

    /// Executes the run until it waits, ends, or has taken
    /// `max_steps_per_tick` steps. A waiting run whose time wait is due (or
    /// whose event deadline passed) is moved on first. Returns the saved state.
    pub fn tick(&self, run_id: &str) -> Result<RunState> {
        self.tick_with(run_id, self.inner.config.max_steps_per_tick)
    }

    /// [`Runtime::tick`] with an explicit step budget.
    pub fn tick_with(&self, run_id: &str, max_steps: u64) -> Result<RunState> {
        let _lock = self.run_lock(run_id);
        let mut run = self.get_state(run_id)?;
        let mut pending = Vec::new();
        if run.status == RunStatus::Waiting {
            match self.resolve_due(&mut run)? {
                Some(record) => pending.push(record),
                None => return Ok(run),
            }
        }
        self.run_steps(run, max_steps, pending)
    }

    /// Steps the (locked) run until it stops running or `max_steps` ran.
    ///
    /// `pending` holds the record of a wait that just ended (a resume, a due
    /// time): it commits together with the first step, in one store commit,
    /// so a resume costs one commit, not two. Until that commit the run is
    /// still waiting in the store; the lock, held throughout, keeps any
    /// other resume of this runtime out.
    fn run_steps(
        &self,
        mut run: RunState,
        max_steps: u64,
        mut pending: Vec<StepRecord>,
    ) -> Result<RunState> {
        if run.status != RunStatus::Running || max_steps == 0 {
            if !pending.is_empty() {
                self.commit(&pending, &run)?;
            }
            return Ok(run);
        }
        let wf = self.workflow(&run.workflow_id)?;
        let mut steps = 0;
        while run.status == RunStatus::Running && steps < max_steps {
            self.step(&wf, &mut run, std::mem::take(&mut pending))?;
            steps += 1;
        }
        Ok(run)
    }

    /// Resumes the run's current wait with `payload`: checks that the run
    /// waits on `wait_key`, writes the payload to the wait's `result_key`,
    /// commits, then ticks from the wait's `resume_to_node`. A wait is
    /// resumed at most once: a run that is not waiting, or waits on another
    /// key, gets [`Error::StaleResume`] and is left unchanged.
    pub fn resume(&self, run_id: &str, wait_key: &str, payload: Value) -> Result<RunState> {
        self.resume_by(run_id, wait_key, payload, None)
    }

    /// [`Runtime::resume`], recording in the resume record which effect
    /// (`<run_id>:<effect_seq>`) caused it, so a replayed effect can tell
    /// the listeners it already reached.
    pub(crate) fn resume_by(
        &self,
        run_id: &str,
        wait_key: &str,
        payload: Value,
        cause: Option<&str>,
    ) -> Result<RunState> {
        let _lock = self.run_lock(run_id);
        let mut run = self.get_state(run_id)?;
        let Some(wait) = run
            .waiting
            .as_ref()
            .filter(|_| run.status == RunStatus::Waiting)
        else {
            return Err(Error::StaleResume {
                run_id: run_id.to_string(),
                reason: format!("Run is not waiting (status {})", run.status.as_str()),
            });
        };
        if wait.wait_key != wait_key {
            return Err(Error::StaleResume {
                run_id: run_id.to_string(),
                reason: format!("Run waits on key {:?}, not {wait_key:?}", wait.wait_key),
            });
        }
        // Load the workflow first: a resume that cannot continue is refused
        // before anything is written.
        self.workflow(&run.workflow_id)?;
        let mut record = self.end_wait(&mut run, payload, "resumed");
        if let (Some(cause), Some(resumed)) = (
            cause,
            record.result.as_mut().and_then(|r| r.get_mut("resumed")),
        ) {
            resumed["cause"] = Value::String(cause.to_string());
        }
        // The resume commits with the first step it leads to; the lock is
        // held until then.
        self.run_steps(run, self.inner.config.max_steps_per_tick, vec![record])
    }

    /// Cancels the run (and its unfinished children): status `cancelled`, a
    /// `cancelled` ledger record, no further step. An ended run is returned
    /// unchanged.
    pub fn cancel_run(&self, run_id: &str, reason: Option<&str>) -> Result<RunState> {
        let run = {
            let _lock = self.run_lock(run_id);
            let mut run = self.get_state(run_id)?;
            if run.status.is_terminal() {
                return Ok(run);
            }
            let now = format_time(self.now());
            let error = format!("cancelled: {}", reason.unwrap_or("cancelled by request"));
            let record = StepRecord {
                status: StepStatus::Cancelled,
                error: Some(error.clone()),
                ended_at: Some(now.clone()),
                idempotency_key: Some(terminal_key(&run)),
                ..self.record(&run, run.current_node.clone(), &now)
            };
            run.status = RunStatus::Cancelled;
            run.error = Some(error);
            run.waiting = None;
            run.updated_at = now;
            self.commit(&[record], &run)?;
            run
        };
        let children = self.store().list_runs(&RunQuery {
            parent_run_id: Some(run_id.to_string()),
            ..RunQuery::default()
        })?;
        for child in children.iter().filter(|c| !c.status.is_terminal()) {
            self.cancel_run(
                &child.run_id,
                Some(&format!("parent run {run_id} was cancelled")),
            )?;
        }
        Ok(run)
    }

    /// One pass of the driver: resolves due time waits and event deadlines,
    /// ticks running runs (async children, runs a crash interrupted), and
    /// resumes (or fails) parents whose child ended. Errors of single runs are
    /// collected in the report; only a failing store stops the pass.
    pub fn drive_once(&self) -> Result<DriveReport> {
        let mut report = DriveReport::default();
        for run in self.store().list_due_waits(self.now())? {
            match self.tick(&run.run_id) {
                Ok(after) if after.waiting == run.waiting => {}
                Ok(_) => report.due_resumed.push(run.run_id),
                Err(e) => report.errors.push((run.run_id, e.to_string())),
            }
        }
        let running = self.store().list_runs(&RunQuery {
            status: Some(RunStatus::Running),
            ..RunQuery::default()
        })?;
        for run in running {
            match self.tick(&run.run_id) {
                Ok(_) => report.ticked.push(run.run_id),
                Err(e) => report.errors.push((run.run_id, e.to_string())),
            }
        }
        let parents = self.store().list_runs(&RunQuery {
            status: Some(RunStatus::Waiting),
            wait_reason: Some(WaitReason::Subworkflow),
            ..RunQuery::default()
        })?;
        for parent in parents {
            match self.resume_parent(&parent) {
                Ok(true) => report.parents_resumed.push(parent.run_id),
                Ok(false) => {}
                Err(e) => report.errors.push((parent.run_id, e.to_string())),
            }
        }
        Ok(report)
    }

    /// Resumes (or fails) `parent` if the child it waits on has ended.
    fn resume_parent(&self, parent: &RunState) -> Result<bool> {
        let Some(wait) = &parent.waiting else {
            return Ok(false);
        };
        let Some(child_id) = wait.wait_key.strip_prefix("subworkflow:") else {
            return Ok(false);
        };
        let Some(child) = self.load_run(child_id)? else {
            return Ok(false);
        };
        match child.status {
            RunStatus::Completed => {
                match self.resume(
                    &parent.run_id,
                    &wait.wait_key,
                    subworkflow::child_result(&child),
                ) {
                    Ok(_) | Err(Error::StaleResume { .. }) => Ok(true),
                    Err(e) => Err(e),
                }
            }
            RunStatus::Failed | RunStatus::Cancelled => {
                let _lock = self.run_lock(&parent.run_id);
                let mut run = self.get_state(&parent.run_id)?;
                if run.status != RunStatus::Waiting
                    || run.waiting.as_ref().map(|w| &w.wait_key) != Some(&wait.wait_key)
                {
                    return Ok(false);
                }
                let now = format_time(self.now());
                let message = subworkflow::child_failure(&child);
                let record = StepRecord {
                    status: StepStatus::Failed,
                    error: Some(message.clone()),
                    ended_at: Some(now.clone()),
                    idempotency_key: Some(terminal_key(&run)),
                    ..self.record(&run, run.current_node.clone(), &now)
                };
                run.waiting = None;
                fail(&mut run, message, &now);
                self.commit(&[record], &run)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// If the waiting `run` is due (a time wait whose time came, an event
    /// wait past its deadline), ends the wait in memory and returns the
    /// record of it, for the caller to commit.
    fn resolve_due(&self, run: &mut RunState) -> Result<Option<StepRecord>> {
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
        Ok(Some(self.end_wait(run, payload, "due")))
    }

    /// Ends `run`'s wait with `payload` (in memory) and returns the ledger
    /// record of it.
    fn end_wait(&self, run: &mut RunState, payload: Value, how: &str) -> StepRecord {
        let now = format_time(self.now());
        let wait = run.waiting.take().expect("end_wait on a waiting run");
        if let Some(key) = &wait.result_key {
            template::assign(&mut run.vars, key, payload.clone());
        }
        // The end of a wait completes the effect that started it: its key is
        // that effect's key plus a digest of the payload, so a resume replayed
        // with the same payload lands once, and another payload is another
        // record.
        let digest = {
            use sha2::{Digest, Sha256};
            hex::encode(&Sha256::digest(payload.to_string().as_bytes())[..8])
        };
        let record = StepRecord {
            status: StepStatus::Completed,
            result: Some(json!({
                how: { "wait_key": wait.wait_key, "reason": wait.reason, "payload": payload }
            })),
            ended_at: Some(now.clone()),
            idempotency_key: effect_key(run).map(|k| format!("{k}:{how}:{digest}")),
            ..self.record(run, run.current_node.clone(), &now)
        };
        match wait.resume_to_node {
            Some(node) => {
                run.status = RunStatus::Running;
                run.current_node = Some(node);
            }
            None => complete(run, payload),
        }
        run.updated_at = now;
        record
    }

    fn record(&self, run: &RunState, node_id: Option<String>, started_at: &str) -> StepRecord {
        StepRecord {
            step_id: uuid::Uuid::new_v4().to_string(),
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
        }
    }

    /// Executes the run's current node and commits the step.
    /// `records` starts with the pending records to commit with this step.
    fn step(&self, wf: &Workflow, run: &mut RunState, mut records: Vec<StepRecord>) -> Result<()> {
        let now = self.now();
        let started_at = format_time(now);
        // A resume (or due wait) rides on this step's commit. If the step
        // turns out to touch other runs, that resume is committed first,
        // with the state as it is before this step.
        let before = (!records.is_empty()).then(|| run.clone());
        let Some(node_id) = run.current_node.clone() else {
            return self.fail_step(
                run,
                records,
                None,
                &started_at,
                "invalid_state: a running run has no current node".into(),
            );
        };
        let Some(node) = wf.nodes.get(&node_id) else {
            let msg = format!(
                "unknown_node: workflow {} has no node {node_id:?}",
                wf.workflow_id
            );
            return self.fail_step(run, records, Some(node_id), &started_at, msg);
        };
        let plan = match self.plan(wf, node, run, &started_at) {
            Ok(plan) => plan,
            Err(msg) => return self.fail_step(run, records, Some(node_id), &started_at, msg),
        };
        if let Some(patch) = plan.vars {
            if let Some(key) = patch.keys().find(|k| k.starts_with("_runtime")) {
                let msg = format!(
                    "guest_bad_output: node {node_id} tried to set the host-owned var {key:?}"
                );
                return self.fail_step(run, records, Some(node_id), &started_at, msg);
            }
            for (k, v) in patch {
                if v.is_null() {
                    run.vars.remove(&k);
                } else {
                    run.vars.insert(k, v);
                }
            }
        }
        let target = if let Some(out) = plan.complete_output {
            Target::Complete(out)
        } else if let Some(next) = &plan.next_node {
            let resolved = node.resolve_route(next);
            if !wf.nodes.contains_key(resolved) {
                let msg = format!(
                    "guest_bad_output: node {node_id} routed to {next:?}, which is neither a route label nor a node of workflow {}",
                    wf.workflow_id
                );
                return self.fail_step(run, records, Some(node_id), &started_at, msg);
            }
            Target::Node(resolved.to_string())
        } else if let Some(next) = &node.next {
            Target::Node(next.clone())
        } else if plan.effect.is_some() {
            Target::End
        } else {
            let msg = format!(
                "guest_bad_output: node {node_id} chose no next node, did not complete the run, and has no `next` route"
            );
            return self.fail_step(run, records, Some(node_id), &started_at, msg);
        };

        if let Some(key) = plan
            .effect
            .as_ref()
            .and_then(|e| e.result_key.as_deref())
            .filter(|k| k.starts_with("_runtime"))
        {
            let msg = format!(
                "guest_bad_output: node {node_id} asked for an effect result in the host-owned var {key:?}"
            );
            return self.fail_step(run, records, Some(node_id), &started_at, msg);
        }
        if let Some(effect) = plan.effect {
            let seq = next_effect_seq(run);
            let effect_record = EffectRecord {
                kind: effect.kind.clone(),
                payload: effect.payload.clone(),
                result_key: effect.result_key.clone(),
            };
            let key = effect_idempotency_key(run, seq);
            // Effects that change other runs are not executed twice: their
            // records are appended as soon as they ran (ahead of this step's
            // commit), and a step replayed after a crash reuses them.
            let touches_others = matches!(effect.kind.as_str(), "emit_event" | "start_subworkflow");
            let reused = if touches_others {
                self.recorded_outcome(&run.run_id, &key)?
            } else {
                None
            };
            let replayed = reused.is_some();
            let base = StepRecord {
                status: StepStatus::Started,
                effect: Some(effect_record),
                idempotency_key: Some(key),
                attempt: current_attempt(run),
                ..self.record(run, Some(node_id.clone()), &started_at)
            };
            if touches_others {
                // Make the pending resume true before other runs are touched:
                // from here on the store shows this run running, so no event
                // can resume it a second time while this step runs.
                if let Some(before) = &before {
                    let pending = std::mem::take(&mut records);
                    self.commit(&pending, before)?;
                }
            }
            if !replayed {
                // emit_event appends its own started record (with the
                // listeners it is about to reach).
                if effect.kind != "emit_event" {
                    records.push(base.clone());
                }
                if touches_others {
                    let ahead = std::mem::take(&mut records);
                    self.append_ahead(&ahead)?;
                }
            }
            let outcome = match reused {
                Some(outcome) => outcome,
                None => {
                    let ctx = EffectContext {
                        runtime: self,
                        run,
                        seq,
                        now,
                        started: &base,
                    };
                    effects::execute(&ctx, &effect)?
                }
            };
            let ended_at = format_time(self.now());
            match outcome {
                Outcome::Completed(result) => {
                    if let Some(key) = &effect.result_key {
                        template::assign(&mut run.vars, key, result.clone());
                    }
                    if !replayed {
                        records.push(StepRecord {
                            result: Some(result.clone()),
                            ..outcome_record(&base, StepStatus::Completed, &ended_at)
                        });
                    }
                    self.go(run, target, Some(result));
                }
                Outcome::Waiting(mut wait) => {
                    wait.resume_to_node = match target {
                        Target::Node(n) => Some(n),
                        Target::End => None,
                        Target::Complete(_) => {
                            return self.fail_with(run, records, base, &ended_at, format!(
                                "guest_bad_output: node {node_id} both completes the run and waits ({})",
                                effect.kind
                            ));
                        }
                    };
                    wait.result_key = effect.result_key.clone();
                    if !replayed {
                        records.push(StepRecord {
                            result: Some(json!({ "wait": wait })),
                            ..outcome_record(&base, StepStatus::Waiting, &ended_at)
                        });
                    }
                    set_attempt(run, 1);
                    run.status = RunStatus::Waiting;
                    run.waiting = Some(*wait);
                }
                Outcome::Failed(msg) => {
                    // A replayed failure takes the same path: its records are
                    // already in the ledger, and replays are not appended twice.
                    let attempt = current_attempt(run);
                    if let Some(policy) = self.inner.config.retries.get(&effect.kind) {
                        if attempt < policy.max_attempts {
                            return self.retry_later(
                                run, records, base, &ended_at, msg, &node_id, attempt, policy,
                            );
                        }
                        let msg = format!("{msg} (after {attempt} attempts)");
                        return self.fail_with(run, records, base, &ended_at, msg);
                    }
                    return self.fail_with(run, records, base, &ended_at, msg);
                }
            }
            if touches_others && !replayed {
                let ahead = std::mem::take(&mut records);
                self.append_ahead(&ahead)?;
            }
            run.updated_at = ended_at;
        } else {
            let (result, key) = match &target {
                Target::Node(n) => (json!({ "next_node": n }), None),
                Target::Complete(out) => {
                    (json!({ "complete_output": out }), Some(terminal_key(run)))
                }
                Target::End => (Value::Null, Some(terminal_key(run))),
            };
            records.push(StepRecord {
                result: Some(result),
                ended_at: Some(started_at.clone()),
                idempotency_key: key,
                ..self.record(run, Some(node_id), &started_at)
            });
            self.go(run, target, None);
            run.updated_at = started_at;
        }
        self.commit(&records, run)?;
        Ok(())
    }

    /// Asks the node for its plan.
    fn plan(
        &self,
        wf: &Workflow,
        node: &Node,
        run: &RunState,
        now: &str,
    ) -> std::result::Result<StepPlan, String> {
        match &node.kind {
            NodeKind::Component {
                component,
                config_json,
            } => {
                let vars = vars_json(&run.vars);
                component
                    .call(&NodeCall {
                        run_id: &run.run_id,
                        workflow_id: &wf.workflow_id,
                        node_id: &node.id,
                        config_json,
                        vars_json: &vars,
                        now,
                        attempt: current_attempt(run),
                    })
                    .map_err(|e| format!("{} (node {} of workflow {})", e, node.id, wf.workflow_id))
            }
            NodeKind::Effect {
                kind,
                payload,
                result_key,
            } => Ok(StepPlan {
                effect: Some(EffectRequest {
                    kind: kind.clone(),
                    payload: template::render(payload, &run.vars),
                    result_key: result_key.clone(),
                }),
                ..StepPlan::default()
            }),
            NodeKind::Complete { output } => Ok(StepPlan {
                complete_output: Some(template::render(output, &run.vars)),
                ..StepPlan::default()
            }),
        }
    }

    fn go(&self, run: &mut RunState, target: Target, effect_result: Option<Value>) {
        set_attempt(run, 1);
        match target {
            Target::Node(n) => run.current_node = Some(n),
            Target::Complete(out) => complete(run, out),
            Target::End => complete(run, effect_result.unwrap_or(Value::Null)),
        }
    }

    /// Records failed attempt `attempt` and parks the run until its backoff
    /// has passed; the node then runs again with the next attempt number.
    #[allow(clippy::too_many_arguments)]
    fn retry_later(
        &self,
        run: &mut RunState,
        mut records: Vec<StepRecord>,
        base: StepRecord,
        ended_at: &str,
        msg: String,
        node_id: &str,
        attempt: u32,
        policy: &RetryPolicy,
    ) -> Result<()> {
        let wait = chrono::Duration::from_std(policy.backoff(attempt))
            .unwrap_or(chrono::Duration::days(365));
        let until = self
            .now()
            .checked_add_signed(wait)
            .unwrap_or(chrono::DateTime::<Utc>::MAX_UTC);
        let until = format_time(until);
        let kind = base
            .effect
            .as_ref()
            .map(|e| e.kind.clone())
            .unwrap_or_default();
        records.push(StepRecord {
            error: Some(msg.clone()),
            result: Some(json!({ "retry": { "next_attempt": attempt + 1, "at": until } })),
            ..outcome_record(&base, StepStatus::Failed, ended_at)
        });
        set_attempt(run, attempt + 1);
        run.status = RunStatus::Waiting;
        run.waiting = Some(super::model::WaitState {
            reason: WaitReason::Until,
            wait_key: format!("retry:{node_id}:{}", attempt + 1),
            until: Some(until),
            resume_to_node: Some(node_id.to_string()),
            result_key: None,
            prompt: None,
            choices: None,
            details: Some(
                json!({ "retry": { "effect": kind, "attempt": attempt + 1, "error": msg } }),
            ),
        });
        run.updated_at = ended_at.to_string();
        self.commit(&records, run)
    }

    fn fail_step(
        &self,
        run: &mut RunState,
        mut records: Vec<StepRecord>,
        node_id: Option<String>,
        started_at: &str,
        msg: String,
    ) -> Result<()> {
        records.push(StepRecord {
            status: StepStatus::Failed,
            error: Some(msg.clone()),
            ended_at: Some(started_at.to_string()),
            idempotency_key: Some(terminal_key(run)),
            ..self.record(run, node_id, started_at)
        });
        fail(run, msg, started_at);
        self.commit(&records, run)?;
        Ok(())
    }

    fn fail_with(
        &self,
        run: &mut RunState,
        mut records: Vec<StepRecord>,
        base: StepRecord,
        ended_at: &str,
        msg: String,
    ) -> Result<()> {
        records.push(StepRecord {
            error: Some(msg.clone()),
            ..outcome_record(&base, StepStatus::Failed, ended_at)
        });
        fail(run, msg, ended_at);
        self.commit(&records, run)?;
        Ok(())
    }
}

fn complete(run: &mut RunState, output: Value) {
    run.status = RunStatus::Completed;
    run.output = Some(output);
    run.current_node = None;
    run.waiting = None;
}

fn fail(run: &mut RunState, msg: String, now: &str) {
    run.status = RunStatus::Failed;
    run.error = Some(msg);
    run.updated_at = now.to_string();
}

/// The idempotency key of the run's latest effect (`<run_id>:<effect_seq>`).
fn effect_key(run: &RunState) -> Option<String> {
    let seq = run.vars.get("_runtime")?.get("effect_seq")?.as_u64()?;
    Some(effect_idempotency_key(run, seq))
}

/// The key prefix of a run's records: its id, plus `~<n>` once a snapshot
/// was restored `n` times (a restored run repeats effect numbers, and its
/// new records must not pass for replays of the old ones).
fn key_prefix(run: &RunState) -> String {
    match run
        .vars
        .get("_runtime")
        .and_then(|r| r.get("restores"))
        .and_then(Value::as_u64)
    {
        Some(n) if n > 0 => format!("{}~{n}", run.run_id),
        _ => run.run_id.clone(),
    }
}

/// The idempotency key of effect `seq` of `run` (`<run_id>:<seq>`).
pub(crate) fn effect_idempotency_key(run: &RunState, seq: u64) -> String {
    format!("{}:{seq}", key_prefix(run))
}

/// The idempotency key of the record that ends a run without an effect
/// (completed, failed or cancelled): a run ends once.
fn terminal_key(run: &RunState) -> String {
    format!("{}:terminal", key_prefix(run))
}

/// The record that ends effect record `base` (same effect, key and attempt)
/// with `status`, as of `ended_at`.
fn outcome_record(base: &StepRecord, status: StepStatus, ended_at: &str) -> StepRecord {
    StepRecord {
        step_id: uuid::Uuid::new_v4().to_string(),
        status,
        ended_at: Some(ended_at.to_string()),
        ..base.clone()
    }
}

/// The attempt number of the run's current node (`vars._runtime.attempt`).
fn current_attempt(run: &RunState) -> u32 {
    run.vars
        .get("_runtime")
        .and_then(|r| r.get("attempt"))
        .and_then(Value::as_u64)
        .map_or(1, |a| a.max(1) as u32)
}

/// Sets the attempt number (1 removes it: the first attempt is the default).
fn set_attempt(run: &mut RunState, attempt: u32) {
    if attempt <= 1 {
        if let Some(rt) = run.vars.get_mut("_runtime").and_then(Value::as_object_mut) {
            rt.remove("attempt");
        }
        return;
    }
    runtime_vars(run).insert("attempt".into(), json!(attempt));
}

/// Bumps and returns `vars._runtime.effect_seq`.
fn next_effect_seq(run: &mut RunState) -> u64 {
    let map = runtime_vars(run);
    let seq = map.get("effect_seq").and_then(Value::as_u64).unwrap_or(0) + 1;
    map.insert("effect_seq".into(), json!(seq));
    seq
}

/// The run's `vars._runtime` object (created, or replaced if it is not an
/// object), where the host keeps its bookkeeping.
fn runtime_vars(run: &mut RunState) -> &mut Map<String, Value> {
    let rt = run
        .vars
        .entry("_runtime")
        .or_insert_with(|| Value::Object(Map::new()));
    if !rt.is_object() {
        *rt = Value::Object(Map::new());
    }
    rt.as_object_mut().expect("made an object above")
}

/// The first identity field on which two runs with one id differ.
fn identity_mismatch(existing: &RunState, requested: &RunState) -> Option<&'static str> {
    let meta = |r: &RunState, key: &str| r.vars.get("_meta").and_then(|m| m.get(key)).cloned();
    if existing.workflow_id != requested.workflow_id {
        Some("workflow_id")
    } else if existing.session_id != requested.session_id {
        Some("session_id")
    } else if existing.parent_run_id != requested.parent_run_id {
        Some("parent_run_id")
    } else if meta(existing, "occurrence") != meta(requested, "occurrence") {
        Some("vars._meta.occurrence")
    } else if meta(existing, "creation_digest") != meta(requested, "creation_digest") {
        Some("vars._meta.creation_digest")
    } else {
        None
    }
}
