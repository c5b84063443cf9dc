//! Tool components: the `tool` world's bindings and its calls, each in a
//! fresh sandboxed instance that reaches only the directories it is given,
//! stopped at its own deadline.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::sandbox::{classify, new_store, new_store_with, GuestState, Reach};
use super::{GuestError, LoadOrigin, WasmEngine};

mod bindings {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "tool",
    });
}

use bindings::stepwell::flow::tool_types as wit;
pub(super) use bindings::ToolPre;

/// How a tool call went wrong inside the tool (the sandbox held).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolFault {
    /// The tool refused its arguments.
    InvalidArguments(String),
    /// The tool ran and failed.
    Failed(String),
}

/// A tool component, compiled and pre-instantiated. Every call runs in a
/// fresh instance: tools keep no state between calls.
pub struct ToolComponent {
    label: PathBuf,
    digest: String,
    origin: LoadOrigin,
    pre: ToolPre<GuestState>,
    engine: WasmEngine,
}

impl std::fmt::Debug for ToolComponent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolComponent")
            .field("label", &self.label)
            .field("digest", &self.digest)
            .finish_non_exhaustive()
    }
}

fn class(c: wit::EffectClass) -> ToolClass {
    match c {
        wit::EffectClass::Read => ToolClass::Read,
        wit::EffectClass::Write => ToolClass::Write,
        wit::EffectClass::Exec => ToolClass::Exec,
        wit::EffectClass::Delegate => ToolClass::Delegate,
        wit::EffectClass::Comms => ToolClass::Comms,
        wit::EffectClass::MemoryWrite => ToolClass::MemoryWrite,
    }
}

impl ToolComponent {
    pub(super) fn new(
        label: PathBuf,
        digest: String,
        origin: LoadOrigin,
        pre: ToolPre<GuestState>,
        engine: WasmEngine,
    ) -> Self {
        ToolComponent {
            label,
            digest,
            origin,
            pre,
            engine,
        }
    }

    /// Where the component came from (a file, or `builtin:<name>`).
    pub fn label(&self) -> &Path {
        &self.label
    }

    /// The SHA-256 of the component's bytes, in hex.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Whether the compiled code was compiled now or read from the cache.
    pub fn origin(&self) -> LoadOrigin {
        self.origin
    }

    /// The tools the component offers, as it reports them (the host checks
    /// them when it builds its tool table). Runs under the engine's
    /// ordinary limits, with no directory.
    pub fn describe(&self) -> Result<Vec<ToolSpec>, GuestError> {
        let (mut store, stderr) = new_store(&self.engine);
        let specs = self
            .pre
            .instantiate(&mut store)
            .and_then(|tool| tool.call_describe(&mut store))
            .map_err(|e| classify(e, &store, &self.engine.limits(), &stderr))?;
        specs
            .into_iter()
            .map(|s| {
                let parameters =
                    serde_json::from_str(&s.parameters).map_err(|e| GuestError::BadOutput {
                        message: format!(
                            "tool {:?} has parameters that are not JSON ({e})",
                            s.name
                        ),
                    })?;
                Ok(ToolSpec {
                    name: s.name,
                    description: s.description,
                    parameters,
                    class: class(s.effect_class),
                })
            })
            .collect()
    }

    /// Runs one call of tool `name` in a fresh instance that reaches only
    /// what `reach` gives, stopped after `timeout` (a real stop: the instance is
    /// interrupted and dropped). `Err` is the sandbox's verdict (timeout,
    /// memory, trap); `Ok(Err)` the tool's own refusal or failure.
    pub fn invoke(
        &self,
        call_id: &str,
        name: &str,
        arguments: &Value,
        reach: &Reach,
        timeout: Duration,
        stop: Option<Stop>,
    ) -> Result<Result<Value, ToolFault>, GuestError> {
        let mut limits = self.engine.limits();
        limits.time_limit = timeout;
        let ticks = super::engine::ticks_for(timeout);
        let (mut store, stderr) =
            new_store_with(&self.engine, reach, ticks).map_err(|e| GuestError::Trap {
                message: format!("cannot open the tool's directories: {e:#}"),
            })?;
        if let Some(stop) = stop {
            stop_when(&mut store, ticks, stop);
        }
        let call = wit::ToolCall {
            call_id: call_id.to_string(),
            name: name.to_string(),
            arguments: arguments.to_string(),
        };
        let out = self
            .pre
            .instantiate(&mut store)
            .and_then(|tool| tool.call_invoke(&mut store, &call))
            .map_err(|e| classify(e, &store, &limits, &stderr))?;
        Ok(match out {
            Ok(text) => match serde_json::from_str(&text) {
                Ok(v) => Ok(v),
                Err(e) => Err(ToolFault::Failed(format!(
                    "the tool returned output that is not JSON ({e})"
                ))),
            },
            Err(wit::ToolError::InvalidArguments(m)) => Err(ToolFault::InvalidArguments(m)),
            Err(wit::ToolError::Failed(m)) => Err(ToolFault::Failed(m)),
        })
    }
}

/// Asked every few milliseconds while a tool runs: `true` stops it (its
/// run was cancelled) the way its timeout would, and it is reported so (the
/// outcome of a cancelled run is not recorded).
pub type Stop = std::sync::Arc<dyn Fn() -> bool + Send + Sync>;

/// Checks `stop` at every epoch tick of the call, and interrupts it when
/// `stop` says so or when its `ticks` are up (as the deadline alone would).
fn stop_when(store: &mut wasmtime::Store<super::sandbox::GuestState>, ticks: u64, stop: Stop) {
    store.set_epoch_deadline(1);
    let mut left = ticks;
    store.epoch_deadline_callback(move |_| {
        left = left.saturating_sub(1);
        if left == 0 || stop() {
            return Err(wasmtime::Trap::Interrupt.into());
        }
        Ok(wasmtime::UpdateDeadline::Continue(1))
    });
}

/// What a tool does to the world: decides its sandbox, whether a
/// read-only workspace refuses it, and whether it asks for approval by
/// default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolClass {
    /// Only reads: read-only directories.
    Read,
    /// Changes files: the writable roots read-write.
    Write,
    /// Runs commands or code.
    Exec,
    /// Hands work to another agent or run.
    Delegate,
    /// Sends messages.
    Comms,
    /// Writes the agent's memory.
    MemoryWrite,
}

impl ToolClass {
    /// `read`, `write`, `exec`, `delegate`, `comms` or `memory_write`.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolClass::Read => "read",
            ToolClass::Write => "write",
            ToolClass::Exec => "exec",
            ToolClass::Delegate => "delegate",
            ToolClass::Comms => "comms",
            ToolClass::MemoryWrite => "memory_write",
        }
    }
}

/// One tool as a model sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolSpec {
    /// The name a model calls it by.
    pub name: String,
    /// What it does.
    pub description: String,
    /// A JSON Schema (an object schema) of its arguments.
    pub parameters: Value,
    /// What it does to the world.
    pub class: ToolClass,
}

impl ToolSpec {
    /// The spec in the OpenAI `tools` form `llm_call` sends:
    /// `{"type": "function", "function": {name, description, parameters}}`.
    pub fn openai(&self) -> Value {
        serde_json::json!({"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}})
    }
}
