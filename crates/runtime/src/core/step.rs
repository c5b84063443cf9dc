//! The step machine: one node visit of a run, from the node's plan to the
//! commit of its transition, and the loop that steps a held run.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::clock::format_time;
use super::config::RetryPolicy;
use super::flight::{Flight, Landing};
use super::keys::{
    bad_result_key, children_started, count_child, count_data, count_visit, current_attempt,
    data_bytes, data_since_wait, effect_idempotency_key, is_host_owned, mark_wait, next_effect_seq,
    set_attempt, set_retry_seq, terminal_key, too_deep, visits_since_wait, StepCounters,
};
use super::model::{
    EffectRecord, EffectRequest, RunState, RunStatus, StepPlan, StepRecord, StepStatus, WaitReason,
    WaitState,
};
use super::runtime::Runtime;
use super::secrets::{redact_all, secret_key, REDACTED};
use super::txn::RunTxn;
use super::{panics, Result};
use crate::effects::{EffectClass, EffectCx, EffectHandler, Failure, HostChange, Outcome, Then};
use crate::flow::{template, Node, NodeKind, Workflow};
use crate::wasm::{vars_json, GuestError, NodeCall, NodeComponent, NodeSession};

/// The component instances of one run's tick, by component: consecutive
/// steps that call the same component reuse its instance (a call on a
/// reused instance that fails is tried again on a fresh one, so state left
/// in an instance can make a step faster, never make it fail).
pub(crate) struct Sessions {
    by_component: Vec<NodeSession>,
    /// The run id's part of the steps' seeds ([`Sessions::seed`]), hashed
    /// once a tick rather than for every step.
    seed_prefix: Option<(String, u64)>,
    /// The top-level vars a step without an effect changed: `_runtime`
    /// (its counters; always first, kept from step to step), then its vars
    /// patch's keys.
    changed: Vec<String>,
    /// Set when this tick's last step was one without an effect and its
    /// commit went through: the store then holds the run as that commit
    /// left it, and the next such step names the vars it changes
    /// ([`RunTxn::commit_changed`]) rather than the store comparing all.
    clean: bool,
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions {
            by_component: Vec::new(),
            seed_prefix: None,
            changed: vec!["_runtime".to_string()],
            clean: false,
        }
    }
}

/// How many calls one instance serves before a fresh one is made.
const CALLS_PER_SESSION: u32 = 10_000;

/// How many instances one run's tick keeps (the least recently used goes
/// first): every instance holds a slot of the engine's pool while it is
/// kept, and runs nested inside a step keep theirs too.
const SESSIONS_PER_TICK: usize = 4;

/// FNV-1a's starting state (its 64-bit offset basis).
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a of `bytes`, continuing from `h`.
fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl Sessions {
    /// The seed of a step's random stream: FNV-1a of its run id's bytes
    /// and then of how many steps the run took before it (`visits`, eight
    /// bytes little-endian), the same when the step is replayed. The run
    /// id's part is hashed once a tick.
    fn seed(&mut self, run_id: &str, visits: u64) -> u64 {
        let prefix = match &self.seed_prefix {
            Some((id, h)) if id == run_id => *h,
            _ => {
                let h = fnv1a(FNV_OFFSET, run_id.as_bytes());
                self.seed_prefix = Some((run_id.to_string(), h));
                h
            }
        };
        fnv1a(prefix, &visits.to_le_bytes())
    }

    fn call(
        &mut self,
        reuse: bool,
        component: &std::sync::Arc<NodeComponent>,
        call: &NodeCall<'_>,
    ) -> Result<StepPlan, GuestError> {
        if !reuse {
            return component.call(call);
        }
        let i = match self
            .by_component
            .iter()
            .position(|s| std::sync::Arc::ptr_eq(s.component(), component))
        {
            Some(i) if self.by_component[i].calls() < CALLS_PER_SESSION => i,
            found => {
                if let Some(i) = found {
                    self.by_component.remove(i);
                }
                if self.by_component.len() >= SESSIONS_PER_TICK {
                    self.by_component.remove(0);
                }
                self.by_component.push(component.session()?);
                self.by_component.len() - 1
            }
        };
        // Most recently used last.
        let last = self.by_component.len() - 1;
        if i != last {
            let used = self.by_component.remove(i);
            self.by_component.push(used);
        }
        let i = last;
        let reused = self.by_component[i].calls() > 0;
        let out = self.by_component[i].call(call);
        if let Err(err) = &out {
            // Whatever went wrong, the next call gets a fresh instance.
            self.by_component.remove(i).discard();
            // What an earlier call left in the instance (a leak that reaches
            // the memory limit, say) must not fail this step: the step is
            // tried once more on a fresh instance, whose answer stands. A
            // timeout is not tried again (it would only double the wait).
            if reused && !matches!(err, GuestError::Timeout { .. }) {
                return component.call(call);
            }
        }
        out
    }
}

/// A step whose node is found and whose plan is ready ([`Runtime::ready`]).
struct Ready<'w> {
    node_id: String,
    node: &'w Node,
    counters: StepCounters,
    plan: StepPlan,
    /// The handler of the plan's effect, if it asks for one.
    handler: Option<Arc<dyn EffectHandler>>,
}

/// What an effect's execution is told ([`Runtime::execute`]).
struct Call<'k> {
    seq: u64,
    key: &'k str,
    now: chrono::DateTime<chrono::Utc>,
    attempt: u32,
    depth: u32,
    /// Whether its records go ahead of the commit (not a pure effect).
    ahead: bool,
    /// Whether the step has records still to commit (a resume): such a
    /// step never flies (they would be lost with the hold).
    pending: bool,
}

/// Where an effect of a step executes ([`Runtime::flight_plan`]).
enum FlightPlan {
    /// Inside the step.
    Inline,
    /// In flight.
    Fly,
    /// Not now: every flight is taken.
    HoldBack,
}

/// An effect a step runs, with what settling its outcome needs.
struct EffectStep<'w> {
    wf: &'w Workflow,
    node: &'w Node,
    node_id: String,
    effect: EffectRequest,
    handler: Arc<dyn EffectHandler>,
    class: EffectClass,
    target: Target,
    seq: u64,
    attempt: u32,
}

/// An effect's step once the effect ran: what recording its end needs.
struct Ran {
    /// The effect's `started` record, the base of its outcome's.
    base: StepRecord,
    ended_at: String,
    /// How to take the step's vars patch back.
    undo: Vec<(String, Option<Value>)>,
    /// Whether the effect's records were appended ahead of the commit.
    ahead: bool,
    /// Whether its outcome was read back from them.
    replayed: bool,
}

