//! What the plugin flow keeps that the kernel kept before features were
//! plugins: the controller's effects and workflow are its own, and the
//! kernel's low-level calls a feature uses cannot be turned against a run.

use std::sync::Arc;

use serde_json::{json, Map, Value};
use stepwell::automation::CONTROLLER_WORKFLOW_ID;
use stepwell::core::plugin::{Install, Plugin};
use stepwell::{EffectClass, EffectCx, EffectHandler, Outcome, Runtime, StartOptions};

struct Fake(&'static str);

impl EffectHandler for Fake {
    fn kind(&self) -> &str {
        self.0
    }
    fn class(&self) -> EffectClass {
        EffectClass::Pure
    }
    fn execute(
        &self,
        _cx: &EffectCx<'_>,
        _payload: &Map<String, Value>,
        _prepared: Option<&Value>,
    ) -> stepwell::Result<Outcome> {
        Ok(Outcome::Completed(json!("hijacked")))
    }
}

/// A plugin of the application's that registers effects of its own.
struct AppEffects(Vec<Arc<dyn EffectHandler>>);

impl Plugin for AppEffects {
    fn name(&self) -> &'static str {
        "app-effects"
    }
    fn install(&self, cx: &mut Install<'_>) -> stepwell::Result<()> {
        for h in &self.0 {
            cx.effect(h.clone())?;
        }
        Ok(())
    }
}

/// "The controller's own effects: an application cannot replace them"
/// (crates/automation/src/plugin.rs), as the old `Runtime::build` ensured.
#[test]
fn no_application_code_replaces_the_controller_effects() {
    let ours: Vec<Arc<dyn EffectHandler>> = stepwell::automation::decisions::protocol::EFFECTS
        .iter()
        .map(|k| Arc::new(Fake(k)) as Arc<dyn EffectHandler>)
        .collect();
    let rt = stepwell::builder(Arc::new(stepwell::MemoryStore::new()))
        .engine(stepwell_tests::engine())
        .plugin(Arc::new(AppEffects(ours.clone())))
        .build();
    let err = rt.expect_err("a plugin after `automations` replaced the controller's effects");
    assert!(err.to_string().contains("is sealed"), "{err}");
    // Given to the builder by the application, they do not win either.
    let mut builder =
        stepwell::builder(Arc::new(stepwell::MemoryStore::new())).engine(stepwell_tests::engine());
    for h in &ours {
        builder = builder.effect(h.clone());
    }
    let rt = builder.build().unwrap();
    for h in &ours {
        let got = rt.effects().get(h.kind()).unwrap();
        assert!(
            !Arc::ptr_eq(got, h),
            "the application replaced {}",
            h.kind()
        );
    }
}

/// A run that is not waiting must not panic the host through the public
/// `Runtime::end_wait`.
#[test]
fn end_wait_on_a_run_that_does_not_wait_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let rt = stepwell::builder(Arc::new(stepwell::MemoryStore::new()))
        .engine(stepwell_tests::engine())
        .build()
        .unwrap();
    let b = stepwell_tests::write_bundle(
        dir.path(),
        "b",
        &[(
            "flow.json",
            json!({"workflow_id": "plain", "entry": "end",
                   "nodes": {"end": {"complete": {"ok": true}}}}),
        )],
    );
    rt.load_bundle(&b).unwrap();
    let mut run = rt.new_run("plain", StartOptions::default()).unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.end_wait(&mut run, json!(null), "resumed", None)
    }));
    let r = r.expect("pub Runtime::end_wait panicked on a running run");
    let err = r.expect_err("a run that does not wait has no wait to end");
    assert!(err.to_string().contains("is not waiting"), "{err}");
}

/// A caller cannot start the controller's runs, nor define its workflow in
/// a bundle (only the automations plugin creates its runs, through the
/// kernel's hidden `new_run`).
#[test]
fn callers_cannot_start_or_define_the_controller() {
    let dir = tempfile::tempdir().unwrap();
    let rt = stepwell::builder(Arc::new(stepwell::MemoryStore::new()))
        .engine(stepwell_tests::engine())
        .build()
        .unwrap();
    for err in [
        rt.start(CONTROLLER_WORKFLOW_ID, Default::default())
            .unwrap_err(),
        rt.run(CONTROLLER_WORKFLOW_ID, Default::default())
            .unwrap_err(),
    ] {
        assert!(
            err.to_string().contains("is the automation controller"),
            "{err}"
        );
    }
    let b = stepwell_tests::write_bundle(
        dir.path(),
        "impostor",
        &[(
            "flow.json",
            json!({"workflow_id": CONTROLLER_WORKFLOW_ID, "entry": "end",
                   "nodes": {"end": {"complete": {"ok": true}}}}),
        )],
    );
    let err = rt.load_bundle(&b).unwrap_err();
    assert!(
        err.to_string()
            .contains("is reserved for the automation controller"),
        "{err}"
    );
}

