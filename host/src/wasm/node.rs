//! Node components: the `node` world's bindings and the call itself.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::sandbox::{classify, new_store, GuestState};
use super::{GuestError, LoadOrigin, WasmEngine};
use crate::core::model::{EffectRequest, StepPlan};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "node",
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
        let (mut store, stderr) = new_store(&self.engine);
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
            Err(err) => Err(classify(err, &store, &self.engine.limits(), &stderr)),
        }
    }
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
