//! `tool_calls`: runs a batch of tool calls (usually a model's, from
//! `llm_call`'s `tool_calls`) as WebAssembly tool components, each in a
//! fresh sandbox that reaches only what the run's workspace scope grants.
//!
//! The pipeline (llm-tools spec 3.3): the batch is normalised, checked
//! against the ceiling of allowed tools (the payload's, the run's and every
//! ancestor's), each call's arguments are canonicalised and rewritten by
//! the workspace scope; calls that fail a check get their own `success:
//! false` result and the rest go on. Then, by the run's executor mode, the
//! host runs them now, waits for a person's approval (`write`-class and
//! unknown tools, by default), or hands them to the caller (passthrough) or
//! a worker (delegated). Results keep the input positions.
//!
//! An external effect: its outcome is recorded ahead of the step's commit
//! and reused on replay, so a crash never runs a batch twice once its
//! results are recorded; an approved batch is recorded the same way inside
//! the resume.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::calls::{
    call_json, canonical_arguments, effect_digest, failed, from_output, merge, normalize,
    resolve_ceiling, ApprovalPolicy, Call,
};
use crate::scope::WorkspaceScope;
use crate::{evidence, ToolCatalog, ToolClass, ToolTable};
use stepwell_runtime::core::model::{WaitReason, WaitState};
use stepwell_runtime::core::trace::{SpanContext, Tracer};
use stepwell_runtime::core::{Error, Result};
use stepwell_runtime::effects::{EffectClass, EffectCx, EffectHandler, Failure, Outcome};
use stepwell_runtime::wasm::{GuestError, ToolFault};

/// The default time one tool call may take (`_runtime.tool_timeout_s`
/// overrides it per run).
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(60);

/// How many read-only calls in a row run at once.
const PARALLEL_READS: usize = 8;

/// The `tool_calls` handler over a tool catalog.
#[derive(Debug, Clone)]
pub struct ToolCalls {
    catalog: Arc<ToolCatalog>,
}

/// A call ready to run: the call, its tool's class, and its rewritten
/// arguments.
struct Planned {
    call: Call,
    class: ToolClass,
}

/// How the run's calls are executed (`_runtime.tool_executor`).
enum Executor {
    /// The host runs them (after approval where the policy asks).
    Host,
    /// The caller runs them and resumes with the results.
    Passthrough,
    /// A worker runs them: wait reason `job`, with the executor's details.
    Delegated(Map<String, Value>),
}

fn executor(runtime: Option<&Value>) -> Executor {
    match runtime.and_then(|r| r.get("tool_executor")) {
        Some(Value::String(s)) if s == "passthrough" => Executor::Passthrough,
        Some(Value::Object(m)) if m.get("mode").and_then(Value::as_str) == Some("passthrough") => {
            Executor::Passthrough
        }
        Some(Value::Object(m)) if m.get("mode").and_then(Value::as_str) == Some("delegated") => {
            Executor::Delegated(m.clone())
        }
        _ => Executor::Host,
    }
}

/// A number of seconds as Python prints a float (`60.0`, `0.25`).
fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.1}")
    } else {
        format!("{s}")
    }
}

fn timeout_of(runtime: Option<&Value>) -> Duration {
    runtime
        .and_then(|r| r.get("tool_timeout_s"))
        .and_then(Value::as_f64)
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(|s| Duration::from_secs_f64(s.min(86_400.0)))
        .unwrap_or(DEFAULT_TOOL_TIMEOUT)
}

impl ToolCalls {
    /// A handler running the tools of `catalog`.
    pub fn new(catalog: Arc<ToolCatalog>) -> Self {
        ToolCalls { catalog }
    }

    /// The tool table (loaded on first use).
    pub fn table(&self) -> std::result::Result<Arc<ToolTable>, String> {
        self.catalog.table()
    }

    /// Runs one call of the batch, in its span.
    fn run_one(&self, b: &Batch<'_>, p: &Planned) -> Value {
        let mut span = b.tracer.enter("tool.call", b.parent);
        span.attr_with("stepwell.tool.name", || p.call.name.clone());
        span.attr_with("stepwell.tool.class", || p.class.as_str());
        span.attr_with("stepwell.tool.approval", || {
            if b.approved {
                "approved"
            } else {
                "not_required"
            }
        });
        span.attr_with("stepwell.tool.call_id", || p.call.call_id.clone());
        let result = self.run_one_untraced(b, p);
        if result["success"] == false {
            span.fail(result["error"].as_str().unwrap_or("the tool call failed"));
        }
        result
    }