/// Where a retried effect runs again ([`Runtime::retry_later`]).
struct Retry<'p> {
    node_id: &'p str,
    seq: u64,
    attempt: u32,
    policy: &'p RetryPolicy,
}

/// Where a step sends the run.
enum Target {
    Node(String),
    Complete(Value),
    /// No route: a waiting effect completes the run with the resume payload,
    /// a completed effect with its result.
    End,
}

pub(crate) fn complete(run: &mut RunState, output: Value) {
    run.status = RunStatus::Completed;
    run.output = Some(output);
    run.current_node = None;
    run.waiting = None;
}

fn fail(run: &mut RunState, msg: String, now: &str) {
    run.status = RunStatus::Failed;
    run.error = Some(msg);
    run.waiting = None;
    run.updated_at = now.to_string();
}

/// The record that ends effect record `base` (same effect, key and attempt)
/// with `status`, as of `ended_at`.
/// The outcome of an effect executed in its step, its failure marked on
/// its span.
fn failed_in(span: &mut super::trace::Span, outcome: Result<Outcome>) -> Result<Outcome> {
    match &outcome {
        Ok(Outcome::Failed(f)) => span.fail(f),
        Err(e) => span.fail(e),
        Ok(_) => {}
    }
    outcome
}

fn outcome_record(base: &StepRecord, status: StepStatus, ended_at: &str) -> StepRecord {
    StepRecord {
        step_id: super::keys::new_step_id(),
        status,
        ended_at: Some(ended_at.to_string()),
        result: None,
        // What the step wrote is the `started` record's to say.
        vars: None,
        input: None,
        ..base.clone()
    }
}

/// The outcome an effect's ledger recorded for `attempt`, if it ran before.
fn recorded_outcome(records: &[StepRecord], attempt: u32) -> Option<Outcome> {
    let r = records
        .iter()
        .find(|r| r.attempt == attempt && r.status != StepStatus::Started)?;
    match r.status {
        StepStatus::Completed => Some(Outcome::Completed(r.result.clone().unwrap_or(Value::Null))),
        StepStatus::Waiting => r
            .result
            .as_ref()
            .and_then(|v| serde_json::from_value::<WaitState>(v["wait"].clone()).ok())
            .map(|w| Outcome::Waiting(Box::new(w))),
        StepStatus::Failed => {
            let error = r.error.clone().unwrap_or_default();
            let (code, message) = error.split_once(": ").unwrap_or(("effect_failed", &error));
            let retryable = r
                .result
                .as_ref()
                .and_then(|v| v.get("retryable"))
                .and_then(Value::as_bool)
                .unwrap_or(false);
            Some(Outcome::Failed(Failure {
                code: code.to_string(),
                message: message.to_string(),
                retryable,
            }))
        }
        _ => None,
    }
}

impl Runtime {
    /// Steps the held run until it stops running or `max_steps` ran.
    ///
    /// `pending` holds the record of a wait that just ended (a resume, a due
    /// time): it commits together with the first step, in one store commit,
    /// so a resume costs one commit, not two. Until that commit the run is
    /// still waiting in the store; the hold keeps every other executor out.
    ///
    /// Each step runs under [`panics::catch`]: a panic fails the run with
    /// `host_panic`. A commit that loses a race returns
    /// [`Error::Conflict`].
    pub(crate) fn run_steps(
        &self,
        txn: &mut RunTxn<'_>,
        run: RunState,
        max_steps: u64,
        pending: Vec<StepRecord>,
        depth: u32,
    ) -> Result<RunState> {
        if !self.inner.tracer.is_on() {
            return self.run_steps_untraced(txn, run, max_steps, pending, depth);
        }
        // A state that already shows its end commits it in this tick (with
        // the resume that ended it).
        let ending = !pending.is_empty();
        let tick = super::trace::TickSpan::start(&self.inner.tracer, &run, ending);
        let answer = self.run_steps_untraced(txn, run, max_steps, pending, depth);
        tick.end(&self.inner.tracer, &answer);
        answer
    }

    /// [`Runtime::run_steps`] without its tick's span.
    fn run_steps_untraced(
        &self,
        txn: &mut RunTxn<'_>,
        mut run: RunState,
        max_steps: u64,
        mut pending: Vec<StepRecord>,
        depth: u32,
    ) -> Result<RunState> {
        let mut sessions = Sessions::default();
        if run.status != RunStatus::Running || max_steps == 0 {
            if !pending.is_empty() || !txn.exists() {
                txn.keep = false;
                txn.commit(pending, &mut run)?;
            }
            return Ok(run);
        }
        let wf = self.workflow_of(&run)?;
        txn.fly = depth == 0 && (txn.fly || self.inner.config.calls_in_flight);
        // A run left to the driver in the middle of a chain continues it at
        // the depth it was left at (the first commit forgets the note).
        // A step not nested inside another run's starts a new count of the
        // runs it executes inline (whatever depth the run continues at).
        let top = depth == 0;
        let depth = match super::keys::take_cascade_depth(&mut run) {
            Some(d) => depth.max(d),
            None => depth,
        };
        let mut steps = 0;
        let limit = self.inner.config.max_node_visits;
        // A tick that uses up the run's visit budget also fails it (one
        // more step, which refuses), rather than leave that to the next.
        while run.status == RunStatus::Running
            && (steps < max_steps || visits_since_wait(&run) >= limit)
            && !(steps > 0 && txn.deadline.is_some_and(|d| d.passed()))
        {
            // Keep the lease through this commit if another step follows.
            txn.keep = steps + 1 < max_steps || visits_since_wait(&run) + 1 >= limit;
            if top {
                super::cascade::start();
            }
            let mut records = std::mem::take(&mut pending);
            if records.capacity() == 0 {
                // Room for the one record most steps write, not the four a
                // first push makes room for (four records are past the
                // allocator's fast size classes).
                records.reserve_exact(1);
            }
            let mut span = self.inner.tracer.enter("stepwell.step", None);
            span.attr_with("stepwell.node_id", || {
                run.current_node.clone().unwrap_or_default()
            });
            let stepped =
                panics::catch(|| self.step(txn, &wf, &mut run, records, depth, &mut sessions));
            span.attr_with("stepwell.status", || run.status.as_str());
            drop(span);
            match stepped {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(panic) => return self.fail_after_panic(txn, &run.run_id, panic),
            }
            if txn.flew || txn.held_back {
                // Its effect is in flight (or waits for room to fly): the
                // run as the store has it.
                return self.get_state(&run.run_id);
            }
            steps += 1;
        }
        Ok(run)
    }

