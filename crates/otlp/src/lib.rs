//! # stepwell-otlp
//!
//! Sends the host's spans to an OpenTelemetry collector (or Jaeger, Tempo,
//! Honeycomb, anything that takes OTLP/HTTP): batched on a thread of its
//! own, encoded as protobuf, `POST`ed to `<endpoint>/v1/traces`.
//!
//! The runtime never waits for it: a span is queued (a bounded queue; when
//! the collector is slow or down, spans past it are dropped and counted,
//! never held) and the exporter's thread sends a batch every second or
//! every 512 spans.
//!
//! ```no_run
//! use std::sync::Arc;
//! use stepwell_otlp::{OtlpConfig, OtlpExporter};
//! use stepwell_runtime::core::trace::Tracer;
//!
//! let exporter = OtlpExporter::start(OtlpConfig::new("http://127.0.0.1:4318"))?;
//! let tracer = Tracer::new(Arc::new(exporter));
//! // Runtime::builder(store).tracer(tracer)...
//! # drop(tracer);
//! # Ok::<(), std::io::Error>(())
//! ```
#![deny(missing_docs)]

mod proto;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stepwell_runtime::core::trace::{AttrValue, SpanData, SpanExporter};

pub use proto::export_request;

/// The most spans one request carries.
const BATCH: usize = 512;
/// How long a span waits for its batch to fill.
const LINGER: Duration = Duration::from_secs(1);
/// How often the exporter's thread looks at its queue while spans come,
/// and while none do.
const POLL: Duration = Duration::from_millis(5);
const IDLE_POLL: Duration = Duration::from_millis(25);
/// How long a flush (at the end of a command, at shutdown) waits for the
/// collector: a collector that hangs delays an exit by at most this.
const FLUSH_DEADLINE: Duration = Duration::from_secs(3);