    /// Runs one planned call: a component in its sandbox, or a host tool.
    fn run_one_untraced(&self, b: &Batch<'_>, p: &Planned) -> Value {
        let (table, scope, timeout) = (b.table, b.scope, b.timeout);
        let c = &p.call;
        let Some(entry) = table.get(&c.name) else {
            return failed(c, format!("Tool '{}' not found", c.name));
        };
        if entry.origin == crate::Origin::Host {
            let output = match c.name.as_str() {
                "open_attachment" => crate::attach::open(b.artifacts, b.run_id, &c.arguments),
                _ => crate::exec::run(
                    &c.arguments,
                    timeout,
                    self.catalog.exec_env(),
                    b.stop.as_ref(),
                ),
            };
            return from_output(c, output);
        }
        let Some(component) = entry.component() else {
            return failed(c, format!("Tool '{}' not found", c.name));
        };
        let reach = scope.map(|s| s.reach(p.class)).unwrap_or_default();
        let mut arguments = c.arguments.clone();
        if entry.origin == crate::Origin::Builtin {
            // The built-ins hide what the scope excludes inside the
            // directories they can see (listings and searches walk them).
            if let Some(s) = scope {
                let (exclude, include) = s.exclusions();
                arguments.insert("_exclude".into(), json!(exclude));
                arguments.insert("_include".into(), json!(include));
            }
            // With a ruff program, a Python file written or edited comes
            // back to be linted here (crate::ruff).
            if self.catalog.ruff().is_some() {
                arguments.insert("_ruff".into(), json!(true));
            }
        }
        match component.invoke(
            &c.call_id,
            &c.name,
            &Value::Object(arguments),
            &reach,
            timeout,
            b.stop.clone(),
        ) {
            Ok(Ok(output)) => match (self.catalog.ruff(), &entry.origin) {
                (Some(program), crate::Origin::Builtin) => from_output(
                    c,
                    crate::ruff::finish(output, program, self.catalog.exec_env()),
                ),
                _ => from_output(c, output),
            },
            Ok(Err(ToolFault::InvalidArguments(d))) => failed(
                c,
                format!("Invalid argument type for tool '{}': {d}", c.name),
            ),
            Ok(Err(ToolFault::Failed(m))) => failed(
                c,
                if m.trim().is_empty() {
                    "Tool execution failed".to_string()
                } else {
                    m
                },
            ),
            Err(GuestError::Timeout { .. }) => failed(
                c,
                format!("Tool execution timed out after {}s", seconds(timeout)),
            ),
            Err(e) => failed(c, format!("Tool execution failed: {e}")),
        }
    }

    /// Runs planned calls in order: consecutive read-class calls at most 8
    /// at a time, every other call alone. Results in input order.
    ///
    /// Before each call (or group of reads) the run is read again: once it
    /// is cancelled, no further call starts (each gets `Tool call not
    /// started: the run was cancelled`, `cancelled: true`).
    fn run_all(
        &self,
        b: &Batch<'_>,
        planned: &[Planned],
        cancelled: &dyn Fn() -> bool,
    ) -> Vec<Value> {
        let mut out = Vec::with_capacity(planned.len());
        let mut i = 0;
        while i < planned.len() {
            // (The first call is not held back for a look at the store; a
            // batch in flight looks at its cancel, which costs nothing.)
            if (i > 0 || b.stop.is_some()) && cancelled() {
                for p in &planned[i..] {
                    let mut r = failed(&p.call, "Tool call not started: the run was cancelled");
                    r["cancelled"] = json!(true);
                    out.push(r);
                }
                break;
            }
            if planned[i].class != ToolClass::Read {
                out.push(self.run_one(b, &planned[i]));
                i += 1;
                continue;
            }
            let mut j = i;
            while j < planned.len() && planned[j].class == ToolClass::Read && j - i < PARALLEL_READS
            {
                j += 1;
            }
            if j - i == 1 {
                out.push(self.run_one(b, &planned[i]));
            } else {
                let group = &planned[i..j];
                let results: Vec<Value> = std::thread::scope(|s| {
                    let handles: Vec<_> = group
                        .iter()
                        .map(|p| s.spawn(move || self.run_one(b, p)))
                        .collect();
                    handles
                        .into_iter()
                        .zip(group)
                        .map(|(h, p)| {
                            h.join().unwrap_or_else(|_| {
                                failed(&p.call, "Tool execution failed: the host thread panicked")
                            })
                        })
                        .collect()
                });
                out.extend(results);
            }
            i = j;
        }
        out
    }

