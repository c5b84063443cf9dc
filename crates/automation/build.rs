//! Embeds the built-in trigger sources (`schedule@1`, `manual@1`,
//! `webhook.received@1`, `feed.item@1`) and the automation controller's
//! nodes and flow in the crate: components built from
//! `flows/triggers/builtin/` and `flows/automation-controller/` by
//! `scripts/build-guests`, which must run before this crate is built.

use std::path::Path;

fn main() {
    // Read at run time (not `env!`): a build script compiled once is reused
    // for another checkout of the same sources.
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let sources = Path::new(&manifest).join("../../flows/triggers/builtin");
    let controller = Path::new(&manifest).join("../../flows/automation-controller");
    for name in ["schedule", "manual", "webhook", "feed"] {
        embed(name, &sources.join(format!("{name}.wasm")));
    }
    embed("controller", &controller.join("nodes.wasm"));
    embed("controller_flow", &controller.join("flow.json"));
}

/// Names `file` to the crate as `STEPWELL_BUILTIN_<NAME>` (for
/// `include_bytes!`), and rebuilds when it changes.
fn embed(name: &str, file: &Path) {
    println!("cargo:rerun-if-changed={}", file.display());
    let file = file.canonicalize().unwrap_or_else(|_| {
        panic!(
            "{} is missing: build the guest components first (scripts/build-guests)",
            file.display()
        )
    });
    println!(
        "cargo:rustc-env=STEPWELL_BUILTIN_{}={}",
        name.to_uppercase(),
        file.display()
    );
}
