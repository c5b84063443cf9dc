//! The LLM feature as a kernel plugin: the `llm_call` effect.

use std::sync::Arc;

use super::{LlmCall, Settings};
use stepwell_runtime::core::plugin::{Install, Plugin};
use stepwell_runtime::core::Result;

/// The LLM plugin: adds `llm_call` over the providers it was given (unless
/// the application gave the builder an `llm_call` of its own).
///
/// ```
/// use std::sync::Arc;
/// use stepwell_llm::{Llm, LlmCall, Providers};
/// use stepwell_runtime::{MemoryStore, Runtime};
///
/// # fn main() -> stepwell_runtime::Result<()> {
/// let rt = stepwell_runtime::Runtime::builder(Arc::new(MemoryStore::new()))
///     .plugin(Arc::new(Llm::new(LlmCall::new(Providers::default()))))
///     .build()?;
/// assert!(rt.effects().get("llm_call").is_some());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Llm {
    call: Arc<LlmCall>,
}

impl Llm {
    /// `llm_call` as `call` executes it.
    pub fn new(call: LlmCall) -> Self {
        Llm {
            call: Arc::new(call),
        }
    }
}

impl Default for Llm {
    /// The built-in profiles with no settings: no default provider and no
    /// keys until the application configures them.
    fn default() -> Self {
        Llm::new(LlmCall::configured(None, &Settings::default()))
    }
}

impl Plugin for Llm {
    fn name(&self) -> &'static str {
        "llm"
    }

    fn install(&self, cx: &mut Install<'_>) -> Result<()> {
        cx.default_effect(self.call.clone());
        // A model call has no side effect: tried three times, 1 s then 2 s
        // apart (the reference's factories; a tool call is never retried
        // by default).
        cx.default_retry(
            "llm_call",
            stepwell_runtime::RetryPolicy {
                max_attempts: 3,
                initial_backoff: std::time::Duration::from_secs(1),
                factor: 2.0,
                max_backoff: std::time::Duration::from_secs(30),
            },
        );
        Ok(())
    }
}
