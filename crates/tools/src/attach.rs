//! Large tool outputs: kept out of the ledger as attachments of the run
//! (artifacts), with a handle the model reads back in bounded excerpts
//! through the host tool `open_attachment` (llm-tools spec 3.13).
//!
//! Applies only when the runtime has an artifact store. An output over the
//! inline limit (`_runtime.max_inline_bytes`, default 256 KiB) is stored;
//! one over the retention cap (`max_attachment_bytes` of the payload, else
//! `_runtime.max_attachment_bytes`, default 50 MiB) is not stored at all
//! and becomes a notice telling the model to narrow it.

use serde_json::{json, Map, Value};

use super::{ToolClass, ToolSpec};
use stepwell_runtime::store::ArtifactStore;

/// The default inline limit of one tool output, in bytes.
pub const DEFAULT_INLINE_BYTES: usize = 256 << 10;

/// The default retention cap of one attachment, in bytes (the reference's
/// 50 MiB).
pub const DEFAULT_ATTACHMENT_BYTES: usize = 50 << 20;

/// Where and how large outputs go.
pub struct Offload<'a> {
    /// The artifact store.
    pub store: &'a dyn ArtifactStore,
    /// The run the attachments belong to.
    pub run_id: &'a str,
    /// The time they are stored at.
    pub now: &'a str,
    /// Outputs larger than this are stored.
    pub inline_bytes: usize,
    /// Outputs larger than this are dropped with a notice.
    pub cap_bytes: usize,
}

fn positive(v: Option<&Value>) -> Option<usize> {
    v.and_then(Value::as_u64)
        .filter(|n| *n > 0)
        .map(|n| n as usize)
}

impl<'a> Offload<'a> {
    /// The limits of a call: the payload's `max_attachment_bytes`, then the
    /// run's `_runtime` values, then the defaults.
    pub fn new(
        store: &'a dyn ArtifactStore,
        run_id: &'a str,
        now: &'a str,
        payload: Option<&Map<String, Value>>,
        runtime: Option<&Value>,
    ) -> Self {
        let rt = |k: &str| runtime.and_then(|r| r.get(k));
        Offload {
            store,
            run_id,
            now,
            inline_bytes: positive(rt("max_inline_bytes")).unwrap_or(DEFAULT_INLINE_BYTES),
            cap_bytes: positive(payload.and_then(|p| p.get("max_attachment_bytes")))
                .or_else(|| positive(rt("max_attachment_bytes")))
                .unwrap_or(DEFAULT_ATTACHMENT_BYTES),
        }
    }

    /// Stores `text` if it is over the inline limit: `Ok(Some(id))` stored,
    /// `Ok(None)` small enough, `Err(n)` over the cap (`n` bytes, not stored).
    fn store_text(&self, text: &str) -> Result<Option<String>, usize> {
        let n = text.len();
        if n <= self.inline_bytes {
            return Ok(None);
        }
        if n > self.cap_bytes {
            return Err(n);
        }
        // Stored with the run's id inside: the same text of two runs is two
        // attachments, each its run's own.
        let content =
            json!({"stepwell_attachment": 1, "run_id": self.run_id, "text": text}).to_string();
        match self.store.put(
            content.as_bytes(),
            "application/json",
            Some(self.run_id),
            self.now,
        ) {
            Ok(meta) => Ok(Some(meta.artifact_id)),
            // Kept inline when the store fails: never lost.
            Err(_) => Ok(None),
        }
    }

    fn too_large(&self, n: usize, what: &str) -> String {
        format!(
            "[{what} was {n} bytes, exceeding the {}-byte retention limit — it was NOT stored to keep the run record bounded. Re-run narrowing the output (e.g. pipe through head/grep, or redirect to a file and read a bounded range).]",
            self.cap_bytes
        )
    }

