//! Effects: what the host does when a node's plan asks for one. Each kind is
//! an [`EffectHandler`] in an [`EffectRegistry`]; the kernel's own live one
//! family per module: [`waits`] (`ask_user`, `answer_user`, `wait_event`,
//! `wait_until`), [`events`] (`emit_event`), [`subworkflow`]
//! (`start_subworkflow`) and [`vars_query`]. A feature's (`llm_call`,
//! `tool_calls`, the controller's) come with its plugin
//! ([`crate::core::plugin`]), and an embedding application registers its
//! own with [`crate::RuntimeBuilder::effect`].
//!
//! Every handler declares its [`EffectClass`], and the runtime applies one
//! rule by class: a *pure* effect is simply executed again when a step is
//! replayed after a crash; an effect that *touches other runs* or reaches the
//! *external* world records its `started` record and its outcome in the
//! ledger ahead of the step's commit, and a replay reuses the recorded
//! outcome: it never executes twice.
//!
//! An effect either completes at once with a result (written to the
//! effect's `result_key`), parks the run on a [`WaitState`], or fails with a
//! typed [`Failure`] (a reason code, a message naming the payload field, and
//! whether a retry could help).

pub mod events;
pub mod subworkflow;
pub mod vars_query;
pub mod waits;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

use crate::core::config::StartOptions;
use crate::core::flight::Landing;
use crate::core::model::{RunState, RunStatus, WaitState};
use crate::core::Result;

/// What an effect may touch, which decides how a replayed step treats it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EffectClass {
    /// Reads or changes only its own run (waits, `answer_user`,
    /// `vars_query`): executed again on replay.
    Pure,
    /// Creates or resumes other runs (`emit_event`, `start_subworkflow`):
    /// recorded ahead of the step's commit, never executed twice.
    TouchesRuns,
    /// Reaches the world outside the host (an LLM call, a tool): recorded
    /// ahead of the step's commit, never executed twice once its outcome is
    /// recorded. A crash between the call and the record of its outcome
    /// repeats the call with the same idempotency key
    /// ([`EffectCx::key`]): pass it on to the outside system.
    External,
}

impl EffectClass {
    /// `pure`, `touches_runs` or `external`.
    pub fn as_str(self) -> &'static str {
        match self {
            EffectClass::Pure => "pure",
            EffectClass::TouchesRuns => "touches_runs",
            EffectClass::External => "external",
        }
    }
}

/// Why an effect failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The reason code (`invalid_effect`, `limit_exceeded`, ...).
    pub code: String,
    /// What went wrong, naming the payload field where one is at fault.
    pub message: String,
    /// Whether trying again could succeed (a timeout, a transport error, a
    /// host resource limit): only such failures are retried by a
    /// [`crate::RetryPolicy`].
    pub retryable: bool,
}

impl Failure {
    /// A failure that a retry cannot help.
    pub fn permanent(code: impl Into<String>, message: impl Into<String>) -> Self {
        Failure {
            code: code.into(),
            message: message.into(),
            retryable: false,
        }
    }

    /// The failure an API error stands for (its reason code, and its
    /// message without the code).
    pub fn from_error(e: &crate::core::Error) -> Self {
        let code = e.reason_code();
        let text = e.to_string();
        let message = text
            .strip_prefix(code)
            .and_then(|t| t.strip_prefix(": "))
            .unwrap_or(&text)
            .to_string();
        Failure::permanent(code, message)
    }

