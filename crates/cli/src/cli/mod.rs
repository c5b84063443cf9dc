//! The binary's commands, one module each, over the library; `main.rs`
//! parses the arguments and dispatches. What a command prints goes through
//! `render` (a run, a record; text or JSON). `stepwell bench` runs the
//! benchmarks' own binary, `stepwell-bench` (crates/bench), so neither the
//! library nor this binary carries them.

pub mod automations;
pub mod bench;
pub mod connections;
pub mod db;
pub mod drive;
pub mod environment;
pub mod input;
pub mod ledger;
pub mod render;
pub mod runs;
pub mod serve;
pub mod sessions;
pub mod setup;
pub mod snapshot;
pub mod tools;
pub mod triggers;