    /// Checks each call (spec 3.3 step 5): the ones that may run, and a
    /// result for every one that may not, by position.
    fn plan(
        &self,
        table: &ToolTable,
        scope: Option<&WorkspaceScope>,
        ceiling: Option<&std::collections::BTreeSet<String>>,
        calls: Vec<Call>,
    ) -> (Vec<Planned>, Map<String, Value>, Vec<Value>) {
        let mut planned = Vec::new();
        let mut blocked = Map::new();
        let mut evidence = Vec::new();
        for mut c in calls {
            let index = c.index.to_string();
            if !c.valid {
                blocked.insert(
                    index,
                    json!({"call_id": "", "runtime_call_id": null, "name": "", "success": false,
                           "output": null, "error": "Invalid tool call (expected an object)"}),
                );
                evidence.push(Value::Null);
                continue;
            }
            if let Some(ceiling) = ceiling {
                if c.name.is_empty() {
                    blocked.insert(index, failed(&c, "Tool call missing a valid name"));
                    evidence.push(json!({"name": c.name, "arguments": {}}));
                    continue;
                }
                if !ceiling.contains(&c.name) {
                    blocked.insert(
                        index,
                        failed(
                            &c,
                            format!("Tool '{}' is not allowed for this node or run", c.name),
                        ),
                    );
                    evidence.push(json!({"name": c.name, "arguments": {}}));
                    continue;
                }
            }
            let Some(spec) = table.get(&c.name).and_then(|e| e.spec.as_ref()) else {
                evidence.push(call_json(&c));
                let why = if c.name.is_empty() {
                    "Tool call missing a valid name".to_string()
                } else {
                    format!("Tool '{}' not found", c.name)
                };
                blocked.insert(index, failed(&c, why));
                continue;
            };
            let mut args = canonical_arguments(std::mem::take(&mut c.arguments), &spec.parameters);
            // Trust-boundary arguments never come from the model.
            args.remove("_sandbox");
            args.remove("_session_route");
            let class = spec.class;
            let rewritten = match scope {
                Some(s) => scoped_args(s, table, &c.name, class, args),
                None if matches!(class, ToolClass::Read | ToolClass::Write | ToolClass::Exec)
                    && c.name != "open_attachment" =>
                {
                    Err(format!(
                    "Tool '{}' needs a workspace: the run has no workspace_root, so it can reach no file",
                    c.name
                ))
                }
                None => Ok(args),
            };
            match rewritten {
                Ok(args) => {
                    c.arguments = args;
                    evidence.push(call_json(&c));
                    planned.push(Planned { call: c, class });
                }
                Err(e) => {
                    evidence.push(call_json(&c));
                    blocked.insert(index, failed(&c, e));
                }
            }
        }
        (planned, blocked, evidence)
    }

    /// The ceiling of `run` (and its ancestors) with an effect payload's
    /// own `allowed_tools`.
    fn ceiling(
        cx: &EffectCx<'_>,
        local: Option<&Map<String, Value>>,
    ) -> std::result::Result<Option<std::collections::BTreeSet<String>>, String> {
        resolve_ceiling(local, cx.run, &|id| {
            cx.runs.get_run(id).map_err(|e| e.to_string())
        })
    }
}

/// A call's arguments rewritten by the workspace scope, then refused when
/// a third-party tool names a path an `.abstractignore` file ignores (the
/// built-ins apply those files themselves, in their own words).
fn scoped_args(
    scope: &WorkspaceScope,
    table: &ToolTable,
    name: &str,
    class: ToolClass,
    args: Map<String, Value>,
) -> std::result::Result<Map<String, Value>, String> {
    let args = scope.rewrite(name, class, args)?;
    let third_party = table
        .get(name)
        .is_some_and(|e| matches!(e.origin, crate::Origin::File(_)));
    match third_party.then(|| scope.ignore_file_refusal(class, &args)) {
        Some(Some(refusal)) => Err(refusal),
        _ => Ok(args),
    }
}

