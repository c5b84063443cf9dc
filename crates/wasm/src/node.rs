//! Node components: the `node` world's bindings and the call itself.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Map, Value};
use stepwell_flat_json::NotAnObject;

use super::sandbox::{classify, memory_refused, new_store, prepare_call, GuestState};
use super::{GuestError, LoadOrigin, WasmEngine};
use stepwell_model::model::{EffectRequest, StepPlan};

mod bindings {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "node",
        // The input's strings are lowered straight from the host's
        // buffers, not copied first.
        ownership: Borrowing { duplicate_if_necessary: false },
    });
}

use bindings::stepwell::flow::types as wit;
pub(super) use bindings::NodePre;

/// What the host passes to a node for one step.
#[derive(Debug, Clone, Copy)]
pub struct NodeCall<'a> {
    /// The run's id.
    pub run_id: &'a str,
    /// The run's workflow id.
    pub workflow_id: &'a str,
    /// The node's id.
    pub node_id: &'a str,
    /// The node's config, as JSON text; `None` when the node has none.
    /// (A `String`: the bindings lower it into the guest straight from
    /// this buffer.)
    pub config_json: Option<&'a String>,
    /// The run's vars, as JSON text of an object.
    pub vars_json: &'a String,
    /// The current time (passed to the microsecond, as the ledger writes
    /// it). Not before 1970: the contract's `datetime` counts from then
    /// (the step loop fails a step whose clock reads earlier).
    pub now: chrono::DateTime<chrono::Utc>,
    /// The attempt number (1 first).
    pub attempt: u32,
    /// Seeds the guest's random stream for this call (the same step gets
    /// the same stream, also when it is replayed).
    pub seed: u64,
}

/// A node component, compiled and pre-instantiated: each call instantiates
/// it afresh in its own sandbox, so no state survives from one call to the
/// next. Its next instance is made ahead, on the engine's worker thread
/// (`warm.rs`): a fresh instance, never called before it is used.
pub struct NodeComponent {
    path: PathBuf,
    digest: String,
    origin: LoadOrigin,
    pre: NodePre<GuestState>,
    engine: WasmEngine,
    /// The next instance, made ahead (never called).
    warm: parking_lot::Mutex<Option<Box<NodeInstance>>>,
    /// Set when a fresh instance made ahead was too large or too slow to
    /// make: this component's instances are made at the call only.
    cold: std::sync::atomic::AtomicBool,
    /// The route labels its author declared (`describe_node!`), if any.
    declared_routes: Option<Vec<String>>,
}

/// An instance of a node component in its own store.
pub(crate) struct NodeInstance {
    store: wasmtime::Store<GuestState>,
    stderr: wasmtime_wasi::p2::pipe::MemoryOutputPipe,
    node: bindings::Node,
}

impl NodeInstance {
    /// Bytes of linear memory the instance holds.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.store.data().memory_bytes()
    }
}

