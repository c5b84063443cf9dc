//! `stepwell bench --fanout`: slow work never holds other work. Runs
//! started over HTTP each make one `llm_call` to a loopback
//! OpenAI-compatible server (a process of its own) that answers after a
//! delay; meanwhile one-second timers are started and runs are read over
//! the API. Fails when an answer is wrong: a run not completed, a timer
//! not fired, the model server not asked exactly once per run.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::http::percentile;
use serde_json::{json, Map, Value};
use stepwell::host::{HostOptions, StoreSpec};
use stepwell::llm::{LlmCall, Provider, Providers};
use stepwell::{Error, Result, RunStatus, Runtime};
use stepwell_serve::{ServeOptions, Server};

/// What the fan-out does.
pub struct FanoutOptions {
    /// Runs, each making one model call.
    pub calls: usize,
    /// How long the model server takes to answer.
    pub answer_after: Duration,
    /// One-second timers started during the fan-out.
    pub timers: usize,
    /// Client threads starting the runs.
    pub clients: usize,
}

impl Default for FanoutOptions {
    fn default() -> Self {
        FanoutOptions {
            calls: 1_000,
            answer_after: Duration::from_secs(2),
            timers: 100,
            clients: 8,
        }
    }
}

fn fail(message: impl Into<String>) -> Error {
    crate::bench::bench_err(message)
}

/// This process's resident memory, in KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// The model server, a process of its own (so its threads are not in the
/// host's memory figure): `stepwell-bench model-server`.
struct ModelServer {
    child: std::process::Child,
    base: String,
}

