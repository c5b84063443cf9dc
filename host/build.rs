//! Embeds the built-in trigger sources (`schedule@1`, `manual@1`), the
//! built-in workspace tools and the automation controller's nodes in the
//! library: they are components built
//! from `flows/triggers/builtin/` and `flows/automation-controller/` by
//! `scripts/build-guests`, which must run before the host is built.

use std::path::Path;

fn main() {
    // Read at run time (not `env!`): a build script compiled once is reused
    // for another checkout of the same sources.
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let dir = Path::new(&manifest).join("../flows/triggers/builtin");
    println!("cargo:rerun-if-changed={}", dir.display());
    let controller = Path::new(&manifest).join("../flows/automation-controller");
    println!("cargo:rerun-if-changed={}", controller.display());
    let tools = Path::new(&manifest).join("../flows/tools");
    println!("cargo:rerun-if-changed={}", tools.display());
    let files = [
        ("tools_workspace", tools.join("workspace.wasm")),
        ("schedule", dir.join("schedule.wasm")),
        ("manual", dir.join("manual.wasm")),
        ("webhook", dir.join("webhook.wasm")),
        ("feed", dir.join("feed.wasm")),
        ("controller", controller.join("nodes.wasm")),
        ("controller_flow", controller.join("flow.json")),
    ];
    for (name, file) in files {
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
}
