//! An OpenTelemetry collector on loopback, as small as a test needs: it
//! takes `POST /v1/traces` (OTLP/HTTP, protobuf), decodes each request
//! with a protobuf reader of its own (written from the `.proto` files, not
//! from the exporter's code) and keeps the spans.

use std::collections::BTreeMap;
use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// One span as the collector decoded it.
#[derive(Debug, Clone, PartialEq)]
pub struct Received {
    /// Hex trace id (32 digits).
    pub trace_id: String,
    /// Hex span id (16 digits).
    pub span_id: String,
    /// Hex parent span id, if any.
    pub parent: Option<String>,
    /// The span's name.
    pub name: String,
    /// SpanKind: 1 internal, 2 server, 3 client.
    pub kind: u64,
    /// Start and end, in Unix nanoseconds.
    pub start: u64,
    /// End.
    pub end: u64,
    /// Attributes: strings, integers and booleans as JSON.
    pub attributes: BTreeMap<String, Value>,
    /// Links: (trace id, span id).
    pub links: Vec<(String, String)>,
    /// The status code (0 unset, 2 error) and message.
    pub status: (u64, String),
    /// The resource's attributes.
    pub resource: BTreeMap<String, Value>,
    /// The instrumentation scope's name.
    pub scope: String,
}

impl Received {
    /// Attribute `key`, or `Null`.
    pub fn attr(&self, key: &str) -> &Value {
        self.attributes.get(key).unwrap_or(&Value::Null)
    }
}

/// The collector. It stops with the test process.
#[derive(Clone)]
pub struct Collector {
    /// `http://127.0.0.1:<port>` (the base URL; spans go to `/v1/traces`).
    pub endpoint: String,
    spans: Arc<Mutex<Vec<Received>>>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Collector {
    /// Starts listening on a free loopback port.
    pub fn start() -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let c = Collector {
            endpoint: format!("http://127.0.0.1:{port}"),
            spans: Arc::default(),
            requests: Arc::default(),
        };
        let server = c.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let server = server.clone();
                std::thread::spawn(move || server.serve(stream));
            }
        });
        c
    }

    /// Every span so far.
    pub fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap().clone()
    }

    /// The request lines and content types it got.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    /// The spans, once `done` holds of them (at most `limit`).
    pub fn wait(&self, limit: Duration, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        let until = Instant::now() + limit;
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < until,
                "the collector did not get the spans in time; it has: {:#?}",
                spans.iter().map(|s| &s.name).collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn serve(&self, stream: TcpStream) {
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut writer = stream;
        while let Some((line, headers, body)) = crate::read_http_request(&mut reader) {
            let content_type = headers
                .iter()
                .find(|(k, _)| k == "content-type")
                .map_or("", |(_, v)| v.as_str());
            self.requests
                .lock()
                .unwrap()
                .push(format!("{line} {content_type}"));
            let decoded = decode_request(&body);
            self.spans.lock().unwrap().extend(decoded);
            let answer =
                "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
            if writer.write_all(answer.as_bytes()).is_err() {
                return;
            }
        }
    }
}

/// A protobuf field: its number and its value (a varint, a fixed 64 or 32
/// bit number, or bytes).
#[derive(Debug, Clone)]
enum Field<'a> {
    Varint(u64),
    Fixed(u64),
    Bytes(&'a [u8]),
}

/// Reads every field of a message; panics on malformed input (a test
/// wants to know).
fn fields(mut b: &[u8]) -> Vec<(u64, Field<'_>)> {
    fn varint(b: &mut &[u8]) -> u64 {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = b[0];
            *b = &b[1..];
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return v;
            }
        }
        panic!("a varint longer than ten bytes");
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let key = varint(&mut b);
        let field = match key & 7 {
            0 => Field::Varint(varint(&mut b)),
            1 => {
                let v = u64::from_le_bytes(b[..8].try_into().unwrap());
                b = &b[8..];
                Field::Fixed(v)
            }
            2 => {
                let n = varint(&mut b) as usize;
                let v = &b[..n];
                b = &b[n..];
                Field::Bytes(v)
            }
            5 => {
                let v = u32::from_le_bytes(b[..4].try_into().unwrap());
                b = &b[4..];
                Field::Fixed(v.into())
            }
            wire => panic!("wire type {wire} is not used by OTLP traces"),
        };
        out.push((key >> 3, field));
    }
    out
}