impl std::fmt::Debug for NodeComponent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeComponent")
            .field("path", &self.path)
            .field("digest", &self.digest)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl NodeComponent {
    pub(super) fn new(
        path: PathBuf,
        digest: String,
        origin: LoadOrigin,
        pre: NodePre<GuestState>,
        engine: WasmEngine,
        declared_routes: Option<Vec<String>>,
    ) -> Self {
        NodeComponent {
            path,
            digest,
            origin,
            pre,
            engine,
            warm: parking_lot::Mutex::new(None),
            cold: std::sync::atomic::AtomicBool::new(false),
            declared_routes,
        }
    }

    /// The route labels the component's author declared it may return
    /// (its `stepwell:node` section's `routes`); `None` when it declares
    /// none.
    pub fn declared_routes(&self) -> Option<&[String]> {
        self.declared_routes.as_deref()
    }

    /// The file the component was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The SHA-256 of the component's bytes, in hex.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Whether the compiled code was compiled now or read from the cache.
    pub fn origin(&self) -> LoadOrigin {
        self.origin
    }

    /// Calls the node's `handle` in a fresh sandboxed instance and checks
    /// what it returns. (The step loop uses a [`NodeSession`], which keeps
    /// the instance for the next steps of the same run.)
    pub fn call(self: &Arc<Self>, call: &NodeCall<'_>) -> Result<StepPlan, GuestError> {
        self.session()?.call(call)
    }

    /// A fresh instance of the component in its own sandbox, for the calls
    /// of one run's tick: the one made ahead if there is one, else one made
    /// now. When the session ends, the next one is made ahead.
    pub fn session(self: &Arc<Self>) -> Result<NodeSession, GuestError> {
        let made = self.warm.lock().take();
        self.engine.guest_metrics().instance(made.is_some());
        let instance = match made {
            Some(instance) => instance,
            None => self.instantiate_now()?,
        };
        Ok(NodeSession {
            component: self.clone(),
            instance: Some(instance),
            calls: 0,
        })
    }

    /// A session on an instance made now, never one made ahead (what
    /// `stepwell bench` times as an instantiation).
    pub fn session_made_now(self: &Arc<Self>) -> Result<NodeSession, GuestError> {
        Ok(NodeSession {
            component: self.clone(),
            instance: Some(self.instantiate_now()?),
            calls: 0,
        })
    }

    /// A new instance, for a call waiting for it: if making it fails (the
    /// pool of instances or the engine's shared memory budget may be full),
    /// the instances the worker holds are dropped and it is tried once
    /// more.
    fn instantiate_now(&self) -> Result<Box<NodeInstance>, GuestError> {
        match self.instantiate() {
            Err(_) if self.engine.worker().release_all() => self.instantiate(),
            made => made,
        }
    }

    /// A new instance in a new sandbox.
    pub(crate) fn instantiate(&self) -> Result<Box<NodeInstance>, GuestError> {
        let (mut store, stderr) = new_store(&self.engine);
        match self.pre.instantiate(&mut store) {
            Ok(node) => Ok(Box::new(NodeInstance {
                store,
                stderr,
                node,
            })),
            Err(err) => Err(classify(err, &store, &self.engine.limits(), &stderr)),
        }
    }

    /// Whether an instance made ahead is waiting.
    pub(crate) fn has_warm(&self) -> bool {
        self.warm.lock().is_some()
    }

    /// Keeps `instance` (never called) for the next session.
    pub(crate) fn put_warm(&self, instance: Box<NodeInstance>) {
        *self.warm.lock() = Some(instance);
    }

    /// Whether this component's instances are made at the call only.
    pub(crate) fn is_cold(&self) -> bool {
        self.cold.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Makes this component's instances at the call only from now on.
    pub(crate) fn make_cold(&self) {
        self.cold.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Takes the instance made ahead, if any.
    pub(crate) fn take_warm(&self) -> Option<Box<NodeInstance>> {
        self.warm.lock().take()
    }
}

/// An instance of a node component kept for the consecutive calls of one
/// run within one tick: each call after the first costs a function call,
/// not an instantiation. Guests are pure, so a call must not depend on what
/// an earlier call left in the instance; whatever it leaves is seen only by
/// later steps of the same run in the same tick, never by another run (a
/// session is never shared between runs, and ends with the tick). After a
/// call that fails (a trap, a timeout, the memory limit, a wait, bad
/// output) the step loop discards the session ([`NodeSession::discard`])
/// and the next call gets a fresh instance.
pub struct NodeSession {
    component: Arc<NodeComponent>,
    /// Set until the session ends: dropped (the engine's worker drops the
    /// instance and makes the component's next one) or discarded.
    instance: Option<Box<NodeInstance>>,
    calls: u32,
}

impl NodeSession {
    /// Ends the session after a failed call: its instance is dropped here
    /// and now (its memory and its slot in the pool given back before the
    /// step is tried again), and nothing is made ahead.
    pub fn discard(mut self) {
        drop(self.instance.take());
    }
}

impl Drop for NodeSession {
    fn drop(&mut self) {
        if let Some(instance) = self.instance.take() {
            let next = Arc::downgrade(&self.component);
            self.component.engine.worker().session_ended(instance, next);
        }
    }
}

impl std::fmt::Debug for NodeSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeSession")
            .field("component", &self.component.path)
            .field("calls", &self.calls)
            .finish_non_exhaustive()
    }
}

impl NodeSession {
    /// The component this session runs.
    pub fn component(&self) -> &Arc<NodeComponent> {
        &self.component
    }

    /// How many calls this session made.
    pub fn calls(&self) -> u32 {
        self.calls
    }

    /// Calls the node's `handle` and checks what it returns.
    pub fn call(&mut self, call: &NodeCall<'_>) -> Result<StepPlan, GuestError> {
        let engine = &self.component.engine;
        let NodeInstance {
            store,
            stderr,
            node,
        } = &mut **self
            .instance
            .as_mut()
            .expect("a session holds its instance until it is dropped");
        prepare_call(store, engine, call.seed);
        self.calls += 1;
        let input = wit::NodeInput {
            run_id: call.run_id,
            workflow_id: call.workflow_id,
            node_id: call.node_id,
            config: call.config_json,
            vars: call.vars_json,
            now: wit::Datetime {
                // The step refuses a clock before 1970 (`NodeCall::now`).
                seconds: u64::try_from(call.now.timestamp()).unwrap_or(0),
                // A leap second (chrono's micros past 999,999) is written
                // as the end of the second before.
                nanoseconds: call.now.timestamp_subsec_micros().min(999_999) * 1_000,
            },
            attempt: call.attempt,
        };
        let started = std::time::Instant::now();
        let answer = node.call_handle(&mut *store, input);
        engine.guest_metrics().call(started.elapsed());
        match answer {
            Ok(Ok(plan)) => parse_plan(plan, engine.limits().max_output_bytes),
            // A language whose runtime catches a refused memory growth and
            // reports it (JavaScript's "out of memory") fails as one that
            // traps on it (Rust) does: with the memory limit.
            Ok(Err(e)) => Err(memory_refused(store, &engine.limits()).unwrap_or(match e {
                wit::NodeError::InvalidInput(m) => GuestError::InvalidInput(m),
                wit::NodeError::Failed(m) => GuestError::Failed(m),
            })),
            Err(err) => Err(classify(err, store, &engine.limits(), stderr)),
        }
    }
}

