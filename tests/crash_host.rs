//! `crash-host`: a stepwell host for the crash harness (`tests/crash.rs`).
//!
//! ```text
//! crash-host STORE SCENARIO [CRASH_AT PHASE]
//! ```
//!
//! Runs SCENARIO (`chain`, `ask`, `subworkflow`, `event`, `event-loop`,
//! `external`, `automation`) on STORE (`sqlite:PATH` or `json:DIR`) the way a host
//! recovering from a crash would: every start uses an explicit id
//! (create-if-absent), a parked run is resumed only if it still waits, and
//! the driver moves whatever is left.
//!
//! With CRASH_AT = n, the process aborts (no destructors, no flushing: like
//! `kill -9`) at the n-th persistence call (every store write: create,
//! claim, release, commit, append, quarantine, bundle):
//!
//! - `before`: before the call reaches the store;
//! - `after`: after it returned;
//! - `ledger`, `temp`, `published`, `lease` (JSON files only): inside the
//!   store's own write, at its crash points `ledger-appended` (a commit torn
//!   between its ledger append and its run file), `run-temp-written`,
//!   `run-published`, `lease-written`.
//!
//! On completion it prints `{"points": N, "kinds": [...]}` (the kind of each
//! persistence call) and exits 0; if a crash was asked for and never fired,
//! it exits 3 instead.
//!
//! The `external` scenario's effect (`side_effect`, class external) appends
//! its idempotency key to `side-effects.log` beside the store: the world
//! outside the host, which the harness checks was touched once.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Map, Value};
use stepwell::host::StoreSpec;
use stepwell::{
    Claim, Clock, EffectClass, EffectCx, EffectHandler, EngineConfig, Error, Fence, JsonFileStore,
    LeaseAfter, LeaseRequest, Outcome, RunQuery, RunState, RunStatus, Runtime, StartOptions,
    StepRecord, Store, StoreError, WasmEngine,
};