    /// A failure that a later attempt may not have.
    pub fn retryable(code: impl Into<String>, message: impl Into<String>) -> Self {
        Failure {
            code: code.into(),
            message: message.into(),
            retryable: true,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

/// What executing an effect led to.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Done; this is the result.
    Completed(Value),
    /// The run must wait (the runtime fills in `resume_to_node` and `result_key`).
    Waiting(Box<WaitState>),
    /// The effect failed.
    Failed(Failure),
    /// A built-in host effect changed its own run's host-owned state
    /// (only handlers whose [`EffectHandler::owns_host_state`] is true may
    /// answer this; the automation controller's effects do).
    HostChange(Box<HostChange>),
}

/// What a host effect that owns its run's host state did: values to set
/// under host-owned vars, ledger records to commit with the step (in the
/// same atomic commit), the route the run takes, and whether it then
/// continues or waits.
#[derive(Debug, Clone, PartialEq)]
pub struct HostChange {
    /// `(dotted path, value)` pairs written into the run's vars, in order
    /// (for example `_runtime.automation`).
    pub assign: Vec<(String, Value)>,
    /// Records committed with the step, after its `started` record.
    pub records: Vec<crate::core::model::StepRecord>,
    /// A route label (or node id) of the node that overrides the plan's
    /// next node; `None` keeps the plan's.
    pub route: Option<String>,
    /// Continue with this result, or wait.
    pub then: Then,
}

/// How a run goes on after a [`HostChange`].
#[derive(Debug, Clone, PartialEq)]
pub enum Then {
    /// Continue at once; the value is the effect's result.
    Continue(Value),
    /// Wait (the runtime fills in `resume_to_node` from the route and
    /// `result_key` from the effect).
    Wait(Box<WaitState>),
}

impl Outcome {
    /// An `invalid_effect` failure naming the payload field.
    pub fn invalid(kind: &str, field: &str, message: &str) -> Outcome {
        Outcome::Failed(Failure::permanent(
            "invalid_effect",
            format!("{kind}.payload.{field}: {message}"),
        ))
    }
}

/// What became of a resume an effect delivered to another run.
#[derive(Debug, Clone, PartialEq)]
pub enum Delivery {
    /// Resumed now; the listener's status after the resume (and the steps
    /// it led to, if it was ticked).
    Resumed(RunStatus),
    /// This effect had resumed it before (a replay after a crash); its
    /// status now.
    AlreadyDelivered(RunStatus),
    /// It no longer waits on that key (someone else resumed it first).
    NotWaiting,
    /// It could not be resumed (its workflow cannot be loaded, it is
    /// busy past the wait, ...); it is left as it was.
    Refused(String),
}

/// What the runtime lets an effect do to other runs. Implemented by the
/// runtime; every call goes through the same run transaction as the API.
pub trait RunPort {
    /// Starts a run (create-if-absent under its explicit id, identity
    /// checked). Returns its id.
    fn start_run(&self, workflow_id: &str, options: StartOptions) -> Result<String>;
    /// Lets the runtime's plugins adjust a child a flow starts, or refuse
    /// it (`Err((field, message))`; [`crate::core::plugin::Plugin::prepare_child`]).
    fn prepare_child(
        &self,
        child: &mut crate::core::plugin::ChildStart<'_>,
    ) -> std::result::Result<(), (String, String)> {
        let _ = child;
        Ok(())
    }
    /// Ticks `run_id` inside the current step, `depth` levels deep.
    fn tick_nested(&self, run_id: &str, depth: u32) -> Result<RunState>;
    /// The run's state.
    fn get_run(&self, run_id: &str) -> Result<RunState>;
    /// The records of `run_id`'s ledger carrying `idempotency_key`,
    /// oldest first.
    fn find_records(
        &self,
        run_id: &str,
        idempotency_key: &str,
    ) -> Result<Vec<crate::core::model::StepRecord>>;
    /// The run index rows `query` selects (no vars: cheap).
    fn list_run_index(
        &self,
        query: &crate::store::RunIndexQuery,
    ) -> Result<Vec<crate::store::RunIndexRow>>;
    /// Ids of runs waiting (reason `event`) on one of `wait_keys`, oldest
    /// first.
    fn event_listeners(&self, wait_keys: &[String]) -> Result<Vec<RunState>>;
    /// Resumes `run_id`'s wait on `wait_key` with `payload` on behalf of
    /// effect `cause`, at most once per cause (checked in the listener's
    /// ledger before resuming, so a replay does not resume a listener that
    /// waits on the same key again); with `tick`, the listener's steps run
    /// `depth` levels deep inside the current step.
    fn deliver(
        &self,
        run_id: &str,
        wait_key: &str,
        payload: Value,
        cause: &str,
        depth: u32,
        tick: bool,
    ) -> Result<Delivery>;
}

/// Everything an effect handler gets besides its payload.
pub struct EffectCx<'a> {
    /// The run executing the effect (as it is before the effect).
    pub run: &'a RunState,
    /// The effect's sequence number in its run (1 for the first effect).
    pub seq: u64,
    /// The effect's idempotency key: the same for every attempt and on
    /// replay.
    pub key: &'a str,
    /// The time of the step.
    pub now: DateTime<Utc>,
    /// The attempt number (1 first).
    pub attempt: u32,
    /// How deep the step is nested inside other runs' steps (0 for a step
    /// the API or the driver started).
    pub depth: u32,
    /// The deepest nesting allowed: an effect that would nest deeper fails
    /// with `limit_exceeded`.
    pub max_depth: u32,
    /// The scopes `emit_event` may use.
    pub emit_scopes: &'a [String],
    /// How many other runs the step this effect belongs to (and the steps
    /// nested inside it) may execute inline: see
    /// [`crate::RuntimeConfig::max_cascade_runs`].
    pub max_cascade: u64,
    /// Other runs.
    pub runs: &'a dyn RunPort,
    /// The runtime's artifact store, if it has one (large tool outputs go
    /// there as attachments of the run).
    pub artifacts: Option<&'a dyn crate::store::ArtifactStore>,
    /// For an effect executing in flight: fires when its run is cancelled
    /// (the effect should stop: drop its request, interrupt its instance,
    /// kill its process). `None` inside a step.
    pub cancel: Option<&'a Arc<crate::core::flight::Cancel>>,
    /// Where the effect's own spans go (a model call's, a tool call's):
    /// started on the effect's thread, they nest under its span.
    pub tracer: &'a crate::core::trace::Tracer,
}

impl EffectCx<'_> {
    /// Whether another run (a resumed listener, a sync child) may be
    /// executed inside this step; counts it if so. Past the limit, the run
    /// is resumed or started and left to the driver: one step never sets
    /// off unbounded work, however its runs fan out.
    pub fn take_inline(&self) -> bool {
        crate::core::cascade::take(self.max_cascade)
    }

