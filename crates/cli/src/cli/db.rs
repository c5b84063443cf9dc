//! `stepwell db migrate`: creates or migrates the store's schema;
//! `stepwell db vacuum`: gives a SQLite file's free pages back.

use clap::Subcommand;
use stepwell::Error;

use super::render::Report;
use super::setup::Host;

/// The `db` subcommands.
#[derive(Subcommand)]
pub(crate) enum DbCommand {
    /// Create the store's schema or migrate it to this build's version
    /// (opening a store does too; this does only that, and prints the
    /// version). Refused when the store was written by a newer stepwell.
    Migrate,
    /// Give the space deleted runs left (`prune`) back to the file system:
    /// SQLite's file is rewritten (stop the other processes on it first).
    Vacuum,
}

/// Runs a `db` subcommand.
pub(crate) fn run(host: &Host, command: DbCommand) -> Result<Report, Error> {
    match command {
        DbCommand::Migrate => migrate(host),
        DbCommand::Vacuum => vacuum(host),
    }
}

/// Rewrites a SQLite file without its free pages; the sizes.
fn vacuum(host: &Host) -> Result<Report, Error> {
    let spec = &host.spec;
    Ok(match spec.vacuum()? {
        Some((before, after)) => Report::compact(&serde_json::json!({
            "store": spec.to_string(), "bytes_before": before, "bytes_after": after}))
        .line(format!("{spec}: {before} bytes, now {after}")),
        None => Report::compact(&serde_json::json!({
            "store": spec.to_string(), "bytes_before": null, "bytes_after": null}))
        .line(format!(
            "{spec}: nothing to do (JSON files are deleted with their runs, PostgreSQL's autovacuum reclaims its pages, a memory store has no file)"
        )),
    })
}

/// Opens the store (creating or migrating its schema); the schema version
/// it is at.
fn migrate(host: &Host) -> Result<Report, Error> {
    let spec = &host.spec;
    let version = spec.migrate(host.options.durability)?;
    let report =
        Report::compact(&serde_json::json!({"store": spec.to_string(), "schema_version": version}));
    Ok(report.line(match version {
        Some(v) => format!("{spec}: schema version {v}"),
        None => format!("{spec}: keeps no schema"),
    }))
}
