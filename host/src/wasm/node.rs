//! Node components: the `node` world's bindings, the per-call sandbox state,
//! and the call itself.

use std::path::{Path, PathBuf};

use rand::SeedableRng;
use serde_json::{Map, Value};
use wasmtime::component::ResourceTable;
use wasmtime::{ResourceLimiter, Store, Trap};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{
    HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView,
};

use super::{GuestError, LoadOrigin, SandboxLimits, WasmEngine};
use crate::core::model::{EffectRequest, StepPlan};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "node",
    });
}

use bindings::stepwell::flow::types as wit;
pub(super) use bindings::NodePre;

/// How much of a guest's stderr is kept for error messages.
const STDERR_CAPACITY: usize = 4096;

/// The state of one guest call's store: an empty WASI context and the
/// resource limiter.
pub(crate) struct GuestState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: Limiter,
}

impl WasiView for GuestState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

struct Limiter {
    memory_limit: usize,
    table_limit: usize,
    memory_exceeded: bool,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_limit {
            self.memory_exceeded = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= self.table_limit)
    }
}

/// A clock stopped at the Unix epoch: what guests see if they read a clock.
struct EpochClock;

impl HostWallClock for EpochClock {
    fn resolution(&self) -> std::time::Duration {
        std::time::Duration::from_secs(1)
    }
    fn now(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

impl HostMonotonicClock for EpochClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

fn sandbox(limits: &SandboxLimits, stderr: MemoryOutputPipe) -> GuestState {
    let wasi = WasiCtxBuilder::new()
        .stderr(stderr)
        .wall_clock(EpochClock)
        .monotonic_clock(EpochClock)
        .secure_random(rand::rngs::StdRng::seed_from_u64(0))
        .insecure_random(rand::rngs::StdRng::seed_from_u64(0))
        .insecure_random_seed(0)
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .build();
    GuestState {
        wasi,
        table: ResourceTable::new(),
        limiter: Limiter {
            memory_limit: limits.memory_limit_bytes,
            table_limit: limits.table_elements_limit,
            memory_exceeded: false,
        },
    }
}

/// What the host passes to a node for one step.
#[derive(Debug, Clone, Copy)]
pub struct NodeCall<'a> {
    /// The run's id.
    pub run_id: &'a str,
    /// The run's workflow id.
    pub workflow_id: &'a str,
    /// The node's id.
    pub node_id: &'a str,
    /// The node's config, as JSON text.
    pub config_json: &'a str,
    /// The run's vars, as JSON text of an object.
    pub vars_json: &'a str,
    /// The current time, RFC 3339 UTC.
    pub now: &'a str,
    /// The attempt number (1 first).
    pub attempt: u32,
}

/// A node component, compiled and pre-instantiated: each call instantiates
/// it afresh in its own sandbox, so no state survives from one call to the
/// next.
pub struct NodeComponent {
    path: PathBuf,
    digest: String,
    origin: LoadOrigin,
    pre: NodePre<GuestState>,
    engine: WasmEngine,
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
    ) -> Self {
        NodeComponent {
            path,
            digest,
            origin,
            pre,
            engine,
        }
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
    /// what it returns.
    pub fn call(&self, call: &NodeCall<'_>) -> Result<StepPlan, GuestError> {
        let limits = self.engine.limits();
        let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
        let mut store = Store::new(self.engine.engine(), sandbox(&limits, stderr.clone()));
        store.limiter(|s| &mut s.limiter);
        store.set_epoch_deadline(self.engine.deadline_ticks());
        let input = wit::NodeInput {
            run_id: call.run_id.to_string(),
            workflow_id: call.workflow_id.to_string(),
            node_id: call.node_id.to_string(),
            config: call.config_json.to_string(),
            vars: call.vars_json.to_string(),
            now: call.now.to_string(),
            attempt: call.attempt,
        };
        let result = self
            .pre
            .instantiate(&mut store)
            .and_then(|node| node.call_handle(&mut store, &input));
        match result {
            Ok(Ok(plan)) => parse_plan(plan),
            Ok(Err(wit::NodeError::InvalidInput(m))) => Err(GuestError::InvalidInput(m)),
            Ok(Err(wit::NodeError::Failed(m))) => Err(GuestError::Failed(m)),
            Err(err) => Err(classify(err, &store, &limits, &stderr)),
        }
    }
}

fn classify(
    err: wasmtime::Error,
    store: &Store<GuestState>,
    limits: &SandboxLimits,
    stderr: &MemoryOutputPipe,
) -> GuestError {
    if store.data().limiter.memory_exceeded {
        return GuestError::MemoryLimit {
            limit_bytes: limits.memory_limit_bytes,
        };
    }
    if let Some(Trap::Interrupt) = err.downcast_ref::<Trap>() {
        return GuestError::Timeout {
            limit_ms: limits.time_limit.as_millis() as u64,
        };
    }
    let mut message = match err.downcast_ref::<Trap>() {
        Some(trap) => trap.to_string(),
        None => format!("{err:#}"),
    };
    let out = stderr.contents();
    let text = String::from_utf8_lossy(&out);
    let text = text.trim();
    if !text.is_empty() {
        message.push_str(" (stderr: ");
        message.push_str(text);
        message.push(')');
    }
    GuestError::Trap { message }
}

fn parse_json(field: &str, text: &str) -> Result<Value, GuestError> {
    serde_json::from_str(text).map_err(|e| GuestError::BadOutput {
        message: format!("step-plan.{field} that is not JSON ({e})"),
    })
}

fn parse_plan(plan: wit::StepPlan) -> Result<StepPlan, GuestError> {
    let vars = match plan.vars {
        None => None,
        Some(text) => match parse_json("vars", &text)? {
            Value::Object(map) => Some(map),
            other => {
                return Err(GuestError::BadOutput {
                    message: format!(
                        "step-plan.vars that is not a JSON object (got {})",
                        kind_of(&other)
                    ),
                })
            }
        },
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
    Ok(StepPlan {
        vars,
        effect,
        next_node: plan.next_node,
        complete_output,
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
pub(crate) fn vars_json(vars: &Map<String, Value>) -> String {
    serde_json::to_string(vars).unwrap_or_else(|_| "{}".into())
}
