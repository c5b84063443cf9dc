//! The HTTP load test of `stepwell bench` (figures `http_*`): a server on
//! loopback (in this process, on its own SQLite file, the driver on), a
//! bounded client starting runs of the ask-user example over HTTP, then
//! resuming many of them at once, while subscribers follow the store's
//! stream. It fails unless every answer was a success, every run exists
//! once, and every subscriber saw every completion.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};
use stepwell::triggers::Connections as _;

use serde_json::{json, Map, Value};
use stepwell::store::SqliteStore;
use stepwell::wasm::WasmEngine;
use stepwell::{Error, Result, RunQuery, RunStatus};
use stepwell_serve::{ServeOptions, Server};

/// How big the load is.
#[derive(Debug, Clone)]
pub struct HttpLoad {
    /// Signed webhook calls sent (`webhook_accept_per_s`).
    pub webhooks: usize,
    /// Runs started over HTTP.
    pub starts: usize,
    /// Client threads starting them.
    pub start_clients: usize,
    /// Runs resumed at once (one thread each).
    pub resumes: usize,
    /// Subscribers of the store's stream.
    pub subscribers: usize,
}

fn fail(message: impl Into<String>) -> Error {
    Error::InvalidInput {
        field: "bench http".into(),
        message: message.into(),
    }
}

/// The `p` quantile of `xs` (nearest rank; NaN for none).
pub(crate) fn percentile(mut xs: Vec<f64>, p: f64) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    if xs.is_empty() {
        return f64::NAN;
    }
    let i = ((xs.len() as f64 - 1.0) * p).round() as usize;
    xs[i.min(xs.len() - 1)]
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .max_idle_connections_per_host(64)
        .build()
        .into()
}