    /// A `limit_exceeded` failure if nesting one level deeper would pass
    /// [`EffectCx::max_depth`].
    pub fn check_depth(&self, kind: &str) -> Option<Outcome> {
        (self.depth + 1 > self.max_depth).then(|| {
            Outcome::Failed(Failure::permanent(
                "limit_exceeded",
                format!(
                    "{kind} would make a chain of runs setting one another off {} deep (the limit is {}; RuntimeConfig::max_nesting)",
                    self.depth + 1,
                    self.max_depth
                ),
            ))
        })
    }
}

/// One effect kind.
pub trait EffectHandler: Send + Sync {
    /// The kind a plan names (`ask_user`, ...).
    fn kind(&self) -> &str;

    /// What the effect may touch.
    fn class(&self) -> EffectClass;

    /// Whether the effect starts a run (counted against
    /// [`crate::RuntimeConfig::max_children_per_run`] of the run that
    /// asks for it).
    fn starts_runs(&self) -> bool {
        false
    }

    /// Whether the handler may answer [`Outcome::HostChange`]: change its
    /// own run's host-owned vars and add ledger records to the step's
    /// commit. Only the host's own effects (the automation controller's)
    /// say yes; any other handler's `HostChange` fails the step.
    fn owns_host_state(&self) -> bool {
        false
    }

    /// What the step's ledger records keep of `payload` (`None`: all of
    /// it): secrets redacted (`llm_call`), or only what is not written in
    /// full elsewhere in the same commit (the automation controller's
    /// decisions, in their `automation.*` records). A replay asks the node
    /// again for the payload, and finds a recorded outcome by its
    /// idempotency key: it never reads the recorded payload back.
    fn recorded_payload(&self, payload: &Value) -> Option<Value> {
        let _ = payload;
        None
    }

