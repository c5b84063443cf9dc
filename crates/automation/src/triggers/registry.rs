//! The registry of trigger sources: the built-ins, embedded in the host and
//! required, and the plugins found in a folder, each probed in the sandbox.
//! A plugin that fails to load, traps, loops, has a bad descriptor or
//! duplicates another `id@version` is listed unavailable with the reason; it
//! cannot be selected, and every other source keeps working.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Map, Value};

use super::{Binding, Descriptor, TriggerError, Wait};
use stepwell_runtime::core::clock::{format_time, parse_time};
use stepwell_runtime::wasm::{TriggerComponent, WasmEngine};

/// The environment variable naming the plugin folder.
pub const PLUGIN_DIR_ENV: &str = "STEPWELL_TRIGGER_DIR";

/// The binding id the host uses where no automation binding exists yet
/// (previews, and calls that give none).
pub const PREVIEW_BINDING_ID: &str = "00000000-0000-0000-0000-000000000000";

static BUILTINS: [(&str, &[u8]); 4] = [
    (
        "schedule",
        include_bytes!(env!("STEPWELL_BUILTIN_SCHEDULE")),
    ),
    ("manual", include_bytes!(env!("STEPWELL_BUILTIN_MANUAL"))),
    ("webhook", include_bytes!(env!("STEPWELL_BUILTIN_WEBHOOK"))),
    ("feed", include_bytes!(env!("STEPWELL_BUILTIN_FEED"))),
];

/// Where a source comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Embedded in the host.
    Builtin,
    /// A component file in the plugin folder.
    Plugin(PathBuf),
}

impl Serialize for Origin {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Origin::Builtin => s.serialize_str("builtin"),
            Origin::Plugin(p) => s.serialize_str(&p.display().to_string()),
        }
    }
}

/// One source of the registry, usable or not.
#[derive(Debug, Clone, Serialize)]
pub struct SourceEntry {
    /// `id@version`, or the file name when the descriptor could not be read.
    pub name: String,
    /// Where it comes from.
    pub origin: Origin,
    /// The descriptor, when it could be read.
    pub descriptor: Option<Descriptor>,
    /// Whether it can be selected.
    pub available: bool,
    /// Why not, when it cannot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip)]
    component: Option<Arc<TriggerComponent>>,
}

/// One firing of a preview.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fire {
    /// The firing's event id (with the preview binding id).
    pub event_id: String,
    /// When it fires.
    pub fired_at: String,
    /// What the occurrence would receive.
    pub payload: Value,
}

/// The next firings of a config, computed by the source itself.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Preview {
    /// `id@version`.
    pub source: String,
    /// The config as `validate` completed it.
    pub config: Value,
    /// The firings, in order.
    pub fires: Vec<Fire>,
    /// Why the list ends: `count` (as many as asked), `exhausted` (the source
    /// will not fire again) or `idle` (it only fires when asked).
    pub end: &'static str,
}

/// Every trigger source the host knows.
#[derive(Debug, Clone)]
pub struct TriggerRegistry {
    entries: Vec<SourceEntry>,
}

fn unavailable(
    name: String,
    origin: Origin,
    descriptor: Option<Descriptor>,
    reason: String,
) -> SourceEntry {
    SourceEntry {
        name,
        origin,
        descriptor,
        available: false,
        reason: Some(reason),
        component: None,
    }
}

fn input(field: &str, message: impl Into<String>) -> TriggerError {
    TriggerError::Input {
        field: field.into(),
        message: message.into(),
    }
}

