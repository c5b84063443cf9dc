//! LLM calls over the OpenAI-compatible chat-completions API (the one
//! OpenAI, Ollama, LM Studio, vLLM and llama.cpp's server all serve): the
//! providers a host may call ([`Providers`]), the request an `llm_call`
//! payload becomes ([`chat_request`]), the HTTP exchange ([`Providers::call`])
//! and the normalised result ([`normalize_response`]).
//!
//! The behaviour is the reference implementation's (abstractruntime 0.13.0,
//! AbstractCore's OpenAI-compatible client); `docs/llm.md` is the user's
//! guide.

// Every public item says what it is; every unsafe operation sits in a
// block that says why it holds (a `SAFETY:` comment).
#![deny(
    missing_docs,
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks
)]

mod chat;
pub mod effect;
mod http;
mod plugin;
mod providers;

pub use effect::{LlmCall, LLM_CONFIG_ENV};
pub use plugin::Llm;

pub use chat::{
    attempted_budget, chat_request, finish_is_truncation, normalize_response, output_budget,
    parse_json_text, positive, redact, requested_schema, schema_mismatch, truncation_message,
    ChatRequest, REDACTED,
};
pub use providers::{shown_url, LlmError, Provider, Providers, Settings, DEFAULT_TIMEOUT_S};
