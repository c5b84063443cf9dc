//! Write tools in Rust: implement [`Toolbox`] over serde_json values and
//! export the type with [`export_toolbox!`](crate::export_toolbox).
//!
//! A tool component offers one or more tools to a model (through the
//! host's `tool_calls` effect). Each call runs in a fresh instance that sees
//! only the directories the run's workspace scope grants: path arguments
//! arrive as absolute host paths inside them, so `std::fs` works on them as
//! they are. See `docs/tools.md`.
//!
//! ```ignore
//! use serde_json::{json, Value};
//! use stepwell_guest::export_toolbox;
//! use stepwell_guest::tool::*;
//!
//! struct Echo;
//!
//! impl Toolbox for Echo {
//!     fn describe() -> Vec<ToolSpec> {
//!         vec![ToolSpec::new("echo", "Says its text back", EffectClass::Read,
//!             json!({"type": "object", "properties": {"text": {"type": "string"}},
//!                    "required": ["text"]}))]
//!     }
//!     fn invoke(call: ToolCall) -> Result<Value, ToolError> {
//!         let text = call.str_arg("text").ok_or_else(|| ToolError::invalid("text is required"))?;
//!         Ok(json!(text))
//!     }
//! }
//!
//! export_toolbox!(Echo);
//! ```

use serde_json::{Map, Value};

/// Bindings generated from `crates/wasm/wit/tool.wit` (the `tool` world).
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../crates/wasm/wit",
        world: "tool",
        pub_export_macro: true,
        export_macro_name: "__export_tool_world",
        default_bindings_module: "stepwell_guest::tool::bindings",
    });
}

use bindings::stepwell::flow::tool_types as wit;

/// What a tool does to the world: decides its sandbox and its approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EffectClass {
    /// Only reads.
    Read,
    /// Changes files.
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

/// One tool of a component.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// The name a model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// A JSON Schema (an object schema) of its arguments.
    pub parameters: Value,
    /// What it does to the world.
    pub effect_class: EffectClass,
}

impl ToolSpec {
    /// A tool spec.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        effect_class: EffectClass,
        parameters: Value,
    ) -> Self {
        ToolSpec {
            name: name.into(),
            description: description.into(),
            parameters,
            effect_class,
        }
    }
}

/// One call of a tool.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The call's id.
    pub call_id: String,
    /// Which tool.
    pub name: String,
    /// Its arguments (an object; paths already absolute and inside the scope).
    pub arguments: Map<String, Value>,
}

impl ToolCall {
    /// The argument `key` if it is a string.
    pub fn str_arg(&self, key: &str) -> Option<&str> {
        self.arguments.get(key).and_then(Value::as_str)
    }

    /// The argument `key` if it is an integer.
    pub fn int_arg(&self, key: &str) -> Option<i64> {
        self.arguments.get(key).and_then(Value::as_i64)
    }

    /// The argument `key` if it is a boolean.
    pub fn bool_arg(&self, key: &str) -> Option<bool> {
        self.arguments.get(key).and_then(Value::as_bool)
    }
}

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolError {
    /// The arguments are not what the tool needs.
    InvalidArguments(String),
    /// The tool ran and failed.
    Failed(String),
}

impl ToolError {
    /// An [`ToolError::InvalidArguments`].
    pub fn invalid(message: impl Into<String>) -> Self {
        ToolError::InvalidArguments(message.into())
    }

    /// A [`ToolError::Failed`].
    pub fn failed(message: impl Into<String>) -> Self {
        ToolError::Failed(message.into())
    }
}

/// The tools of a component.
pub trait Toolbox {
    /// The tools it offers.
    fn describe() -> Vec<ToolSpec>;
    /// Runs one call.
    fn invoke(call: ToolCall) -> Result<Value, ToolError>;
}

/// The glue between the generated bindings and a [`Toolbox`].
#[doc(hidden)]
pub mod glue {
    use super::*;

    pub fn describe<T: Toolbox>() -> Vec<wit::ToolSpec> {
        T::describe()
            .into_iter()
            .map(|s| wit::ToolSpec {
                name: s.name,
                description: s.description,
                parameters: crate::json_text(&s.parameters),
                effect_class: match s.effect_class {
                    EffectClass::Read => wit::EffectClass::Read,
                    EffectClass::Write => wit::EffectClass::Write,
                    EffectClass::Exec => wit::EffectClass::Exec,
                    EffectClass::Delegate => wit::EffectClass::Delegate,
                    EffectClass::Comms => wit::EffectClass::Comms,
                    EffectClass::MemoryWrite => wit::EffectClass::MemoryWrite,
                },
            })
            .collect()
    }

    pub fn invoke<T: Toolbox>(call: wit::ToolCall) -> Result<String, wit::ToolError> {
        let arguments = match serde_json::from_str::<Value>(&call.arguments) {
            Ok(Value::Object(map)) => map,
            Ok(_) => {
                return Err(wit::ToolError::InvalidArguments(
                    "arguments must be a JSON object".into(),
                ))
            }
            Err(e) => {
                return Err(wit::ToolError::InvalidArguments(format!(
                    "arguments are not JSON: {e}"
                )))
            }
        };
        let call = ToolCall {
            call_id: call.call_id,
            name: call.name,
            arguments,
        };
        match T::invoke(call) {
            Ok(v) => Ok(crate::json_text(&v)),
            Err(ToolError::InvalidArguments(m)) => Err(wit::ToolError::InvalidArguments(m)),
            Err(ToolError::Failed(m)) => Err(wit::ToolError::Failed(m)),
        }
    }
}

/// Export `$ty` (a type implementing [`Toolbox`]) as this component's
/// tools. Call it once, at the crate root.
#[macro_export]
macro_rules! export_toolbox {
    ($ty:ty) => {
        const _: () = {
            use $crate::tool::bindings::stepwell::flow::tool_types as __t;
            use $crate::tool::glue;

            struct __StepwellTools;

            impl $crate::tool::bindings::Guest for __StepwellTools {
                fn describe() -> ::std::vec::Vec<__t::ToolSpec> {
                    glue::describe::<$ty>()
                }
                fn invoke(call: __t::ToolCall) -> Result<String, __t::ToolError> {
                    glue::invoke::<$ty>(call)
                }
            }

            $crate::tool::bindings::__export_tool_world!(
                __StepwellTools with_types_in $crate::tool::bindings
            );
        };
    };
}
