//! Traces: spans of the host's work (ticks, steps, guest calls, effects,
//! store commits, and what plugins add: model calls, tool calls, HTTP
//! requests), handed to a [`SpanExporter`] the embedder gives the builder
//! ([`crate::RuntimeBuilder::tracer`]).
//!
//! Off by default, and free when off: a [`Tracer`] without an exporter
//! makes no span, reads no clock and allocates nothing ([`Span`] is then
//! an empty `Option`).
//!
//! A run's spans share one trace. Its id is the run's own (derived from
//! the run id) unless the run was started inside another trace: a
//! W3C `traceparent` given at start ([`crate::StartOptions::trace_parent`]),
//! or the span the starting thread is in (a request's, or the step of the
//! run that starts a child). Then `vars._runtime.trace` keeps the trace
//! and the parent span, and the run's spans continue that trace. A run
//! started by an automation's controller step (an occurrence:
//! `vars._meta.occurrence`) without a trace of its caller starts its own
//! trace, linked to that step.
//!
//! Spans nest through the thread that does the work: [`Tracer::enter`]
//! makes a span the thread's current one until it ends, and a span
//! started on that thread takes it as its parent ([`current`]). Work
//! handed to another thread or task carries the [`SpanContext`] along
//! ([`scope`]).
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use stepwell_runtime::core::trace::{SpanData, SpanExporter, Tracer};
//!
//! #[derive(Default)]
//! struct Kept(Mutex<Vec<SpanData>>);
//! impl SpanExporter for Kept {
//!     fn export(&self, span: SpanData) {
//!         self.0.lock().unwrap().push(span);
//!     }
//! }
//!
//! let kept = Arc::new(Kept::default());
//! let tracer = Tracer::new(kept.clone());
//! {
//!     let mut outer = tracer.enter("outer", None);
//!     outer.attr("answer", 42);
//!     let _inner = tracer.enter("inner", None);
//! }
//! let spans = kept.0.lock().unwrap();
//! assert_eq!(spans[0].name, "inner");
//! assert_eq!(spans[0].parent, Some(spans[1].context.span_id));
//! assert!(Tracer::off().start("never made", None).context().is_none());
//! ```

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

/// A trace's id: 16 bytes, never all zero.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId(pub [u8; 16]);

/// A span's id: 8 bytes, never all zero.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanId(pub [u8; 8]);

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceId({self})")
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SpanId({self})")
    }
}

impl TraceId {
    /// Parses 32 lowercase hex digits (not all zero).
    pub fn parse(hex_text: &str) -> Option<TraceId> {
        parse_id(hex_text).map(TraceId)
    }
}

impl SpanId {
    /// Parses 16 lowercase hex digits (not all zero).
    pub fn parse(hex_text: &str) -> Option<SpanId> {
        parse_id(hex_text).map(SpanId)
    }
}

fn parse_id<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N || text.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    let mut id = [0u8; N];
    hex::decode_to_slice(text, &mut id).ok()?;
    id.iter().any(|b| *b != 0).then_some(id)
}

/// Where a span sits: its trace and its own id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SpanContext {
    /// The trace the span belongs to.
    pub trace_id: TraceId,
    /// The span's id.
    pub span_id: SpanId,
}

impl SpanContext {
    /// Parses a W3C `traceparent` header (`00-<trace>-<span>-<flags>`):
    /// `None` for anything else, as the recommendation asks (a bad header
    /// starts a new trace rather than failing the request).
    pub fn from_traceparent(header: &str) -> Option<SpanContext> {
        let mut parts = header.trim().split('-');
        let version = parts.next()?;
        let (trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?);
        // Version 00 has exactly four fields; a later one may add more.
        let extra = parts.next().is_some();
        let hex2 = |s: &str| {
            s.len() == 2
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        if !hex2(version) || !hex2(flags) || version == "ff" || (version == "00" && extra) {
            return None;
        }
        Some(SpanContext {
            trace_id: TraceId::parse(trace)?,
            span_id: SpanId::parse(span)?,
        })
    }

    /// This context as a W3C `traceparent` header value (sampled).
    pub fn traceparent(&self) -> String {
        format!("00-{}-{}-01", self.trace_id, self.span_id)
    }
}

/// What kind of work a span is, in OpenTelemetry's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanKind {
    /// Work inside the host.
    Internal,
    /// A request the host answered (HTTP).
    Server,
    /// A request the host made (a model call).
    Client,
}