impl TriggerRegistry {
    /// Loads the built-in sources (a missing or broken one is a
    /// `trigger_registry_error`) and probes every `*.wasm` file of
    /// `plugin_dir`, in name order.
    pub fn load(engine: &WasmEngine, plugin_dir: Option<&Path>) -> Result<Self, TriggerError> {
        let mut entries = Vec::new();
        for (name, bytes) in BUILTINS {
            let label = PathBuf::from(format!("builtin:{name}"));
            let broken =
                |why: String| TriggerError::Registry(format!("built-in source {name}: {why}"));
            let component = engine
                .load_trigger_bytes(bytes, &label)
                .map_err(|e| broken(e.to_string()))?;
            let descriptor = component.descriptor().map_err(|e| broken(e.to_string()))?;
            if let Some(problem) = descriptor.problem() {
                return Err(broken(problem));
            }
            entries.push(SourceEntry {
                name: descriptor.name(),
                origin: Origin::Builtin,
                descriptor: Some(descriptor),
                available: true,
                reason: None,
                component: Some(component),
            });
        }
        if let Some(dir) = plugin_dir {
            let listing = std::fs::read_dir(dir).map_err(|e| {
                input(
                    "trigger_dir",
                    format!("{}: cannot list the plugin folder: {e}", dir.display()),
                )
            })?;
            let mut files: Vec<PathBuf> = listing
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "wasm") && p.is_file())
                .collect();
            files.sort();
            for file in files {
                let entry = Self::probe(engine, &file, &entries);
                entries.push(entry);
            }
        }
        Ok(TriggerRegistry { entries })
    }

    fn probe(engine: &WasmEngine, file: &Path, known: &[SourceEntry]) -> SourceEntry {
        let origin = Origin::Plugin(file.to_path_buf());
        let file_name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let bytes = match std::fs::read(file) {
            Ok(b) => b,
            Err(e) => return unavailable(file_name, origin, None, format!("cannot read: {e}")),
        };
        let component = match engine.load_trigger_bytes(&bytes, file) {
            Ok(c) => c,
            Err(e) => {
                let reason = e.message.split_whitespace().collect::<Vec<_>>().join(" ");
                return unavailable(file_name, origin, None, reason);
            }
        };
        let descriptor = match component.descriptor() {
            Ok(d) => d,
            Err(e) => {
                return unavailable(file_name, origin, None, format!("descriptor() failed: {e}"))
            }
        };
        if let Some(problem) = descriptor.problem() {
            return unavailable(file_name, origin, Some(descriptor), problem);
        }
        let name = descriptor.name();
        if let Some(first) = known.iter().find(|e| e.available && e.name == name) {
            let from = match &first.origin {
                Origin::Builtin => "the built-in source".to_string(),
                Origin::Plugin(p) => p.display().to_string(),
            };
            return unavailable(
                name.clone(),
                origin,
                Some(descriptor),
                format!("duplicates {name} from {from}"),
            );
        }
        SourceEntry {
            name,
            origin,
            descriptor: Some(descriptor),
            available: true,
            reason: None,
            component: Some(component),
        }
    }

    /// Every source, built-ins first.
    pub fn entries(&self) -> &[SourceEntry] {
        &self.entries
    }

    /// The kind of the available source `id@version`, if there is one.
    pub fn kind(&self, name: &str) -> Option<super::SourceKind> {
        self.entries
            .iter()
            .find(|e| e.available && e.name == name)
            .and_then(|e| e.descriptor.as_ref())
            .map(|d| d.kind)
    }

    /// The available source `id@version`.
    pub fn get(&self, name: &str) -> Result<&Arc<TriggerComponent>, TriggerError> {
        match name.split_once('@') {
            Some((id, v)) if !id.is_empty() && v.parse::<u32>().is_ok_and(|v| v >= 1) => {}
            _ => {
                return Err(input(
                    "source",
                    format!("{name:?} is not SOURCE@VERSION (for example schedule@1)"),
                ))
            }
        }
        let mut reason = None;
        for e in self.entries.iter().filter(|e| e.name == name) {
            match (&e.component, e.available) {
                (Some(c), true) => return Ok(c),
                _ => reason = e.reason.clone(),
            }
        }
        match reason {
            Some(reason) => Err(TriggerError::Unavailable {
                name: name.to_string(),
                reason,
            }),
            None => Err(TriggerError::UnknownSource(format!(
                "{name} (available: {})",
                self.entries
                    .iter()
                    .filter(|e| e.available)
                    .map(|e| e.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    fn binding(name: &str, binding_id: &str, config: Value) -> Binding {
        let (id, version) = name.split_once('@').unwrap_or((name, "1"));
        Binding {
            binding_id: binding_id.to_string(),
            source_id: id.to_string(),
            source_version: version.parse().unwrap_or(1),
            config,
        }
    }

    /// The next `count` firings of `config` from `from`, as the source itself
    /// computes them: validate, initial state, then prepare and admit at each
    /// due time in turn.
    pub fn preview(
        &self,
        name: &str,
        config: &Value,
        from: DateTime<Utc>,
        count: usize,
    ) -> Result<Preview, TriggerError> {
        let source = self.get(name)?;
        let mut now = format_time(from);
        let config = source.validate(config, &now)?;
        let binding = Self::binding(name, PREVIEW_BINDING_ID, config.clone());
        let mut state = source.initial_state(&binding, &now)?;
        let mut fires = Vec::new();
        let mut end = "count";
        while fires.len() < count {
            let until = match source.prepare(&binding, &state, &now, &[])? {
                Wait::Until { until } => until,
                Wait::Idle => {
                    end = "idle";
                    break;
                }
                Wait::Exhausted => {
                    end = "exhausted";
                    break;
                }
            };
            let due = parse_time(&until)
                .map_err(|m| TriggerError::Failed(format!("prepare returned {m}")))?;
            if due > parse_time(&now).unwrap_or(from) {
                now = format_time(due);
            }
            let admitted = source.admit(&binding, &state, &now, &[])?;
            let Some(a) = admitted.admission else {
                return Err(TriggerError::Failed(format!(
                    "prepare said {until} but admit at {now} admitted nothing"
                )));
            };
            state = admitted.state;
            fires.push(Fire {
                event_id: a.event_id,
                fired_at: a.fired_at,
                payload: a.payload,
            });
        }
        Ok(Preview {
            source: name.to_string(),
            config,
            fires,
            end,
        })
    }

    /// Calls one method of a source with the seeds' arguments given as one
    /// JSON object, and returns its result as JSON: the plugin author's
    /// debugger. Methods and their input fields:
    /// `validate {config, now?}`, `initial-state {binding, now?}`,
    /// `prepare`/`admit`/`rearm {binding, state, now?}`,
    /// `normalize {binding, event_id, fired_at, payload?}`. `now` defaults to
    /// `default_now`; a binding may leave out `binding_id`, `source_id` and
    /// `source_version`.
    pub fn call(
        &self,
        name: &str,
        method: &str,
        input_json: &Value,
        default_now: DateTime<Utc>,
    ) -> Result<Value, TriggerError> {
        let source = self.get(name)?;
        let Some(args) = input_json.as_object() else {
            return Err(input("input", "must be a JSON object"));
        };
        let allowed: &[&str] = match method {
            "validate" => &["config", "now"],
            "initial-state" | "initial_state" => &["binding", "now"],
            "prepare" | "admit" => &["binding", "state", "now", "events"],
            "rearm" => &["binding", "state", "now"],
            "normalize" => &["binding", "event_id", "fired_at", "payload"],
            other => {
                return Err(input(
                    "method",
                    format!("{other:?} is not one of validate, initial-state, prepare, admit, rearm, normalize"),
                ))
            }
        };
        if let Some(k) = args.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(input(
                &format!("input.{k}"),
                format!("unknown for {method} (it takes {})", allowed.join(", ")),
            ));
        }
        let now = match args.get("now") {
            None | Some(Value::Null) => format_time(default_now),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(input("input.now", "must be an RFC 3339 string")),
        };
        let need = |k: &str| {
            args.get(k)
                .ok_or_else(|| input(&format!("input.{k}"), "is required"))
        };
        let text = |k: &str| -> Result<String, TriggerError> {
            need(k)?
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| input(&format!("input.{k}"), "must be a string"))
        };
        let binding =
            || -> Result<Binding, TriggerError> { Self::binding_arg(name, need("binding")?) };
        let events = match args.get("events") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items.clone(),
            Some(_) => return Err(input("input.events", "must be a JSON array")),
        };
        let out = match method {
            "validate" => source.validate(need("config")?, &now)?,
            "initial-state" | "initial_state" => source.initial_state(&binding()?, &now)?,
            "prepare" => json!(source.prepare(&binding()?, need("state")?, &now, &events)?),
            "admit" => json!(source.admit(&binding()?, need("state")?, &now, &events)?),
            "rearm" => source.rearm(&binding()?, need("state")?, &now)?,
            _ => json!(source.normalize(
                &binding()?,
                &text("event_id")?,
                &text("fired_at")?,
                args.get("payload").unwrap_or(&Value::Object(Map::new())),
            )?),
        };
        Ok(out)
    }

    fn binding_arg(name: &str, v: &Value) -> Result<Binding, TriggerError> {
        let Some(obj) = v.as_object() else {
            return Err(input("input.binding", "must be an object"));
        };
        let mut full = Self::binding(name, PREVIEW_BINDING_ID, Value::Null);
        for (k, v) in obj {
            match (k.as_str(), v) {
                ("binding_id", Value::String(s)) => full.binding_id = s.clone(),
                ("source_id", Value::String(s)) => full.source_id = s.clone(),
                ("source_version", v) if v.as_u64().is_some() => {
                    full.source_version = v.as_u64().unwrap_or(1) as u32
                }
                ("config", v) => full.config = v.clone(),
                _ => return Err(input(
                    &format!("input.binding.{k}"),
                    "unknown, or of the wrong type (binding_id, source_id, source_version, config)",
                )),
            }
        }
        if full.config.is_null() {
            return Err(input("input.binding.config", "is required"));
        }
        Ok(full)
    }
}
