//! Forks: a new run started from a past point of another run's history,
//! its vars rebuilt from the ledger.
//!
//! Every node step's record says what the step wrote (`vars`, the guest's
//! patch), the first step's record carries the vars the run started with
//! (`input`), effects' results and resume payloads
//! name their result keys: so the ledger alone gives the run's vars before
//! any step. A point a fork may start from is the start of a node's
//! execution: a node step, an effect's `started` record or a step that
//! failed. The fork runs that node again with the vars as they were just
//! before it (plus the caller's patch).

use serde_json::{json, Map, Value};

use super::clock::format_time;
use super::config::StartOptions;
use super::keys::{is_host_owned, user_vars};
use super::model::{RunState, RunStatus, StepRecord, StepStatus};
use super::runtime::Runtime;
use super::secrets::{redact_all, secret_key, REDACTED};
use super::{Error, Result};
use crate::flow::template;
use crate::store::Snapshot;

/// A point of a run's history a fork can start from.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ForkPoint {
    /// The ledger record's seq (1 for the first record).
    pub seq: u64,
    /// The node that ran there (and that a fork runs again).
    pub node_id: String,
    /// When that record started (RFC 3339).
    pub started_at: String,
    /// Whether the ledger holds the vars of this point: `false` for points
    /// of a ledger an older stepwell wrote, or after a change no record
    /// explains.
    pub reproducible: bool,
}

/// Where a fork starts.
#[derive(Debug, Clone)]
pub enum ForkFrom {
    /// The record with this seq (see [`Runtime::fork_points`]).
    Seq(u64),
    /// The run's first step: the run again from its start.
    Start,
    /// A snapshot of the run: its state's vars, at its current node.
    Snapshot(Box<Snapshot>),
}

/// What [`Runtime::fork`] is asked.
#[derive(Debug, Clone)]
pub struct ForkOptions {
    /// Where in the source run's history the fork starts.
    pub from: ForkFrom,
    /// A patch over the vars at that point (top-level keys; `null`
    /// removes one). Host-owned vars are refused.
    pub vars: Map<String, Value>,
    /// The workflow version the fork runs (`None`: the source run's).
    pub workflow_version: Option<u32>,
}

/// A started fork: its id and where it came from.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Forked {
    /// The new run.
    pub run_id: String,
    /// The source run.
    pub source_run_id: String,
    /// The source's record the fork started from (`None` from a snapshot).
    pub seq: Option<u64>,
    /// The snapshot it started from, if it did.
    pub snapshot_id: Option<String>,
    /// The node the fork starts at.
    pub node_id: String,
    /// The workflow version the fork runs.
    pub workflow_version: Option<u32>,
}

impl Runtime {
    /// The points of `run_id`'s history a fork can start from, oldest
    /// first. The ledger is read a page at a time.
    pub fn fork_points(&self, run_id: &str) -> Result<Vec<ForkPoint>> {
        let source = self.get_state(run_id)?;
        self.refuse_unforkable(&source)?;
        let (rebuild, _, faithful) = self.rebuild(&source, None)?;
        Ok(rebuild
            .points
            .into_iter()
            .map(|p| ForkPoint {
                reproducible: p.reproducible && faithful,
                ..p
            })
            .collect())
    }

