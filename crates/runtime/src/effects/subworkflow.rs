//! `start_subworkflow`: child runs. Touches other runs.

use serde_json::{json, Map, Value};

use super::{opt_bool, opt_str, EffectClass, EffectCx, EffectHandler, Failure, Outcome};
use crate::core::config::StartOptions;
use crate::core::keys::{effect_idempotency_key, is_host_owned};
use crate::core::model::{RunState, RunStatus, WaitReason, WaitState};
use crate::core::{Error, Result};

/// The namespace of the default child run ids (uuid5 of
/// `"<effect idempotency key>:subworkflow"`, the key being
/// `<parent_run_id>:<effect_seq>` until a snapshot is restored): a step
/// replayed after a crash asks for the same child and re-attaches to it.
pub const SUBWORKFLOW_NAMESPACE: uuid::Uuid = uuid::uuid!("6b1f7c0e-2d4a-5c3b-9e8f-1a2b3c4d5e6f");

/// The id of the child a parent starts without naming it, from the
/// effect's idempotency key (`<parent_run_id>:<effect_seq>`):
/// `uuid5(SUBWORKFLOW_NAMESPACE, "<effect key>:subworkflow")`.
pub fn default_child_id(effect_key: &str) -> String {
    uuid::Uuid::new_v5(
        &SUBWORKFLOW_NAMESPACE,
        format!("{effect_key}:subworkflow").as_bytes(),
    )
    .to_string()
}

/// The namespace of the ids of children their parent names (`run_id` in
/// the payload): see [`named_child_id`].
pub const NAMED_CHILD_NAMESPACE: uuid::Uuid = uuid::uuid!("14527913-f37c-49fb-88f2-25bcc0b05e07");

/// The id of the child that run `parent_run_id` names `name`:
/// `uuid5(NAMED_CHILD_NAMESPACE, "<parent_run_id>:<name>")`.
///
/// A flow or a guest names its child; the child lives under its parent.
/// The same name from the same parent is the same child (create-if-absent,
/// identity-checked, so a replayed step finds it), two parents never share
/// one, and no name can give an id the host derives for someone else (an
/// automation, its occurrences, a default child: other namespaces or
/// names), nor an id chosen at a root start (`--run-id`), which is never a
/// UUID of this namespace. Run ids hold no `:`, so the name of the UUID
/// says which parent and which name it was.
pub fn named_child_id(parent_run_id: &str, name: &str) -> String {
    uuid::Uuid::new_v5(
        &NAMED_CHILD_NAMESPACE,
        format!("{parent_run_id}:{name}").as_bytes(),
    )
    .to_string()
}

/// The wait key of a parent waiting on child `child_run_id`.
pub fn wait_key(child_run_id: &str) -> String {
    format!("subworkflow:{child_run_id}")
}

/// What a parent does when its child fails. A cancelled child always
/// comes back as data (`"cancelled": true`), as in the reference runtime:
/// whoever cancelled it meant the child, not its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnChildFailure {
    /// Continue with the child's outcome as data ([`child_result`]).
    Data,
    /// Fail too, with `subworkflow_failed`.
    Fail,
}

impl OnChildFailure {
    /// `data` or `fail`.
    pub fn as_str(self) -> &'static str {
        match self {
            OnChildFailure::Data => "data",
            OnChildFailure::Fail => "fail",
        }
    }

    /// The policy a waiting parent recorded in its wait's details (`data`
    /// when absent).
    pub fn of_wait(wait: &WaitState) -> Self {
        match wait
            .details
            .as_ref()
            .and_then(|d| d.get("on_child_failure"))
            .and_then(Value::as_str)
        {
            Some("fail") => OnChildFailure::Fail,
            _ => OnChildFailure::Data,
        }
    }
}