    /// Fails the held run with `host_panic` from its last committed state
    /// (what the panicking step did in memory is dropped).
    fn fail_after_panic(
        &self,
        txn: &mut RunTxn<'_>,
        run_id: &str,
        panic: String,
    ) -> Result<RunState> {
        let mut run = self.get_state(run_id)?;
        let now = format_time(self.now());
        let msg = format!("host_panic: the host failed while executing this run: {panic}");
        let record = StepRecord {
            status: StepStatus::Failed,
            error: Some(msg.clone()),
            ended_at: Some(now.clone()),
            idempotency_key: Some(terminal_key(&run)),
            ..self.record(&run, run.current_node.clone(), &now)
        };
        fail(&mut run, msg, &now);
        txn.keep = false;
        if !txn.exists() {
            // The panic came before the run's first commit: it never existed.
            return Ok(run);
        }
        txn.commit(vec![record], &mut run)?;
        Ok(run)
    }

    /// Executes the run's current node and commits the step. `records`
    /// starts with the pending records to commit with this step.
    fn step(
        &self,
        txn: &mut RunTxn<'_>,
        wf: &Workflow,
        run: &mut RunState,
        mut records: Vec<StepRecord>,
        depth: u32,
        sessions: &mut Sessions,
    ) -> Result<()> {
        txn.steps_never_fail = wf.steps_never_fail;
        // Only a step without an effect that follows another one keeps
        // this: every other path leaves it unset.
        let clean = std::mem::take(&mut sessions.clean);
        // A step replayed for an effect that landed plans at the time it
        // took off (its seed is pinned too): the node plans the same.
        let now = match &txn.landed {
            Some(landed) => landed.now,
            None => self.now(),
        };
        let started_at = format_time(now);
        // What the ledger needs to rebuild the run's vars at any step (for
        // forks): the user vars at the first step, each step's patch.
        let mut notes = Notes {
            input: first_step_input(run),
            vars: None,
        };
        let Ready {
            node_id,
            node,
            counters,
            plan,
            handler,
        } = match self.ready(wf, run, now, sessions) {
            Ok(ready) => ready,
            Err((node_id, msg)) => {
                let at = (node_id, started_at.as_str(), notes);
                return self.fail_step(txn, run, records, at, msg);
            }
        };
        if handler.as_ref().is_some_and(|h| h.commits_first())
            && (!records.is_empty() || !txn.exists())
        {
            // Make the pending resume (or the run itself) true before other
            // runs or the world are touched: from here on the store shows
            // this run running, so no event can resume it a second time
            // while this step runs, and no child can see a parent that does
            // not exist.
            let keep = txn.keep;
            txn.keep = true;
            let pending = std::mem::take(&mut records);
            txn.commit(pending, run)?;
            txn.keep = keep;
        }
        count_visit(run);
        sessions.changed.truncate(1);
        let StepPlan {
            vars,
            effect,
            next_node,
            complete_output,
            ..
        } = plan;
        let recorded = recorded_patch(vars.as_ref());
        let patched = apply_patch(run, vars, effect.is_some(), &node_id, &mut sessions.changed);
        // Only a patch that was applied is the step's to record.
        if patched.is_ok() {
            notes.vars = recorded;
        }
        let target = patched.and_then(|undo| {
            let route = (complete_output, next_node.as_deref(), effect.is_some());
            step_target(wf, node, &node_id, route).map(|t| (undo, t))
        });
        let (undo, target) = match target {
            Ok(found) => found,
            Err(msg) => {
                let at = (Some(node_id), started_at.as_str(), notes);
                return self.fail_step(txn, run, records, at, msg);
            }
        };
        let (Some(effect), Some(handler)) = (effect, handler) else {
            let (result, key) = match &target {
                // Built directly: `json!` goes through serde for `n`.
                Target::Node(n) => (next_node_result(n), None),
                Target::Complete(out) => {
                    (json!({ "complete_output": out }), Some(terminal_key(run)))
                }
                Target::End => (Value::Null, Some(terminal_key(run))),
            };
            records.push(StepRecord {
                result: Some(result),
                vars: notes.vars,
                input: notes.input,
                ended_at: Some(started_at.clone()),
                idempotency_key: key,
                ..self.record(run, Some(node_id), &started_at)
            });
            // The attempt number is cleared only if a retry set one.
            go_clearing(run, target, None, counters.retrying);
            run.updated_at = started_at;
            // The store holds the run as this tick's last step left it:
            // since, only `_runtime` and the patch's keys changed.
            let done = if clean {
                txn.commit_changed(records, run, &sessions.changed)
            } else {
                txn.commit(records, run)
            };
            sessions.clean = done.is_ok();
            return done;
        };
        if let Some(msg) = self.refused_request(wf, run, &node_id, &effect, &*handler) {
            let at = (Some(node_id), started_at.as_str(), notes);
            return self.fail_step(txn, run, records, at, msg);
        }
        let seq = next_effect_seq(run);
        let key = effect_idempotency_key(run, seq);
        let attempt = current_attempt(run);
        let base = StepRecord {
            status: StepStatus::Started,
            effect: Some(EffectRecord {
                kind: effect.kind.clone(),
                payload: handler
                    .recorded_payload(&effect.payload)
                    .unwrap_or_else(|| effect.payload.clone()),
                result_key: effect.result_key.clone(),
            }),
            idempotency_key: Some(key.clone()),
            attempt,
            vars: notes.vars,
            input: notes.input,
            ..self.record(run, Some(node_id.clone()), &started_at)
        };
        let class = handler.class();
        let ahead = class != EffectClass::Pure && effect.payload.is_object();
        let call = Call {
            seq,
            key: &key,
            now,
            attempt,
            depth,
            ahead,
            pending: !records.is_empty(),
        };
        let Some((outcome, replayed)) = self.execute(txn, run, &effect, &handler, &base, call)?
        else {
            // In flight: the step is replayed when the effect lands.
            return Ok(());
        };
        if !ahead {
            records.push(base.clone());
        }
        if handler.starts_runs() && !matches!(outcome, Outcome::Failed(_)) {
            count_child(run);
        }
        let ran = Ran {
            base,
            ended_at: format_time(self.now()),
            undo,
            ahead,
            replayed,
        };
        let step = EffectStep {
            wf,
            node,
            node_id,
            effect,
            handler,
            class,
            target,
            seq,
            attempt,
        };
        self.settle(txn, run, records, step, outcome, ran)
    }

