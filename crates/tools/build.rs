//! Embeds the built-in workspace tools in the crate: a component built from
//! `flows/tools/workspace/` by `scripts/build-guests`, which must run before
//! this crate is built.

use std::path::Path;

fn main() {
    // Read at run time (not `env!`): a build script compiled once is reused
    // for another checkout of the same sources.
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let file = Path::new(&manifest).join("../../flows/tools/workspace.wasm");
    embed("tools_workspace", &file);
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
