//! The binary's commands, one module each, over the library; `main.rs`
//! parses the arguments and dispatches. A command returns a
//! `render::Report` (its text, its JSON, how it ends) and `render::Sink`
//! prints it as text or JSON; a command that prints as it goes (`drive`,
//! `ledger --follow`, `serve`) hands the sink a report at a time. No other
//! module prints. `stepwell bench` runs the benchmarks' own binary,
//! `stepwell-bench` (crates/bench), so neither the library nor this binary
//! carries them.

pub mod automations;
pub mod bench;
pub mod connections;
pub mod db;
pub mod drive;
pub mod environment;
pub mod history;
pub mod input;
pub mod inspect;
pub mod ledger;
pub mod render;
pub mod retention;
pub mod runs;
pub mod serve;
pub mod sessions;
pub mod setup;
pub mod snapshot;
pub mod tools;
pub mod triggers;
pub mod workflows;
