//! The features' tests: automations, trigger sources, tools, LLM calls,
//! conversations, and the attacks on them (one test binary: each file is a
//! module).

#[path = "attacks/main.rs"]
mod attacks;
mod automation;
mod automation_behaviours;
mod automation_controller;
mod conversations;
mod in_flight;
mod llm;
mod tools;
mod triggers;