fn parse_json(field: &str, text: &str) -> Result<Value, GuestError> {
    refuse_inexact(field, text)?;
    serde_json::from_str(text).map_err(|e| GuestError::BadOutput {
        message: format!("step-plan.{field} that is not JSON ({e})"),
    })
}

/// Refuses a step plan's JSON `field` holding an integer no 64-bit integer
/// holds (it would be changed into a float without a word).
fn refuse_inexact(field: &str, text: &str) -> Result<(), GuestError> {
    match stepwell_flat_json::find_inexact_integer(text) {
        None => Ok(()),
        Some(found) => Err(GuestError::BadOutput {
            message: format!(
                "{}: {}",
                stepwell_model::json::inexact_field(&format!("step-plan.{field}"), &found.path),
                stepwell_model::json::inexact_message(&found.literal)
            ),
        }),
    }
}

fn parse_plan(plan: wit::StepPlan, max_bytes: usize) -> Result<StepPlan, GuestError> {
    let bytes = [&plan.vars, &plan.complete_output, &plan.next_node]
        .iter()
        .filter_map(|t| t.as_ref().map(String::len))
        .sum::<usize>()
        + plan.effect.as_ref().map_or(0, |e| {
            e.kind.len() + e.payload.len() + e.result_key.as_ref().map_or(0, String::len)
        });
    if bytes > max_bytes {
        return Err(GuestError::OutputTooLarge {
            bytes: Some(bytes),
            limit_bytes: max_bytes,
        });
    }
    let vars = match plan.vars {
        None => None,
        Some(text) => {
            refuse_inexact("vars", &text)?;
            Some(
                stepwell_flat_json::read_object(&text).map_err(|e| GuestError::BadOutput {
                    message: match e {
                        NotAnObject::Json(e) => format!("step-plan.vars that is not JSON ({e})"),
                        NotAnObject::Other(other) => format!(
                            "step-plan.vars that is not a JSON object (got {})",
                            kind_of(&other)
                        ),
                    },
                })?,
            )
        }
    };
    let effect = match plan.effect {
        None => None,
        Some(e) => {
            let payload = parse_json("effect.payload", &e.payload)?;
            if !payload.is_object() {
                return Err(GuestError::BadOutput {
                    message: format!(
                        "step-plan.effect.payload that is not a JSON object (got {})",
                        kind_of(&payload)
                    ),
                });
            }
            Some(EffectRequest {
                kind: e.kind,
                payload,
                result_key: e.result_key,
            })
        }
    };
    let complete_output = match plan.complete_output {
        None => None,
        Some(text) => Some(parse_json("complete-output", &text)?),
    };
    if complete_output.is_some() && plan.next_node.is_some() {
        return Err(GuestError::BadOutput {
            message: "a step-plan with both next-node and complete-output".into(),
        });
    }
    // Every value the plan writes into the run must nest within bounds the
    // stores can read back (a patch value sits one level below the vars,
    // the output one level below the run).
    let too_deep = |field: &str, v: &Value| {
        stepwell_model::json::too_deep(v, 1).map(|why| GuestError::BadOutput {
            message: format!("step-plan.{field} that {why}"),
        })
    };
    for (k, v) in vars.iter().flatten() {
        // Scalars (most patches) cannot nest: no field name to format.
        if v.is_object() || v.is_array() {
            if let Some(e) = too_deep(&format!("vars.{k}"), v) {
                return Err(e);
            }
        }
    }
    if let Some(e) = complete_output
        .as_ref()
        .and_then(|v| too_deep("complete-output", v))
    {
        return Err(e);
    }
    if let Some(e) = effect
        .as_ref()
        .and_then(|e| too_deep("effect.payload", &e.payload))
    {
        return Err(e);
    }
    Ok(StepPlan {
        vars,
        effect,
        next_node: plan.next_node,
        complete_output,
        output_bytes: bytes,
    })
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Serialises vars for a guest call.
/// The host's bookkeeping vars, which a node sees only when its flow entry
/// asks for them (`host_vars: true`).
pub const HOST_BOOKKEEPING_VARS: [&str; 2] = ["_runtime", "_limits"];

/// Serialises vars for a guest call, without the host's bookkeeping unless
/// `host_vars`.
pub fn vars_json(vars: &Map<String, Value>, host_vars: bool) -> String {
    struct ForGuest<'a>(&'a Map<String, Value>, bool);
    impl serde::Serialize for ForGuest<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            let mut m = s.serialize_map(None)?;
            for (k, v) in self.0 {
                // Both bookkeeping names start with `_`: most keys stop there.
                let bookkeeping = k.starts_with('_') && HOST_BOOKKEEPING_VARS.contains(&k.as_str());
                if self.1 || !bookkeeping {
                    m.serialize_entry(k, v)?;
                }
            }
            m.end()
        }
    }
    serde_json::to_string(&ForGuest(vars, host_vars)).unwrap_or_else(|_| "{}".into())
}