    /// Starts a new run (its own id) from a past point of `run_id`: the
    /// node that ran there runs again, with the vars as they were just
    /// before it and `options.vars` over them, on the source's workflow
    /// version (a snapshot's: the snapshot's) or `options.workflow_version`.
    /// The fork's first ledger record and its `vars._meta.forked_from` say
    /// where it came from: `{"run", "seq", "snapshot_id", "node",
    /// "workflow_version"}`. The fork is a root run of no session; it
    /// keeps the source's actor, its operator policy (`_runtime` keys such
    /// as `allowed_tools`) and its `_limits` settings (not their counters).
    /// Secrets, which the ledger does not keep, come from the source's
    /// vars as they are now, or from the patch. The fork is created, not
    /// stepped: tick it (or let the driver).
    ///
    /// Refused with `not_forkable` when the point is not the start of a
    /// node's execution (the error names the nearest points that are),
    /// when the ledger does not reproduce the run's vars, or for runs an
    /// automation owns; a node the chosen version lacks is
    /// `upgrade_incompatible`; a secret neither the source nor the patch
    /// holds is `invalid_input`.
    pub fn fork(&self, run_id: &str, options: ForkOptions) -> Result<Forked> {
        let source = self.get_state(run_id)?;
        self.refuse_unforkable(&source)?;
        if let Some(key) = options.vars.keys().find(|k| is_host_owned(k)) {
            return Err(Error::invalid(
                format!("vars.{key}"),
                "is owned by the host: a fork's patch sets the run's own vars only",
            ));
        }
        let (point, version) = match &options.from {
            ForkFrom::Snapshot(s) => (from_snapshot(&source, s)?, s.run_state.workflow_version),
            from => (self.vars_at(&source, from)?, source.workflow_version),
        };
        let Point {
            mut vars,
            node_id,
            seq,
            snapshot_id,
        } = point;
        let version = options.workflow_version.or(version);
        let wf = match version {
            Some(v) => self.workflow_version(&source.workflow_id, v)?,
            None => self.workflow(&source.workflow_id)?,
        };
        if !wf.nodes.contains_key(&node_id) {
            return Err(Error::UpgradeIncompatible {
                run_id: run_id.to_string(),
                to: version.unwrap_or(0),
                missing: vec![node_id],
            });
        }
        // The ledger keeps no secret: the fork takes them from the
        // source's vars as they are now, or from the patch.
        for (k, v) in vars.iter_mut() {
            if let Some(now) = source.vars.get(k) {
                unredact(k, v, now);
            }
        }
        for (k, v) in options.vars {
            if v.is_null() {
                vars.remove(&k);
            } else {
                vars.insert(k, v);
            }
        }
        if let Some(path) = redacted_path(&vars) {
            return Err(Error::invalid(
                format!("vars.{path}"),
                "a secret the ledger does not keep, and the run's vars no longer hold: give it in the fork's vars",
            ));
        }
        if let Some(limits) = limit_settings(&source) {
            vars.insert("_limits".into(), limits);
        }
        let start = StartOptions {
            vars,
            actor_id: source.actor_id.clone(),
            runtime: operator_runtime(&source),
            workflow_version: version,
            ..StartOptions::default()
        };
        let mut run = self.new_run(&source.workflow_id, start)?;
        run.current_node = Some(node_id.clone());
        let forked_from = json!({
            "run": run_id,
            "seq": seq,
            "snapshot_id": snapshot_id,
            "node": node_id,
            "workflow_version": run.workflow_version,
        });
        meta_vars(&mut run).insert("forked_from".into(), forked_from.clone());
        let now = format_time(self.now());
        let record = StepRecord {
            result: Some(json!({ "forked_from": forked_from })),
            ended_at: Some(now.clone()),
            ..self.record(&run, Some(node_id.clone()), &now)
        };
        let mut txn = self.hold_new(&run.run_id)?;
        txn.commit(vec![record], &mut run)?;
        Ok(Forked {
            run_id: run.run_id,
            source_run_id: run_id.to_string(),
            seq,
            snapshot_id,
            node_id,
            workflow_version: run.workflow_version,
        })
    }