/// A span attribute's value.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    /// Text.
    Str(String),
    /// An integer.
    Int(i64),
    /// A flag.
    Bool(bool),
}

impl From<&str> for AttrValue {
    fn from(v: &str) -> Self {
        AttrValue::Str(v.to_string())
    }
}

impl From<String> for AttrValue {
    fn from(v: String) -> Self {
        AttrValue::Str(v)
    }
}

impl From<i64> for AttrValue {
    fn from(v: i64) -> Self {
        AttrValue::Int(v)
    }
}

impl From<u64> for AttrValue {
    fn from(v: u64) -> Self {
        AttrValue::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}

impl From<u32> for AttrValue {
    fn from(v: u32) -> Self {
        AttrValue::Int(v.into())
    }
}

impl From<i32> for AttrValue {
    fn from(v: i32) -> Self {
        AttrValue::Int(v.into())
    }
}

impl From<bool> for AttrValue {
    fn from(v: bool) -> Self {
        AttrValue::Bool(v)
    }
}

/// A finished span, as an exporter receives it.
#[derive(Clone, Debug, PartialEq)]
pub struct SpanData {
    /// The span's trace and id.
    pub context: SpanContext,
    /// The parent span (in the same trace), if any.
    pub parent: Option<SpanId>,
    /// What the span measures (`stepwell.step`, `llm.call`,
    /// `POST /v1/runs`, ...).
    pub name: Cow<'static, str>,
    /// Its kind.
    pub kind: SpanKind,
    /// When it started, in nanoseconds since the Unix epoch.
    pub start_unix_nanos: u64,
    /// When it ended.
    pub end_unix_nanos: u64,
    /// Its attributes, in the order they were set.
    pub attributes: Vec<(&'static str, AttrValue)>,
    /// Why it failed, if it did (OpenTelemetry's error status).
    pub error: Option<String>,
    /// Spans of other traces it relates to (a resume from another trace,
    /// an occurrence and its controller's step).
    pub links: Vec<SpanContext>,
    /// Whether its parent is another process's (a caller's `traceparent`).
    pub remote_parent: bool,
}

impl SpanData {
    /// The attribute `key`, if set.
    pub fn attr(&self, key: &str) -> Option<&AttrValue> {
        self.attributes
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
    }
}

/// Where finished spans go: an OTLP exporter, a test's list, a log.
/// Called on the thread that ended the span: queue and return.
pub trait SpanExporter: Send + Sync {
    /// Takes one finished span.
    fn export(&self, span: SpanData);

    /// Sends what is queued (at shutdown). The default does nothing.
    fn flush(&self) {}
}

/// Makes spans, if it has an exporter. Cloning is cheap.
#[derive(Clone, Default)]
pub struct Tracer {
    exporter: Option<Arc<dyn SpanExporter>>,
}

impl fmt::Debug for Tracer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tracer").field("on", &self.is_on()).finish()
    }
}

impl Tracer {
    /// A tracer that hands its spans to `exporter`.
    pub fn new(exporter: Arc<dyn SpanExporter>) -> Tracer {
        Tracer {
            exporter: Some(exporter),
        }
    }

    /// A tracer that makes no spans (the default).
    pub fn off() -> Tracer {
        Tracer::default()
    }

    /// Whether spans are made.
    #[inline]
    pub fn is_on(&self) -> bool {
        self.exporter.is_some()
    }

    /// Sends what the exporter holds (see [`SpanExporter::flush`]).
    pub fn flush(&self) {
        if let Some(e) = &self.exporter {
            e.flush();
        }
    }

