//! The kernel's tests: the step loop, stores, sandbox, flows, crashes and
//! races (one test binary: each file is a module).

mod conformance;
mod crash;
mod events;
mod flows;
mod history;
mod hostile;
mod kernel;
mod persistence;
mod races;
mod sandbox;
mod versions;