#[derive(Clone, Copy, PartialEq, Debug)]
enum Phase {
    Before,
    After,
    /// One of the JSON store's own crash points.
    Inside(&'static str),
}

struct Faults {
    calls: AtomicUsize,
    crash_at: Option<(usize, Phase)>,
    kinds: Mutex<Vec<&'static str>>,
}

impl Faults {
    fn maybe_crash(&self, n: usize, phase: Phase) {
        if self.crash_at == Some((n, phase)) {
            std::process::abort();
        }
    }
}

struct FaultStore {
    inner: Arc<dyn Store>,
    faults: Arc<Faults>,
}

impl FaultStore {
    /// Numbers a persistence call and crashes where asked.
    fn write<T>(
        &self,
        kind: &'static str,
        f: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let n = self.faults.calls.fetch_add(1, Ordering::SeqCst) + 1;
        self.faults.kinds.lock().unwrap().push(kind);
        self.faults.maybe_crash(n, Phase::Before);
        let out = f()?;
        self.faults.maybe_crash(n, Phase::After);
        Ok(out)
    }
}

impl Store for FaultStore {
    fn indexer(&self) -> std::sync::Arc<dyn stepwell::store::RunIndexer> {
        self.inner.indexer()
    }
    fn set_indexer(
        &self,
        indexer: std::sync::Arc<dyn stepwell::store::RunIndexer>,
    ) -> Result<(), StoreError> {
        self.inner.set_indexer(indexer)
    }
    fn load_run(&self, id: &str) -> Result<Option<RunState>, StoreError> {
        self.inner.load_run(id)
    }
    fn create_if_absent(&self, run: &RunState) -> Result<(RunState, bool), StoreError> {
        self.write("create", || self.inner.create_if_absent(run))
    }
    fn claim(&self, id: &str, lease: &LeaseRequest<'_>) -> Result<Claim, StoreError> {
        self.write("claim", || self.inner.claim(id, lease))
    }
    fn renew(
        &self,
        holder: &str,
        ids: &[String],
        until: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), StoreError> {
        // Renewals come from a timer thread: not a numbered point.
        self.inner.renew(holder, ids, until)
    }
    fn release(&self, id: &str, holder: &str) -> Result<(), StoreError> {
        self.write("release", || self.inner.release(id, holder))
    }
    fn commit(
        &self,
        records: &[StepRecord],
        run: &RunState,
        fence: Fence<'_>,
        lease: LeaseAfter,
    ) -> Result<(), StoreError> {
        // A commit that creates its run cannot be torn in two (there is no
        // run to leave behind).
        let kind = if fence.version == 0 {
            "create-commit"
        } else {
            "commit"
        };
        self.write(kind, || self.inner.commit(records, run, fence, lease))
    }
    fn append_ahead(&self, records: &[StepRecord], fence: Fence<'_>) -> Result<(), StoreError> {
        self.write("append", || self.inner.append_ahead(records, fence))
    }
    fn append_records(&self, r: &[StepRecord]) -> Result<(), StoreError> {
        self.write("append", || self.inner.append_records(r))
    }
    fn list_records(&self, id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.inner.list_records(id)
    }
    fn list_ahead(&self, id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.inner.list_ahead(id)
    }
    fn find_records(&self, id: &str, key: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.inner.find_records(id, key)
    }
    fn list_runs(&self, q: &RunQuery) -> Result<Vec<RunState>, StoreError> {
        self.inner.list_runs(q)
    }
    fn list_due(
        &self,
        now: chrono::DateTime<chrono::Utc>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.inner.list_due(now, limit)
    }
    fn list_claimable(
        &self,
        now: chrono::DateTime<chrono::Utc>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.inner.list_claimable(now, limit)
    }
    fn list_ended_children(&self, limit: usize) -> Result<Vec<(String, String)>, StoreError> {
        self.inner.list_ended_children(limit)
    }
    fn list_orphans(&self, limit: usize) -> Result<Vec<String>, StoreError> {
        self.inner.list_orphans(limit)
    }
    fn list_leased(&self, limit: usize) -> Result<Vec<(String, String)>, StoreError> {
        self.inner.list_leased(limit)
    }
    fn quarantine(&self, id: &str, reason: &str) -> Result<(), StoreError> {
        self.write("quarantine", || self.inner.quarantine(id, reason))
    }
    fn defer(
        &self,
        id: &str,
        reason: Option<&str>,
        until: &dyn Fn(u32) -> chrono::DateTime<chrono::Utc>,
    ) -> Result<u32, StoreError> {
        self.write("defer", || self.inner.defer(id, reason, until))
    }
    fn deferral(&self, id: &str) -> Result<Option<stepwell::store::Deferral>, StoreError> {
        self.inner.deferral(id)
    }
    fn list_quarantined(&self) -> Result<Vec<(String, String)>, StoreError> {
        self.inner.list_quarantined()
    }
    fn bundle_dir(&self, w: &str) -> Result<Option<std::path::PathBuf>, StoreError> {
        self.inner.bundle_dir(w)
    }
    fn deploy(
        &self,
        d: &stepwell::store::Deployment<'_>,
    ) -> Result<Vec<stepwell::store::Deployed>, StoreError> {
        self.write("bundle", || self.inner.deploy(d))
    }
    fn workflow_version(
        &self,
        w: &str,
        v: Option<u32>,
    ) -> Result<Option<stepwell::store::WorkflowVersion>, StoreError> {
        self.inner.workflow_version(w, v)
    }
    fn workflow_versions(
        &self,
        w: Option<&str>,
    ) -> Result<Vec<stepwell::store::WorkflowVersion>, StoreError> {
        self.inner.workflow_versions(w)
    }
    fn remove_versions(&self, v: &[stepwell::store::WorkflowVersion]) -> Result<usize, StoreError> {
        self.inner.remove_versions(v)
    }
    fn delete_runs(&self, ids: &[String]) -> Result<stepwell::store::Deleted, StoreError> {
        self.inner.delete_runs(ids)
    }
    fn version_use(&self, w: &str) -> Result<Vec<stepwell::store::VersionUse>, StoreError> {
        self.inner.version_use(w)
    }
    fn bundle_files(
        &self,
        digest: &str,
    ) -> Result<Vec<stepwell::flow::archive::BundleFile>, StoreError> {
        self.inner.bundle_files(digest)
    }
}

/// The `external` scenario's effect: writes its key to a file (the outside
/// world) and completes with it.
struct SideEffect {
    log: PathBuf,
}

impl EffectHandler for SideEffect {
    fn kind(&self) -> &str {
        "side_effect"
    }
    fn class(&self) -> EffectClass {
        EffectClass::External
    }
    fn execute(
        &self,
        cx: &EffectCx<'_>,
        _: &Map<String, Value>,
        _: Option<&Value>,
    ) -> stepwell::Result<Outcome> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("side-effects.log");
        writeln!(f, "{}", cx.key).expect("write the side effect");
        Ok(Outcome::Completed(json!({ "key": cx.key })))
    }
}