    /// Starts a span under `parent`, or under this thread's current span
    /// when `parent` is `None`, or as a new trace's root when there is
    /// neither. It ends when dropped (or [`Span::end`]).
    #[inline]
    pub fn start(&self, name: impl Into<Cow<'static, str>>, parent: Option<SpanContext>) -> Span {
        match &self.exporter {
            None => Span(None),
            Some(exporter) => Span(Some(live(exporter, name.into(), parent))),
        }
    }

    /// [`Tracer::start`], and the span is this thread's current one until
    /// it ends (spans started meanwhile are its children).
    #[inline]
    pub fn enter(&self, name: impl Into<Cow<'static, str>>, parent: Option<SpanContext>) -> Span {
        let mut span = self.start(name, parent);
        if let Some(live) = &mut span.0 {
            live.restore = Some(CURRENT.with(|c| c.replace(Some(live.data.context))));
        }
        span
    }

    /// Exports a span that was measured elsewhere (a run's whole life, from
    /// its creation to its end), if tracing is on.
    pub fn record(&self, span: SpanData) {
        if let Some(e) = &self.exporter {
            e.export(span);
        }
    }
}

/// A span being made (tracing on).
#[inline(never)]
fn live(
    exporter: &Arc<dyn SpanExporter>,
    name: Cow<'static, str>,
    parent: Option<SpanContext>,
) -> Box<Live> {
    let parent = parent.or_else(current);
    let context = SpanContext {
        trace_id: parent.map_or_else(new_trace_id, |p| p.trace_id),
        span_id: new_span_id(),
    };
    Box::new(Live {
        data: SpanData {
            context,
            parent: parent.map(|p| p.span_id),
            name,
            kind: SpanKind::Internal,
            start_unix_nanos: unix_nanos(),
            end_unix_nanos: 0,
            attributes: Vec::new(),
            error: None,
            links: Vec::new(),
            remote_parent: false,
        },
        exporter: exporter.clone(),
        restore: None,
    })
}

struct Live {
    data: SpanData,
    exporter: Arc<dyn SpanExporter>,
    /// The thread's current span before this one was entered.
    restore: Option<Option<SpanContext>>,
}

/// A span being measured (or nothing, when tracing is off). It ends, and
/// goes to the exporter, when dropped.
#[must_use = "a span ends when dropped"]
#[derive(Default)]
pub struct Span(Option<Box<Live>>);

impl fmt::Debug for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(live) => write!(f, "Span({:?})", live.data.name),
            None => f.write_str("Span(off)"),
        }
    }
}

impl Span {
    /// A span that is nothing (tracing off).
    pub fn none() -> Span {
        Span(None)
    }

    /// Whether this span is being measured.
    #[inline]
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// The span's trace and id (`None` when tracing is off).
    #[inline]
    pub fn context(&self) -> Option<SpanContext> {
        self.0.as_ref().map(|l| l.data.context)
    }

    /// Sets an attribute (a text is cut to [`MAX_TEXT`] bytes).
    #[inline]
    pub fn attr(&mut self, key: &'static str, value: impl Into<AttrValue>) {
        if let Some(live) = &mut self.0 {
            live.data.attributes.push((key, bounded(value.into())));
        }
    }

    /// Sets an attribute computed only when tracing is on.
    #[inline]
    pub fn attr_with<V: Into<AttrValue>>(&mut self, key: &'static str, value: impl FnOnce() -> V) {
        if let Some(live) = &mut self.0 {
            live.data.attributes.push((key, bounded(value().into())));
        }
    }

    /// Marks the span failed, with why (cut to [`MAX_TEXT`] bytes).
    #[inline]
    pub fn fail(&mut self, why: impl fmt::Display) {
        if let Some(live) = &mut self.0 {
            let mut text = why.to_string();
            cut(&mut text);
            live.data.error = Some(text);
        }
    }

    /// Marks the span's parent as another process's (a caller's
    /// `traceparent`).
    pub fn remote_parent(&mut self) {
        if let Some(live) = &mut self.0 {
            live.data.remote_parent = true;
        }
    }

