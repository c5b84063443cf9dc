//! Bad flow documents get an error naming the file and the field, and
//! nothing is written.

use std::path::Path;

use serde_json::{json, Value};
use stepwell::flow::FlowError;
use stepwell::{Error, RunQuery};
use stepwell_tests::{component, write_bundle, Backend, Host};

fn greet() -> String {
    component("hello/greet.wasm").display().to_string()
}

/// Loads a one-file bundle holding `text` and returns the flow error.
fn load_text(h: &Host, name: &str, text: &str) -> FlowError {
    let dir = h.dir.path().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("flow.json"), text).unwrap();
    load_dir(h, &dir)
}

fn load_dir(h: &Host, dir: &Path) -> FlowError {
    match h.rt.load_bundle(dir) {
        Err(Error::Flow(e)) => {
            // Nothing was written: no run, no recorded bundle.
            assert!(h.rt.list_runs(&RunQuery::default()).unwrap().is_empty());
            e
        }
        other => panic!("expected a flow error, got {other:?}"),
    }
}

fn load_doc(h: &Host, name: &str, doc: Value) -> FlowError {
    load_text(h, name, &serde_json::to_string_pretty(&doc).unwrap())
}

fn check(e: &FlowError, file: &str, field: &str, message: &str) {
    assert!(
        e.path.ends_with(file),
        "path {} should end with {file}",
        e.path.display()
    );
    assert_eq!(e.field, field, "{e}");
    assert!(e.message.contains(message), "{e}");
    let shown = e.to_string();
    assert!(shown.starts_with("invalid_definition: "), "{shown}");
    assert!(shown.contains(file) && shown.contains(field), "{shown}");
}

