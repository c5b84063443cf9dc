//! `stepwell db migrate`: creates or migrates the store's schema.

use stepwell::Error;

use super::setup::Host;

/// Opens the store (creating or migrating its schema) and prints the
/// schema version it is at.
pub(crate) fn migrate(host: &Host, json: bool) -> Result<(), Error> {
    let spec = &host.spec;
    let version = spec.migrate(host.options.durability)?;
    if json {
        println!(
            "{}",
            serde_json::json!({"store": spec.to_string(), "schema_version": version})
        );
    } else {
        match version {
            Some(v) => println!("{spec}: schema version {v}"),
            None => println!("{spec}: keeps no schema"),
        }
    }
    Ok(())
}