    /// Sets the span's kind.
    pub fn kind(&mut self, kind: SpanKind) {
        if let Some(live) = &mut self.0 {
            live.data.kind = kind;
        }
    }

    /// Links the span to a span of another trace.
    pub fn link(&mut self, other: SpanContext) {
        if let Some(live) = &mut self.0 {
            if live.data.context.trace_id != other.trace_id {
                live.data.links.push(other);
            }
        }
    }

    /// Ends the span now.
    pub fn end(self) {}
}

/// The most bytes of text a span keeps in one attribute or error: what a
/// guest, a model or a caller writes cannot grow a span without bound.
pub const MAX_TEXT: usize = 1024;

fn cut(text: &mut String) {
    if text.len() > MAX_TEXT {
        let mut end = MAX_TEXT;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

fn bounded(value: AttrValue) -> AttrValue {
    match value {
        AttrValue::Str(mut s) => {
            cut(&mut s);
            AttrValue::Str(s)
        }
        other => other,
    }
}

impl Drop for Span {
    #[inline]
    fn drop(&mut self) {
        if let Some(live) = self.0.take() {
            end(*live);
        }
    }
}

/// Ends a span: the thread's current span back, the end time, the export.
#[inline(never)]
fn end(mut live: Live) {
    if let Some(previous) = live.restore {
        CURRENT.with(|c| c.set(previous));
    }
    live.data.end_unix_nanos = unix_nanos().max(live.data.start_unix_nanos);
    live.exporter.export(live.data);
}

thread_local! {
    static CURRENT: Cell<Option<SpanContext>> = const { Cell::new(None) };
}

/// This thread's current span (the innermost entered one), if any.
pub fn current() -> Option<SpanContext> {
    CURRENT.with(Cell::get)
}

/// Makes `context` this thread's current span until the guard drops
/// (work carried to another thread keeps its parent).
pub fn scope(context: Option<SpanContext>) -> Scope {
    match context {
        None => Scope(None),
        Some(c) => Scope(Some(CURRENT.with(|cur| cur.replace(Some(c))))),
    }
}

/// Restores the thread's current span when dropped (see [`scope`]).
#[must_use = "the scope ends when dropped"]
pub struct Scope(Option<Option<SpanContext>>);

impl Drop for Scope {
    fn drop(&mut self) {
        if let Some(previous) = self.0.take() {
            CURRENT.with(|c| c.set(previous));
        }
    }
}

fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn random_bytes() -> [u8; 16] {
    *uuid::Uuid::new_v4().as_bytes()
}

fn new_trace_id() -> TraceId {
    TraceId(random_bytes())
}

fn new_span_id() -> SpanId {
    // The bytes of a v4 UUID that are all random (6 holds its version, 8
    // its variant).
    let b = random_bytes();
    SpanId(nonzero([b[0], b[1], b[2], b[3], b[4], b[5], b[9], b[10]]))
}

/// Nanoseconds since the Unix epoch of an RFC 3339 time (0 if unreadable).
pub fn time_nanos(rfc3339: &str) -> u64 {
    chrono::DateTime::parse_from_rfc3339(rfc3339)
        .ok()
        .and_then(|t| t.timestamp_nanos_opt())
        .and_then(|n| u64::try_from(n).ok())
        .unwrap_or(0)
}

/// Where a run's spans go: its trace, the span standing for the run's
/// whole life (every tick is its child), and what that span hangs from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunTrace {
    /// The run's span (its id is derived from the run id).
    pub run: SpanContext,
    /// The span the run was started under, if any (same trace).
    pub parent: Option<SpanId>,
    /// A span of another trace the run relates to (an occurrence's
    /// controller step).
    pub link: Option<SpanContext>,
}

/// The trace of the run `run_id` whose `vars._runtime` is `runtime`.
pub fn run_trace(run_id: &str, runtime: Option<&Value>) -> RunTrace {
    let digest = Sha256::digest(run_id.as_bytes());
    let mut derived = [0u8; 16];
    derived.copy_from_slice(&digest[..16]);
    let mut span = [0u8; 8];
    span.copy_from_slice(&digest[16..24]);
    let kept = runtime.and_then(|r| r.get("trace"));
    let field = |k: &str| kept.and_then(|t| t.get(k)).and_then(Value::as_str);
    let trace_id = field("trace_id")
        .and_then(TraceId::parse)
        .unwrap_or(TraceId(nonzero(derived)));
    RunTrace {
        run: SpanContext {
            trace_id,
            span_id: SpanId(nonzero(span)),
        },
        parent: field("parent_span_id").and_then(SpanId::parse),
        link: field("link").and_then(SpanContext::from_traceparent),
    }
}

fn nonzero<const N: usize>(mut id: [u8; N]) -> [u8; N] {
    if id.iter().all(|b| *b == 0) {
        id[N - 1] = 1;
    }
    id
}

/// What a new run keeps in `vars._runtime.trace`, started under `parent`:
/// the parent's trace and span, or (`own_trace`: an occurrence) only a
/// link to it.
pub fn seed(runtime: &mut Map<String, Value>, parent: SpanContext, own_trace: bool) {
    let kept = if own_trace {
        json!({ "link": parent.traceparent() })
    } else {
        json!({
            "trace_id": parent.trace_id.to_string(),
            "parent_span_id": parent.span_id.to_string(),
        })
    };
    runtime.insert("trace".into(), kept);
}

/// The span of one tick of a run ([`crate::Runtime::tick`], a resume, a
/// driver's pass), and the run's own span when the tick ends the run.
pub(crate) struct TickSpan {
    span: Span,
    trace: RunTrace,
    was_terminal: bool,
    _inside: Inside,
}

thread_local! {
    /// How many ticks this thread is inside (a run's step that ticks
    /// another run inline is one deeper).
    static TICKS: Cell<u32> = const { Cell::new(0) };
}

/// Counts this thread one tick deeper until dropped.
struct Inside;

impl Inside {
    fn enter() -> Inside {
        TICKS.with(|t| t.set(t.get() + 1));
        Inside
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        TICKS.with(|t| t.set(t.get().saturating_sub(1)));
    }
}

impl TickSpan {
    /// Starts (and enters) the tick's span: under the span this thread is
    /// in (an API call, another run's step), else under the run's span.
    /// `ending`: the tick commits the end the state already shows (a
    /// resume that completes the run).
    pub(crate) fn start(tracer: &Tracer, run: &crate::RunState, ending: bool) -> TickSpan {
        let (span, trace) = run_work_span(tracer, "stepwell.tick", run);
        TickSpan {
            span,
            trace,
            was_terminal: run.status.is_terminal() && !ending,
            _inside: Inside::enter(),
        }
    }

    /// Ends the tick's span with the run's status; if the tick ended the
    /// run, exports the run's span (from its creation to now).
    pub(crate) fn end(mut self, tracer: &Tracer, answer: &crate::Result<crate::RunState>) {
        let run = match answer {
            Ok(run) => run,
            Err(e) => {
                self.span.fail(e);
                return;
            }
        };
        self.span.attr("stepwell.status", run.status.as_str());
        drop(self.span);
        if run.status.is_terminal() && !self.was_terminal {
            tracer.record(run_span(self.trace, run));
        }
    }
}

/// A span (entered) of work on `run`: under the span this thread is in (a
/// request, or the step of another run in the same trace; a request of
/// another trace is linked to the run's span), else under the run's span
/// (a run worked on inside the step of a run of another trace, an
/// occurrence inside its controller's, links to that step instead).
pub(crate) fn run_work_span(
    tracer: &Tracer,
    name: &'static str,
    run: &crate::RunState,
) -> (Span, RunTrace) {
    let trace = run_trace(&run.run_id, run.vars.get("_runtime"));
    let inside_run = TICKS.with(Cell::get) > 0;
    // Read once, before the new span becomes the thread's current one.
    let outer = current();
    let here = outer.filter(|h| !inside_run || h.trace_id == trace.run.trace_id);
    let mut span = tracer.enter(name, Some(here.unwrap_or(trace.run)));
    match (here, outer) {
        (Some(_), _) => span.link(trace.run),
        (None, Some(other)) => span.link(other),
        (None, None) => {}
    }
    span.attr("stepwell.run_id", run.run_id.as_str());
    span.attr("stepwell.workflow_id", run.workflow_id.as_str());
    (span, trace)
}

/// The span of a run's whole life, from its creation to its end (`run`
/// has ended).
pub(crate) fn run_span(trace: RunTrace, run: &crate::RunState) -> SpanData {
    let mut attributes = vec![
        ("stepwell.run_id", AttrValue::from(run.run_id.as_str())),
        ("stepwell.workflow_id", run.workflow_id.as_str().into()),
        ("stepwell.status", run.status.as_str().into()),
    ];
    if let Some(parent) = &run.parent_run_id {
        attributes.push(("stepwell.parent_run_id", parent.as_str().into()));
    }
    SpanData {
        context: trace.run,
        parent: trace.parent,
        name: "stepwell.run".into(),
        kind: SpanKind::Internal,
        start_unix_nanos: time_nanos(&run.created_at),
        end_unix_nanos: unix_nanos(),
        attributes,
        error: run.error.as_deref().map(|e| {
            let mut e = e.to_string();
            cut(&mut e);
            e
        }),
        links: trace.link.into_iter().collect(),
        remote_parent: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_headers_are_read_as_w3c_says() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let c = SpanContext::from_traceparent(good).unwrap();
        assert_eq!(c.traceparent(), good);
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-zz",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-+1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-FF",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0G-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(SpanContext::from_traceparent(bad).is_none(), "{bad}");
        }
        // A later version may carry more fields.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what";
        assert!(SpanContext::from_traceparent(later).is_some());
    }

    #[test]
    fn a_run_keeps_its_trace_and_derives_one_otherwise() {
        let own = run_trace("r1", None);
        assert_eq!(own, run_trace("r1", None));
        assert_ne!(own.run.trace_id, run_trace("r2", None).run.trace_id);
        let parent = SpanContext::from_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .unwrap();
        let mut rt = Map::new();
        seed(&mut rt, parent, false);
        let joined = run_trace("r1", Some(&Value::Object(rt)));
        assert_eq!(joined.run.trace_id, parent.trace_id);
        assert_eq!(joined.parent, Some(parent.span_id));
        assert_eq!(joined.run.span_id, own.run.span_id);
        let mut rt = Map::new();
        seed(&mut rt, parent, true);
        let linked = run_trace("r1", Some(&Value::Object(rt)));
        assert_eq!(linked.run.trace_id, own.run.trace_id);
        assert_eq!(linked.link, Some(parent));
    }

    #[test]
    fn entered_spans_nest_and_restore_the_current_one() {
        #[derive(Default)]
        struct Kept(parking_lot::Mutex<Vec<SpanData>>);
        impl SpanExporter for Kept {
            fn export(&self, span: SpanData) {
                self.0.lock().push(span);
            }
        }
        let kept = Arc::new(Kept::default());
        let tracer = Tracer::new(kept.clone());
        assert_eq!(current(), None);
        let outer = tracer.enter("outer", None);
        let outer_cx = outer.context();
        {
            let _inner = tracer.enter("inner", None);
            assert_ne!(current(), outer_cx);
        }
        assert_eq!(current(), outer_cx);
        drop(outer);
        assert_eq!(current(), None);
        let spans = kept.0.lock();
        assert_eq!(spans.len(), 2);
        assert_eq!(spans[0].parent, outer_cx.map(|c| c.span_id));
        assert_eq!(spans[0].context.trace_id, spans[1].context.trace_id);
        assert!(spans[1].end_unix_nanos >= spans[1].start_unix_nanos);
    }
}