/// Where and as what the spans are sent.
#[derive(Clone, Debug, PartialEq)]
pub struct OtlpConfig {
    /// The full URL spans are posted to (`.../v1/traces`).
    pub traces_url: String,
    /// The resource's `service.name`.
    pub service_name: String,
    /// More resource attributes (`service.instance.id`, ...).
    pub resource: Vec<(&'static str, String)>,
    /// Extra request headers (an API key a hosted collector asks for).
    pub headers: Vec<(String, String)>,
    /// How many finished spans may wait to be sent; past that they are
    /// dropped (and counted).
    pub queue: usize,
    /// How long one request may take.
    pub timeout: Duration,
}

impl OtlpConfig {
    /// Spans sent to the collector at `endpoint`, a base URL as
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` gives it (`/v1/traces` is added),
    /// as service `stepwell`.
    pub fn new(endpoint: &str) -> OtlpConfig {
        OtlpConfig {
            traces_url: format!("{}/v1/traces", endpoint.trim_end_matches('/')),
            service_name: "stepwell".into(),
            resource: Vec::new(),
            headers: Vec::new(),
            queue: 65_536,
            timeout: Duration::from_secs(10),
        }
    }
}

enum Message {
    Span(Box<SpanData>),
    Flush(SyncSender<()>),
}

/// What the exporter did so far.
#[derive(Default, Debug)]
pub struct OtlpCounters {
    /// Spans the collector accepted.
    pub sent: AtomicU64,
    /// Spans dropped: the queue was full, or the collector refused or did
    /// not answer.
    pub dropped: AtomicU64,
    /// Requests that failed.
    pub failed_requests: AtomicU64,
}

/// A [`SpanExporter`] that sends to an OTLP/HTTP collector.
pub struct OtlpExporter {
    queue: SyncSender<Message>,
    counters: Arc<OtlpCounters>,
    /// A span was queued since the last flush.
    dirty: AtomicBool,
}

impl std::fmt::Debug for OtlpExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpExporter")
            .field("counters", &self.counters)
            .finish()
    }
}

impl OtlpExporter {
    /// Starts the exporter's thread (an error if the system has no thread
    /// to give).
    pub fn start(config: OtlpConfig) -> std::io::Result<OtlpExporter> {
        let (queue, rx) = mpsc::sync_channel(config.queue.max(1));
        let counters = Arc::new(OtlpCounters::default());
        let sender = Sender::new(config, counters.clone());
        std::thread::Builder::new()
            .name("stepwell-otlp".into())
            .spawn(move || sender.run(&rx))?;
        Ok(OtlpExporter {
            queue,
            counters,
            dirty: AtomicBool::new(false),
        })
    }

    /// What it sent and dropped.
    pub fn counters(&self) -> &OtlpCounters {
        &self.counters
    }
}

impl SpanExporter for OtlpExporter {
    fn export(&self, span: SpanData) {
        match self.queue.try_send(Message::Span(Box::new(span))) {
            Ok(()) => self.dirty.store(true, Ordering::Relaxed),
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Sends everything queued, waiting at most three seconds in all (a
    /// collector that hangs delays the caller no longer; what it did not
    /// take is counted as dropped by the exporter's thread).
    fn flush(&self) {
        if !self.dirty.swap(false, Ordering::Relaxed) {
            return;
        }
        let until = Instant::now() + FLUSH_DEADLINE;
        let (done, sent) = mpsc::sync_channel(1);
        let mut message = Message::Flush(done);
        // A full queue: wait for room, within the deadline.
        loop {
            match self.queue.try_send(message) {
                Ok(()) => break,
                Err(TrySendError::Disconnected(_)) => return,
                Err(TrySendError::Full(m)) if Instant::now() < until => {
                    message = m;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(TrySendError::Full(_)) => return,
            }
        }
        let _ = sent.recv_timeout(until.saturating_duration_since(Instant::now()));
    }
}

impl Drop for OtlpExporter {
    /// Sends what was queued since the last flush (within the flush's
    /// deadline); the thread ends when the queue closes.
    fn drop(&mut self) {
        self.flush();
    }
}

/// The exporter's thread: batches and posts.
struct Sender {
    agent: ureq::Agent,
    config: OtlpConfig,
    resource: Vec<(&'static str, AttrValue)>,
    counters: Arc<OtlpCounters>,
}

impl Sender {
    fn new(config: OtlpConfig, counters: Arc<OtlpCounters>) -> Sender {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(config.timeout))
            .http_status_as_error(false)
            .build()
            .into();
        let mut resource = vec![("service.name", AttrValue::Str(config.service_name.clone()))];
        resource.extend(
            config
                .resource
                .iter()
                .map(|(k, v)| (*k, AttrValue::Str(v.clone()))),
        );
        Sender {
            agent,
            config,
            resource,
            counters,
        }
    }

    /// Takes what is queued in bursts, a few milliseconds apart, rather
    /// than waiting on the queue: a thread that queues a span then never
    /// has to wake this one (a system call per span).
    fn run(&self, rx: &Receiver<Message>) {
        let mut batch = Vec::with_capacity(BATCH);
        let mut due = Instant::now() + LINGER;
        loop {
            let mut took = 0usize;
            loop {
                match rx.try_recv() {
                    Ok(Message::Span(span)) => {
                        took += 1;
                        batch.push(*span);
                        if batch.len() >= BATCH {
                            self.send(&mut batch);
                            due = Instant::now() + LINGER;
                        }
                    }
                    Ok(Message::Flush(done)) => {
                        self.send(&mut batch);
                        let _ = done.try_send(());
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        self.send(&mut batch);
                        return;
                    }
                }
            }
            if Instant::now() >= due {
                self.send(&mut batch);
                due = Instant::now() + LINGER;
            }
            // Idle, it looks less often (a queue of 65,536 holds 25 ms of
            // the busiest step loop's spans).
            std::thread::sleep(if took > 0 { POLL } else { IDLE_POLL });
        }
    }

    fn send(&self, batch: &mut Vec<SpanData>) {
        if batch.is_empty() {
            return;
        }
        let body = export_request(&self.resource, batch);
        let n = batch.len() as u64;
        batch.clear();
        let mut req = self
            .agent
            .post(&self.config.traces_url)
            .header("Content-Type", "application/x-protobuf");
        for (k, v) in &self.config.headers {
            req = req.header(k.as_str(), v.as_str());
        }
        match req.send(&body[..]) {
            Ok(r) if r.status().is_success() => {
                self.counters.sent.fetch_add(n, Ordering::Relaxed);
            }
            answer => {
                let why = match answer {
                    Ok(r) => format!("HTTP {}", r.status()),
                    Err(e) => e.to_string(),
                };
                self.counters.dropped.fetch_add(n, Ordering::Relaxed);
                self.counters
                    .failed_requests
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(url = %self.config.traces_url, spans = n, %why,
                    "the OTLP collector did not take a batch of spans; they are dropped");
            }
        }
    }
}