/// `llm_call` against the loopback server the harness names in
/// `STEPWELL_CRASH_LLM_URL` (the `llm` scenario).
fn llm_call() -> stepwell::llm::LlmCall {
    let url =
        std::env::var("STEPWELL_CRASH_LLM_URL").unwrap_or_else(|_| "http://127.0.0.1:9/v1".into());
    let provider = stepwell::llm::Provider {
        timeout_s: Some(10.0),
        ..stepwell::llm::Provider::new("mock", &url, Some("mock-model"))
    };
    stepwell::llm::LlmCall::new(stepwell::llm::Providers::only(provider))
}

fn start(rt: &Runtime, wf: &str, id: &str, vars: Value) -> Result<(), Error> {
    rt.start(
        wf,
        StartOptions {
            vars: serde_json::from_value(vars).unwrap(),
            run_id: Some(id.into()),
            ..StartOptions::default()
        },
    )
    .map(|_| ())
}

fn settle(rt: &Runtime) -> Result<(), Error> {
    for _ in 0..20 {
        let report = rt.drive_once()?;
        if !report.moved_anything() && report.busy.is_empty() {
            break;
        }
        if !report.busy.is_empty() {
            // Another host holds a run: give it a moment.
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    Ok(())
}

/// Writes a scratch bundle beside the store (the same files every time).
fn bundle(root: &Path, name: &str, files: &[(&str, Value)]) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    for (file, doc) in files {
        let path = dir.join(file);
        let text = serde_json::to_string_pretty(doc).unwrap();
        if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
            // Published whole (two hosts at once write the same bundle: the
            // other must never read half a file).
            let tmp = dir.join(format!(".{file}.{}.tmp", std::process::id()));
            std::fs::write(&tmp, text).unwrap();
            std::fs::rename(&tmp, &path).unwrap();
        }
    }
    dir
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (spec, scenario) = (StoreSpec::parse(&args[0])?, args[1].as_str());
    let crash_at = match (args.get(2), args.get(3).map(String::as_str)) {
        (Some(n), Some(phase)) => Some((
            n.parse()?,
            match phase {
                "before" => Phase::Before,
                "after" => Phase::After,
                "ledger" => Phase::Inside("ledger-appended"),
                "temp" => Phase::Inside("run-temp-written"),
                "published" => Phase::Inside("run-published"),
                "lease" => Phase::Inside("lease-written"),
                other => return Err(format!("unknown phase {other}").into()),
            },
        )),
        _ => None,
    };
    let faults = Arc::new(Faults {
        calls: AtomicUsize::new(0),
        crash_at,
        kinds: Mutex::new(Vec::new()),
    });
    let root = match &spec {
        StoreSpec::Sqlite(p) => p.parent().unwrap().to_path_buf(),
        StoreSpec::Json(d) => d.parent().unwrap().to_path_buf(),
        // A database elsewhere: the side files go where the test says.
        StoreSpec::Postgres(_) => PathBuf::from(std::env::var("STEPWELL_CRASH_DIR")?),
        StoreSpec::Memory => return Err("a crash harness needs a store that persists".into()),
    };
    let inner: Arc<dyn Store> = match &spec {
        StoreSpec::Json(dir) => {
            let f = faults.clone();
            Arc::new(
                JsonFileStore::open(dir)?.with_crash_points(Arc::new(move |name| {
                    let n = f.calls.load(Ordering::SeqCst);
                    if let Some((at, Phase::Inside(point))) = f.crash_at {
                        if at == n && point == name {
                            std::process::abort();
                        }
                    }
                })),
            )
        }
        other => other.open(None)?,
    };
    let store = Arc::new(FaultStore {
        inner,
        faults: faults.clone(),
    });
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let engine = WasmEngine::new(EngineConfig {
        cache_dir: Some(repo.join("target/stepwell-test-cache")),
        ..EngineConfig::default()
    })?;
    // The `loop` scenario's node loops to itself until the visit budget
    // ends the run: every visit's record has the same content.
    let config = if scenario == "loop" {
        stepwell::RuntimeConfig {
            max_node_visits: 6,
            ..stepwell::RuntimeConfig::default()
        }
    } else {
        stepwell::RuntimeConfig::default()
    };
    // The `automation` scenario moves a clock of its own, kept beside the
    // store: like a wall clock, it does not go back when a host restarts.
    let clock_file = root.join("clock.txt");
    let clock_start = std::fs::read_to_string(&clock_file)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or_else(|| "2026-01-01T00:00:00Z".parse().unwrap());
    let clock = Arc::new(stepwell::ManualClock::new(clock_start));
    let advance = |to: chrono::DateTime<chrono::Utc>| {
        if to > clock.now() {
            let tmp = root.join(format!(".clock.{}.tmp", std::process::id()));
            std::fs::write(&tmp, to.to_rfc3339()).unwrap();
            std::fs::rename(&tmp, &clock_file).unwrap();
            clock.set(to);
        }
    };
    let rt = stepwell::builder(store.clone())
        .engine(engine)
        .config(config)
        .clock(clock.clone())
        .effect(Arc::new(SideEffect {
            log: root.join("side-effects.log"),
        }))
        .effect(Arc::new(llm_call()))
        .build()?;
    let examples = repo.join("flows/examples");
    match scenario {
        "chain" => {
            rt.load_bundle(&examples.join("chain"))?;
            start(&rt, "chain", "crash-chain", json!({}))?;
            rt.tick("crash-chain")?;
        }
        "ask" => {
            rt.load_bundle(&examples.join("ask-user"))?;
            start(&rt, "ask-user", "crash-ask", json!({}))?;
            let state = rt.tick("crash-ask")?;
            if let (RunStatus::Waiting, Some(w)) = (state.status, state.waiting) {
                match rt.resume("crash-ask", &w.wait_key, json!({"text": "Bob"})) {
                    Ok(_) | Err(Error::StaleResume { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        "subworkflow" => {
            rt.load_bundle(&examples.join("subworkflow"))?;
            start(
                &rt,
                "subworkflow",
                "crash-sub",
                json!({"text": "hi", "child_run_id": "crash-child"}),
            )?;
            rt.tick("crash-sub")?;
        }
        "event" => {
            rt.load_bundle(&examples.join("event"))?;
            start(&rt, "event", "crash-waiter", json!({}))?;
            rt.tick("crash-waiter")?;
            start(
                &rt,
                "event.emitter",
                "crash-emitter",
                json!({"payload": {"order": 7}}),
            )?;
            rt.tick("crash-emitter")?;
        }
        "event-loop" => {
            // The listener waits on the same key again once resumed: a
            // replayed emit must not resume it a second time.
            let wait = |key: &str, next: &str| {
                json!({"effect": "wait_event", "payload": {"name": "tick", "scope": "global"},
                       "result_key": key, "next": next})
            };
            let dir = bundle(
                &root,
                "event-loop",
                &[
                    (
                        "flow.json",
                        json!({"workflow_id": "looper", "entry": "first",
                               "nodes": {"first": wait("e1", "second"), "second": wait("e2", "done"),
                                         "done": {"complete": {"e1": {"$var": "e1.payload"}, "e2": {"$var": "e2.payload"}}}}}),
                    ),
                    (
                        "ticker.flow.json",
                        json!({"workflow_id": "ticker", "entry": "emit",
                               "nodes": {"emit": {"effect": "emit_event",
                                                  "payload": {"name": "tick", "scope": "global", "payload": {"n": 1}},
                                                  "result_key": "sent", "next": "done"},
                                         "done": {"complete": {"$var": "sent.delivered"}}}}),
                    ),
                ],
            );
            rt.load_bundle(&dir)?;
            start(&rt, "looper", "crash-looper", json!({}))?;
            rt.tick("crash-looper")?;
            start(&rt, "ticker", "crash-ticker", json!({}))?;
            rt.tick("crash-ticker")?;
        }
        "loop" => {
            let step = examples.join("chain/step.wasm");
            let dir = bundle(
                &root,
                "loop",
                &[(
                    "flow.json",
                    json!({"workflow_id": "loop", "entry": "n0",
                           "nodes": {"n0": {"component": step, "next": "n0"}}}),
                )],
            );
            rt.load_bundle(&dir)?;
            start(&rt, "loop", "crash-loop", json!({}))?;
            rt.tick("crash-loop")?;
        }
        "llm" => {
            let dir = bundle(
                &root,
                "llm",
                &[(
                    "flow.json",
                    json!({"workflow_id": "llm", "entry": "ask",
                           "nodes": {"ask": {"effect": "llm_call", "payload": {"prompt": "Hello"},
                                             "result_key": "answer", "next": "done"},
                                     "done": {"complete": {"$var": "answer.content"}}}}),
                )],
            );
            rt.load_bundle(&dir)?;
            start(&rt, "llm", "crash-llm", json!({}))?;
            rt.tick("crash-llm")?;
        }
        "tools" => {
            // Two writes, each waiting for a person's approval and run
            // inside the resume: each appends a line to ws/log.txt (what
            // the harness counts).
            let append = |line: &str| {
                json!({"tool_calls": [{"name": "write_file", "call_id": line,
                    "arguments": {"file_path": "log.txt", "content": format!("{line}\n"), "mode": "a"}}]})
            };
            let dir = bundle(
                &root,
                "tools",
                &[(
                    "flow.json",
                    json!({"workflow_id": "tools", "entry": "first",
                           "nodes": {"first": {"effect": "tool_calls", "payload": append("one"),
                                               "result_key": "first", "next": "second"},
                                     "second": {"effect": "tool_calls", "payload": append("two"),
                                                "result_key": "second", "next": "done"},
                                     "done": {"complete": {"first": {"$var": "first.results.0.success"},
                                                           "second": {"$var": "second.results.0.success"}}}}}),
                )],
            );
            rt.load_bundle(&dir)?;
            let ws = root.join("ws");
            start(
                &rt,
                "tools",
                "crash-tools",
                json!({"workspace_root": ws.to_str().unwrap()}),
            )?;
            let mut state = rt.tick("crash-tools")?;
            while state.status == RunStatus::Waiting {
                state = match rt.respond("crash-tools", json!({"approved": true})) {
                    Ok(s) => s,
                    Err(Error::StaleResume { .. }) => rt.get_state("crash-tools")?,
                    Err(e) => return Err(e.into()),
                };
            }
        }
        "external" => {
            let dir = bundle(
                &root,
                "external",
                &[(
                    "flow.json",
                    json!({"workflow_id": "external", "entry": "call",
                           "nodes": {"call": {"effect": "side_effect", "payload": {},
                                              "result_key": "out", "next": "done"},
                                     "done": {"complete": {"$var": "out"}}}}),
                )],
            );
            rt.load_bundle(&dir)?;
            start(&rt, "external", "crash-external", json!({}))?;
            rt.tick("crash-external")?;
        }
        "automation" => {
            // A flaky occurrence retried once after its backoff, then a
            // run-now: admission, dispatch, retry scheduling, completion
            // and a command, each a commit a crash may cut.
            use stepwell::automation::{apply_automation_command, create_automation, Command};
            let target = repo.join("flows/automations/flaky").canonicalize()?;
            let request = json!({
                "request_id": "crash-automation", "title": "Crash",
                "target": {"workflow_id": "flaky", "bundle_ref": target.display().to_string(),
                           "flow_id": "flaky", "input_data": {"prompt": "p", "fail_until": 2}},
                "trigger": {"source_id": "schedule", "source_version": 1,
                            "config": {"start_at": "2026-01-01T00:00:00Z", "every": "1h"}},
                "workspace_root": "/tmp/crash-automation",
            });
            let t = |s: &str| -> chrono::DateTime<chrono::Utc> { s.parse().unwrap() };
            create_automation(&rt, &request, clock.now(), None)?;
            settle(&rt)?;
            advance(t("2026-01-01T00:00:31Z"));
            settle(&rt)?;
            let id = stepwell::automation::automation_id("local", "local", "crash-automation");
            apply_automation_command(
                &rt,
                &Command {
                    automation_id: &id,
                    command_id: "run-1",
                    command_type: "run_now",
                    ..Command::default()
                },
                clock.now(),
            )?;
            // A person-waiting occurrence stopped (its run cancelled, the
            // controller resumed: follow-ups after the command's commit,
            // run again when the command is sent again), then archive and
            // unarchive (a revived controller).
            let ask = repo.join("flows/automations/ask").canonicalize()?;
            let request = json!({
                "request_id": "crash-ask", "title": "Crash ask",
                "target": {"workflow_id": "ask", "bundle_ref": ask.display().to_string(),
                           "flow_id": "ask", "input_data": {}},
                "trigger": {"source_id": "schedule", "source_version": 1,
                            "config": {"start_at": "2026-01-01T00:00:00Z", "every": "1h"}},
                "workspace_root": "/tmp/crash-automation",
            });
            create_automation(&rt, &request, clock.now(), None)?;
            settle(&rt)?;
            let ask_id = stepwell::automation::automation_id("local", "local", "crash-ask");
            for (command_id, kind) in [
                ("stop-1", "stop_current"),
                ("arch-1", "archive"),
                ("un-1", "unarchive"),
            ] {
                let answer = apply_automation_command(
                    &rt,
                    &Command {
                        automation_id: &ask_id,
                        command_id,
                        command_type: kind,
                        ..Command::default()
                    },
                    clock.now(),
                )?;
                if answer["status"] != "applied" {
                    return Err(format!("{kind}: {answer}").into());
                }
                settle(&rt)?;
            }
        }
        other => return Err(format!("unknown scenario {other}").into()),
    }
    settle(&rt)?;
    if crash_at.is_some() {
        // The fault never fired (no such point in this run).
        std::process::exit(3);
    }
    println!(
        "{}",
        json!({
            "points": faults.calls.load(Ordering::SeqCst),
            "kinds": *faults.kinds.lock().unwrap(),
        })
    );
    Ok(())
}