/// What a parent receives when its child ended: `{"sub_run_id", "status",
/// "output"}`, and for a child that failed or was cancelled also `"error"`
/// and `"cancelled"`, its output being an object with `"success": false`
/// (and `"cancelled": true`, `"error"`) added to the child's own output
/// (a non-object output is kept under `"result"`), as the reference runtime
/// hands it.
pub fn child_result(child: &RunState) -> Value {
    if child.status == RunStatus::Completed {
        return json!({
            "sub_run_id": child.run_id,
            "status": "completed",
            "output": child.output,
        });
    }
    let cancelled = child.status == RunStatus::Cancelled;
    let mut output = match &child.output {
        Some(Value::Object(m)) => m.clone(),
        None | Some(Value::Null) => Map::new(),
        Some(other) => {
            let mut m = Map::new();
            m.insert("result".into(), other.clone());
            m
        }
    };
    output.entry("success").or_insert(Value::Bool(false));
    if cancelled {
        output.entry("cancelled").or_insert(Value::Bool(true));
    }
    if let Some(e) = child
        .error
        .as_deref()
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        output
            .entry("error")
            .or_insert_with(|| Value::String(e.to_string()));
    }
    json!({
        "sub_run_id": child.run_id,
        "status": child.status.as_str(),
        "output": output,
        "error": child.error,
        "cancelled": cancelled,
    })
}

/// What a parent gets for a child the host set aside (quarantined: its
/// stored state could not be read or committed): with `fail`, it fails
/// with `subworkflow_failed`; with `data`, it continues with
/// `{"sub_run_id", "status": "quarantined", "error", "cancelled": false,
/// "output": {"success": false, "error"}}`.
pub fn quarantined_child(child_id: &str, reason: &str, policy: OnChildFailure) -> Outcome {
    let error = format!("quarantined: {reason}");
    match policy {
        OnChildFailure::Fail => Outcome::Failed(Failure::permanent(
            "subworkflow_failed",
            format!("child run {child_id} was set aside: {error}"),
        )),
        OnChildFailure::Data => Outcome::Completed(json!({
            "sub_run_id": child_id,
            "status": "quarantined",
            "output": {"success": false, "error": error},
            "error": error,
            "cancelled": false,
        })),
    }
}

/// Why a parent with `on_child_failure: "fail"` fails when its child failed.
pub fn child_failure(child: &RunState) -> Failure {
    Failure::permanent(
        "subworkflow_failed",
        format!(
            "child run {} ({}) ended {}: {}",
            child.run_id,
            child.workflow_id,
            child.status.as_str(),
            child.error.as_deref().unwrap_or("no error recorded")
        ),
    )
}

/// What the parent gets for a child that has ended.
pub fn ended_child(child: &RunState, policy: OnChildFailure) -> Outcome {
    if child.status == RunStatus::Failed && policy == OnChildFailure::Fail {
        Outcome::Failed(child_failure(child))
    } else {
        Outcome::Completed(child_result(child))
    }
}

/// `start_subworkflow {workflow_id, vars?, run_id?, session_id?, async?,
/// wait?, on_child_failure?}`.
///
/// - sync (default): the child runs inside this step; its outcome comes
///   back as [`child_result`]. If the child parks, the parent waits (reason
///   `subworkflow`, key `subworkflow:<child id>`) until the driver resumes
///   it when the child ends.
/// - `async: true, wait: true`: the child is created and left for the driver;
///   the parent waits on it (and continues at once if the child already
///   ended, as on a replay).
/// - `async: true`: fire and forget; the result is `{"sub_run_id", "async":
///   true}`.
///
/// `on_child_failure` says what a child that failed does to the parent:
/// `data` (the default of async children) continues with its outcome as
/// data; `fail` (the default of sync children) fails the parent with
/// `subworkflow_failed`. A cancelled child always comes back as data.
///
/// `run_id` names the child: its id is [`named_child_id`] of the parent's id
/// and that name (create-if-absent, identity-checked), so a guest cannot
/// take an id it does not own; by default the id is derived from the
/// parent's id and the effect's sequence number. `vars` may not set host-owned vars (`_runtime`, `_meta`,
/// `_limits`); the runtime's plugins give the child what it inherits
/// ([`crate::core::plugin::Plugin::prepare_child`]).
pub struct StartSubworkflow;

