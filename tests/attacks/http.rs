//! Callers of `stepwell serve` without credentials (slow uploads, forged
//! webhook calls) and readers of a long ledger, against a real server
//! process over real sockets.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stepwell_tests::served::Served;
use stepwell_tests::{repo, write_bundle};

/// The `host:port` of a served URL.
fn addr(s: &Served) -> String {
    s.url.trim_start_matches("http://").to_string()
}

/// Opens a connection that sends `POST path` announcing a body of
/// `declared` bytes, and `sent` bytes of it.
fn slow_upload(
    s: &Served,
    path: &str,
    token: Option<&str>,
    declared: usize,
    sent: usize,
) -> TcpStream {
    let mut socket = TcpStream::connect(addr(s)).unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
    );
    socket.write_all(head.as_bytes()).unwrap();
    socket.write_all(&vec![b' '; sent]).unwrap();
    socket
}

/// The start of what the server answered on `socket` within `limit` (its
/// status line and headers), or `None` when it answered nothing (the
/// connection still open).
fn answer(socket: &mut TcpStream, limit: Duration) -> Option<String> {
    socket.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 1024];
    match socket.read(&mut buf) {
        Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            None
        }
        // Reset by the server: an answer of sorts (the connection is gone).
        Err(e) => Some(format!("closed: {e}")),
    }
}

/// `GET /v1/health` on a fresh connection: its time, or `None` when it got
/// no 200 within `limit`.
fn health(s: &Served, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut socket = TcpStream::connect_timeout(&addr(s).parse().unwrap(), limit).ok()?;
    socket
        .write_all(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    let line = answer(&mut socket, limit)?;
    line.starts_with("HTTP/1.1 200").then(|| started.elapsed())
}

/// The server's peak resident memory so far, in KiB.
fn peak_rss_kib(s: &Served) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", s.child.id())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap()
}

fn webhook_connection(s: &Served) -> String {
    let (status, created) = s.post("/v1/connections", json!({"source": "webhook.received@1"}));
    assert_eq!(status, 201, "{created}");
    created["connection_id"].as_str().unwrap().to_string()
}

/// Slow uploads (headers, a little of a 1 MiB body, then a byte now and
/// then) to the open webhook route, to an unknown connection and to a real
/// one, more of them than the server takes connections: health keeps
/// answering, each upload is cut off, memory stays small. Before bodies
/// had a deadline and a budget, and the webhook route looked its
/// connection up before reading, health got no answer while they lasted.
#[test]
fn slow_uploads_leave_the_server_answering() {
    let s = Served::start(&[
        "--max-connections",
        "64",
        "--body-timeout-ms",
        "2000",
        "--max-body-bytes-in-flight",
        "4194304",
    ]);
    let real = format!("/v1/hooks/{}", webhook_connection(&s));
    let mut sockets: Vec<TcpStream> = Vec::new();
    for i in 0..192 {
        // An unknown connection, a real one, and a body over the webhook
        // limit (read on briefly, by a few at once, kept nowhere).
        let (path, declared) = match i % 3 {
            0 => ("/v1/hooks/tc_doesnotexist", 1 << 20),
            1 => (real.as_str(), 1 << 20),
            _ => (real.as_str(), 2_000_000),
        };
        sockets.push(slow_upload(&s, path, None, declared, 1000));
    }
    let started = Instant::now();
    let mut probes = Vec::new();
    let mut writes = Vec::new();
    while started.elapsed() < Duration::from_secs(5) {
        for socket in &mut sockets {
            let _ = socket.write_all(b" ");
        }
        probes.push(health(&s, Duration::from_secs(2)));
        // Callers with the token have a budget of their own.
        writes.push(s.post("/v1/runs", json!({"nope": 1})).0);
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        probes.iter().all(Option::is_some),
        "health went unanswered during the uploads: {probes:?}"
    );
    assert!(writes.iter().all(|w| *w == 400), "{writes:?}");
    // Every upload was answered or cut off by now (the deadline is 2 s).
    for (i, socket) in sockets.iter_mut().enumerate() {
        let got = answer(socket, Duration::from_secs(5));
        assert!(got.is_some(), "upload {i} is still held open");
    }
    let rss = peak_rss_kib(&s);
    assert!(rss < 200 * 1024, "the server's peak RSS was {rss} KiB");
}

