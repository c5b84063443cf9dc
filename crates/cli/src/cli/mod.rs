//! The parts of the `stepwell` binary that are not argument parsing: the
//! benchmarks behind `stepwell bench` (kept out of the library, so an
//! application embedding stepwell does not carry them), and the
//! `automations` subcommands.

pub mod automations;
pub mod bench;
pub mod bench_http;
pub mod bench_scale;
pub mod connections;
pub mod environment;
pub mod ledger;
pub mod sessions;