/// The ceiling of a call (its payload's `allowed_tools` with the run's and
/// its ancestors') and the tool table, or the failure: `tool_scope` for a
/// ceiling that cannot be resolved, `tool_executor_missing` for tools that
/// cannot be loaded.
fn ceiling_and_table(
    catalog: &ToolCatalog,
    cx: &EffectCx<'_>,
    payload: &Map<String, Value>,
) -> std::result::Result<(Option<std::collections::BTreeSet<String>>, Arc<ToolTable>), Failure> {
    let ceiling =
        ToolCalls::ceiling(cx, Some(payload)).map_err(|e| Failure::permanent("tool_scope", e))?;
    let table = catalog.table().map_err(|e| {
        Failure::permanent(
            "tool_executor_missing",
            format!("the host's tools could not be loaded: {e}"),
        )
    })?;
    Ok((ceiling, table))
}

/// What a person is asked: every call with its arguments (paths already
/// resolved), each shown up to 2,000 characters (a command up to 64 KiB),
/// and said so when cut.
fn approval_prompt(planned: &[Planned]) -> String {
    let mut out = String::from("Approve these tool calls?");
    for p in planned {
        let args = Value::Object(p.call.arguments.clone()).to_string();
        // A command is shown whole (up to 64 KiB): what runs must be seen.
        let limit = if p.class == ToolClass::Exec {
            65_536
        } else {
            2000
        };
        let total = args.chars().count();
        let shown: String = args.chars().take(limit).collect();
        let more = if total > limit {
            format!(
                " [... {} more characters: read the whole call in the wait's details before approving]",
                total - limit
            )
        } else {
            String::new()
        };
        out.push_str(&format!("\n  {} {shown}{more}", p.call.name));
    }
    out
}

/// What the calls of one batch run with.
struct Batch<'a> {
    table: &'a ToolTable,
    scope: Option<&'a WorkspaceScope>,
    timeout: Duration,
    artifacts: Option<&'a dyn stepwell_runtime::store::ArtifactStore>,
    run_id: &'a str,
    /// Whether the run was cancelled (a batch in flight).
    stop: Option<stepwell_runtime::wasm::Stop>,
    /// Where the calls' spans go, and the span they hang from (the
    /// effect's, or the resume's that approved them).
    tracer: &'a Tracer,
    parent: Option<SpanContext>,
    /// Whether a person approved the batch.
    approved: bool,
}

impl<'a> Batch<'a> {
    /// Whether the run was cancelled: its cancel fired (a batch in
    /// flight), or the store says so.
    fn stopped(&self, cx: &EffectCx<'_>) -> bool {
        self.stop.as_ref().is_some_and(|stop| stop()) || cancelled(cx)
    }

    fn of(cx: &'a EffectCx<'a>, table: &'a ToolTable, scope: Option<&'a WorkspaceScope>) -> Self {
        Batch {
            table,
            scope,
            timeout: timeout_of(cx.run.vars.get("_runtime")),
            artifacts: cx.artifacts,
            run_id: &cx.run.run_id,
            stop: cx.cancel.map(|c| {
                let c = c.clone();
                std::sync::Arc::new(move || c.is_cancelled()) as stepwell_runtime::wasm::Stop
            }),
            tracer: cx.tracer,
            parent: stepwell_runtime::core::trace::current(),
            approved: false,
        }
    }
}

/// Whether the run of `cx` was cancelled meanwhile (by any process).
fn cancelled(cx: &EffectCx<'_>) -> bool {
    cx.runs
        .get_run(&cx.run.run_id)
        .is_ok_and(|r| r.status == stepwell_runtime::core::model::RunStatus::Cancelled)
}

/// Moves the large outputs of `results` into attachments of the run, when
/// the runtime has an artifact store ([`crate::attach`]).
fn offload(cx: &EffectCx<'_>, payload: Option<&Map<String, Value>>, results: &mut [Value]) {
    let Some(store) = cx.artifacts else {
        return;
    };
    let now = stepwell_runtime::core::clock::format_time(cx.now);
    let o = crate::attach::Offload::new(
        store,
        &cx.run.run_id,
        &now,
        payload,
        cx.run.vars.get("_runtime"),
    );
    for r in results {
        o.result(r);
    }
}

/// The class of tool `name` in `table`, if it has that tool.
fn class_in(table: &ToolTable, name: &str) -> Option<ToolClass> {
    table
        .get(name)
        .and_then(|e| e.spec.as_ref())
        .map(|s| s.class)
}

