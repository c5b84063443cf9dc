//! The `stepwell` binary's and server's tests, through real processes and
//! sockets (one test binary: each file is a module).

mod automation_cli;
mod cli;
mod docs;
mod serve;
mod traces;