fn all_bad_documents_are_refused(b: Backend) {
    let h = Host::new(b);
    let e = load_text(&h, "syntax", "{\"workflow_id\": \"x\", \"entry\": ");
    check(
        &e,
        "syntax/flow.json",
        "entry",
        "EOF while parsing a value at line 1",
    );

    let e = load_doc(
        &h,
        "unknown-field",
        json!({"workflow_id": "x", "entry": "a", "nodes": {"a": {"component": greet(), "componnt": 1}}}),
    );
    check(
        &e,
        "unknown-field/flow.json",
        "nodes.a.componnt",
        "unknown field",
    );

    let e = load_doc(
        &h,
        "top-field",
        json!({"workflow_id": "x", "entry": "a", "nodes": {}, "extra": true}),
    );
    check(&e, "top-field/flow.json", "extra", "unknown field");

    let e = load_doc(
        &h,
        "no-entry",
        json!({"workflow_id": "x", "nodes": {"a": {"complete": 1}}}),
    );
    check(&e, "no-entry/flow.json", "", "missing field `entry`");

    let e = load_doc(
        &h,
        "bad-entry",
        json!({"workflow_id": "x", "entry": "zz", "nodes": {"a": {"complete": 1}}}),
    );
    check(&e, "bad-entry/flow.json", "entry", "\"zz\" is not defined");

    let e = load_doc(
        &h,
        "bad-next",
        json!({"workflow_id": "x", "entry": "a", "nodes": {"a": {"component": greet(), "next": "gone"}}}),
    );
    check(
        &e,
        "bad-next/flow.json",
        "nodes.a.next",
        "unknown node \"gone\"",
    );

    let e = load_doc(
        &h,
        "bad-route",
        json!({"workflow_id": "x", "entry": "a", "nodes": {"a": {"component": greet(), "routes": {"yes": "gone"}}}}),
    );
    check(
        &e,
        "bad-route/flow.json",
        "nodes.a.routes.yes",
        "unknown node \"gone\"",
    );

    let e = load_doc(
        &h,
        "missing-component",
        json!({"workflow_id": "x", "entry": "a", "nodes": {"a": {"component": "nope.wasm"}}}),
    );
    check(
        &e,
        "missing-component/flow.json",
        "nodes.a.component",
        "not found",
    );

    let e = load_doc(
        &h,
        "two-kinds",
        json!({"workflow_id": "x", "entry": "a", "nodes": {"a": {"component": greet(), "complete": 1}}}),
    );
    check(&e, "two-kinds/flow.json", "nodes.a", "exactly one of");

    let e = load_doc(
        &h,
        "bad-effect",
        json!({"workflow_id": "x", "entry": "a", "nodes": {"a": {"effect": "launch_rockets"}}}),
    );
    check(
        &e,
        "bad-effect/flow.json",
        "nodes.a.effect",
        "unknown effect \"launch_rockets\"",
    );

    let e = load_doc(
        &h,
        "bad-payload",
        json!({"workflow_id": "x", "entry": "a", "nodes": {"a": {"effect": "ask_user", "payload": [1]}}}),
    );
    check(
        &e,
        "bad-payload/flow.json",
        "nodes.a.payload",
        "JSON object",
    );

    let e = load_doc(
        &h,
        "bad-id",
        json!({"workflow_id": "has space", "entry": "a", "nodes": {"a": {"complete": 1}}}),
    );
    check(&e, "bad-id/flow.json", "workflow_id", "not a valid id");

    let e = load_doc(
        &h,
        "complete-next",
        json!({"workflow_id": "x", "entry": "a", "nodes": {"a": {"complete": 1, "next": "a"}}}),
    );
    check(&e, "complete-next/flow.json", "nodes.a", "ends the run");

    let e = load_doc(
        &h,
        "complete-key",
        json!({"workflow_id": "x", "entry": "a", "nodes": {"a": {"complete": 1, "result_key": "k"}}}),
    );
    check(&e, "complete-key/flow.json", "nodes.a", "result_key");

    let e = load_doc(
        &h,
        "host-key",
        json!({"workflow_id": "x", "entry": "a", "nodes": {"a": {"effect": "vars_query", "payload": {"path": "x"}, "result_key": "_runtime.effect_seq"}}}),
    );
    check(
        &e,
        "host-key/flow.json",
        "nodes.a.result_key",
        "owned by the host",
    );

    let e = load_doc(
        &h,
        "wrong-type",
        json!({"workflow_id": "x", "entry": "a", "nodes": {"a": {"component": 5}}}),
    );
    check(
        &e,
        "wrong-type/flow.json",
        "nodes.a.component",
        "invalid type",
    );

    // A bundle without flow.json, and a duplicate workflow id across files.
    let empty = h.dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let e = load_dir(&h, &empty);
    assert!(e.message.contains("no flow.json"), "{e}");

    let dup = write_bundle(
        h.dir.path(),
        "dup",
        &[
            (
                "flow.json",
                json!({"workflow_id": "same", "entry": "a", "nodes": {"a": {"complete": 1}}}),
            ),
            (
                "other.flow.json",
                json!({"workflow_id": "same", "entry": "a", "nodes": {"a": {"complete": 2}}}),
            ),
        ],
    );
    let e = load_dir(&h, &dup);
    check(&e, "dup/other.flow.json", "workflow_id", "already defined");

    // A broken extra file refuses the whole bundle: its good main workflow is
    // not registered either.
    let partial = write_bundle(
        h.dir.path(),
        "partial",
        &[
            (
                "flow.json",
                json!({"workflow_id": "partial-main", "entry": "a", "nodes": {"a": {"complete": 1}}}),
            ),
            (
                "child.flow.json",
                json!({"workflow_id": "partial-child", "entry": "nope", "nodes": {"a": {"complete": 2}}}),
            ),
        ],
    );
    let e = load_dir(&h, &partial);
    check(&e, "partial/child.flow.json", "entry", "not defined");
    for wf in ["partial-main", "partial-child"] {
        let err = h.rt.start(wf, Default::default()).unwrap_err();
        assert_eq!(err.reason_code(), "unknown_workflow", "{err}");
    }
    assert!(
        h.store.workflow_versions(None).unwrap().is_empty(),
        "nothing recorded"
    );
}

fn every_example_flow_loads(b: Backend) {
    let h = Host::new(b);
    for name in [
        "hello",
        "hello-py",
        "ask-user",
        "wait-until",
        "subworkflow",
        "event",
        "chain",
        "runaway",
    ] {
        let bundle = h.rt.load_bundle(&stepwell_tests::example(name)).unwrap();
        assert_eq!(bundle.main_workflow_id, name);
    }
}

fn a_complete_node_may_output_null(b: Backend) {
    let h = Host::new(b);
    let wf = h.load_scratch(
        "null",
        &[(
            "flow.json",
            json!({"workflow_id": "null", "entry": "a", "nodes": {"a": {"complete": null}}}),
        )],
    );
    let id = h.rt.start(&wf, Default::default()).unwrap();
    let done = h.rt.tick(&id).unwrap();
    assert_eq!(done.status, stepwell::RunStatus::Completed);
    assert_eq!(done.output, Some(Value::Null));
}

stepwell_tests::store_tests!(
    all_bad_documents_are_refused,
    every_example_flow_loads,
    a_complete_node_may_output_null
);