/// The scope of a run, or a `workspace_policy` failure.
fn scope_of(
    cx: &EffectCx<'_>,
    home: Option<&std::path::Path>,
) -> std::result::Result<Option<WorkspaceScope>, Failure> {
    WorkspaceScope::from_runtime(cx.run.vars.get("_runtime"), home)
        .map_err(|e| Failure::permanent("workspace_policy", e))
}

impl EffectHandler for ToolCalls {
    fn kind(&self) -> &str {
        "tool_calls"
    }

    fn class(&self) -> EffectClass {
        EffectClass::External
    }

    /// A batch runs on a thread of its own, off the driver's pass.
    fn flies(&self) -> bool {
        true
    }

    fn execute(
        &self,
        cx: &EffectCx<'_>,
        payload: &Map<String, Value>,
        _prepared: Option<&Value>,
    ) -> Result<Outcome> {
        let Some(raw) = payload.get("tool_calls").and_then(Value::as_array) else {
            return Ok(Outcome::Failed(Failure::permanent(
                "invalid_effect",
                "tool_calls requires payload.tool_calls (list)",
            )));
        };
        let (ceiling, table) = match ceiling_and_table(&self.catalog, cx, payload) {
            Ok(x) => x,
            Err(f) => return Ok(Outcome::Failed(f)),
        };
        let scope = match scope_of(cx, self.catalog.home()) {
            Ok(s) => s,
            Err(f) => return Ok(Outcome::Failed(f)),
        };
        let digest = effect_digest(cx.run, cx.seq, payload);
        let calls = normalize(raw, &digest);
        let count = calls.len();
        let (planned, blocked, evidence) =
            self.plan(&table, scope.as_ref(), ceiling.as_ref(), calls);
        if planned.is_empty() {
            let results = merge(count, &blocked, &[]);
            return Ok(Outcome::Completed(
                json!({"mode": "executed", "results": results}),
            ));
        }
        let runtime = cx.run.vars.get("_runtime");
        let policy = ApprovalPolicy::of(cx.run);
        let (mode, reason, executor_details) = match executor(runtime) {
            Executor::Passthrough => ("passthrough", WaitReason::Event, None),
            Executor::Delegated(d) => ("delegated", WaitReason::Job, Some(d)),
            Executor::Host => {
                // Commands always ask, whatever the policy says.
                let exec = planned.iter().any(|p| p.class == ToolClass::Exec);
                if !exec
                    && !policy
                        .needs_approval(planned.iter().map(|p| (p.call.name.as_str(), p.class)))
                {
                    let batch = Batch::of(cx, &table, scope.as_ref());
                    let results = self.run_all(&batch, &planned, &|| batch.stopped(cx));
                    let mut results = merge(count, &blocked, &results);
                    let calls: Vec<Value> = planned.iter().map(|p| call_json(&p.call)).collect();
                    let class_of = |n: &str| class_in(&table, n);
                    let ran = evidence::Ran {
                        class_of: &class_of,
                        calls: &calls,
                        approval: None,
                    };
                    evidence::record(cx, &mut results, &ran);
                    offload(cx, Some(payload), &mut results);
                    return Ok(Outcome::Completed(
                        json!({"mode": "executed", "results": results}),
                    ));
                }
                ("approval_required", WaitReason::User, None)
            }
        };
        let node = cx.run.current_node.as_deref().unwrap_or("-");
        let wait_key = payload
            .get("wait_key")
            .and_then(Value::as_str)
            .filter(|s| !s.trim().is_empty())
            .map(str::to_string)
            .or_else(|| {
                executor_details
                    .as_ref()
                    .and_then(|d| d.get("wait_key"))
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .unwrap_or_else(|| format!("tool_approval:{}:{node}:{digest}", cx.run.run_id));
        let reason = match executor_details
            .as_ref()
            .and_then(|d| d.get("wait_reason"))
            .and_then(Value::as_str)
        {
            Some("job") => WaitReason::Job,
            Some("event") => WaitReason::Event,
            Some("user") => WaitReason::User,
            _ => reason,
        };
        let mut details = json!({
            "mode": mode,
            "tool_calls": planned.iter().map(|p| call_json(&p.call)).collect::<Vec<_>>(),
            "original_call_count": count,
            "blocked_by_index": blocked,
            "tool_calls_for_evidence": evidence,
            "effect_idempotency_key": cx.key,
        });
        details["executor"] = match (mode, executor_details) {
            ("approval_required", _) => policy.details(),
            (_, Some(d)) => d.get("details").cloned().unwrap_or(Value::Object(d)),
            _ => json!({"kind": mode}),
        };
        let prompt = (mode == "approval_required").then(|| approval_prompt(&planned));
        Ok(Outcome::Waiting(Box::new(WaitState {
            reason,
            wait_key,
            until: None,
            resume_to_node: None,
            result_key: None,
            prompt,
            choices: None,
            details: Some(details),
        })))
    }

    /// The waits it parks a run on: an approval, or calls handed out
    /// (`passthrough`, `delegated`), recognised by their details.
    fn owns_wait(&self, wait: &WaitState) -> bool {
        let Some(d) = wait.details.as_ref() else {
            return false;
        };
        let mode = d.get("mode").and_then(Value::as_str);
        matches!(
            mode,
            Some("approval_required" | "passthrough" | "delegated")
        ) && d.get("tool_calls").is_some_and(Value::is_array)
    }

    fn check_resume(&self, wait: &WaitState, payload: &Value) -> Result<()> {
        let details = wait.details.as_ref().unwrap_or(&Value::Null);
        let is_results = payload.get("mode").is_some() && payload.get("results").is_some();
        if details["mode"] == "approval_required" && !is_results {
            match payload.get("approved") {
                Some(Value::Bool(_)) => {}
                _ => {
                    return Err(Error::invalid(
                        "payload.approved",
                        "a tool approval is resumed with {\"approved\": true} or {\"approved\": false, \"reason\": \"...\"}",
                    ))
                }
            }
        } else if !payload["results"].is_array() {
            return Err(Error::invalid(
                "payload.results",
                "tool calls handed out are resumed with {\"mode\": \"executed\", \"results\": [...]}",
            ));
        }
        Ok(())
    }

    /// An approval runs the batch: in flight when calls fly. A denial, or
    /// results of calls run elsewhere, have no work to fly.
    fn resume_flies(&self, wait: &WaitState, payload: &Value) -> bool {
        let details = wait.details.as_ref().unwrap_or(&Value::Null);
        let is_results = payload.get("mode").is_some() && payload.get("results").is_some();
        details["mode"] == "approval_required" && !is_results && payload["approved"] == true
    }

    fn on_resume(
        &self,
        cx: &EffectCx<'_>,
        wait: &WaitState,
        payload: &Value,
    ) -> Result<Option<Value>> {
        let details = wait.details.as_ref().unwrap_or(&Value::Null);
        let count = details["original_call_count"].as_u64().map(|n| n as usize);
        let empty = Map::new();
        let blocked = details["blocked_by_index"].as_object().unwrap_or(&empty);
        let is_results = payload.get("mode").is_some() && payload.get("results").is_some();
        if details["mode"] != "approval_required" || is_results {
            // Results of calls run outside: put back in place.
            let mut given = payload["results"].as_array().cloned().unwrap_or_default();
            evidence::strip(&mut given);
            let results = match count {
                Some(n) if n != given.len() => merge(n, blocked, &given),
                _ => given,
            };
            let mode = payload["mode"].as_str().unwrap_or("executed");
            return Ok(Some(json!({"mode": mode, "results": results})));
        }
        let waiting: Vec<Call> = details["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(index, c)| Call {
                index,
                call_id: c["call_id"].as_str().unwrap_or_default().to_string(),
                runtime_call_id: c["runtime_call_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                name: c["name"].as_str().unwrap_or_default().to_string(),
                arguments: c["arguments"].as_object().cloned().unwrap_or_default(),
                valid: true,
            })
            .collect();
        let results: Vec<Value> = if payload["approved"] == true {
            // Approval never widens the ceiling: it is resolved again, and
            // the scope checked again, before anything runs.
            let ceiling = Self::ceiling(cx, None);
            let table = self.catalog.table();
            let scope =
                WorkspaceScope::from_runtime(cx.run.vars.get("_runtime"), self.catalog.home());
            match (ceiling, table, scope) {
                (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => waiting
                    .iter()
                    .map(|c| failed(c, format!("Tool execution failed: {e}")))
                    .collect(),
                (Ok(ceiling), Ok(table), Ok(scope)) => {
                    let mut out: Vec<Option<Value>> = vec![None; waiting.len()];
                    let mut planned = Vec::new();
                    for c in waiting {
                        let allowed = ceiling.as_ref().is_none_or(|s| s.contains(&c.name));
                        let class = table
                            .get(&c.name)
                            .and_then(|e| e.spec.as_ref())
                            .map(|s| s.class);
                        match (allowed, class) {
                            (false, _) => {
                                out[c.index] = Some(failed(
                                    &c,
                                    format!("Tool '{}' is not allowed for this run", c.name),
                                ))
                            }
                            (true, None) => {
                                out[c.index] =
                                    Some(failed(&c, format!("Tool '{}' not found", c.name)))
                            }
                            (true, Some(class)) => {
                                let args = match &scope {
                                    Some(s) => {
                                        scoped_args(s, &table, &c.name, class, c.arguments.clone())
                                    }
                                    None => Ok(c.arguments.clone()),
                                };
                                match args {
                                    Ok(a) => planned.push(Planned {
                                        call: Call { arguments: a, ..c },
                                        class,
                                    }),
                                    Err(e) => out[c.index] = Some(failed(&c, e)),
                                }
                            }
                        }
                    }
                    let batch = Batch {
                        approved: true,
                        ..Batch::of(cx, &table, scope.as_ref())
                    };
                    let ran = self.run_all(&batch, &planned, &|| batch.stopped(cx));
                    for (p, r) in planned.iter().zip(ran) {
                        out[p.call.index] = Some(r);
                    }
                    out.into_iter().flatten().collect()
                }
            }
        } else {
            let reason = payload["reason"]
                .as_str()
                .filter(|s| !s.trim().is_empty())
                .unwrap_or("Denied by user");
            waiting.iter().map(|c| failed(c, reason)).collect()
        };
        let mut results = match count {
            Some(n) => merge(n, blocked, &results),
            None => results,
        };
        if payload["approved"] == true {
            let calls = details["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let table = self.catalog.table().ok();
            let class_of = |n: &str| table.as_deref().and_then(|t| class_in(t, n));
            let at = stepwell_runtime::core::clock::format_time(cx.now);
            let approval = evidence::approval(&wait.wait_key, payload, &at);
            let ran = evidence::Ran {
                class_of: &class_of,
                calls: &calls,
                approval: Some(&approval),
            };
            evidence::record(cx, &mut results, &ran);
        }
        offload(cx, None, &mut results);
        Ok(Some(json!({"mode": "executed", "results": results})))
    }
}

/// `tool_specs {allowed_tools?}`: the tools a model may be offered in this
/// run, in the OpenAI `tools` form `llm_call` sends: every usable tool of
/// the host's table within the ceiling (the payload's `allowed_tools`, the
/// run's and every ancestor's). Result `{"tools": [...], "names": [...],
/// "toolset_id": "ts_<sha256 of the name-sorted specs>"}`. Pure: a replay
/// asks again.
#[derive(Debug, Clone)]
pub struct ToolSpecs {
    catalog: Arc<ToolCatalog>,
}

impl ToolSpecs {
    /// The specs of `catalog`'s tools.
    pub fn new(catalog: Arc<ToolCatalog>) -> Self {
        ToolSpecs { catalog }
    }
}

impl EffectHandler for ToolSpecs {
    fn kind(&self) -> &str {
        "tool_specs"
    }

    fn class(&self) -> EffectClass {
        EffectClass::Pure
    }

    fn execute(
        &self,
        cx: &EffectCx<'_>,
        payload: &Map<String, Value>,
        _prepared: Option<&Value>,
    ) -> Result<Outcome> {
        let (ceiling, table) = match ceiling_and_table(&self.catalog, cx, payload) {
            Ok(x) => x,
            Err(f) => return Ok(Outcome::Failed(f)),
        };
        let mut specs: Vec<&crate::ToolSpec> = table
            .specs()
            .into_iter()
            .filter(|s| ceiling.as_ref().is_none_or(|c| c.contains(&s.name)))
            .collect();
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        let tools: Vec<Value> = specs.iter().map(|s| s.openai()).collect();
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        let digest = {
            use sha2::{Digest, Sha256};
            let text =
                stepwell_automation_core::ids::canonical_json_ascii(&Value::Array(tools.clone()));
            hex::encode(Sha256::digest(text.as_bytes()))
        };
        Ok(Outcome::Completed(json!({
            "tools": tools,
            "names": names,
            "toolset_id": format!("ts_{}", &digest[..32]),
        })))
    }
}
