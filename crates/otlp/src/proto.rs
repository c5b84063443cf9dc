//! The OTLP trace request in protobuf's wire format, written by hand: the
//! few messages of `opentelemetry/proto/collector/trace/v1` a span batch
//! needs (`ExportTraceServiceRequest` > `ResourceSpans` > `ScopeSpans` >
//! `Span`, with `KeyValue`, `AnyValue`, `Link` and `Status`), and no
//! protobuf compiler in the build.

use stepwell_runtime::core::trace::{AttrValue, SpanContext, SpanData, SpanKind};

/// Protobuf wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// A message being written.
#[derive(Default)]
struct Msg(Vec<u8>);

impl Msg {
    fn tag(&mut self, field: u32, wire: u8) {
        self.varint(u64::from(field << 3 | u32::from(wire)));
    }

    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn bytes(&mut self, field: u32, b: &[u8]) {
        self.tag(field, LEN);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }

    fn string(&mut self, field: u32, s: &str) {
        self.bytes(field, s.as_bytes());
    }

    fn message(&mut self, field: u32, m: Msg) {
        self.bytes(field, &m.0);
    }

    fn uint(&mut self, field: u32, v: u64) {
        self.tag(field, VARINT);
        self.varint(v);
    }

    fn fixed64(&mut self, field: u32, v: u64) {
        self.tag(field, FIXED64);
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    fn fixed32(&mut self, field: u32, v: u32) {
        self.tag(field, FIXED32);
        self.0.extend_from_slice(&v.to_le_bytes());
    }
}

/// `KeyValue { key = 1; AnyValue value = 2 }`, `AnyValue { string = 1;
/// bool = 2; int64 = 3 }`.
fn key_value(key: &str, value: &AttrValue) -> Msg {
    let mut any = Msg::default();
    match value {
        AttrValue::Str(s) => any.string(1, s),
        AttrValue::Bool(b) => any.uint(2, u64::from(*b)),
        // int64 is a two's-complement varint.
        AttrValue::Int(i) => any.uint(3, *i as u64),
    }
    let mut kv = Msg::default();
    kv.string(1, key);
    kv.message(2, any);
    kv
}

/// The W3C flags OTLP keeps on spans and links: sampled (every span is
/// recorded), and (bit 8) that whether the parent is remote is known.
const FLAGS: u32 = 0x1 | 0x100;
/// Bit 9: the parent is remote (a caller's `traceparent`).
const REMOTE_PARENT: u32 = 0x200;

/// `Span` (trace.proto): ids 1, 2, parent 4, name 5, kind 6, times 7 and 8
/// (fixed64), attributes 9, links 13, status 15, flags 16 (fixed32).
fn span(s: &SpanData) -> Msg {
    let mut m = Msg::default();
    m.bytes(1, &s.context.trace_id.0);
    m.bytes(2, &s.context.span_id.0);
    if let Some(parent) = s.parent {
        m.bytes(4, &parent.0);
    }
    m.string(5, &s.name);
    m.uint(
        6,
        match s.kind {
            SpanKind::Internal => 1,
            SpanKind::Server => 2,
            SpanKind::Client => 3,
        },
    );
    m.fixed64(7, s.start_unix_nanos);
    m.fixed64(8, s.end_unix_nanos);
    for (k, v) in &s.attributes {
        m.message(9, key_value(k, v));
    }
    for l in &s.links {
        m.message(13, link(l));
    }
    if let Some(error) = &s.error {
        // Status { message = 2; code = 3 (2: error) }
        let mut status = Msg::default();
        status.string(2, error);
        status.uint(3, 2);
        m.message(15, status);
    }
    m.fixed32(16, FLAGS | if s.remote_parent { REMOTE_PARENT } else { 0 });
    m
}

/// `Link { trace_id = 1; span_id = 2; flags = 6 }`.
fn link(l: &SpanContext) -> Msg {
    let mut m = Msg::default();
    m.bytes(1, &l.trace_id.0);
    m.bytes(2, &l.span_id.0);
    m.fixed32(6, FLAGS);
    m
}

/// The body of one `POST /v1/traces`: `spans` of the resource whose
/// attributes are `resource` (`service.name` and the like), from the
/// instrumentation scope `stepwell`.
pub fn export_request(resource: &[(&'static str, AttrValue)], spans: &[SpanData]) -> Vec<u8> {
    let mut res = Msg::default();
    for (k, v) in resource {
        res.message(1, key_value(k, v));
    }
    // InstrumentationScope { name = 1; version = 2 }
    let mut scope = Msg::default();
    scope.string(1, "stepwell");
    scope.string(2, env!("CARGO_PKG_VERSION"));
    let mut scope_spans = Msg::default();
    scope_spans.message(1, scope);
    for s in spans {
        scope_spans.message(2, span(s));
    }
    let mut resource_spans = Msg::default();
    resource_spans.message(1, res);
    resource_spans.message(2, scope_spans);
    let mut request = Msg::default();
    request.message(1, resource_spans);
    request.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_are_little_endian_groups_of_seven_bits() {
        let mut m = Msg::default();
        m.varint(1);
        m.varint(300);
        m.varint(u64::MAX);
        assert_eq!(&m.0[..3], &[0x01, 0xac, 0x02]);
        assert_eq!(m.0.len(), 3 + 10);
        // A negative int64 is ten bytes, as protobuf writes it.
        let kv = key_value("n", &AttrValue::Int(-1));
        assert_eq!(kv.0.len(), 3 + 2 + 1 + 10);
    }
}