    /// Offloads the large parts of one result row in place: an
    /// `execute_command` object's `stdout`/`stderr`, or a string output.
    pub fn result(&self, row: &mut Value) {
        let name = row["name"].as_str().unwrap_or_default().to_string();
        if name == "execute_command" {
            let Some(out) = row.get_mut("output").and_then(Value::as_object_mut) else {
                return;
            };
            for field in ["stdout", "stderr"] {
                let Some(text) = out.get(field).and_then(Value::as_str).map(str::to_string) else {
                    continue;
                };
                let note = match self.store_text(&text) {
                    Ok(None) => continue,
                    Ok(Some(id)) => {
                        out.insert(format!("{field}_offloaded_artifact_id"), json!(id));
                        format!(
                            "\n\n(Full {field} was {} bytes; stored as attachment id={id}. Use open_attachment(artifact_id='{id}', start_line=1, end_line=200) for bounded excerpts.)",
                            text.len()
                        )
                    }
                    Err(n) => format!("\n\n{}", self.too_large(n, &format!("Command {field}"))),
                };
                out.insert(field.into(), json!(""));
                let rendered = out
                    .get("rendered")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                out.insert("rendered".into(), json!(rendered + &note));
            }
            return;
        }
        let Some(text) = row["output"].as_str().map(str::to_string) else {
            return;
        };
        match self.store_text(&text) {
            Ok(None) => {}
            Ok(Some(id)) => {
                row["output"] = json!(format!(
                    "(Output was {} bytes; stored as attachment id={id}. Use open_attachment(artifact_id='{id}', start_line=1, end_line=200) for bounded excerpts.)",
                    text.len()
                ));
                row["output_offloaded_artifact_id"] = json!(id);
            }
            Err(n) => row["output"] = json!(self.too_large(n, "Tool output")),
        }
    }
}

/// The spec of `open_attachment`.
pub fn spec() -> ToolSpec {
    ToolSpec {
        name: "open_attachment".into(),
        description: "Read a bounded excerpt of an attachment of this run (a large tool output \
                      stored aside), by its artifact id."
            .into(),
        parameters: json!({"type": "object", "properties": {
            "artifact_id": {"type": "string", "description": "The attachment's id."},
            "start_line": {"type": "integer", "description": "First line, from 1 (default 1)."},
            "end_line": {"type": "integer", "description": "Last line, inclusive (default: start_line + 199)."},
            "max_chars": {"type": "integer", "description": "At most this many characters (default 8000)."}
        }, "required": ["artifact_id"]}),
        class: ToolClass::Read,
    }
}

/// Runs `open_attachment` for run `run_id`: only that run's attachments.
pub fn open(store: Option<&dyn ArtifactStore>, run_id: &str, args: &Map<String, Value>) -> Value {
    let Some(store) = store else {
        return json!("Error: ArtifactStore is not available");
    };
    let id = ["artifact_id", "$artifact", "id"]
        .iter()
        .find_map(|k| args.get(*k).and_then(Value::as_str))
        .unwrap_or_default()
        .trim()
        .to_string();
    if id.is_empty() {
        return json!("Error: open_attachment requires artifact_id");
    }
    let attachment = store
        .get(&id)
        .ok()
        .flatten()
        .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
        .filter(|v| v["stepwell_attachment"] == 1 && v["run_id"] == run_id)
        // Stored by this run first: no other run planted it.
        .filter(|_| {
            store
                .meta(&id)
                .ok()
                .flatten()
                .is_some_and(|m| m.run_id.as_deref() == Some(run_id))
        });
    let Some(text) = attachment.as_ref().and_then(|v| v["text"].as_str()) else {
        return json!(format!("Error: attachment '{id}' not found for this run"));
    };
    let lines: Vec<&str> = text.lines().collect();
    let start = positive(args.get("start_line")).unwrap_or(1);
    let end = positive(args.get("end_line"))
        .unwrap_or(start + 199)
        .min(lines.len());
    let max_chars = positive(args.get("max_chars")).unwrap_or(8000);
    if start > lines.len().max(1) {
        return json!(format!(
            "Error: Start line {start} exceeds attachment length ({} lines)",
            lines.len()
        ));
    }
    let mut out = format!("Attachment {id} ({} lines)\n\n", lines.len());
    let width = end.to_string().len();
    for (i, line) in lines.iter().enumerate().take(end).skip(start - 1) {
        let row = format!("{:>width$}: {line}\n", i + 1);
        if out.chars().count() + row.chars().count() > max_chars {
            out.push_str(&format!(
                "... (truncated at max_chars={max_chars}; continue from start_line={})",
                i + 1
            ));
            return json!(out);
        }
        out.push_str(&row);
    }
    json!(out)
}