fn bytes<'a>(f: &Field<'a>) -> &'a [u8] {
    match f {
        Field::Bytes(b) => b,
        other => panic!("expected bytes, got {other:?}"),
    }
}

fn text(f: &Field<'_>) -> String {
    String::from_utf8(bytes(f).to_vec()).unwrap()
}

fn number(f: &Field<'_>) -> u64 {
    match f {
        Field::Varint(v) | Field::Fixed(v) => *v,
        other => panic!("expected a number, got {other:?}"),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `KeyValue { key = 1; AnyValue value = 2 }`.
fn key_value(b: &[u8]) -> (String, Value) {
    let mut key = String::new();
    let mut value = Value::Null;
    for (n, f) in fields(b) {
        match n {
            1 => key = text(&f),
            2 => {
                for (m, v) in fields(bytes(&f)) {
                    value = match m {
                        1 => json!(text(&v)),
                        2 => json!(number(&v) != 0),
                        3 => json!(number(&v) as i64),
                        other => json!(format!("(AnyValue field {other})")),
                    };
                }
            }
            _ => {}
        }
    }
    (key, value)
}

fn decode_span(b: &[u8], resource: &BTreeMap<String, Value>, scope: &str) -> Received {
    let mut s = Received {
        trace_id: String::new(),
        span_id: String::new(),
        parent: None,
        name: String::new(),
        kind: 0,
        start: 0,
        end: 0,
        attributes: BTreeMap::new(),
        links: Vec::new(),
        status: (0, String::new()),
        resource: resource.clone(),
        scope: scope.to_string(),
    };
    for (n, f) in fields(b) {
        match n {
            1 => s.trace_id = hex(bytes(&f)),
            2 => s.span_id = hex(bytes(&f)),
            4 => s.parent = Some(hex(bytes(&f))).filter(|p| !p.is_empty()),
            5 => s.name = text(&f),
            6 => s.kind = number(&f),
            7 => s.start = number(&f),
            8 => s.end = number(&f),
            9 => {
                let (k, v) = key_value(bytes(&f));
                s.attributes.insert(k, v);
            }
            13 => {
                let mut link = (String::new(), String::new());
                for (m, v) in fields(bytes(&f)) {
                    match m {
                        1 => link.0 = hex(bytes(&v)),
                        2 => link.1 = hex(bytes(&v)),
                        _ => {}
                    }
                }
                s.links.push(link);
            }
            15 => {
                for (m, v) in fields(bytes(&f)) {
                    match m {
                        2 => s.status.1 = text(&v),
                        3 => s.status.0 = number(&v),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    s
}

/// `ExportTraceServiceRequest { repeated ResourceSpans resource_spans = 1 }`,
/// `ResourceSpans { Resource resource = 1; repeated ScopeSpans = 2 }`,
/// `ScopeSpans { InstrumentationScope scope = 1; repeated Span spans = 2 }`.
pub fn decode_request(body: &[u8]) -> Vec<Received> {
    let mut out = Vec::new();
    for (n, rs) in fields(body) {
        assert_eq!(n, 1, "ExportTraceServiceRequest has only resource_spans");
        let parts = fields(bytes(&rs));
        let mut resource = BTreeMap::new();
        for (m, f) in &parts {
            if *m == 1 {
                for (k, kv) in fields(bytes(f)) {
                    if k == 1 {
                        let (key, value) = key_value(bytes(&kv));
                        resource.insert(key, value);
                    }
                }
            }
        }
        for (m, f) in &parts {
            if *m != 2 {
                continue;
            }
            let scope_parts = fields(bytes(f));
            let mut scope = String::new();
            for (k, v) in &scope_parts {
                if *k == 1 {
                    for (j, w) in fields(bytes(v)) {
                        if j == 1 {
                            scope = text(&w);
                        }
                    }
                }
            }
            for (k, v) in &scope_parts {
                if *k == 2 {
                    out.push(decode_span(bytes(v), &resource, &scope));
                }
            }
        }
    }
    out
}