impl EffectHandler for StartSubworkflow {
    fn kind(&self) -> &str {
        "start_subworkflow"
    }

    fn class(&self) -> EffectClass {
        EffectClass::TouchesRuns
    }

    fn starts_runs(&self) -> bool {
        true
    }

    fn execute(
        &self,
        cx: &EffectCx<'_>,
        p: &Map<String, Value>,
        _: Option<&Value>,
    ) -> Result<Outcome> {
        let k = "start_subworkflow";
        macro_rules! field {
            ($e:expr) => {
                match $e {
                    Ok(v) => v,
                    Err(o) => return Ok(o),
                }
            };
        }
        let Some(workflow_id) = field!(opt_str(k, p, "workflow_id")).map(str::to_string) else {
            return Ok(Outcome::invalid(k, "workflow_id", "is required"));
        };
        let vars = match p.get("vars") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(_) => return Ok(Outcome::invalid(k, "vars", "must be a JSON object")),
        };
        if let Some(key) = vars.keys().find(|k| is_host_owned(k)) {
            return Ok(Outcome::invalid(
                k,
                &format!("vars.{key}"),
                "is owned by the host and cannot be set by a flow",
            ));
        }
        let mut vars = vars;
        let is_async = field!(opt_bool(k, p, "async"));
        let wait = field!(opt_bool(k, p, "wait"));
        let policy = match field!(opt_str(k, p, "on_child_failure")) {
            Some("data") => OnChildFailure::Data,
            Some("fail") => OnChildFailure::Fail,
            Some(_) => {
                return Ok(Outcome::invalid(
                    k,
                    "on_child_failure",
                    "must be \"data\" or \"fail\"",
                ))
            }
            None if is_async => OnChildFailure::Data,
            None => OnChildFailure::Fail,
        };
        // Async children count too: a child (async or not) is one run
        // further down the chain its parent is in, and one generation
        // below it, however long the parent waited in between.
        if let Some(limit) = cx.check_depth(k) {
            return Ok(limit);
        }
        let lineage = crate::core::keys::lineage(cx.run);
        if lineage + 1 > cx.max_depth {
            return Ok(Outcome::Failed(Failure::permanent(
                "limit_exceeded",
                format!(
                    "start_subworkflow would start a run with {} runs above it (the limit is {}; RuntimeConfig::max_nesting)",
                    lineage + 1,
                    cx.max_depth
                ),
            )));
        }
        let run_id = match field!(opt_str(k, p, "run_id")) {
            // The name is checked as an id would be (the same error as
            // before names were confined).
            Some(name) if !crate::core::runtime::valid_run_id(name) => {
                return Ok(Outcome::Failed(Failure::from_error(&Error::invalid(
                    "run_id",
                    format!("{name:?} is not a valid run id ([A-Za-z0-9_-]+, at most 200)"),
                ))))
            }
            Some(name) => named_child_id(&cx.run.run_id, name),
            None => default_child_id(&effect_idempotency_key(cx.run, cx.seq)),
        };
        let named_session = field!(opt_str(k, p, "session_id"));
        // What the child inherits of its parent, and whether it may join
        // the session it names, are the plugins' (the automations' keep
        // their attribution across every hop, and their sessions closed).
        let mut child = crate::core::plugin::ChildStart {
            parent: cx.run,
            vars: &mut vars,
            session_id: named_session,
        };
        if let Err((field, message)) = cx.runs.prepare_child(&mut child) {
            return Ok(Outcome::invalid(k, &field, &message));
        }
        let session_id = named_session
            .map(str::to_string)
            .or_else(|| cx.run.session_id.clone());
        // A sync child runs inside this step, unless the step has set off
        // as many runs as it may: then the parent waits for it, and the
        // driver runs it (at the depth it would have had here).
        let inline = !is_async && cx.take_inline();
        let mut runtime = Map::new();
        runtime.insert(crate::core::keys::LINEAGE.into(), json!(lineage + 1));
        if !inline {
            runtime.insert(crate::core::keys::CASCADE_DEPTH.into(), json!(cx.depth + 1));
        }
        // What a child inherits of its parent's tool policy: its workspace
        // scope (which the child may narrow, never widen; frozen at its
        // start), its run-level read-only flags and mounts, and its
        // approval policy. Its tool ceiling is read through the ancestry.
        if let Some(parent) = cx.run.vars.get("_runtime").and_then(Value::as_object) {
            for key in [
                "workspace",
                "workspace_read_only",
                "workspace_read_only_paths",
                "workspace_writable_paths",
                "tool_policy",
                "untrusted_input",
                "tool_executor",
                "tool_timeout_s",
            ] {
                if let Some(v) = parent.get(key) {
                    runtime.insert(key.into(), v.clone());
                }
            }
        }
        // A parent without a workspace hands down an empty scope: its child
        // may not give itself one.
        runtime.entry("workspace").or_insert_with(|| json!({}));
        let options = StartOptions {
            vars,
            run_id: Some(run_id),
            actor_id: cx.run.actor_id.clone(),
            session_id,
            parent_run_id: Some(cx.run.run_id.clone()),
            runtime,
            workflow_version: None,
            // A child in its parent's bundle runs its parent's version.
            same_bundle_as: cx
                .run
                .workflow_version
                .map(|v| (cx.run.workflow_id.clone(), v)),
            // The child's spans join the trace of this step's.
            trace_parent: None,
        };
        let child_id = match cx.runs.start_run(&workflow_id, options) {
            Ok(id) => id,
            Err(
                e @ (Error::IdentityConflict { .. }
                | Error::UnknownWorkflow { .. }
                | Error::InvalidInput { .. }),
            ) => return Ok(Outcome::Failed(Failure::from_error(&e))),
            Err(e) => return Err(e),
        };
        if is_async && !wait {
            return Ok(Outcome::Completed(
                json!({ "sub_run_id": child_id, "async": true }),
            ));
        }
        let child = if !inline {
            cx.runs.get_run(&child_id)?
        } else {
            cx.runs.tick_nested(&child_id, cx.depth + 1)?
        };
        if child.status.is_terminal() {
            return Ok(ended_child(&child, policy));
        }
        Ok(Outcome::Waiting(Box::new(child_wait(
            &child_id,
            &workflow_id,
            is_async,
            policy,
        ))))
    }
}