/// A caller with the token who sends a body slowly is answered 408 at the
/// deadline; callers whose bodies would go over the budget are answered
/// 503 at once; once the bodies are gone, the budget serves again.
#[test]
fn slow_bodies_get_408_and_the_budget_503() {
    let s = Served::start(&[
        "--body-timeout-ms",
        "1500",
        "--max-body-bytes-in-flight",
        "2097152",
    ]);
    let token = s.token.clone();
    let mut held: Vec<TcpStream> = (0..2)
        .map(|_| slow_upload(&s, "/v1/runs", Some(&token), 1 << 20, 10))
        .collect();
    // Both hold the budget now (1 MiB each, declared).
    std::thread::sleep(Duration::from_millis(300));
    let mut third = slow_upload(&s, "/v1/runs", Some(&token), 1 << 20, 10);
    let busy = answer(&mut third, Duration::from_secs(1)).unwrap_or_default();
    assert!(
        busy.starts_with("HTTP/1.1 503"),
        "over the budget: {busy:?}"
    );
    assert!(
        busy.to_ascii_lowercase().contains("\r\nretry-after: 1\r\n"),
        "a busy server says when to come back: {busy:?}"
    );
    for socket in &mut held {
        let got = answer(socket, Duration::from_secs(10)).unwrap_or_default();
        assert!(got.starts_with("HTTP/1.1 408"), "a slow body: {got:?}");
    }
    // The budget is back: a whole body is served.
    let (status, v) = s.post("/v1/runs", json!({"nope": 1}));
    assert_eq!(
        (status, v["error"]["field"].clone()),
        (400, json!("body.nope")),
        "{v}"
    );
}

/// Clients that ask and never read the answers (pipelined requests for the
/// dashboard's script) have their connections closed once a write has
/// waited `--write-timeout-ms`, rather than holding them for ever.
#[test]
fn clients_that_never_read_are_let_go() {
    let s = Served::start(&["--write-timeout-ms", "1000"]);
    let request = b"GET /assets/app.js HTTP/1.1\r\nHost: x\r\n\r\n".repeat(200);
    let mut sockets: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut socket = TcpStream::connect(addr(&s)).unwrap();
            socket.write_all(&request).unwrap();
            socket
        })
        .collect();
    // Nothing read for a while: the server's writes wait, then give up.
    std::thread::sleep(Duration::from_secs(3));
    for socket in &mut sockets {
        socket
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut sink = Vec::new();
        let ended = match socket.read_to_end(&mut sink) {
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        };
        assert!(
            ended,
            "the connection is still open after {} bytes",
            sink.len()
        );
    }
    assert!(health(&s, Duration::from_secs(2)).is_some());
}

/// Forged webhook calls that alternate their refusal reason write to the
/// store once a minute per connection, not once a call: the WAL barely
/// grows, and the connection's last error counts the calls refused.
#[test]
fn refused_webhook_calls_cost_no_write_each() {
    let s = Served::start(&[]);
    let cid = webhook_connection(&s);
    let wal = s.db().with_extension("sqlite-wal");
    let before = std::fs::metadata(&wal).map_or(0, |m| m.len());
    let url = format!("{}/v1/hooks/{cid}", s.url);
    let forged: [&[(&str, &str)]; 3] = [
        &[],
        &[
            ("webhook-id", "msg_x"),
            ("webhook-timestamp", "x"),
            ("webhook-signature", "v1,AAAA"),
        ],
        &[
            ("webhook-id", "msg_y"),
            ("webhook-timestamp", "1"),
            ("webhook-signature", "v1,AAAA"),
        ],
    ];
    let mut reasons = std::collections::BTreeSet::new();
    for i in 0..1500 {
        let mut request = s
            .agent
            .post(&url)
            .header("Content-Type", "application/json");
        for (k, v) in forged[i % 3] {
            request = request.header(*k, *v);
        }
        let mut response = request.send("{}").unwrap();
        assert_eq!(response.status().as_u16(), 401);
        let body: Value = response.body_mut().read_json().unwrap();
        reasons.insert(body["reason"].as_str().unwrap().to_string());
    }
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    let grown = std::fs::metadata(&wal)
        .map_or(0, |m| m.len())
        .saturating_sub(before);
    assert!(
        grown < 256 * 1024,
        "1,500 refusals grew the WAL by {grown} bytes"
    );
    let shown = s.ok(&format!("/v1/connections/{cid}"));
    let error = &shown["last_error"];
    assert_eq!(error["code"], "webhook_missing_headers", "{shown}");
    assert_eq!(error["refused_calls"], 1, "{shown}");
}

