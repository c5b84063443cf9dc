//! The collector the traced chain sends its spans to: a loopback HTTP
//! server that takes `POST /v1/traces`, counts the requests and the bytes,
//! and answers `200`. The benchmark fails unless every span arrived.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use stepwell::core::trace::SpanExporter;
use stepwell::otlp::OtlpExporter;
use stepwell::{Error, Result};

/// The loopback collector.
pub struct Sink {
    /// Its base URL.
    pub endpoint: String,
    requests: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
}

impl Sink {
    /// Listens on a free loopback port.
    pub fn start() -> Result<Sink> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(io)?;
        let port = listener.local_addr().map_err(io)?.port();
        let sink = Sink {
            endpoint: format!("http://127.0.0.1:{port}"),
            requests: Arc::default(),
            bytes: Arc::default(),
        };
        let (requests, bytes) = (sink.requests.clone(), sink.bytes.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (requests, bytes) = (requests.clone(), bytes.clone());
                std::thread::spawn(move || serve(stream, &requests, &bytes));
            }
        });
        Ok(sink)
    }
}

fn io(e: std::io::Error) -> Error {
    Error::invalid("bench", e.to_string())
}

fn serve(stream: TcpStream, requests: &AtomicU64, bytes: &AtomicU64) {
    let Ok(clone) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(clone);
    let mut writer = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0usize;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        requests.fetch_add(1, Ordering::Relaxed);
        bytes.fetch_add(length as u64, Ordering::Relaxed);
        let answer = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// Flushes the exporter and checks that it sent at least three spans per
/// step of `steps` (the step, its guest call, its commit), dropped none,
/// and that the collector got them.
pub fn check(sink: &Sink, exporter: &OtlpExporter, steps: usize) -> Result<()> {
    exporter.flush();
    let c = exporter.counters();
    let sent = c.sent.load(Ordering::Relaxed);
    let dropped = c.dropped.load(Ordering::Relaxed);
    let requests = sink.requests.load(Ordering::Relaxed);
    if dropped > 0 || sent < 3 * steps as u64 || requests == 0 {
        return Err(Error::invalid(
            "bench",
            format!(
                "the traced chain sent {sent} spans in {requests} requests and dropped {dropped}, for {steps} steps"
            ),
        ));
    }
    Ok(())
}