/// The wait of a parent on child `child_id` (of `workflow_id`): reason
/// `subworkflow`, key [`wait_key`], with what the driver needs to resume
/// it when the child ends (`on_child_failure`).
pub fn child_wait(
    child_id: &str,
    workflow_id: &str,
    is_async: bool,
    policy: OnChildFailure,
) -> WaitState {
    WaitState {
        reason: WaitReason::Subworkflow,
        wait_key: wait_key(child_id),
        until: None,
        resume_to_node: None,
        result_key: None,
        prompt: None,
        choices: None,
        details: Some(json!({
            "sub_run_id": child_id,
            "sub_workflow_id": workflow_id,
            "async": is_async,
            "on_child_failure": policy.as_str(),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_child_lives_under_its_parent() {
        let id = named_child_id("p1", "child-1");
        assert_eq!(id, named_child_id("p1", "child-1"), "the same child");
        assert_ne!(id, named_child_id("p2", "child-1"), "another parent's");
        // A name never gives the id it spells, nor a default child's id.
        let other = default_child_id("victim:1");
        assert_ne!(named_child_id("p1", &other), other);
        assert_ne!(named_child_id("victim", "1"), other);
        // The one-colon name is unambiguous: run ids hold no `:`.
        assert_ne!(named_child_id("a-b", "c"), named_child_id("a", "b-c"));
    }
}
