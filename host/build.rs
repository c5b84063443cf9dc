//! Embeds the built-in trigger sources (`schedule@1`, `manual@1`), the
//! built-in workspace tools and the automation controller's nodes in the
//! library: they are components built
//! from `flows/triggers/builtin/` and `flows/automation-controller/` by
//! `scripts/build-guests`, which must run before the host is built with
//! the `tools` or `automation` feature (the kernel alone needs none).

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
    // Each only with the feature that embeds it: an embedder of the kernel
    // alone needs no guest built.
    let on = |feature: &str| std::env::var_os(format!("CARGO_FEATURE_{feature}")).is_some();
    let (tools_on, automation_on) = (on("TOOLS"), on("AUTOMATION"));
    let files = [
        ("tools_workspace", tools.join("workspace.wasm"), tools_on),
        ("schedule", dir.join("schedule.wasm"), automation_on),
        ("manual", dir.join("manual.wasm"), automation_on),
        ("webhook", dir.join("webhook.wasm"), automation_on),
        ("feed", dir.join("feed.wasm"), automation_on),
        ("controller", controller.join("nodes.wasm"), automation_on),
        (
            "controller_flow",
            controller.join("flow.json"),
            automation_on,
        ),
    ];
    for (name, file, wanted) in files {
        if !wanted {
            continue;
        }
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
