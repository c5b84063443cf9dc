//! The step machine: one node visit of a run, from the node's plan to the
//! commit of its transition, and the loop that steps a held run.

use serde_json::{json, Value};

use super::clock::format_time;
use super::config::RetryPolicy;
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
use super::txn::RunTxn;
use super::{panics, Result};
use crate::effects::{EffectClass, EffectCx, Failure, Outcome, Then};
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
fn outcome_record(base: &StepRecord, status: StepStatus, ended_at: &str) -> StepRecord {
    StepRecord {
        step_id: super::keys::new_step_id(),
        status,
        ended_at: Some(ended_at.to_string()),
        result: None,
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
        let wf = self.workflow(&run.workflow_id)?;
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
            match panics::catch(|| self.step(txn, &wf, &mut run, records, depth, &mut sessions)) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(panic) => return self.fail_after_panic(txn, &run.run_id, panic),
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
        let now = self.now();
        let started_at = format_time(now);
        let Some(node_id) = run.current_node.clone() else {
            return self.fail_step(
                txn,
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
            return self.fail_step(txn, run, records, Some(node_id), &started_at, msg);
        };
        let counters = StepCounters::read(run);
        let limit = self.inner.config.max_node_visits;
        if counters.visits_since_wait() >= limit {
            let msg = format!(
                "limit_exceeded: the run took {limit} node steps without waiting (RuntimeConfig::max_node_visits); a flow that loops must wait somewhere"
            );
            return self.fail_step(txn, run, records, Some(node_id), &started_at, msg);
        }
        let per_wait = wf.steps_never_fail;
        let spent = counters.data_spent(counters.data_bytes, per_wait);
        if let Some(msg) = self.data_over_budget(spent, per_wait) {
            return self.fail_step(txn, run, records, Some(node_id), &started_at, msg);
        }
        let plan = match self.plan(wf, node, run, now, sessions, &counters) {
            Ok(plan) => plan,
            Err(msg) => return self.fail_step(txn, run, records, Some(node_id), &started_at, msg),
        };
        if plan.output_bytes > 0 {
            let total = count_data(run, plan.output_bytes as u64);
            let spent = counters.data_spent(total, per_wait);
            if let Some(msg) = self.data_over_budget(spent, per_wait) {
                return self.fail_step(txn, run, records, Some(node_id), &started_at, msg);
            }
        }
        let handler = match &plan.effect {
            None => None,
            Some(effect) => match self.inner.effects.get(&effect.kind) {
                Some(h) => Some(h.clone()),
                None => {
                    let msg = format!(
                        "unsupported_feature: node {node_id} asked for the unknown effect {:?} (known: {})",
                        effect.kind,
                        self.inner.effects.kinds().join(", ")
                    );
                    return self.fail_step(txn, run, records, Some(node_id), &started_at, msg);
                }
            },
        };
        let class = handler.as_ref().map(|h| h.class());
        let first = handler.as_ref().is_some_and(|h| h.commits_first());
        if first && (!records.is_empty() || !txn.exists()) {
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
        // The patch, and how to take it back if the step's effect fails.
        // Only a step with an effect can fail after the patch: a step
        // without keeps no undo (a copy of each key).
        let mut undo: Vec<(String, Option<Value>)> = Vec::new();
        sessions.changed.truncate(1);
        if let Some(patch) = plan.vars {
            if let Some(key) = patch.keys().find(|k| is_host_owned(k)) {
                let msg = format!(
                    "guest_bad_output: node {node_id} tried to set the host-owned var {key:?}"
                );
                return self.fail_step(txn, run, records, Some(node_id), &started_at, msg);
            }
            let keep = plan.effect.is_some();
            for (k, v) in patch {
                if !keep {
                    if v.is_null() {
                        run.vars.remove(&k);
                    } else if let Some(old) = run.vars.get_mut(&k) {
                        *old = v;
                    } else {
                        run.vars.insert(k.clone(), v);
                    }
                    sessions.changed.push(k);
                    continue;
                }
                let old = if v.is_null() {
                    run.vars.remove(&k)
                } else {
                    run.vars.insert(k.clone(), v)
                };
                undo.push((k, old));
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
                return self.fail_step(txn, run, records, Some(node_id), &started_at, msg);
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
            return self.fail_step(txn, run, records, Some(node_id), &started_at, msg);
        };

        let (Some(effect), Some(handler), Some(class)) = (plan.effect, handler, class) else {
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

        if let Some(key) = effect.result_key.as_deref().filter(|k| is_host_owned(k)) {
            let msg = format!(
                "guest_bad_output: node {node_id} asked for an effect result in the host-owned var {key:?}"
            );
            return self.fail_step(txn, run, records, Some(node_id), &started_at, msg);
        }
        if let Some(why) = effect.result_key.as_deref().and_then(bad_result_key) {
            let msg = format!(
                "guest_bad_output: node {node_id} of workflow {} asked for a result key that {why}",
                wf.workflow_id
            );
            return self.fail_step(txn, run, records, Some(node_id), &started_at, msg);
        }
        let max_children = self.inner.config.max_children_per_run;
        if handler.starts_runs() && children_started(run) >= max_children {
            let msg = format!(
                "limit_exceeded: node {node_id}: the run has started {max_children} child runs (RuntimeConfig::max_children_per_run)"
            );
            return self.fail_step(txn, run, records, Some(node_id), &started_at, msg);
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
            ..self.record(run, Some(node_id.clone()), &started_at)
        };
        let ahead = class != EffectClass::Pure && effect.payload.is_object();
        let (outcome, replayed) = {
            let cx = EffectCx {
                run,
                seq,
                key: &key,
                now,
                attempt,
                depth,
                max_depth: self.inner.config.max_nesting,
                emit_scopes: &self.inner.config.emit_scopes,
                max_cascade: self.inner.config.max_cascade_runs,
                runs: self,
                artifacts: self.artifact_store(),
            };
            match effect.payload.as_object() {
                None => (
                    Outcome::invalid(&effect.kind, "", "must be a JSON object"),
                    false,
                ),
                Some(payload) if !ahead => (handler.execute(&cx, payload, None)?, false),
                Some(payload) => {
                    // Recorded ahead of the commit, reused on replay: an
                    // effect on other runs or the world never runs twice.
                    let recorded: Vec<StepRecord> = if txn.exists() {
                        self.list_ahead(&run.run_id)?
                            .into_iter()
                            .filter(|r| r.idempotency_key.as_deref() == Some(key.as_str()))
                            .collect()
                    } else {
                        Vec::new()
                    };
                    match recorded_outcome(&recorded, attempt) {
                        Some(outcome) => (outcome, true),
                        None => {
                            let started = recorded
                                .iter()
                                .find(|r| r.attempt == attempt && r.status == StepStatus::Started);
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
                            (handler.execute(&cx, payload, prepared.as_ref())?, false)
                        }
                    }
                }
            }
        };
        if !ahead {
            records.push(base.clone());
        }
        if handler.starts_runs() && !matches!(outcome, Outcome::Failed(_)) {
            count_child(run);
        }
        let ended_at = format_time(self.now());
        match outcome {
            Outcome::Completed(result) => {
                if let Some(failure) = self.check_result(run, &effect, &result, wf.steps_never_fail)
                {
                    return self.fail_effect(
                        txn, run, records, &base, &ended_at, failure, undo, ahead, replayed,
                    );
                }
                if let Some(payload) = effect.payload.as_object() {
                    handler.after_completed(run, payload, &result);
                }
                let kept = if class == EffectClass::Pure {
                    handler.recorded_result(&result)
                } else {
                    None
                };
                complete_effect(run, &mut records, &base, &ended_at, target, result);
                if let (Some(kept), Some(record)) = (kept, records.last_mut()) {
                    record.result = Some(kept);
                }
            }
            Outcome::Waiting(mut wait) => {
                wait.resume_to_node = match target {
                    Target::Node(n) => Some(n),
                    Target::End => None,
                    Target::Complete(_) => {
                        let failure = Failure::permanent(
                            "guest_bad_output",
                            format!(
                                "node {node_id} both completes the run and waits ({})",
                                effect.kind
                            ),
                        );
                        return self.fail_effect(
                            txn, run, records, &base, &ended_at, failure, undo, ahead, replayed,
                        );
                    }
                };
                park(run, &mut records, &base, &ended_at, *wait);
            }
            Outcome::HostChange(change) => {
                let change = *change;
                let refuse = |why: String| Failure::permanent("invalid_effect", why);
                let route = match change.route.as_deref() {
                    None => None,
                    Some(label) => {
                        let resolved = node.resolve_route(label);
                        if !wf.nodes.contains_key(resolved) {
                            let failure = refuse(format!(
                                "effect {} routed node {node_id} to {label:?}, which is neither a route label nor a node of workflow {}",
                                effect.kind, wf.workflow_id
                            ));
                            return self.fail_effect(
                                txn, run, records, &base, &ended_at, failure, undo, ahead, replayed,
                            );
                        }
                        Some(Target::Node(resolved.to_string()))
                    }
                };
                if !handler.owns_host_state() {
                    let failure = refuse(format!(
                        "effect {} may not change its run's host state",
                        effect.kind
                    ));
                    return self.fail_effect(
                        txn, run, records, &base, &ended_at, failure, undo, ahead, replayed,
                    );
                }
                for (path, value) in change.assign {
                    template::assign(&mut run.vars, &path, value);
                }
                records.extend(change.records);
                let target = route.unwrap_or(target);
                match change.then {
                    Then::Continue(result) => {
                        complete_effect(run, &mut records, &base, &ended_at, target, result);
                    }
                    Then::Wait(mut wait) => {
                        wait.resume_to_node = match target {
                            Target::Node(n) => Some(n),
                            _ => None,
                        };
                        park(run, &mut records, &base, &ended_at, *wait);
                    }
                }
            }
            Outcome::Failed(failure) => {
                let policy = self.inner.config.retries.get(&effect.kind).copied();
                if let Some(policy) =
                    policy.filter(|p| failure.retryable && attempt < p.max_attempts)
                {
                    return self.retry_later(
                        txn, run, records, &base, &ended_at, failure, &node_id, seq, attempt,
                        &policy, undo, ahead, replayed,
                    );
                }
                let failure = match policy {
                    Some(_) if failure.retryable => Failure {
                        message: format!("{} (after {attempt} attempts)", failure.message),
                        ..failure
                    },
                    _ => failure,
                };
                let absorb = stepwell_model::json::truthy(effect.payload.get("_absorb_failure"));
                match target {
                    // Opted in, with a node to go on to: the final failure
                    // is the effect's result, and the run goes on.
                    Target::Node(_) if absorb => {
                        let absorbed =
                            json!({"ok": false, "absorbed_failure": failure.to_string()});
                        records.push(StepRecord {
                            error: Some(failure.to_string()),
                            result: Some(absorbed.clone()),
                            ..outcome_record(&base, StepStatus::Failed, &ended_at)
                        });
                        if let Some(key) = effect.result_key.as_deref() {
                            template::assign(&mut run.vars, key, absorbed.clone());
                        }
                        go(run, target, Some(absorbed));
                    }
                    _ => {
                        return self.fail_effect(
                            txn, run, records, &base, &ended_at, failure, undo, ahead, replayed,
                        );
                    }
                }
            }
        }
        records = settle_ahead(txn, records, ahead, replayed)?;
        run.updated_at = ended_at;
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
                sessions
                    .call(self.inner.config.reuse_instances, component, &call)
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

    /// Records failed attempt `attempt` and parks the run until its backoff
    /// has passed; the node then runs again with the next attempt number and
    /// the same effect (same idempotency key). The attempt's vars patch is
    /// taken back.
    #[allow(clippy::too_many_arguments)]
    fn retry_later(
        &self,
        txn: &mut RunTxn<'_>,
        run: &mut RunState,
        mut records: Vec<StepRecord>,
        base: &StepRecord,
        ended_at: &str,
        failure: Failure,
        node_id: &str,
        seq: u64,
        attempt: u32,
        policy: &RetryPolicy,
        undo: Vec<(String, Option<Value>)>,
        ahead: bool,
        replayed: bool,
    ) -> Result<()> {
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
        node_id: Option<String>,
        started_at: &str,
        msg: String,
    ) -> Result<()> {
        if txn.steps_never_fail {
            return Err(held_at_node(msg));
        }
        records.push(StepRecord {
            status: StepStatus::Failed,
            error: Some(msg.clone()),
            ended_at: Some(started_at.to_string()),
            idempotency_key: Some(terminal_key(run)),
            ..self.record(run, node_id, started_at)
        });
        fail(run, msg, started_at);
        txn.commit(records, run)
    }

    /// Fails the run because its effect failed; the step's vars patch is
    /// taken back.
    #[allow(clippy::too_many_arguments)]
    fn fail_effect(
        &self,
        txn: &mut RunTxn<'_>,
        run: &mut RunState,
        mut records: Vec<StepRecord>,
        base: &StepRecord,
        ended_at: &str,
        failure: Failure,
        undo: Vec<(String, Option<Value>)>,
        ahead: bool,
        replayed: bool,
    ) -> Result<()> {
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
