//! # stepwell-guest: write stepwell node handlers in Rust
//!
//! A node handler is one plain function from an [`Input`] to a [`Plan`]. Export
//! it with [`export_node!`] and build the crate as a `cdylib` for
//! `wasm32-wasip2`: the result is a WebAssembly component that the stepwell host
//! loads from a flow document.
//!
//! ```ignore
//! use serde_json::json;
//! use stepwell_guest::{export_node, Input, NodeError, Plan};
//!
//! fn greet(input: Input) -> Result<Plan, NodeError> {
//!     let name = input.var_str("name").unwrap_or("World");
//!     Ok(Plan::complete(json!({ "message": format!("Hello, {name}!") })))
//! }
//!
//! export_node!(greet);
//! ```
//!
//! The handler must be pure: everything it needs is in its input (including the
//! time, [`Input::now`]); everything it wants done is in its plan. The host gives
//! guests no filesystem, network or environment; a guest that reads a clock
//! gets the Unix epoch, and its random source is a fixed, seeded stream.

use serde_json::{Map, Value};

pub mod small_alloc;
pub mod tool;
pub mod trigger;

/// Components (wasm32, one thread) allocate small blocks through
/// [`small_alloc::SmallAlloc`] unless the `small-alloc` feature is off.
#[cfg(all(
    feature = "small-alloc",
    target_arch = "wasm32",
    not(target_feature = "atomics")
))]
#[global_allocator]
static GUEST_ALLOC: small_alloc::SmallAlloc = small_alloc::SmallAlloc::new();

/// Bindings generated from `crates/wasm/wit/stepwell.wit` (the `node` world). Authors do not
/// need them directly; [`export_node!`] wires a handler to them.
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../crates/wasm/wit",
        world: "node",
        pub_export_macro: true,
        export_macro_name: "__export_node_world",
        default_bindings_module: "stepwell_guest::bindings",
    });
}

use bindings::stepwell::flow::types as wit;
use stepwell_flat_json::NotAnObject;

/// What the host passes to a node handler for one step of a run.
#[derive(Debug, Clone)]
pub struct Input {
    /// The id of the run being executed.
    pub run_id: String,
    /// The id of the run's workflow.
    pub workflow_id: String,
    /// The id of the node being executed.
    pub node_id: String,
    /// The node's static `config` from the flow document (`Null` when absent).
    pub config: Value,
    /// The run's vars.
    pub vars: Map<String, Value>,
    /// The current time, chosen by the host (to the microsecond: the
    /// `started_at` of the step's ledger record). `now.to_rfc3339()` or
    /// `now.to_string()` writes it as the ledger does.
    pub now: Time,
    /// 1 for the first attempt of this step.
    pub attempt: u32,
}

/// A point in time, UTC: seconds and nanoseconds since the Unix epoch.
///
/// ```
/// let t = stepwell_guest::Time { seconds: 1_796_198_400, nanoseconds: 123_456_000 };
/// assert_eq!(t.to_rfc3339(), "2026-12-02T08:00:00.123456Z");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time {
    /// Whole seconds since 1970-01-01T00:00:00Z.
    pub seconds: u64,
    /// Nanoseconds past `seconds` (below 1,000,000,000).
    pub nanoseconds: u32,
}

impl Time {
    /// RFC 3339 in UTC with microseconds (`2026-11-30T08:00:00.123456Z`),
    /// the form the host writes times in.
    pub fn to_rfc3339(&self) -> String {
        // Days since the epoch to a civil date (Howard Hinnant's
        // `civil_from_days`, for days >= 0).
        let days = self.seconds / 86_400;
        let secs = self.seconds % 86_400;
        let z = days + 719_468;
        let era = z / 146_097;
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + u64::from(month <= 2);
        // Past 9999, a sign (as RFC 3339's extension and chrono write it).
        let sign = if year > 9_999 { "+" } else { "" };
        format!(
            "{sign}{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
            secs / 3_600,
            secs / 60 % 60,
            secs % 60,
            self.nanoseconds.min(999_999_999) / 1_000
        )
    }
}

impl std::fmt::Display for Time {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

impl Input {
    /// The var `key` as a string, if it is one.
    pub fn var_str(&self, key: &str) -> Option<&str> {
        self.vars.get(key).and_then(Value::as_str)
    }

    /// The value at a dotted path in the vars (`"user_input.text"`), if present.
    pub fn var_path(&self, path: &str) -> Option<&Value> {
        let mut parts = path.split('.');
        let mut cur = self.vars.get(parts.next()?)?;
        for part in parts {
            cur = match cur {
                Value::Object(map) => map.get(part)?,
                Value::Array(items) => items.get(part.parse::<usize>().ok()?)?,
                _ => return None,
            };
        }
        Some(cur)
    }