    /// The step's node, its counters, its plan and its effect's handler;
    /// or why the run fails at this node (and which node, if it has one).
    fn ready<'w>(
        &self,
        wf: &'w Workflow,
        run: &mut RunState,
        now: chrono::DateTime<chrono::Utc>,
        sessions: &mut Sessions,
    ) -> std::result::Result<Ready<'w>, (Option<String>, String)> {
        let Some(node_id) = run.current_node.clone() else {
            let msg = "invalid_state: a running run has no current node";
            return Err((None, msg.into()));
        };
        let Some(node) = wf.nodes.get(&node_id) else {
            let msg = format!(
                "unknown_node: workflow {} has no node {node_id:?}",
                wf.workflow_id
            );
            return Err((Some(node_id), msg));
        };
        let at_node = |msg: String| (Some(node_id.clone()), msg);
        let counters = StepCounters::read(run);
        let limit = self.inner.config.max_node_visits;
        if counters.visits_since_wait() >= limit {
            return Err(at_node(format!(
                "limit_exceeded: the run took {limit} node steps without waiting (RuntimeConfig::max_node_visits); a flow that loops must wait somewhere"
            )));
        }
        let per_wait = wf.steps_never_fail;
        let spent = counters.data_spent(counters.data_bytes, per_wait);
        if let Some(msg) = self.data_over_budget(spent, per_wait) {
            return Err(at_node(msg));
        }
        let plan = self
            .plan(wf, node, run, now, sessions, &counters)
            .map_err(at_node)?;
        if plan.output_bytes > 0 {
            let total = count_data(run, plan.output_bytes as u64);
            let spent = counters.data_spent(total, per_wait);
            if let Some(msg) = self.data_over_budget(spent, per_wait) {
                return Err(at_node(msg));
            }
        }
        let handler = match &plan.effect {
            None => None,
            Some(effect) => match self.inner.effects.get(&effect.kind) {
                Some(h) => Some(h.clone()),
                None => {
                    return Err(at_node(format!(
                        "unsupported_feature: node {node_id} asked for the unknown effect {:?} (known: {})",
                        effect.kind,
                        self.inner.effects.kinds().join(", ")
                    )))
                }
            },
        };
        Ok(Ready {
            node_id,
            node,
            counters,
            plan,
            handler,
        })
    }

    /// Why the effect a node asked for is refused before it runs, if it
    /// is: a result key the host owns or that cannot be written, or a
    /// child run past the run's limit.
    fn refused_request(
        &self,
        wf: &Workflow,
        run: &RunState,
        node_id: &str,
        effect: &EffectRequest,
        handler: &dyn EffectHandler,
    ) -> Option<String> {
        if let Some(key) = effect.result_key.as_deref().filter(|k| is_host_owned(k)) {
            return Some(format!(
                "guest_bad_output: node {node_id} asked for an effect result in the host-owned var {key:?}"
            ));
        }
        if let Some(why) = effect.result_key.as_deref().and_then(bad_result_key) {
            return Some(format!(
                "guest_bad_output: node {node_id} of workflow {} asked for a result key that {why}",
                wf.workflow_id
            ));
        }
        let max_children = self.inner.config.max_children_per_run;
        (handler.starts_runs() && children_started(run) >= max_children).then(|| {
            format!(
                "limit_exceeded: node {node_id}: the run has started {max_children} child runs (RuntimeConfig::max_children_per_run)"
            )
        })
    }

    /// Runs the effect, or reads its outcome back from the records
    /// appended ahead of an earlier try of this step: an effect on other
    /// runs or the world never runs twice. Returns the outcome and whether
    /// it was read back.
    fn execute(
        &self,
        txn: &mut RunTxn<'_>,
        run: &RunState,
        effect: &EffectRequest,
        handler: &Arc<dyn EffectHandler>,
        base: &StepRecord,
        call: Call<'_>,
    ) -> Result<Option<(Outcome, bool)>> {
        let cx = self.effect_cx(run, &call);
        let Some(payload) = effect.payload.as_object() else {
            let outcome = Outcome::invalid(&effect.kind, "", "must be a JSON object");
            return Ok(Some((outcome, false)));
        };
        if !call.ahead {
            let mut span = self.effect_span(effect, &**handler, false);
            let outcome = failed_in(&mut span, handler.execute(&cx, payload, None))?;
            return Ok(Some((outcome, false)));
        }
        // Recorded ahead of the commit, reused on replay.
        let recorded: Vec<StepRecord> = if txn.exists() {
            self.list_ahead(&run.run_id)?
                .into_iter()
                .filter(|r| r.idempotency_key.as_deref() == Some(call.key))
                .collect()
        } else {
            Vec::new()
        };
        if let Some(outcome) = recorded_outcome(&recorded, call.attempt) {
            return Ok(Some((outcome, true)));
        }
        // Landed from flight: settled like an outcome executed here.
        if let Some(landed) = txn.landed.take() {
            // The same effect as the one that flew (a node plans the same
            // again: its step's seed is pinned).
            if landed.kind == effect.kind
                && landed.key == call.key
                && landed.attempt == call.attempt
            {
                return landed.outcome.map(|o| Some((o, false)));
            }
        }
        let started = recorded
            .iter()
            .find(|r| r.attempt == call.attempt && r.status == StepStatus::Started);
        let prepared = match started {
            Some(r) => r.result.clone(),
            None => {
                let prepared = handler.prepare(&cx, payload)?;
                let mut record = base.clone();
                record.result = prepared.clone();
                txn.append_ahead(&[record])?;
                prepared
            }
        };
        match self.flight_plan(txn, &**handler, &call) {
            FlightPlan::Inline => {}
            FlightPlan::Fly => {
                let flight = Flight {
                    now: call.now,
                    kind: &effect.kind,
                    key: call.key,
                    attempt: call.attempt,
                    resume: None,
                };
                let span = self.effect_span(effect, &**handler, true);
                let _scope = super::trace::scope(span.context());
                let landing = self.take_off(&run.run_id, &flight, span);
                if let Some(landing) = handler.launch(&cx, payload, prepared.as_ref(), landing) {
                    self.fly_on_thread(run, payload, prepared, handler.clone(), &call, landing);
                }
                txn.detach();
                return Ok(None);
            }
            FlightPlan::HoldBack => {
                // As many effects are out as may be: the run waits for its
                // turn (its `started` record stays; the replay flies it).
                txn.held_back = true;
                return Ok(None);
            }
        }
        let mut span = self.effect_span(effect, &**handler, false);
        let outcome = failed_in(&mut span, handler.execute(&cx, payload, prepared.as_ref()))?;
        Ok(Some((outcome, false)))
    }

    /// The span of an effect executed now (entered) or in flight (ended
    /// when it lands).
    fn effect_span(
        &self,
        effect: &EffectRequest,
        handler: &dyn EffectHandler,
        in_flight: bool,
    ) -> super::trace::Span {
        let tracer = &self.inner.tracer;
        let mut span = if in_flight {
            tracer.start("stepwell.effect", None)
        } else {
            tracer.enter("stepwell.effect", None)
        };
        span.attr_with("stepwell.effect.kind", || effect.kind.clone());
        span.attr_with("stepwell.effect.class", || handler.class().as_str());
        span.attr("stepwell.effect.in_flight", in_flight);
        span
    }

    /// What effect `call` of `run` is told.
    fn effect_cx<'a>(&'a self, run: &'a RunState, call: &Call<'a>) -> EffectCx<'a> {
        self.cx_at(run, call.seq, call.key, call.now, call.attempt, call.depth)
    }

    /// What effect `key` (the run's `seq`th), attempt `attempt`, at `now`
    /// and `depth` runs deep, is told (no cancel: set one for flight).
    pub(super) fn cx_at<'a>(
        &'a self,
        run: &'a RunState,
        seq: u64,
        key: &'a str,
        now: chrono::DateTime<chrono::Utc>,
        attempt: u32,
        depth: u32,
    ) -> EffectCx<'a> {
        EffectCx {
            run,
            seq,
            key,
            now,
            attempt,
            depth,
            max_depth: self.inner.config.max_nesting,
            emit_scopes: &self.inner.config.emit_scopes,
            max_cascade: self.inner.config.max_cascade_runs,
            runs: self,
            artifacts: self.artifact_store(),
            cancel: None,
            tracer: &self.inner.tracer,
        }
    }

    /// Whether the effect of the step under `txn` leaves in flight: its
    /// handler flies, the step is a driver's (or direct calls fly), not
    /// nested inside another run's step, has nothing left to commit, and
    /// the hold has the lease. With as many effects out as
    /// [`crate::RuntimeConfig::max_in_flight`] allows, or every flight
    /// thread taken for an effect that needs one, the run is held back
    /// instead (executing the effect here would hold the driver, and
    /// queueing it would hold its run's state).
    fn flight_plan(
        &self,
        txn: &RunTxn<'_>,
        handler: &dyn EffectHandler,
        call: &Call<'_>,
    ) -> FlightPlan {
        let max = self.inner.config.max_in_flight;
        let flies = txn.fly && call.depth == 0 && !call.pending && txn.leased() && handler.flies();
        let threads_taken = !handler.own_executor()
            && self.inner.flights.thread_jobs() >= self.inner.config.flight_threads.max(1);
        if !flies || max == 0 {
            FlightPlan::Inline
        } else if self.inner.flights.out() < max && !threads_taken && self.bytes_room() {
            FlightPlan::Fly
        } else {
            FlightPlan::HoldBack
        }
    }

    /// Executes an effect in flight on one of the runtime's flight threads
    /// (for handlers that do not launch themselves), landing its outcome.
    fn fly_on_thread(
        &self,
        run: &RunState,
        payload: &Map<String, Value>,
        prepared: Option<Value>,
        handler: Arc<dyn EffectHandler>,
        call: &Call<'_>,
        landing: Landing,
    ) {
        let (rt, run, payload) = (self.clone(), run.clone(), payload.clone());
        // The copy of the run this job keeps until it lands.
        landing
            .hold_bytes(super::flight::json_size(&run.vars) + super::flight::json_size(&payload));
        let (seq, key, now, attempt) = (call.seq, call.key.to_string(), call.now, call.attempt);
        self.fly_job(Box::new(move || {
            let call = Call {
                seq,
                key: &key,
                now,
                attempt,
                depth: 0,
                ahead: true,
                pending: false,
            };
            let cancel = landing.cancel().clone();
            let _scope = super::trace::scope(landing.span_context());
            let cx = EffectCx {
                cancel: Some(&cancel),
                ..rt.effect_cx(&run, &call)
            };
            match panics::catch(|| handler.execute(&cx, &payload, prepared.as_ref())) {
                Ok(Ok(outcome)) => landing.land(outcome),
                Ok(Err(e)) => landing.land_error(e),
                Err(panic) => landing.land(Outcome::Failed(Failure::permanent(
                    "host_panic",
                    format!("the host failed while executing this effect: {panic}"),
                ))),
            }
        }));
    }

    /// Records the outcome of the effect `step` ran and commits the run's
    /// transition: on, parked, retried later, or failed.
    fn settle(
        &self,
        txn: &mut RunTxn<'_>,
        run: &mut RunState,
        mut records: Vec<StepRecord>,
        step: EffectStep<'_>,
        outcome: Outcome,
        ran: Ran,
    ) -> Result<()> {
        match outcome {
            Outcome::Completed(result) => {
                let per_wait = step.wf.steps_never_fail;
                if let Some(failure) = self.check_result(run, &step.effect, &result, per_wait) {
                    return self.fail_effect(txn, run, records, ran, failure);
                }
                if let Some(payload) = step.effect.payload.as_object() {
                    step.handler.after_completed(run, payload, &result);
                }
                let kept = if step.class == EffectClass::Pure {
                    step.handler.recorded_result(&result)
                } else {
                    None
                };
                complete_effect(
                    run,
                    &mut records,
                    &ran.base,
                    &ran.ended_at,
                    step.target,
                    result,
                );
                if let (Some(kept), Some(record)) = (kept, records.last_mut()) {
                    record.result = Some(kept);
                }
            }
            Outcome::Waiting(mut wait) => {
                wait.resume_to_node = match step.target {
                    Target::Node(n) => Some(n),
                    Target::End => None,
                    Target::Complete(_) => {
                        let failure = Failure::permanent(
                            "guest_bad_output",
                            format!(
                                "node {} both completes the run and waits ({})",
                                step.node_id, step.effect.kind
                            ),
                        );
                        return self.fail_effect(txn, run, records, ran, failure);
                    }
                };
                park(run, &mut records, &ran.base, &ran.ended_at, *wait);
            }
            Outcome::HostChange(change) => {
                if let Err(failure) = host_change(run, &mut records, step, *change, &ran) {
                    return self.fail_effect(txn, run, records, ran, failure);
                }
            }
            Outcome::Failed(failure) => {
                return self.effect_failed(txn, run, records, step, failure, ran);
            }
        }
        self.commit_effect(txn, run, records, ran)
    }

    /// The effect `step` ran failed: it is tried again later (its kind's
    /// retry policy, for a retryable failure), its failure is its result
    /// (`_absorb_failure`, with a node to go on to), or the run fails.
    fn effect_failed(
        &self,
        txn: &mut RunTxn<'_>,
        run: &mut RunState,
        mut records: Vec<StepRecord>,
        step: EffectStep<'_>,
        failure: Failure,
        ran: Ran,
    ) -> Result<()> {
        let attempt = step.attempt;
        let policy = self.inner.config.retries.get(&step.effect.kind).copied();
        if let Some(policy) = policy.filter(|p| failure.retryable && attempt < p.max_attempts) {
            let retry = Retry {
                node_id: &step.node_id,
                seq: step.seq,
                attempt,
                policy: &policy,
            };
            return self.retry_later(txn, run, records, ran, failure, retry);
        }
        let failure = match policy {
            Some(_) if failure.retryable => Failure {
                message: format!("{} (after {attempt} attempts)", failure.message),
                ..failure
            },
            _ => failure,
        };
        let absorb = stepwell_model::json::truthy(step.effect.payload.get("_absorb_failure"));
        match step.target {
            // Opted in, with a node to go on to: the final failure is the
            // effect's result, and the run goes on.
            target @ Target::Node(_) if absorb => {
                let absorbed = json!({"ok": false, "absorbed_failure": failure.to_string()});
                records.push(StepRecord {
                    error: Some(failure.to_string()),
                    result: Some(absorbed.clone()),
                    ..outcome_record(&ran.base, StepStatus::Failed, &ran.ended_at)
                });
                if let Some(key) = step.effect.result_key.as_deref() {
                    template::assign(&mut run.vars, key, absorbed.clone());
                }
                go(run, target, Some(absorbed));
                self.commit_effect(txn, run, records, ran)
            }
            _ => self.fail_effect(txn, run, records, ran, failure),
        }
    }

    /// Commits an effect's step: its records appended ahead are settled
    /// and the run saved with the rest.
    fn commit_effect(
        &self,
        txn: &mut RunTxn<'_>,
        run: &mut RunState,
        records: Vec<StepRecord>,
        ran: Ran,
    ) -> Result<()> {
        let records = settle_ahead(txn, records, ran.ahead, ran.replayed)?;
        run.updated_at = ran.ended_at;
        txn.commit(records, run)
    }

    /// Why the run may not take more data, if its budget is spent: over
    /// its life, or (`per_wait`: a workflow whose steps never fail it, the
    /// automation controller) since it last waited.
    fn over_data_budget(&self, run: &RunState, per_wait: bool) -> Option<String> {
        let spent = if per_wait {
            data_since_wait(run)
        } else {
            data_bytes(run)
        };
        self.data_over_budget(spent, per_wait)
    }

    /// [`Runtime::over_data_budget`] for `spent` bytes counted as it counts
    /// them.
    fn data_over_budget(&self, spent: u64, per_wait: bool) -> Option<String> {
        let limit = self.inner.config.max_run_data_bytes;
        let since = if per_wait {
            " since it last waited"
        } else {
            ""
        };
        (spent > limit).then(|| {
            format!(
                "limit_exceeded: the run's steps wrote {spent} bytes of data{since} (guest output, effect results, resume payloads), over the limit of {limit} (RuntimeConfig::max_run_data_bytes)"
            )
        })
    }

    /// Why an effect's result may not enter the run, if it may not: it
    /// nests too deep where it is written, is larger than a payload may be,
    /// or spends the run's data budget. Counts it against the budget.
    fn check_result(
        &self,
        run: &mut RunState,
        effect: &EffectRequest,
        result: &Value,
        per_wait: bool,
    ) -> Option<Failure> {
        let parts = effect
            .result_key
            .as_deref()
            .map_or(0, |k| k.split('.').count());
        if let Some(why) = too_deep(result, parts + 1) {
            return Some(Failure::permanent(
                "state_too_large",
                format!("the result of {} {why}", effect.kind),
            ));
        }
        let bytes = serde_json::to_vec(result).map_or(0, |b| b.len());
        let limit = self.inner.config.max_payload_bytes;
        if bytes > limit {
            return Some(Failure::permanent(
                "state_too_large",
                format!(
                    "the result of {} takes {bytes} bytes as JSON, over the limit of {limit} (RuntimeConfig::max_payload_bytes)",
                    effect.kind
                ),
            ));
        }
        count_data(run, bytes as u64);
        self.over_data_budget(run, per_wait).map(|msg| {
            Failure::permanent(
                "limit_exceeded",
                msg["limit_exceeded: ".len()..].to_string(),
            )
        })
    }

    /// Asks the node for its plan.
    fn plan(
        &self,
        wf: &Workflow,
        node: &Node,
        run: &RunState,
        now: chrono::DateTime<chrono::Utc>,
        sessions: &mut Sessions,
        counters: &StepCounters,
    ) -> std::result::Result<StepPlan, String> {
        match &node.kind {
            NodeKind::Component {
                component,
                config_json,
                host_vars,
            } => {
                if now.timestamp() < 0 {
                    return Err(format!(
                        "invalid_state: the host's clock reads {}, before 1970: a node's `now` counts from 1970",
                        format_time(now)
                    ));
                }
                let vars = vars_json(&run.vars, *host_vars);
                let limit = self.inner.config.max_state_bytes;
                if vars.len() > limit {
                    return Err(format!(
                        "state_too_large: the run's vars take {} bytes as JSON, over the limit of {limit} (RuntimeConfig::max_state_bytes; keep large values in artifacts)",
                        vars.len()
                    ));
                }
                let call = NodeCall {
                    run_id: &run.run_id,
                    workflow_id: &wf.workflow_id,
                    node_id: &node.id,
                    config_json: config_json.as_ref(),
                    vars_json: &vars,
                    now,
                    attempt: counters.attempt,
                    seed: sessions.seed(&run.run_id, counters.node_visits),
                };
                let mut span = self.inner.tracer.enter("stepwell.guest", None);
                span.attr_with("stepwell.node_id", || node.id.clone());
                span.attr_with("stepwell.component", || {
                    component.path().display().to_string()
                });
                let plan = sessions
                    .call(self.inner.config.reuse_instances, component, &call)
                    .map_err(|e| {
                        format!("{} (node {} of workflow {})", e, node.id, wf.workflow_id)
                    });
                if let Err(e) = &plan {
                    span.fail(e);
                }
                plan
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

    /// Records failed attempt `attempt` and parks the run until its backoff
    /// has passed; the node then runs again with the next attempt number and
    /// the same effect (same idempotency key). The attempt's vars patch is
    /// taken back.
    fn retry_later(
        &self,
        txn: &mut RunTxn<'_>,
        run: &mut RunState,
        mut records: Vec<StepRecord>,
        ran: Ran,
        failure: Failure,
        retry: Retry<'_>,
    ) -> Result<()> {
        let Retry {
            node_id,
            seq,
            attempt,
            policy,
        } = retry;
        let Ran {
            base,
            ended_at,
            undo,
            ahead,
            replayed,
        } = ran;
        let (base, ended_at) = (&base, ended_at.as_str());
        undo_patch(run, undo);
        let wait = chrono::Duration::from_std(policy.backoff(attempt))
            .unwrap_or(chrono::Duration::days(365));
        let until = self
            .now()
            .checked_add_signed(wait)
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC)
            .min(crate::effects::waits::latest_time());
        let until = format_time(until);
        let kind = base
            .effect
            .as_ref()
            .map(|e| e.kind.clone())
            .unwrap_or_default();
        let msg = failure.to_string();
        records.push(StepRecord {
            error: Some(msg.clone()),
            result: Some(json!({
                "retryable": true,
                "retry": { "next_attempt": attempt + 1, "at": until },
            })),
            ..outcome_record(base, StepStatus::Failed, ended_at)
        });
        records = settle_ahead(txn, records, ahead, replayed)?;
        set_attempt(run, attempt + 1);
        set_retry_seq(run, seq);
        run.status = RunStatus::Waiting;
        mark_wait(run);
        run.waiting = Some(WaitState {
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
        txn.commit(records, run)
    }

    /// Fails the run at a node, before or without an effect.
    fn fail_step(
        &self,
        txn: &mut RunTxn<'_>,
        run: &mut RunState,
        mut records: Vec<StepRecord>,
        (node_id, started_at, notes): (Option<String>, &str, Notes),
        msg: String,
    ) -> Result<()> {
        if txn.steps_never_fail {
            return Err(held_at_node(msg));
        }
        records.push(StepRecord {
            status: StepStatus::Failed,
            error: Some(msg.clone()),
            vars: notes.vars,
            input: notes.input,
            ended_at: Some(started_at.to_string()),
            idempotency_key: Some(terminal_key(run)),
            ..self.record(run, node_id, started_at)
        });
        fail(run, msg, started_at);
        txn.commit(records, run)
    }

    /// Fails the run because its effect failed; the step's vars patch is
    /// taken back.
    fn fail_effect(
        &self,
        txn: &mut RunTxn<'_>,
        run: &mut RunState,
        mut records: Vec<StepRecord>,
        ran: Ran,
        failure: Failure,
    ) -> Result<()> {
        let Ran {
            base,
            ended_at,
            undo,
            ahead,
            replayed,
        } = ran;
        let (base, ended_at) = (&base, ended_at.as_str());
        undo_patch(run, undo);
        let msg = failure.to_string();
        if txn.steps_never_fail {
            return Err(held_at_node(msg));
        }
        records.push(StepRecord {
            error: Some(msg.clone()),
            result: failure.retryable.then(|| json!({ "retryable": true })),
            ..outcome_record(base, StepStatus::Failed, ended_at)
        });
        records = settle_ahead(txn, records, ahead, replayed)?;
        set_attempt(run, 1);
        fail(run, msg, ended_at);
        txn.commit(records, run)
    }
}

/// Applies a node's vars patch (a null removes the key) and returns how to
/// take it back: for a step with an effect, which can fail after the
/// patch, a copy of each key; for one without, nothing, and the keys
/// changed are noted in `changed` instead. A patch of a host-owned var is
/// refused (the run fails at the node).
fn apply_patch(
    run: &mut RunState,
    patch: Option<Map<String, Value>>,
    with_effect: bool,
    node_id: &str,
    changed: &mut Vec<String>,
) -> std::result::Result<Vec<(String, Option<Value>)>, String> {
    let mut undo = Vec::new();
    let Some(patch) = patch else {
        return Ok(undo);
    };
    if let Some(key) = patch.keys().find(|k| is_host_owned(k)) {
        return Err(format!(
            "guest_bad_output: node {node_id} tried to set the host-owned var {key:?}"
        ));
    }
    for (k, v) in patch {
        if !with_effect {
            if v.is_null() {
                run.vars.remove(&k);
            } else if let Some(old) = run.vars.get_mut(&k) {
                *old = v;
            } else {
                run.vars.insert(k.clone(), v);
            }
            changed.push(k);
            continue;
        }
        let old = if v.is_null() {
            run.vars.remove(&k)
        } else {
            run.vars.insert(k.clone(), v)
        };
        undo.push((k, old));
    }
    Ok(undo)
}

/// Where a step sends the run: the plan's output completes it, its next
/// node (a route label or a node) or the node's `next` route is where it
/// goes, and an effect with none ends it. `route` is the plan's
/// `(complete_output, next_node, has an effect)`.
fn step_target(
    wf: &Workflow,
    node: &Node,
    node_id: &str,
    route: (Option<Value>, Option<&str>, bool),
) -> std::result::Result<Target, String> {
    let (complete_output, next_node, has_effect) = route;
    if let Some(out) = complete_output {
        return Ok(Target::Complete(out));
    }
    if let Some(next) = next_node {
        let resolved = node.resolve_route(next);
        if !wf.nodes.contains_key(resolved) {
            return Err(format!(
                "guest_bad_output: node {node_id} routed to {next:?}, which is neither a route label nor a node of workflow {}",
                wf.workflow_id
            ));
        }
        return Ok(Target::Node(resolved.to_string()));
    }
    match &node.next {
        Some(next) => Ok(Target::Node(next.clone())),
        None if has_effect => Ok(Target::End),
        None => Err(format!(
            "guest_bad_output: node {node_id} chose no next node, did not complete the run, and has no `next` route"
        )),
    }
}

/// An effect that changes its own run's host state ([`Outcome::HostChange`]):
/// its assignments and records are applied, and the run goes on (to the
/// change's route, if it names one) or waits. Refused for an effect that
/// does not own host state, or a route that names no node.
fn host_change(
    run: &mut RunState,
    records: &mut Vec<StepRecord>,
    step: EffectStep<'_>,
    change: HostChange,
    ran: &Ran,
) -> std::result::Result<(), Failure> {
    let refuse = |why: String| Failure::permanent("invalid_effect", why);
    let kind = &step.effect.kind;
    let route = match change.route.as_deref() {
        None => None,
        Some(label) => {
            let resolved = step.node.resolve_route(label);
            if !step.wf.nodes.contains_key(resolved) {
                return Err(refuse(format!(
                    "effect {kind} routed node {} to {label:?}, which is neither a route label nor a node of workflow {}",
                    step.node_id, step.wf.workflow_id
                )));
            }
            Some(Target::Node(resolved.to_string()))
        }
    };
    if !step.handler.owns_host_state() {
        return Err(refuse(format!(
            "effect {kind} may not change its run's host state"
        )));
    }
    for (path, value) in change.assign {
        template::assign(&mut run.vars, &path, value);
    }
    records.extend(change.records);
    let target = route.unwrap_or(step.target);
    match change.then {
        Then::Continue(result) => {
            complete_effect(run, records, &ran.base, &ran.ended_at, target, result);
        }
        Then::Wait(mut wait) => {
            wait.resume_to_node = match target {
                Target::Node(n) => Some(n),
                _ => None,
            };
            park(run, records, &ran.base, &ran.ended_at, *wait);
        }
    }
    Ok(())
}

/// The end of an effect that completed with `result`: written to the
/// effect's result key, recorded, and the run goes on to `target`.
fn complete_effect(
    run: &mut RunState,
    records: &mut Vec<StepRecord>,
    base: &StepRecord,
    ended_at: &str,
    target: Target,
    result: Value,
) {
    if let Some(key) = base.effect.as_ref().and_then(|e| e.result_key.as_deref()) {
        template::assign(&mut run.vars, key, result.clone());
    }
    records.push(StepRecord {
        result: Some(result.clone()),
        ..outcome_record(base, StepStatus::Completed, ended_at)
    });
    go(run, target, Some(result));
}

/// Parks the run on `wait` (its `resume_to_node` set): the wait takes the
/// effect's result key, is recorded, and the run is waiting.
fn park(
    run: &mut RunState,
    records: &mut Vec<StepRecord>,
    base: &StepRecord,
    ended_at: &str,
    mut wait: WaitState,
) {
    wait.result_key = base.effect.as_ref().and_then(|e| e.result_key.clone());
    records.push(StepRecord {
        result: Some(json!({ "wait": wait })),
        ..outcome_record(base, StepStatus::Waiting, ended_at)
    });
    set_attempt(run, 1);
    run.status = RunStatus::Waiting;
    mark_wait(run);
    run.waiting = Some(wait);
}

/// The error of a step that failed in a run whose workflow's steps never
/// fail it (the automation controller): nothing was committed, the run
/// stays at its node, and the driver tries it again.
fn held_at_node(msg: String) -> crate::core::Error {
    crate::core::Error::StepHeld { message: msg }
}

fn go(run: &mut RunState, target: Target, effect_result: Option<Value>) {
    go_clearing(run, target, effect_result, true);
}

/// [`go`], clearing the attempt number only if `clear_attempt` (when the
/// caller knows none is set, the search for it is skipped).
fn go_clearing(
    run: &mut RunState,
    target: Target,
    effect_result: Option<Value>,
    clear_attempt: bool,
) {
    if clear_attempt {
        set_attempt(run, 1);
    }
    match target {
        Target::Node(n) => run.current_node = Some(n),
        Target::Complete(out) => complete(run, out),
        Target::End => complete(run, effect_result.unwrap_or(Value::Null)),
    }
}

/// The result of a step that moves on to node `n`: `{"next_node": n}`.
fn next_node_result(n: &str) -> Value {
    let mut result = serde_json::Map::new();
    result.insert("next_node".into(), Value::String(n.to_string()));
    Value::Object(result)
}

/// What a step's records say it did to the vars (their `vars` and
/// `input`): the ledger alone rebuilds the vars at any step (forks).
struct Notes {
    /// The user vars before the run's first step.
    input: Option<Value>,
    /// The step's vars patch.
    vars: Option<Value>,
}

/// The user vars (no host-owned ones, secrets redacted) of a run that has
/// taken no step yet: its first step's record carries them.
fn first_step_input(run: &RunState) -> Option<Value> {
    let visited = run
        .vars
        .get("_runtime")
        .is_some_and(|r| r.get("node_visits").is_some());
    if visited {
        return None;
    }
    Some(redact_map(&super::keys::user_vars(&run.vars)))
}

/// The step's vars patch as its record keeps it (never a secret: a value
/// under a key such as `api_key` reads `[redacted]`); none when empty.
fn recorded_patch(patch: Option<&Map<String, Value>>) -> Option<Value> {
    patch.filter(|p| !p.is_empty()).map(redact_map)
}

/// A vars map with its secrets redacted, as the ledger keeps it.
fn redact_map(vars: &Map<String, Value>) -> Value {
    Value::Object(
        vars.iter()
            .map(
                |(k, v)| match secret_key(k) && !v.is_null() && v.as_str() != Some("") {
                    true => (k.clone(), Value::String(REDACTED.into())),
                    false => (k.clone(), redact_all(v)),
                },
            )
            .collect(),
    )
}

/// Takes a vars patch back.
fn undo_patch(run: &mut RunState, undo: Vec<(String, Option<Value>)>) {
    for (k, old) in undo.into_iter().rev() {
        match old {
            Some(v) => {
                run.vars.insert(k, v);
            }
            None => {
                run.vars.remove(&k);
            }
        }
    }
}

/// The records an effect step commits: for an effect recorded ahead of its
/// commit, its outcome records are appended ahead now (unless the step was
/// replayed and they are there already) and the commit carries none; for
/// any other, all of them.
fn settle_ahead(
    txn: &RunTxn<'_>,
    records: Vec<StepRecord>,
    ahead: bool,
    replayed: bool,
) -> Result<Vec<StepRecord>> {
    if !ahead {
        return Ok(records);
    }
    if !replayed {
        txn.append_ahead(&records)?;
    }
    Ok(Vec::new())
}

#[cfg(test)]
mod tests {
    use super::Sessions;

    /// A replayed step must draw the same random bytes as the first time,
    /// also after an upgrade: the seeds are pinned (FNV-1a of the run id,
    /// then of the visit count's eight little-endian bytes).
    #[test]
    fn step_seeds_are_pinned_and_follow_the_run() {
        let mut s = Sessions::default();
        let run = "01a234fa-21c8-74b6-800c-ab28263f6deb";
        assert_eq!(s.seed(run, 0), 0xedae_bfc9_033b_81f0);
        assert_eq!(s.seed(run, 7), 0xc68a_3108_4fc6_88d7);
        // Another run id is hashed anew, not served from the first's prefix.
        assert_eq!(s.seed("r", 1), 0x91ce_6778_1fe4_ef54);
        assert_eq!(s.seed(run, 7), 0xc68a_3108_4fc6_88d7);
    }
}