    /// What the step's ledger record keeps of a **pure** effect's result
    /// (`None`: all of it). The run's vars get the whole result; a pure
    /// effect is executed again on replay, so its recorded result is only
    /// read by people: a large answer written in full elsewhere (a growing
    /// automation's history, frozen in its `automation.admitted` record)
    /// need not be kept twice. Not asked for other effect classes, whose
    /// recorded results are reused.
    fn recorded_result(&self, result: &Value) -> Option<Value> {
        let _ = result;
        None
    }

    /// Writes of a completed effect beyond its `result_key`, in the same
    /// commit (`llm_call`: `_limits.estimated_tokens_used`, and the turn in
    /// `context.messages` when asked): derived only from the payload and
    /// the result, so that a replay reusing a recorded result writes the
    /// same.
    fn after_completed(
        &self,
        run: &mut crate::core::model::RunState,
        payload: &Map<String, Value>,
        result: &Value,
    ) {
        let _ = (run, payload, result);
    }

    /// Whether the run's pending records (a resume not committed yet, or
    /// the run itself) must be committed before the effect executes: true
    /// for every effect that touches other runs or the world, so nothing
    /// outside the run sees a run that does not exist yet.
    fn commits_first(&self) -> bool {
        self.class() != EffectClass::Pure
    }

    /// For effects that are not [`EffectClass::Pure`]: fixes what the effect
    /// is about to do (for example the listeners of an event), before it
    /// does any of it. The runtime records it in the effect's `started`
    /// record ahead of the commit; a replay gets the recorded value back in
    /// [`EffectHandler::execute`] instead of preparing again.
    fn prepare(&self, cx: &EffectCx<'_>, payload: &Map<String, Value>) -> Result<Option<Value>> {
        let _ = (cx, payload);
        Ok(None)
    }

    /// Whether `wait` is one this effect parks runs on and has resume hooks
    /// for ([`EffectHandler::check_resume`], [`EffectHandler::on_resume`]).
    /// The runtime asks its effects when a wait is resumed, then checks in
    /// the ledger that this effect really started the wait. Default: none.
    fn owns_wait(&self, wait: &WaitState) -> bool {
        let _ = wait;
        false
    }

    /// For a wait this effect parked its run on: refuses a resume payload
    /// the effect cannot take (an [`Error::InvalidInput`] naming the
    /// field), before anything is recorded. Only asked of waits
    /// [`EffectHandler::owns_wait`] claims.
    ///
    /// [`Error::InvalidInput`]: crate::Error::InvalidInput
    fn check_resume(&self, wait: &WaitState, payload: &Value) -> Result<()> {
        let _ = (wait, payload);
        Ok(())
    }

    /// For a wait this effect parked its run on: what a resume with
    /// `payload` writes to the wait's result key (`None`: the payload as it
    /// is). Called under the run's lease before the resume commits; for an
    /// external effect its answer is recorded ahead of that commit and
    /// reused if the resume is repeated after a crash (an approved tool
    /// batch runs once). `cx` describes the effect that started the wait.
    fn on_resume(
        &self,
        cx: &EffectCx<'_>,
        wait: &WaitState,
        payload: &Value,
    ) -> Result<Option<Value>> {
        let _ = (cx, wait, payload);
        Ok(None)
    }

    /// Whether the effect may execute in flight, off its run's step (see
    /// [`crate::core::flight`]): for effects of the
    /// [`EffectClass::External`] class that wait on the outside world (a
    /// model, a tool, a command). The runtime flies them when the step is
    /// a driver's (or [`crate::RuntimeConfig::calls_in_flight`] says so)
    /// and fewer than [`crate::RuntimeConfig::max_in_flight`] are in
    /// flight; otherwise they execute inside the step. Default: no.
    fn flies(&self) -> bool {
        false
    }

    /// Whether the work of [`EffectHandler::on_resume`] for `payload` may
    /// run in flight (an approved tool batch: seconds or minutes), on one
    /// of the runtime's flight threads, when calls fly: the resume returns
    /// at once with the run still waiting, and the wait ends when the work
    /// lands. Default: no (the hook runs inside the resume).
    fn resume_flies(&self, wait: &WaitState, payload: &Value) -> bool {
        let _ = (wait, payload);
        false
    }