/// Runs the load test in `dir`; the figures.
pub fn http_load(
    load: &HttpLoad,
    flows_dir: &Path,
    engine: &WasmEngine,
    dir: &Path,
) -> Result<Map<String, Value>> {
    std::fs::create_dir_all(dir).map_err(|e| fail(e.to_string()))?;
    let store = Arc::new(SqliteStore::open(dir.join("http.sqlite"))?);
    let rt = stepwell::builder(store).engine(engine.clone()).build()?;
    let bundle = flows_dir
        .join("examples/ask-user")
        .canonicalize()
        .map_err(|e| fail(format!("the ask-user example: {e}")))?;
    rt.load_bundle(&bundle)?;
    let mut options = ServeOptions::new(dir.join("serve-token"));
    options.listen = "127.0.0.1:0".parse().expect("an address");
    let server = Server::bind(rt.clone(), options)?;
    let base = format!("http://{}", server.local_addr());
    let token = std::fs::read_to_string(dir.join("serve-token"))
        .map_err(|e| fail(e.to_string()))?
        .trim()
        .to_string();
    let stopper = server.stopper();
    let serving = std::thread::spawn(move || server.run());
    let auth = format!("Bearer {token}");
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));

    // Subscribers of the store's stream: the runs they saw complete.
    let mut followers = Vec::new();
    let ready = Arc::new(Barrier::new(load.subscribers + 1));
    for _ in 0..load.subscribers {
        let (base, auth, ready, errors) =
            (base.clone(), auth.clone(), ready.clone(), errors.clone());
        followers.push(std::thread::spawn(move || {
            let response = agent()
                .get(format!("{base}/v1/stream"))
                .header("Authorization", &auth)
                .config()
                .timeout_global(None)
                .build()
                .call();
            ready.wait();
            let mut completed = HashSet::new();
            let mut response = match response {
                Ok(r) if r.status() == 200 => r,
                Ok(r) => {
                    errors
                        .lock()
                        .unwrap()
                        .push(format!("stream: {}", r.status()));
                    return completed;
                }
                Err(e) => {
                    errors.lock().unwrap().push(format!("stream: {e}"));
                    return completed;
                }
            };
            let reader = BufReader::new(response.body_mut().as_reader());
            let mut event = String::new();
            for line in reader.lines() {
                let Ok(line) = line else { break };
                if let Some(e) = line.strip_prefix("event: ") {
                    event = e.to_string();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    if event == "run" {
                        if let Ok(v) = serde_json::from_str::<Value>(d) {
                            if v["status"] == "completed" {
                                completed
                                    .insert(v["run_id"].as_str().unwrap_or_default().to_string());
                            }
                        }
                    }
                }
            }
            completed
        }));
    }
    ready.wait();

    // Starts: a bounded pool of clients.
    let next = Arc::new(AtomicUsize::new(0));
    let started_ids = Arc::new(Mutex::new(Vec::<String>::new()));
    let start_times = Arc::new(Mutex::new(Vec::<f64>::new()));
    let body = json!({"workflow_id": "ask-user"}).to_string();
    let t = Instant::now();
    let clients: Vec<_> = (0..load.start_clients)
        .map(|_| {
            let (base, auth, next, ids, times, errors, body) = (
                base.clone(),
                auth.clone(),
                next.clone(),
                started_ids.clone(),
                start_times.clone(),
                errors.clone(),
                body.clone(),
            );
            let n = load.starts;
            std::thread::spawn(move || {
                let agent = agent();
                while next.fetch_add(1, Ordering::SeqCst) < n {
                    let t = Instant::now();
                    let answer = agent
                        .post(format!("{base}/v1/runs"))
                        .header("Authorization", &auth)
                        .header("Content-Type", "application/json")
                        .send(&body);
                    let ms = t.elapsed().as_secs_f64() * 1e3;
                    match answer {
                        Ok(mut r) if r.status() == 201 => {
                            let v: Value = serde_json::from_str(
                                &r.body_mut().read_to_string().unwrap_or_default(),
                            )
                            .unwrap_or(Value::Null);
                            ids.lock()
                                .unwrap()
                                .push(v["run_id"].as_str().unwrap_or_default().to_string());
                            times.lock().unwrap().push(ms);
                        }
                        Ok(mut r) => errors.lock().unwrap().push(format!(
                            "start: {} {}",
                            r.status(),
                            r.body_mut().read_to_string().unwrap_or_default()
                        )),
                        Err(e) => errors.lock().unwrap().push(format!("start: {e}")),
                    }
                }
            })
        })
        .collect();
    for c in clients {
        let _ = c.join();
    }
    let start_secs = t.elapsed().as_secs_f64();
    let ids = started_ids.lock().unwrap().clone();

    // Resumes: all at once.
    let chosen: Vec<String> = ids.iter().take(load.resumes).cloned().collect();
    let gate = Arc::new(Barrier::new(chosen.len() + 1));
    let resume_times = Arc::new(Mutex::new(Vec::<f64>::new()));
    let resumers: Vec<_> = chosen
        .iter()
        .map(|id| {
            let (base, auth, gate, times, errors, id) = (
                base.clone(),
                auth.clone(),
                gate.clone(),
                resume_times.clone(),
                errors.clone(),
                id.clone(),
            );
            std::thread::spawn(move || {
                let agent = agent();
                gate.wait();
                let t = Instant::now();
                let answer = agent
                    .post(format!("{base}/v1/runs/{id}/resume"))
                    .header("Authorization", &auth)
                    .header("Content-Type", "application/json")
                    .send(r#"{"payload": {"text": "load"}}"#);
                let ms = t.elapsed().as_secs_f64() * 1e3;
                match answer {
                    Ok(mut r) if r.status() == 200 => {
                        let v: Value = serde_json::from_str(
                            &r.body_mut().read_to_string().unwrap_or_default(),
                        )
                        .unwrap_or(Value::Null);
                        if v["status"] != "completed" {
                            errors
                                .lock()
                                .unwrap()
                                .push(format!("resume {id}: {}", v["status"]));
                        }
                        times.lock().unwrap().push(ms);
                    }
                    Ok(mut r) => errors.lock().unwrap().push(format!(
                        "resume: {} {}",
                        r.status(),
                        r.body_mut().read_to_string().unwrap_or_default()
                    )),
                    Err(e) => errors.lock().unwrap().push(format!("resume: {e}")),
                }
            })
        })
        .collect();
    let t = Instant::now();
    gate.wait();
    for r in resumers {
        let _ = r.join();
    }
    let resume_secs = t.elapsed().as_secs_f64();

    // Every subscriber sees every completion (or the load test fails).
    let want: HashSet<String> = chosen.iter().cloned().collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let store_runs = loop {
        let done = rt.list_runs(&RunQuery {
            status: Some(RunStatus::Completed),
            ..RunQuery::default()
        })?;
        if done.len() >= want.len() || Instant::now() > deadline {
            break done.len();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Let the streams catch up, then stop the server (streams end).
    std::thread::sleep(Duration::from_millis(1_000));
    stopper.stop();
    let served = serving.join().map_err(|_| fail("the server panicked"))?;
    served?;
    let mut short = 0;
    for f in followers {
        let seen = f.join().map_err(|_| fail("a subscriber panicked"))?;
        if !want.is_subset(&seen) {
            short += 1;
        }
    }
    let all = rt.list_runs(&RunQuery::default())?;
    let unique: HashSet<&str> = all.iter().map(|r| r.run_id.as_str()).collect();
    let errors = errors.lock().unwrap().clone();
    if !errors.is_empty() {
        return Err(fail(format!(
            "{} error answers, first: {}",
            errors.len(),
            errors[0]
        )));
    }
    if ids.len() != load.starts || all.len() != load.starts || unique.len() != load.starts {
        return Err(fail(format!(
            "{} starts answered, {} runs stored ({} distinct): lost or doubled runs",
            ids.len(),
            all.len(),
            unique.len()
        )));
    }
    if store_runs != want.len() {
        return Err(fail(format!(
            "{store_runs} runs completed, {} resumed",
            want.len()
        )));
    }
    if short > 0 {
        return Err(fail(format!("{short} subscribers missed completions")));
    }
    let round = |x: f64| (x * 10.0).round() / 10.0;
    let starts = start_times.lock().unwrap().clone();
    let resumes = resume_times.lock().unwrap().clone();
    let mut figures = Map::new();
    figures.insert(
        "http_start_runs_per_s".into(),
        json!(round(load.starts as f64 / start_secs)),
    );
    figures.insert(
        "http_start_p50_ms".into(),
        json!(round(percentile(starts.clone(), 0.5))),
    );
    figures.insert(
        "http_start_p99_ms".into(),
        json!(round(percentile(starts, 0.99))),
    );
    figures.insert(
        "http_resumes_per_s".into(),
        json!(round(want.len() as f64 / resume_secs)),
    );
    figures.insert(
        "http_resume_p50_ms".into(),
        json!(round(percentile(resumes.clone(), 0.5))),
    );
    figures.insert(
        "http_resume_p99_ms".into(),
        json!(round(percentile(resumes, 0.99))),
    );
    figures.insert("http_errors".into(), json!(0));
    Ok(figures)
}

/// `webhook_accept_per_s`: `load.webhooks` calls signed per Standard
/// Webhooks, sent by `load.start_clients` clients over loopback to a server
/// on its own SQLite file (no driver, no automation bound: the figure is
/// the verification and the inbox append), each answered 202 and stored
/// once; also their p50 and p99 latency.
pub fn webhook_load(
    load: &HttpLoad,
    engine: &WasmEngine,
    dir: &Path,
) -> Result<Map<String, Value>> {
    std::fs::create_dir_all(dir).map_err(|e| fail(e.to_string()))?;
    let store = Arc::new(SqliteStore::open(dir.join("hooks.sqlite"))?);
    let rt = stepwell::builder(store)
        .engine(engine.clone())
        .plugin(std::sync::Arc::new(
            stepwell::triggers::Triggers::new()
                .sealing_key(stepwell::triggers::SealingKey::random()),
        ))
        .build()?;
    let created = rt.create_connection("webhook.received@1", Some("bench"), &json!({}))?;
    let secret = created.secret.clone().unwrap_or_default();
    let mut options = ServeOptions::new(dir.join("serve-token"));
    options.listen = "127.0.0.1:0".parse().expect("an address");
    options.drive = false;
    let server = Server::bind(rt.clone(), options)?;
    let url = format!(
        "http://{}{}",
        server.local_addr(),
        created.path.clone().unwrap_or_default()
    );
    let stopper = server.stopper();
    let serving = std::thread::spawn(move || server.run());
    let next = Arc::new(AtomicUsize::new(0));
    let times = Arc::new(Mutex::new(Vec::with_capacity(load.webhooks)));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let start = Instant::now();
    let clients: Vec<_> = (0..load.start_clients.max(1))
        .map(|_| {
            let (url, secret, next, times, errors) = (
                url.clone(),
                secret.clone(),
                next.clone(),
                times.clone(),
                errors.clone(),
            );
            let total = load.webhooks;
            std::thread::spawn(move || {
                let agent = agent();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        break;
                    }
                    let id = format!("msg_{i}");
                    let body = json!({"type": "invoice.paid", "n": i, "amount": 1200}).to_string();
                    let ts = chrono::Utc::now().timestamp();
                    let sig = match stepwell::triggers::webhook::sign(
                        &secret,
                        &id,
                        ts,
                        body.as_bytes(),
                    ) {
                        Ok(s) => s,
                        Err(e) => {
                            errors.lock().unwrap().push(e);
                            break;
                        }
                    };
                    let t = Instant::now();
                    let answer = agent
                        .post(&url)
                        .header("webhook-id", &id)
                        .header("webhook-timestamp", ts.to_string())
                        .header("webhook-signature", &sig)
                        .header("content-type", "application/json")
                        .send(&body);
                    match answer {
                        Ok(r) if r.status() == 202 => times
                            .lock()
                            .unwrap()
                            .push(t.elapsed().as_secs_f64() * 1000.0),
                        Ok(r) => errors
                            .lock()
                            .unwrap()
                            .push(format!("{id}: HTTP {}", r.status())),
                        Err(e) => errors.lock().unwrap().push(format!("{id}: {e}")),
                    }
                }
            })
        })
        .collect();
    for c in clients {
        let _ = c.join();
    }
    let secs = start.elapsed().as_secs_f64();
    stopper.stop();
    let _ = serving.join();
    let errors = errors.lock().unwrap().clone();
    if let Some(first) = errors.first() {
        return Err(fail(format!(
            "{} webhook calls failed, first: {first}",
            errors.len()
        )));
    }
    let stored = rt.connection_events(&created.connection_id, 0, load.webhooks + 1)?;
    if stored.len() != load.webhooks {
        return Err(fail(format!(
            "{} webhook calls accepted, {} events stored",
            load.webhooks,
            stored.len()
        )));
    }
    let round = |x: f64| (x * 10.0).round() / 10.0;
    let times = times.lock().unwrap().clone();
    let mut figures = Map::new();
    figures.insert(
        "webhook_accept_per_s".into(),
        json!(round(load.webhooks as f64 / secs)),
    );
    figures.insert(
        "webhook_accept_p50_ms".into(),
        json!(round(percentile(times.clone(), 0.5))),
    );
    figures.insert(
        "webhook_accept_p99_ms".into(),
        json!(round(percentile(times, 0.99))),
    );
    Ok(figures)
}