    /// The config field `key`, if the config is an object that has it.
    pub fn config_field(&self, key: &str) -> Option<&Value> {
        self.config.get(key)
    }
}

/// A request for the host to do something durable (wait, emit an event, start a
/// child run, ...). See `docs/flows.md` for every kind and its payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Effect {
    /// The effect type, such as `"ask_user"`.
    pub kind: String,
    /// The effect's payload (a JSON object).
    pub payload: Value,
    /// Where the result (or the resumed wait's payload) lands in the vars.
    pub result_key: Option<String>,
}

impl Effect {
    /// An effect of any kind with the given payload.
    pub fn new(kind: impl Into<String>, payload: Value) -> Self {
        Effect {
            kind: kind.into(),
            payload,
            result_key: None,
        }
    }

    /// Write the effect's result to this key of the vars.
    pub fn result_key(mut self, key: impl Into<String>) -> Self {
        self.result_key = Some(key.into());
        self
    }

    /// Ask a person: the run waits until it is resumed with their answer.
    pub fn ask_user(prompt: impl Into<String>) -> Self {
        Effect::new("ask_user", serde_json::json!({ "prompt": prompt.into() }))
    }

    /// Wait until an RFC 3339 time.
    pub fn wait_until(until: impl Into<String>) -> Self {
        Effect::new("wait_until", serde_json::json!({ "until": until.into() }))
    }

    /// Wait for an event delivered under `wait_key` (by `emit_event` or a resume).
    pub fn wait_event(wait_key: impl Into<String>) -> Self {
        Effect::new(
            "wait_event",
            serde_json::json!({ "wait_key": wait_key.into() }),
        )
    }

    /// Emit an event: every run waiting on `name` is resumed with `payload`.
    pub fn emit_event(name: impl Into<String>, payload: Value) -> Self {
        Effect::new(
            "emit_event",
            serde_json::json!({ "name": name.into(), "payload": payload }),
        )
    }
}

/// What a node handler returns: what happens next.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// A shallow patch of the vars: each key replaces the key of the same name,
    /// `Null` removes it.
    pub vars: Option<Map<String, Value>>,
    /// An effect for the host to execute before moving on.
    pub effect: Option<Effect>,
    /// The node (or route label) to run next.
    pub next_node: Option<String>,
    /// Finish the run with this output.
    pub complete_output: Option<Value>,
}

impl Plan {
    /// Follow the node's `next` route from the flow document.
    pub fn follow() -> Self {
        Plan::default()
    }

    /// Go to node (or route label) `node` next.
    pub fn goto(node: impl Into<String>) -> Self {
        Plan {
            next_node: Some(node.into()),
            ..Plan::default()
        }
    }

    /// Finish the run with `output`.
    pub fn complete(output: Value) -> Self {
        Plan {
            complete_output: Some(output),
            ..Plan::default()
        }
    }

    /// Set var `key` to `value` (adds to the vars patch).
    pub fn set(mut self, key: impl Into<String>, value: Value) -> Self {
        self.vars
            .get_or_insert_with(Map::new)
            .insert(key.into(), value);
        self
    }

    /// Ask the host to execute `effect` first.
    pub fn with_effect(mut self, effect: Effect) -> Self {
        self.effect = Some(effect);
        self
    }
}

/// Why a node handler could not produce a plan.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeError {
    /// The config or vars are not what the node needs.
    InvalidInput(String),
    /// Any other failure.
    Failed(String),
}

impl NodeError {
    /// A [`NodeError::InvalidInput`] with this message.
    pub fn invalid(msg: impl Into<String>) -> Self {
        NodeError::InvalidInput(msg.into())
    }

    /// A [`NodeError::Failed`] with this message.
    pub fn failed(msg: impl Into<String>) -> Self {
        NodeError::Failed(msg.into())
    }
}

/// JSON text of `value`, written straight into a string (`Value`'s
/// `Display` goes through the formatter, token by token, which costs a
/// node call more than its parsing).
pub(crate) fn json_text<T: serde::Serialize + ?Sized>(value: &T) -> String {
    // Serialising a `Value` or a `Map` cannot fail: their keys are strings.
    serde_json::to_string(value).unwrap_or_else(|_| "null".into())
}