    /// Refuses forking a run of a workflow a plugin reserved (an
    /// automation controller's: its runs are the plugin's to create), and
    /// a run an automation owns (an occurrence, a discussion's turn: a
    /// copy would speak in its session with its granted policy).
    fn refuse_unforkable(&self, source: &RunState) -> Result<()> {
        if self.plugins_reserved(&source.workflow_id).is_some() {
            return Err(not_forkable(
                &source.run_id,
                format!(
                    "its workflow {} belongs to a plugin, which alone starts its runs",
                    source.workflow_id
                ),
            ));
        }
        let meta = source.vars.get("_meta");
        for (key, what) in [
            ("occurrence", "an automation's occurrence"),
            ("discussion", "a turn of an automation's discussion"),
        ] {
            if meta.and_then(|m| m.get(key)).is_some_and(|v| !v.is_null()) {
                return Err(not_forkable(
                    &source.run_id,
                    format!(
                        "it is {what}: the automation starts its runs (run it now, or revise it)"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The rebuild of `source`'s whole ledger (stopping at the point
    /// `wanted` asks for, if any, to keep that point's vars), and whether
    /// it reproduces the run's vars. The state is read again after the
    /// ledger: a run that moved meanwhile is read again (a few times).
    fn rebuild(
        &self,
        source: &RunState,
        wanted: Option<&ForkFrom>,
    ) -> Result<(Rebuild, Option<Found>, bool)> {
        let mut state = source.clone();
        for _ in 0..5 {
            let mut template = state.clone();
            template.vars = Map::new();
            let after = |r: &StepRecord, vars: &mut Map<String, Value>| {
                self.after_completed(&template, r, vars)
            };
            let mut rebuild = Rebuild::default();
            let mut found = None;
            for page in self.ledger_pages(&state.run_id, 0) {
                for (seq, r) in page? {
                    let stop = match wanted {
                        Some(ForkFrom::Seq(w)) => seq == *w,
                        Some(_) => rebuild.points.is_empty(),
                        None => false,
                    };
                    let at = rebuild.record(seq, &r, stop, &after);
                    if found.is_none() {
                        found = at;
                    }
                }
            }
            let again = self.get_state(&state.run_id)?;
            if again.version == state.version {
                let faithful = rebuild.reproduces(&state);
                return Ok((rebuild, found, faithful));
            }
            state = again;
        }
        Err(not_forkable(
            &source.run_id,
            "it kept moving while its ledger was read (five times): fork it when it waits or ends"
                .into(),
        ))
    }

    /// What a completed effect's handler wrote beyond its result key
    /// ([`crate::effects::EffectHandler::after_completed`], derived from
    /// the recorded payload and result), written again into `vars`.
    fn after_completed(&self, template: &RunState, r: &StepRecord, vars: &mut Map<String, Value>) {
        let Some(effect) = &r.effect else {
            return;
        };
        let (Some(handler), Some(payload)) = (
            self.inner.effects.get(&effect.kind),
            effect.payload.as_object(),
        ) else {
            return;
        };
        let mut run = template.clone();
        run.current_node = r.node_id.clone();
        run.vars = std::mem::take(vars);
        handler.after_completed(&mut run, payload, r.result.as_ref().unwrap_or(&Value::Null));
        *vars = run.vars;
    }

    /// The user vars and node at `from` of `source`'s history, and the
    /// point's seq, rebuilt from the ledger (read a page at a time).
    fn vars_at(&self, source: &RunState, from: &ForkFrom) -> Result<Point> {
        let run_id = source.run_id.as_str();
        let (rebuild, found, faithful) = self.rebuild(source, Some(from))?;
        if !faithful {
            return Err(not_forkable(
                run_id,
                "its ledger does not reproduce its vars (written by a stepwell older than forks, or changed by something no record explains)".into(),
            ));
        }
        let wanted = match from {
            ForkFrom::Seq(seq) => Some(*seq),
            _ => None,
        };
        let Some((vars, point)) = found else {
            return Err(not_forkable(run_id, rebuild.refusal(wanted)));
        };
        let Some(vars) = vars else {
            return Err(not_forkable(
                run_id,
                format!(
                    "the ledger does not hold its vars at record {} (after a change no record explains)",
                    point.seq
                ),
            ));
        };
        Ok(Point {
            vars,
            node_id: point.node_id,
            seq: Some(point.seq),
            snapshot_id: None,
        })
    }
}

/// Where a fork starts: the vars there, the node, and the record or
/// snapshot that is the point.
struct Point {
    vars: Map<String, Value>,
    node_id: String,
    seq: Option<u64>,
    snapshot_id: Option<String>,
}

/// The vars and node of a snapshot of `source`, for a fork.
fn from_snapshot(source: &RunState, snapshot: &Snapshot) -> Result<Point> {
    let state = &snapshot.run_state;
    if snapshot.run_id != source.run_id || state.run_id != source.run_id {
        return Err(Error::invalid(
            "snapshot",
            format!(
                "snapshot {} is of run {}, not of run {}",
                snapshot.snapshot_id, snapshot.run_id, source.run_id
            ),
        ));
    }
    let Some(node) = state.current_node.clone() else {
        return Err(not_forkable(
            &source.run_id,
            format!(
                "snapshot {} was taken when the run had ended (no node to run again)",
                snapshot.snapshot_id
            ),
        ));
    };
    Ok(Point {
        vars: user_vars(&state.vars),
        node_id: node,
        seq: None,
        snapshot_id: Some(snapshot.snapshot_id.clone()),
    })
}

/// The operator's policy keys of the source's `_runtime` (its tools and
/// model), which a fork keeps.
fn operator_runtime(source: &RunState) -> Map<String, Value> {
    let Some(Value::Object(rt)) = source.vars.get("_runtime") else {
        return Map::new();
    };
    super::config::OPERATOR_RUNTIME_KEYS
        .iter()
        .filter_map(|k| rt.get(*k).map(|v| (k.to_string(), v.clone())))
        .collect()
}

fn not_forkable(run_id: &str, reason: String) -> Error {
    Error::NotForkable {
        run_id: run_id.to_string(),
        reason,
    }
}

/// The run's user vars rebuilt record by record.
#[derive(Default)]
struct Rebuild {
    /// The vars so far (`None`: not known, before the first step's input
    /// or after a change no record explains).
    vars: Option<Map<String, Value>>,
    /// An effect under way: the vars before its step's patch (taken back
    /// if the effect fails).
    pending: Option<Option<Map<String, Value>>>,
    /// Whether the run waits (a failure recorded while it does is the
    /// wait's, not a step's).
    waiting: bool,
    /// The points seen so far.
    points: Vec<ForkPoint>,
    /// The seq of the last record taken in.
    last_seq: u64,
}

/// What a record is, for the rebuild.
enum Kind<'r> {
    /// A node's execution began here (a fork point).
    Step,
    /// An effect's `started` record (also a fork point).
    EffectStarted,
    /// An effect's outcome.
    EffectOutcome,
    /// The end of a wait: the wait's result key and the value written
    /// there.
    WaitEnded(Option<&'r str>, &'r Value),
    /// Anything else: nothing the vars need.
    Other,
}

/// A point asked for: the vars just before it (if the ledger has them),
/// and the point.
type Found = (Option<Map<String, Value>>, ForkPoint);

/// What a handler writes after its effect completed, written again
/// ([`Runtime::after_completed`]).
type After<'a> = dyn Fn(&StepRecord, &mut Map<String, Value>) + 'a;

impl Rebuild {
    /// Takes in record `seq`. With `stop`, and if the record is a fork
    /// point, returns the vars just before it and the point.
    fn record(&mut self, seq: u64, r: &StepRecord, stop: bool, after: &After<'_>) -> Option<Found> {
        self.last_seq = seq;
        if let Some(input) = r.input.as_ref().and_then(Value::as_object) {
            self.vars = Some(user_vars(input));
        } else if r
            .result
            .as_ref()
            .is_some_and(|v| v.get("restored").is_some())
        {
            // A restore an older stepwell recorded: its vars are not here.
            self.vars = None;
        }
        let kind = match kind(r) {
            // A wait that failed (its child failed, its deadline passed):
            // no node ran.
            Kind::Step if self.waiting && r.status == StepStatus::Failed => Kind::Other,
            k => k,
        };
        let mut found = None;
        if let (Kind::Step | Kind::EffectStarted, Some(node)) = (&kind, &r.node_id) {
            let point = ForkPoint {
                seq,
                node_id: node.clone(),
                started_at: r.started_at.clone(),
                reproducible: self.vars.is_some(),
            };
            if stop {
                found = Some((self.vars.clone(), point.clone()));
            }
            self.points.push(point);
            self.waiting = false;
        }
        let patch = r.vars.as_ref().and_then(Value::as_object);
        match kind {
            Kind::Step => self.patch(patch),
            Kind::EffectStarted => {
                self.pending = Some(self.vars.clone());
                self.patch(patch);
            }
            Kind::EffectOutcome => self.outcome(r, after),
            Kind::WaitEnded(key, value) => {
                self.waiting = false;
                self.assign(key, value.clone());
            }
            Kind::Other => {}
        }
        found
    }

    /// Applies a step's patch.
    fn patch(&mut self, patch: Option<&Map<String, Value>>) {
        let (Some(vars), Some(patch)) = (self.vars.as_mut(), patch) else {
            return;
        };
        for (k, v) in patch {
            if v.is_null() {
                vars.remove(k);
            } else {
                vars.insert(k.clone(), v.clone());
            }
        }
    }

    /// Takes in an effect's outcome, as the step did: a result written
    /// to its key (after what its handler writes), a wait begun, a
    /// failure kept as the result (`_absorb_failure`), or a failure that
    /// took the step's patch back.
    fn outcome(&mut self, r: &StepRecord, after: &After<'_>) {
        let result_key = r.effect.as_ref().and_then(|e| e.result_key.clone());
        let result = r.result.clone().unwrap_or(Value::Null);
        match r.status {
            StepStatus::Completed => {
                self.pending = None;
                if let Some(vars) = self.vars.as_mut() {
                    after(r, vars);
                }
                self.assign(result_key.as_deref(), result);
            }
            StepStatus::Waiting => {
                self.pending = None;
                self.waiting = true;
            }
            StepStatus::Failed if result.get("absorbed_failure").is_some() => {
                self.pending = None;
                self.assign(result_key.as_deref(), result);
            }
            StepStatus::Failed => {
                if let Some(before) = self.pending.take() {
                    self.vars = before;
                }
                // A retry waits for its time.
                self.waiting = result.get("retry").is_some();
            }
            _ => {}
        }
    }

    /// Writes `value` at the dotted `key` (the runtime's own rule).
    fn assign(&mut self, key: Option<&str>, value: Value) {
        if let (Some(vars), Some(key)) = (self.vars.as_mut(), key) {
            template::assign(vars, key, value);
        }
    }

    /// Whether the rebuilt vars are the run's (its ledger explains them).
    /// An effect under way (its `started` record appended ahead, no
    /// outcome yet) left the saved state as it was before its step.
    fn reproduces(&self, run: &RunState) -> bool {
        let expected = match &self.pending {
            Some(before) if run.status != RunStatus::Waiting => before,
            _ => &self.vars,
        };
        match expected {
            // The ledger keeps no secret: they compare redacted.
            Some(vars) => {
                let rebuilt = redact_all(&Value::Object(user_vars(vars)));
                rebuilt == redact_all(&Value::Object(user_vars(&run.vars)))
            }
            // Nothing known: only a run that never took a step.
            None => self.points.is_empty(),
        }
    }

    /// Why `wanted` is no fork point, naming the nearest that are.
    fn refusal(&self, wanted: Option<u64>) -> String {
        let Some(wanted) = wanted else {
            return "it has taken no step yet: there is nothing to fork from".into();
        };
        if wanted == 0 || self.last_seq < wanted {
            return format!(
                "its ledger has records 1 to {}: there is no record {wanted}",
                self.last_seq
            );
        }
        let before = self.points.iter().rev().find(|p| p.seq < wanted);
        let after = self.points.iter().find(|p| p.seq > wanted);
        let near: Vec<String> = [before, after]
            .into_iter()
            .flatten()
            .map(|p| format!("{} (node {})", p.seq, p.node_id))
            .collect();
        let near = if near.is_empty() {
            "it has none".to_string()
        } else {
            format!("the nearest are {}", near.join(" and "))
        };
        format!("record {wanted} is not the start of a node's execution ({near})")
    }
}

/// What record `r` is, for the rebuild.
fn kind(r: &StepRecord) -> Kind<'_> {
    let result = r.result.as_ref();
    if r.effect.is_some() {
        if r.idempotency_key
            .as_deref()
            .is_some_and(|k| k.ends_with(":resumed"))
        {
            // A resume hook's own work: what it wrote is in the resume.
            return Kind::Other;
        }
        return match r.status {
            StepStatus::Started => Kind::EffectStarted,
            _ => Kind::EffectOutcome,
        };
    }
    if let Some(ended) = result.and_then(|v| v.get("resumed").or_else(|| v.get("due"))) {
        let written = ended.get("result").or_else(|| ended.get("payload"));
        let key = ended.get("result_key").and_then(Value::as_str);
        return match written {
            Some(value) => Kind::WaitEnded(key, value),
            None => Kind::Other,
        };
    }
    if r.node_id.is_none() {
        return Kind::Other;
    }
    let routing_only = match result {
        None | Some(Value::Null) => true,
        Some(Value::Object(m)) => m
            .keys()
            .all(|k| matches!(k.as_str(), "next_node" | "complete_output")),
        Some(_) => false,
    };
    match r.status {
        StepStatus::Completed | StepStatus::Failed if routing_only => Kind::Step,
        _ => Kind::Other,
    }
}

/// The source's `_limits` settings (`max_*`, `warn_*`) without their
/// counters, which a fork starts again.
fn limit_settings(source: &RunState) -> Option<Value> {
    let limits = source.vars.get("_limits")?.as_object()?;
    let kept: Map<String, Value> = limits
        .iter()
        .filter(|(k, _)| k.starts_with("max_") || k.starts_with("warn_"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Some(Value::Object(kept))
}

/// The dotted path of a secret still redacted in `vars`, if one is.
fn redacted_path(vars: &Map<String, Value>) -> Option<String> {
    vars.iter().find_map(|(k, v)| {
        if secret_key(k) && v.as_str() == Some(REDACTED) {
            return Some(k.clone());
        }
        match v {
            Value::Object(m) => redacted_path(m).map(|p| format!("{k}.{p}")),
            _ => None,
        }
    })
}

/// The run's `vars._meta` object (created when absent).
fn meta_vars(run: &mut RunState) -> &mut Map<String, Value> {
    if !run.vars.get("_meta").is_some_and(Value::is_object) {
        run.vars.insert("_meta".into(), Value::Object(Map::new()));
    }
    run.vars
        .get_mut("_meta")
        .and_then(Value::as_object_mut)
        .expect("made an object above")
}

/// Puts back, into `rebuilt` (the value of key `key` as the ledger kept
/// it), the secrets the ledger redacted, from `now` (the same key's value
/// in the source run's vars): at any depth, where both have the key.
fn unredact(key: &str, rebuilt: &mut Value, now: &Value) {
    if secret_key(key) && rebuilt.as_str() == Some(REDACTED) {
        *rebuilt = now.clone();
        return;
    }
    match (rebuilt, now) {
        (Value::Object(r), Value::Object(n)) => {
            for (k, v) in r.iter_mut() {
                if let Some(n) = n.get(k) {
                    unredact(k, v, n);
                }
            }
        }
        (Value::Array(r), Value::Array(n)) => {
            for (v, n) in r.iter_mut().zip(n) {
                unredact(key, v, n);
            }
        }
        _ => {}
    }
}