/// A bundle whose flow is `n` WASM nodes in a row (the chain example's
/// node): a run of it leaves more than `n` ledger records.
fn long_chain(root: &Path, n: usize) -> std::path::PathBuf {
    let step = repo().join("flows/examples/chain/step.wasm");
    let step = step.display().to_string();
    let mut nodes = serde_json::Map::new();
    for i in 0..n {
        let mut node = json!({"component": step});
        if i + 1 < n {
            node["next"] = json!(format!("n{}", i + 1));
        } else {
            node["config"] = json!({"last": true});
        }
        nodes.insert(format!("n{i}"), node);
    }
    let flow = json!({"workflow_id": "long", "entry": "n0", "nodes": nodes});
    write_bundle(root, "long", &[("flow.json", flow)])
}

/// A ledger longer than a page is read a page at a time over HTTP (with a
/// link to the next page), checked and streamed whole; the CLI prints it
/// whole, as one JSON array too, and `list` shows a page of runs and says
/// how to see more.
#[test]
fn a_long_ledger_is_read_in_pages() {
    let s = Served::start(&[]);
    let bundle = long_chain(s.dir.path(), 1_100);
    let out = s.cli(&["--json", "run", &bundle.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = run["run_id"].as_str().unwrap().to_string();

    let path = format!("/v1/runs/{id}/ledger");
    let mut response = s
        .agent
        .get(&format!("{}{path}", s.url))
        .header("Authorization", &format!("Bearer {}", s.token))
        .call()
        .unwrap();
    let link = response
        .headers()
        .get("link")
        .map(|v| v.to_str().unwrap().to_string());
    let first: Vec<Value> = response.body_mut().read_json().unwrap();
    assert_eq!(first.len(), 1000, "the default page");
    assert_eq!(
        link.as_deref(),
        Some(format!("</v1/runs/{id}/ledger?after=1000&limit=1000>; rel=\"next\"").as_str())
    );
    let rest = s.ok(&format!("{path}?after=1000&limit=1000"));
    let rest = rest.as_array().unwrap();
    assert!(!rest.is_empty() && rest.len() < 1000, "{}", rest.len());
    assert_eq!(rest[0]["seq"], 1001);
    let total = 1000 + rest.len();
    let (status, v) = s.get(&format!("{path}?limit=10001"));
    assert_eq!(
        (status, v["error"]["field"].clone()),
        (400, json!("limit")),
        "{v}"
    );

    let verified = s.ok(&format!("{path}/verify"));
    assert_eq!(verified["ok"], true, "{verified}");
    assert_eq!(verified["records"], total);

    // The CLI: the whole ledger, as lines and as one array.
    let out = s.cli(&["ledger", &id]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), total);
    let out = s.cli(&["--json", "ledger", &id]);
    let all: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(all.len(), total);
    assert_eq!(all[1000]["step_id"], rest[0]["step_id"]);
    let out = s.cli(&["ledger", &id, "--verify"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with(&format!("ok: {total} records, chain intact")),
        "{text}"
    );

    // A record removed by hand from the middle of a page: pages go on
    // after it by seq, and the check names where the chain breaks.
    let db = rusqlite::Connection::open(s.db()).unwrap();
    let removed = db
        .execute("DELETE FROM ledger WHERE run_id = ?1 AND seq = 1000", [&id])
        .unwrap();
    assert_eq!(removed, 1);
    let out = s.cli(&["ledger", &id, "--verify"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    let broken = format!("broken: record 1000 of {} (", total - 1);
    assert!(text.starts_with(&broken), "{text}");
    let verified = s.ok(&format!("{path}/verify"));
    assert_eq!(verified["ok"], false, "{verified}");
    let next = s.ok(&format!("{path}?after=999&limit=1"));
    assert_eq!(next[0]["seq"], 1001, "{next}");

    // `list`: 100 runs by default, and a hint on standard error.
    for _ in 0..100 {
        let hello = repo().join("flows/examples/hello").display().to_string();
        let (status, v) = s.post("/v1/runs", json!({"bundle": hello, "vars": {"name": "x"}}));
        assert_eq!(status, 201, "{v}");
    }
    let out = s.cli(&["list"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 100);
    let hint = String::from_utf8_lossy(&out.stderr);
    assert!(
        hint.contains("more runs: stepwell ") && hint.contains(" list --after "),
        "{hint}"
    );
    let out = s.cli(&["list", "--limit", "200"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 101);
    assert!(out.stderr.is_empty());
}