/// A bundle defining the controller's id, loaded by a runtime without the
/// automations plugin (the bare kernel, or a build without `automation`)
/// on a shared PostgreSQL store, must never become the controller of a
/// host that has the plugin: the controller's effects would run under a
/// flow the host did not write.
#[test]
fn an_impostor_controller_recorded_by_a_bare_runtime_is_not_the_controller() {
    if stepwell_tests::postgres_skipped() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bare = Runtime::builder(Arc::new(stepwell_tests::open_postgres(dir.path())))
        .engine(stepwell_tests::engine())
        .build()
        .unwrap();
    let b = stepwell_tests::write_bundle(
        dir.path(),
        "impostor",
        &[
            (
                "flow.json",
                json!({"workflow_id": "innocent", "entry": "end",
                       "nodes": {"end": {"complete": {"ok": true}}}}),
            ),
            (
                "controller.flow.json",
                json!({"workflow_id": CONTROLLER_WORKFLOW_ID, "entry": "hijacked",
                       "nodes": {"hijacked": {"complete": {"hijacked": true}}}}),
            ),
        ],
    );
    // Accepted: the bare kernel reserves nothing.
    bare.load_bundle(&b).unwrap();
    drop(bare);

    let full = stepwell::builder(Arc::new(stepwell_tests::open_postgres(dir.path())))
        .engine(stepwell_tests::engine())
        .build()
        .unwrap();
    // Any use of the bundle's innocent workflow...
    let _ = full.workflow("innocent");
    // ...must not register the impostor under the controller's id.
    let controller = full.workflow(CONTROLLER_WORKFLOW_ID).unwrap();
    assert!(
        !controller.nodes.contains_key("hijacked"),
        "the full host's controller is the impostor flow (entry {})",
        controller.entry
    );
}

/// `hold_taking` takes the in-process lock of `run_id`: it must commit that
/// run only. Committing run B (held by this runtime through `claim`) would
/// release B's lease, and another host could take B while it executes.
#[test]
fn a_hold_commits_only_its_own_run() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn stepwell::Store> = Arc::new(stepwell::MemoryStore::new());
    let rt = stepwell::builder(store.clone())
        .engine(stepwell_tests::engine())
        .build()
        .unwrap();
    let b = stepwell_tests::write_bundle(
        dir.path(),
        "w",
        &[(
            "flow.json",
            json!({"workflow_id": "w", "entry": "wait",
                   "nodes": {"wait": {"effect": "wait_event", "payload": {"wait_key": "k"},
                                      "result_key": "r", "next": "end"},
                             "end": {"complete": {"ok": true}}}}),
        )],
    );
    rt.load_bundle(&b).unwrap();
    for id in ["A", "B"] {
        rt.start(
            "w",
            StartOptions {
                run_id: Some(id.into()),
                ..Default::default()
            },
        )
        .unwrap();
    }
    let (_held_b, _) = rt.claim("B", std::time::Duration::ZERO).unwrap();
    let other = rt.get_state("B").unwrap();
    // A hold on A does not start from B's state...
    let refused = rt.hold_taking("A", std::time::Duration::ZERO, Some(other.clone()));
    assert!(refused.is_err(), "a hold on A took run B's state");
    // ...nor commit B.
    let (mut txn_a, _) = rt
        .hold_taking("A", std::time::Duration::ZERO, None)
        .unwrap();
    let mut forged = other;
    forged.vars.insert("forged".into(), json!(true));
    let committed = txn_a.commit(vec![], &mut forged);
    drop(txn_a);
    let now = chrono::Utc::now();
    let stolen = store
        .claim(
            "B",
            &stepwell::LeaseRequest {
                holder: "another-host",
                now,
                until: now + chrono::Duration::seconds(30),
                dead_holder: None,
            },
        )
        .unwrap();
    assert!(
        committed.is_err(),
        "a hold on A committed run B (B's lease now free to another host: {})",
        matches!(stolen, stepwell::Claim::Held(_))
    );
    assert!(
        !matches!(stolen, stepwell::Claim::Held(_)),
        "another host took run B while this runtime holds it"
    );
}