/// Converts between the WIT types and the SDK types and calls `handler`.
/// Used by [`export_node!`]; not part of the stable API.
#[doc(hidden)]
pub fn __dispatch(
    handler: fn(Input) -> Result<Plan, NodeError>,
    input: wit::NodeInput,
) -> Result<wit::StepPlan, wit::NodeError> {
    let config = match &input.config {
        None => Value::Null,
        Some(text) => serde_json::from_str(text)
            .map_err(|e| wit::NodeError::InvalidInput(format!("config is not JSON: {e}")))?,
    };
    // Flat vars (`{"i":5}`) are read without serde's machinery, the rest
    // by serde_json (stepwell-flat-json).
    let vars = stepwell_flat_json::read_object(&input.vars).map_err(|e| match e {
        NotAnObject::Other(_) => wit::NodeError::InvalidInput("vars is not an object".into()),
        NotAnObject::Json(e) => wit::NodeError::InvalidInput(format!("vars is not JSON: {e}")),
    })?;
    let input = Input {
        run_id: input.run_id,
        workflow_id: input.workflow_id,
        node_id: input.node_id,
        config,
        vars,
        now: Time {
            seconds: input.now.seconds,
            nanoseconds: input.now.nanoseconds,
        },
        attempt: input.attempt,
    };
    match handler(input) {
        Ok(plan) => Ok(wit::StepPlan {
            vars: plan.vars.map(|v| json_text(&v)),
            effect: plan.effect.map(|e| wit::Effect {
                kind: e.kind,
                payload: json_text(&e.payload),
                result_key: e.result_key,
            }),
            next_node: plan.next_node,
            complete_output: plan.complete_output.map(|v| json_text(&v)),
        }),
        Err(NodeError::InvalidInput(m)) => Err(wit::NodeError::InvalidInput(m)),
        Err(NodeError::Failed(m)) => Err(wit::NodeError::Failed(m)),
    }
}

/// Export `handler` (a `fn(Input) -> Result<Plan, NodeError>`) as the node
/// handler of this component. Call it once, at the crate root.
#[macro_export]
macro_rules! export_node {
    ($handler:path) => {
        struct __StepwellNode;

        impl $crate::bindings::Guest for __StepwellNode {
            fn handle(
                input: $crate::bindings::stepwell::flow::types::NodeInput,
            ) -> ::core::result::Result<
                $crate::bindings::stepwell::flow::types::StepPlan,
                $crate::bindings::stepwell::flow::types::NodeError,
            > {
                $crate::__dispatch($handler, input)
            }
        }

        $crate::bindings::__export_node_world!(__StepwellNode with_types_in $crate::bindings);
    };
}

/// Declares what this node expects, for `stepwell inspect` and for flow
/// loading: one JSON object, written as a string literal, kept in the
/// component's `stepwell:node` custom section. Its keys (all optional):
/// `description` (text), `vars` and `config` (name → what it holds),
/// `routes` (the route labels the node may return). Call it once, at the
/// crate root:
///
/// ```
/// stepwell_guest::describe_node!(r#"{
///     "description": "Pays up to config.limit at once, asks a person above it.",
///     "vars": {"amount": "the amount to pay, a number (required)"},
///     "config": {"limit": "the most paid without asking, a number (default 100)"},
///     "routes": ["approved", "review"]
/// }"#);
/// ```
#[macro_export]
macro_rules! describe_node {
    ($json:literal) => {
        // On wasm, a `link_section` static is the custom section itself
        // (not also data): nothing reads it, and the linker keeps it.
        #[cfg_attr(target_family = "wasm", link_section = "stepwell:node")]
        #[allow(dead_code)]
        static __STEPWELL_NODE_DESCRIPTION: [u8; $json.len()] = {
            let text: &[u8] = $json.as_bytes();
            let mut out = [0u8; $json.len()];
            let mut i = 0;
            while i < text.len() {
                out[i] = text[i];
                i += 1;
            }
            out
        };
    };
}

#[cfg(all(test, feature = "connection"))]
mod tests {
    use super::Time;

    /// `Time::to_rfc3339` writes what chrono writes, across leap years,
    /// month ends and centuries.
    #[test]
    fn times_are_written_as_chrono_writes_them() {
        let mut seconds = 0u64;
        while seconds < 300_000_000_000 {
            for nanoseconds in [0, 1_000, 999_999_999] {
                let t = Time {
                    seconds,
                    nanoseconds,
                };
                let chrono = chrono::DateTime::from_timestamp(seconds as i64, nanoseconds)
                    .unwrap()
                    .to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
                assert_eq!(t.to_rfc3339(), chrono, "{seconds}.{nanoseconds}");
            }
            seconds += if seconds < 9_000_000_000 {
                86_400 * 29 + 3_601
            } else {
                86_400 * 9_999 + 7
            };
        }
    }
}