    /// Whether [`EffectHandler::launch`] executes the effect on an executor
    /// of the handler's own (`llm_call`'s asynchronous client) rather than
    /// handing it back to run on one of the runtime's flight threads
    /// ([`crate::RuntimeConfig::flight_threads`]; with all of them taken, a
    /// step that would fly such an effect is held back). Default: no.
    fn own_executor(&self) -> bool {
        false
    }

    /// Starts the effect in flight and returns at once; the effect reports
    /// its outcome through `landing` ([`Landing::land`]), once, from any
    /// thread, and should stop when [`Landing::cancel`] fires. `cx` lives
    /// only for this call: take what the effect needs from it. Returning
    /// the landing instead (the default) asks the runtime to execute
    /// [`EffectHandler::execute`] on a thread of its own.
    ///
    /// [`Landing::land`]: crate::core::flight::Landing::land
    /// [`Landing::cancel`]: crate::core::flight::Landing::cancel
    fn launch(
        &self,
        cx: &EffectCx<'_>,
        payload: &Map<String, Value>,
        prepared: Option<&Value>,
        landing: Landing,
    ) -> Option<Landing> {
        let _ = (cx, payload, prepared);
        Some(landing)
    }

    /// Executes the effect. `Err` is for failures of the host itself (the
    /// store); anything wrong with the effect is an [`Outcome::Failed`].
    fn execute(
        &self,
        cx: &EffectCx<'_>,
        payload: &Map<String, Value>,
        prepared: Option<&Value>,
    ) -> Result<Outcome>;
}

/// The effect kinds a runtime executes.
#[derive(Clone)]
pub struct EffectRegistry {
    handlers: BTreeMap<String, Arc<dyn EffectHandler>>,
}

impl fmt::Debug for EffectRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.handlers.keys()).finish()
    }
}

impl Default for EffectRegistry {
    fn default() -> Self {
        Self::builtin()
    }
}

impl EffectRegistry {
    /// The kernel's own effects: waits, events, subworkflows and vars
    /// queries (features add theirs through plugins).
    pub fn builtin() -> Self {
        let mut r = EffectRegistry {
            handlers: BTreeMap::new(),
        };
        r.register(Arc::new(waits::AskUser));
        r.register(Arc::new(waits::AnswerUser));
        r.register(Arc::new(waits::WaitEvent));
        r.register(Arc::new(waits::WaitUntil));
        r.register(Arc::new(events::EmitEvent));
        r.register(Arc::new(subworkflow::StartSubworkflow));
        r.register(Arc::new(vars_query::VarsQuery));
        r
    }

    /// Adds (or replaces) the handler of `handler.kind()`.
    pub fn register(&mut self, handler: Arc<dyn EffectHandler>) {
        self.handlers.insert(handler.kind().to_string(), handler);
    }

    /// The effects that say `wait` is theirs ([`EffectHandler::owns_wait`]):
    /// the runtime takes the one its ledger says started the wait.
    pub fn owners_of(&self, wait: &WaitState) -> Vec<&Arc<dyn EffectHandler>> {
        self.handlers
            .values()
            .filter(|h| h.owns_wait(wait))
            .collect()
    }

    /// The handler of `kind`.
    pub fn get(&self, kind: &str) -> Option<&Arc<dyn EffectHandler>> {
        self.handlers.get(kind)
    }

    /// Every kind, sorted.
    pub fn kinds(&self) -> Vec<String> {
        self.handlers.keys().cloned().collect()
    }
}

/// The optional string field `key` of a payload.
pub(crate) fn opt_str<'a>(
    kind: &str,
    payload: &'a Map<String, Value>,
    key: &str,
) -> std::result::Result<Option<&'a str>, Outcome> {
    match payload.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(Outcome::invalid(kind, key, "must be a string")),
    }
}

/// The optional boolean field `key` of a payload (absent: false).
pub(crate) fn opt_bool(
    kind: &str,
    payload: &Map<String, Value>,
    key: &str,
) -> std::result::Result<bool, Outcome> {
    match payload.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(Outcome::invalid(kind, key, "must be a boolean")),
    }
}