impl ModelServer {
    fn start(dir: &Path, answer_after: Duration) -> Result<ModelServer> {
        let addr_file = dir.join("model-server.addr");
        let child =
            std::process::Command::new(std::env::current_exe().map_err(|e| fail(e.to_string()))?)
                .args(["model-server", "--delay-ms"])
                .arg(answer_after.as_millis().to_string())
                .arg("--addr-file")
                .arg(&addr_file)
                .spawn()
                .map_err(|e| fail(format!("starting the model server: {e}")))?;
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(addr) = std::fs::read_to_string(&addr_file) {
                if !addr.trim().is_empty() {
                    let base = format!("http://{}", addr.trim());
                    return Ok(ModelServer { child, base });
                }
            }
            if Instant::now() > until {
                return Err(fail("the model server did not start"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// How many chat requests it got.
    fn count(&self) -> Result<u64> {
        self.ask("count")
    }

    /// How many of them their client dropped before the answer.
    fn dropped(&self) -> Result<u64> {
        self.ask("dropped")
    }

    fn ask(&self, what: &str) -> Result<u64> {
        let answer = ureq::get(format!("{}/{what}", self.base))
            .call()
            .map_err(|e| fail(format!("asking the model server: {e}")))?
            .into_body()
            .read_to_string()
            .map_err(|e| fail(e.to_string()))?;
        answer
            .trim()
            .parse()
            .map_err(|_| fail(format!("the model server said {answer:?}")))
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The model server's process: answers every chat-completions request
/// after `delay`, counts them, and answers `GET /count` with the count.
/// Asynchronous, on one thread: a thousand connections cost it nothing.
pub fn model_server(delay: Duration, addr_file: &Path) -> Result<()> {
    let io = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| fail(e.to_string()))?;
    io.block_on(async move {
        let socket = tokio::net::TcpSocket::new_v4().map_err(|e| fail(e.to_string()))?;
        socket
            .bind("127.0.0.1:0".parse().expect("an address"))
            .map_err(|e| fail(e.to_string()))?;
        // Room for a burst of connections: a dropped SYN is retried a
        // second later, which would time the kernel.
        let listener = socket.listen(4096).map_err(|e| fail(e.to_string()))?;
        let addr = listener.local_addr().map_err(|e| fail(e.to_string()))?;
        std::fs::write(addr_file, addr.to_string()).map_err(|e| fail(e.to_string()))?;
        let counts = Arc::new(Counts::default());
        loop {
            let (stream, _) = listener.accept().await.map_err(|e| fail(e.to_string()))?;
            tokio::spawn(serve_model(stream, delay, counts.clone()));
        }
    })
}

/// What the model server counts: requests asked, and requests whose
/// client dropped them (closed the connection) before the answer.
#[derive(Default)]
struct Counts {
    asked: AtomicUsize,
    dropped: AtomicUsize,
}

async fn serve_model(stream: tokio::net::TcpStream, delay: Duration, counts: Arc<Counts>) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let (read, mut writer) = stream.into_split();
    let mut reader = tokio::io::BufReader::new(read);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        let request_line = line.clone();
        let mut length = 0usize;
        loop {
            line.clear();
            if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((k, v)) = header.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).await.is_err() {
            return;
        }
        let answer = if request_line.starts_with("GET /count") {
            counts.asked.load(Ordering::SeqCst).to_string()
        } else if request_line.starts_with("GET /dropped") {
            counts.dropped.load(Ordering::SeqCst).to_string()
        } else {
            counts.asked.fetch_add(1, Ordering::SeqCst);
            // The answer comes after `delay`, unless the client closes the
            // connection first (a read of nothing: it sends no more).
            let mut probe = [0u8; 1];
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = reader.read(&mut probe) => {
                    counts.dropped.fetch_add(1, Ordering::SeqCst);
                    return;
                }
            }
            json!({"id": "bench", "object": "chat.completion", "model": "bench-model",
                   "choices": [{"index": 0, "finish_reason": "stop",
                                "message": {"role": "assistant", "content": "ok"}}],
                   "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})
            .to_string()
        };
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            answer.len()
        );
        if writer.write_all(head.as_bytes()).await.is_err()
            || writer.write_all(answer.as_bytes()).await.is_err()
        {
            return;
        }
    }
}

/// The flows: one model call, and one one-second timer.
fn write_flows(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let llm = dir.join("fan-llm");
    let timer = dir.join("fan-timer");
    for (path, flow) in [
        (
            &llm,
            json!({"workflow_id": "fan-llm", "entry": "ask", "nodes": {
            "ask": {"effect": "llm_call", "payload": {"prompt": "Say ok"}, "result_key": "answer", "next": "end"},
            "end": {"complete": {"answer": {"$var": "answer.content"}}}}}),
        ),
        (
            &timer,
            json!({"workflow_id": "fan-timer", "entry": "wait", "nodes": {
            "wait": {"effect": "wait_until", "payload": {"seconds": 1}, "result_key": "waited", "next": "end"},
            "end": {"complete": {"waited": {"$var": "waited"}}}}}),
        ),
    ] {
        std::fs::create_dir_all(path).map_err(|e| fail(e.to_string()))?;
        std::fs::write(path.join("flow.json"), flow.to_string())
            .map_err(|e| fail(e.to_string()))?;
    }
    Ok((llm, timer))
}

/// The host: a SQLite store, `llm_call` against the model server, effects
/// of API calls in flight (as `stepwell serve`'s).
fn host(dir: &Path, model: &ModelServer) -> Result<Runtime> {
    let providers = Providers::only(Provider {
        timeout_s: Some(120.0),
        ..Provider::new("bench", &format!("{}/v1", model.base), Some("bench-model"))
    });
    let once = stepwell::RetryPolicy {
        max_attempts: 1,
        initial_backoff: Duration::from_secs(1),
        factor: 2.0,
        max_backoff: Duration::from_secs(1),
    };
    let options = HostOptions {
        config: stepwell::RuntimeConfig {
            drive_workers: stepwell::RuntimeConfig::host_drive_workers(),
            calls_in_flight: true,
            retries: [("llm_call".to_string(), once)].into(),
            ..Default::default()
        },
        effects: vec![Arc::new(LlmCall::new(providers))],
        cache_home: Some(dir.join("cache")),
        ..HostOptions::default()
    };
    stepwell::host::open_runtime(&StoreSpec::Sqlite(dir.join("fanout.sqlite")), &options)
}

/// A small HTTP client of the server's API.
struct Api {
    base: String,
    auth: String,
    agent: ureq::Agent,
}

impl Api {
    /// A client of the API at `base` with bearer `token`.
    fn new(base: String, token: &str) -> Arc<Api> {
        Arc::new(Api {
            base,
            auth: format!("Bearer {}", token.trim()),
            agent: ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(Duration::from_secs(60)))
                .build()
                .into(),
        })
    }

    fn post(&self, path: &str, body: &Value) -> Result<Value> {
        let response = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("Authorization", &self.auth)
            .header("Content-Type", "application/json")
            .send(body.to_string())
            .map_err(|e| fail(format!("POST {path}: {e}")))?;
        let status = response.status().as_u16();
        let text = response
            .into_body()
            .read_to_string()
            .map_err(|e| fail(e.to_string()))?;
        if !(200..300).contains(&status) {
            return Err(fail(format!("POST {path}: {status} {text}")));
        }
        serde_json::from_str(&text).map_err(|e| fail(e.to_string()))
    }

    fn get(&self, path: &str) -> Result<Value> {
        let response = self
            .agent
            .get(format!("{}{path}", self.base))
            .header("Authorization", &self.auth)
            .call()
            .map_err(|e| fail(format!("GET {path}: {e}")))?;
        let text = response
            .into_body()
            .read_to_string()
            .map_err(|e| fail(e.to_string()))?;
        serde_json::from_str(&text).map_err(|e| fail(e.to_string()))
    }
}

/// Starts `count` runs of `workflow` from `clients` threads; their ids.
fn start_runs(api: &Arc<Api>, workflow: &str, count: usize, clients: usize) -> Result<Vec<String>> {
    let next = Arc::new(AtomicUsize::new(0));
    let ids = Arc::new(Mutex::new(Vec::with_capacity(count)));
    let threads: Vec<_> = (0..clients.max(1))
        .map(|_| {
            let (api, next, ids, workflow) =
                (api.clone(), next.clone(), ids.clone(), workflow.to_string());
            std::thread::spawn(move || -> Result<()> {
                while next.fetch_add(1, Ordering::SeqCst) < count {
                    let run = api.post("/v1/runs", &json!({"workflow_id": workflow}))?;
                    let id = run["run_id"]
                        .as_str()
                        .ok_or_else(|| fail(format!("no run id in {run}")))?;
                    ids.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(id.to_string());
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| fail("a client thread panicked"))??;
    }
    let ids = std::mem::take(&mut *ids.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(ids)
}

/// Runs `measure` against a `serve` on loopback (in this process) over
/// the host of [`host`] in `dir`, with the model server `answer_after`
/// away and the flows loaded; its figures.
fn with_server(
    dir: &Path,
    answer_after: Duration,
    measure: impl FnOnce(&Runtime, &Arc<Api>, &ModelServer) -> Result<Map<String, Value>>,
) -> Result<Map<String, Value>> {
    std::fs::create_dir_all(dir).map_err(|e| fail(e.to_string()))?;
    let model = ModelServer::start(dir, answer_after)?;
    let rt = host(dir, &model)?;
    let (llm, timer) = write_flows(dir)?;
    rt.load_bundle(&llm)?;
    rt.load_bundle(&timer)?;
    let mut serve = ServeOptions::new(dir.join("serve-token"));
    serve.listen = "127.0.0.1:0".parse().expect("an address");
    let server = Server::bind(rt.clone(), serve)?;
    let token =
        std::fs::read_to_string(dir.join("serve-token")).map_err(|e| fail(e.to_string()))?;
    let api = Api::new(format!("http://{}", server.local_addr()), &token);
    let stopper = server.stopper();
    let serving = std::thread::spawn(move || server.run());
    let figures = measure(&rt, &api, &model);
    stopper.stop();
    let _ = serving.join();
    figures
}

/// Runs the fan-out in `dir`; the figures.
pub fn run(options: &FanoutOptions, dir: &Path) -> Result<Map<String, Value>> {
    with_server(dir, options.answer_after, |rt, api, model| {
        fan_out(options, rt, api, model)
    })
}

fn fan_out(
    options: &FanoutOptions,
    rt: &Runtime,
    api: &Arc<Api>,
    model: &ModelServer,
) -> Result<Map<String, Value>> {
    // Memory against calls in flight, sampled through the fan-out.
    let samples = Arc::new(Mutex::new(Vec::<(usize, u64)>::new()));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (rt, samples, done) = (rt.clone(), samples.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                let sample = (rt.in_flight(), rss_kib());
                samples
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(sample);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let start = Instant::now();
    let starter = {
        let api = api.clone();
        let (calls, clients) = (options.calls, options.clients);
        std::thread::spawn(move || {
            let ids = start_runs(&api, "fan-llm", calls, clients)?;
            Ok::<_, Error>((ids, start.elapsed().as_secs_f64()))
        })
    };
    // Timers and reads while the calls fly.
    std::thread::sleep(Duration::from_millis(300));
    let timers = start_runs(api, "fan-timer", options.timers, 4)?;
    let mut reads = Vec::new();
    let read_until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < read_until {
        let id = &timers[reads.len() % timers.len()];
        let t = Instant::now();
        let run = api.get(&format!("/v1/runs/{id}"))?;
        reads.push(t.elapsed().as_secs_f64() * 1e3);
        if run["run_id"] != json!(id) {
            return Err(fail(format!("GET /v1/runs/{id} answered {run}")));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let (ids, started) = starter.join().map_err(|_| fail("the starter panicked"))??;
    let all: Vec<String> = ids.iter().chain(&timers).cloned().collect();
    let wall = wait_all(rt, &all, start)?;
    done.store(true, Ordering::SeqCst);
    let _ = sampler.join();
    check_answers(rt, &ids)?;
    let lateness = timer_lateness(rt, &timers)?;
    let requests = model.count()?;
    if requests != options.calls as u64 {
        return Err(fail(format!(
            "the model server got {requests} requests for {} runs",
            options.calls
        )));
    }
    let samples = std::mem::take(&mut *samples.lock().unwrap_or_else(|e| e.into_inner()));
    let (flying, per_call_kib) = memory_per_call(&samples);
    let round = |x: f64, d: i32| (x * 10f64.powi(d)).round() / 10f64.powi(d);
    let mut figures = Map::new();
    figures.insert("fanout_llm_wall_s".into(), json!(round(wall, 2)));
    figures.insert("fanout_model_requests".into(), json!(requests));
    figures.insert("fanout_starts_s".into(), json!(round(started, 2)));
    figures.insert("fanout_peak_in_flight".into(), json!(flying));
    figures.insert(
        "timer_lateness_p99_ms_under_fanout".into(),
        json!(round(percentile(lateness, 0.99), 1)),
    );
    figures.insert(
        "api_read_p99_ms_under_fanout".into(),
        json!(round(percentile(reads, 0.99), 2)),
    );
    if let Some(kib) = per_call_kib {
        figures.insert(
            "rss_mib_per_1k_inflight_llm".into(),
            json!(round(kib * 1000.0 / 1024.0, 1)),
        );
    }
    Ok(figures)
}

/// The most calls in flight, and the memory each took: the growth of the
/// resident set from a quarter of the peak to the peak, per call (what the
/// process holds whatever the number of calls is not counted).
fn memory_per_call(samples: &[(usize, u64)]) -> (usize, Option<f64>) {
    let Some(&(peak, rss_peak)) = samples.iter().max_by_key(|(n, _)| *n) else {
        return (0, None);
    };
    let quarter = samples.iter().find(|(n, _)| *n * 4 >= peak && *n < peak);
    let per_call = quarter.map(|&(n, rss)| rss_peak.saturating_sub(rss) as f64 / (peak - n) as f64);
    (peak, per_call)
}

/// Waits until every run ended; the seconds since `start`.
fn wait_all(rt: &Runtime, ids: &[String], start: Instant) -> Result<f64> {
    let until = Instant::now() + Duration::from_secs(300);
    let mut left: Vec<&String> = ids.iter().collect();
    while !left.is_empty() {
        if Instant::now() > until {
            return Err(fail(format!(
                "{} runs did not end within 300 s",
                left.len()
            )));
        }
        let mut still = Vec::new();
        for id in left {
            if !rt.get_state(id)?.status.is_terminal() {
                still.push(id);
            }
        }
        left = still;
        if !left.is_empty() {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Every model run completed with the model's answer.
fn check_answers(rt: &Runtime, ids: &[String]) -> Result<()> {
    for id in ids {
        let run = rt.get_state(id)?;
        if run.status != RunStatus::Completed
            || run.output.as_ref().map(|o| &o["answer"]) != Some(&json!("ok"))
        {
            return Err(fail(format!(
                "run {id} ended {:?}: {:?} {:?}",
                run.status, run.error, run.output
            )));
        }
    }
    Ok(())
}

/// How late each timer fired: its completion's time past its due time, in
/// milliseconds.
fn timer_lateness(rt: &Runtime, ids: &[String]) -> Result<Vec<f64>> {
    let mut late = Vec::new();
    for id in ids {
        let run = rt.get_state(id)?;
        let due = run.vars["waited"]["until"]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
        let ended = chrono::DateTime::parse_from_rfc3339(&run.updated_at).ok();
        match (run.status, due, ended) {
            (RunStatus::Completed, Some(due), Some(ended)) => {
                late.push((ended - due).num_microseconds().unwrap_or(0) as f64 / 1e3);
            }
            _ => {
                return Err(fail(format!(
                    "timer {id} ended {:?}: {:?}",
                    run.status,
                    run.vars.get("waited")
                )))
            }
        }
    }
    Ok(late)
}

/// A `stepwell serve` process on `db`, its model calls to `model`.
struct ServeProcess {
    child: std::process::Child,
    api: Arc<Api>,
}

impl ServeProcess {
    fn start(dir: &Path, model: &ModelServer) -> Result<ServeProcess> {
        use std::io::BufRead;
        let token = dir.join("kill-token");
        let mut child = std::process::Command::new(crate::bench::stepwell_exe()?)
            .arg("--db")
            .arg(dir.join("kill.sqlite"))
            .args(["serve", "--listen", "127.0.0.1:0", "--token-file"])
            .arg(&token)
            .env("STEPWELL_LLM_PROVIDER", "openai-compatible")
            .env("OPENAI_COMPATIBLE_BASE_URL", format!("{}/v1", model.base))
            .env("STEPWELL_LLM_MODEL", "bench-model")
            .env("XDG_STATE_HOME", dir.join("state"))
            .env("XDG_CACHE_HOME", dir.join("cache"))
            .env("RUST_LOG", "error")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| fail(format!("starting stepwell serve: {e}")))?;
        let stdout = child.stdout.take().ok_or_else(|| fail("no stdout"))?;
        let mut lines = std::io::BufReader::new(stdout).lines();
        let url = loop {
            let line = lines
                .next()
                .ok_or_else(|| fail("stepwell serve ended before it listened"))?
                .map_err(|e| fail(e.to_string()))?;
            if let Some(url) = line.strip_prefix("stepwell serve: ") {
                break url.trim_end_matches('/').to_string();
            }
        };
        // Its later output is not read: let it go nowhere.
        std::thread::spawn(move || lines.for_each(drop));
        let token = std::fs::read_to_string(&token).map_err(|e| fail(e.to_string()))?;
        let api = Api::new(url, &token);
        Ok(ServeProcess { child, api })
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The fan-out with its host killed (SIGKILL) while the answers come in,
/// and started again: every run completes once, and the only calls made
/// again are those out (asked, not recorded) when the host died.
pub fn kill_run(options: &FanoutOptions, dir: &Path) -> Result<Map<String, Value>> {
    std::fs::create_dir_all(dir).map_err(|e| fail(e.to_string()))?;
    let model = ModelServer::start(dir, options.answer_after)?;
    let (llm, _) = write_flows(dir)?;
    let host = ServeProcess::start(dir, &model)?;
    let bundle = llm.canonicalize().map_err(|e| fail(e.to_string()))?;
    host.api.post(
        "/v1/runs",
        &json!({"bundle": bundle, "run_id": "kill-warm-up", "vars": {}}),
    )?;
    let start = Instant::now();
    let ids = start_runs(&host.api, "fan-llm", options.calls, options.clients)?;
    // Killed as the answers come in: some recorded, some out, some
    // landed and not recorded yet.
    let kill_at = options.answer_after + Duration::from_millis(100);
    std::thread::sleep(kill_at.saturating_sub(start.elapsed()));
    host.kill();
    let asked_at_kill = model.count()?;
    let store = crate::bench::cli_runtime(&dir.join("kill.sqlite"))?;
    let recorded_at_kill = ids
        .iter()
        .chain(std::iter::once(&"kill-warm-up".to_string()))
        .filter(|id| {
            store.get_ledger(id).is_ok_and(|l| {
                l.iter().any(|r| {
                    r.effect.is_some() && r.status == stepwell::core::model::StepStatus::Completed
                })
            })
        })
        .count() as u64;
    let restarted = ServeProcess::start(dir, &model)?;
    let wall = wait_all(&store, &ids, start)?;
    check_answers(&store, &ids)?;
    for id in &ids {
        let ends = store
            .get_ledger(id)?
            .iter()
            .filter(|r| {
                r.effect.is_none() && r.status == stepwell::core::model::StepStatus::Completed
            })
            .count();
        if ends != 1 {
            return Err(fail(format!("run {id} completed {ends} times")));
        }
    }
    drop(restarted);
    let asked = model.count()?;
    let runs = options.calls as u64 + 1;
    let repeated = asked.saturating_sub(runs);
    let window = asked_at_kill.saturating_sub(recorded_at_kill);
    if asked < runs || repeated > window {
        return Err(fail(format!(
            "{asked} model requests for {runs} runs: {repeated} made again, but only {window} were out when the host died"
        )));
    }
    let mut figures = Map::new();
    figures.insert(
        "fanout_kill_wall_s".into(),
        json!((wall * 100.0).round() / 100.0),
    );
    figures.insert("fanout_kill_requests_out_at_kill".into(), json!(window));
    figures.insert("fanout_kill_requests_made_again".into(), json!(repeated));
    Ok(figures)
}

/// 100 runs whose model calls are out (a model that takes a minute), all
/// cancelled over the API: each call must be dropped (the model server sees
/// its connection closed) and each run `cancelled`. The seconds from the
/// first cancel until the last call was dropped.
pub fn cancel_run(dir: &Path) -> Result<Map<String, Value>> {
    with_server(dir, Duration::from_secs(60), |rt, api, model| {
        cancel_all(rt, api, model, 100)
    })
}

fn cancel_all(
    rt: &Runtime,
    api: &Arc<Api>,
    model: &ModelServer,
    runs: usize,
) -> Result<Map<String, Value>> {
    let ids = start_runs(api, "fan-llm", runs, 4)?;
    let until = Instant::now() + Duration::from_secs(30);
    while model.count()? < runs as u64 {
        if Instant::now() > until {
            return Err(fail("the calls never all reached the model server"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let start = Instant::now();
    for id in &ids {
        api.post(
            &format!("/v1/runs/{id}/cancel"),
            &json!({"reason": "bench"}),
        )?;
    }
    while model.dropped()? < runs as u64 {
        if start.elapsed() > Duration::from_secs(30) {
            return Err(fail(format!(
                "{} of {runs} calls were dropped 30 s after their runs were cancelled",
                model.dropped()?
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let dropped_s = start.elapsed().as_secs_f64();
    if !rt.wait_in_flight(Duration::from_secs(30)) {
        return Err(fail(
            "effects still in flight after their runs were cancelled",
        ));
    }
    for id in &ids {
        let run = rt.get_state(id)?;
        if run.status != RunStatus::Cancelled {
            return Err(fail(format!(
                "run {id} is {:?} after its cancel",
                run.status
            )));
        }
    }
    if model.count()? != runs as u64 {
        return Err(fail("a cancelled call was made again"));
    }
    let mut figures = Map::new();
    figures.insert(
        "cancel_100_in_flight_dropped_s".into(),
        json!((dropped_s * 1000.0).round() / 1000.0),
    );
    Ok(figures)
}
