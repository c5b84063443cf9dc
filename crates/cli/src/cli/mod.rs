//! The binary's commands, one module each, over the library; `main.rs`
//! parses the arguments and dispatches. What a command prints goes through
//! `render` (a run, a record, figures; text or JSON). The benchmarks behind
//! `stepwell bench` live here too, kept out of the library so an
//! application embedding stepwell does not carry them.

pub mod automations;
pub mod bench;
pub mod bench_http;
pub mod bench_scale;
pub mod benchmarks;
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
