//! Flow documents: the JSON files that describe workflows, and bundles (a
//! directory of them together with their components).
//!
//! The format is documented in `docs/flows.md`. A bundle is a directory whose
//! `flow.json` is its main workflow; any `*.flow.json` beside it defines more
//! workflows of the same bundle (for example the children a subworkflow node
//! starts). Components are named by paths relative to the flow file.

pub mod archive;
pub mod pack;
pub mod template;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use crate::core::keys::bad_result_key;
use crate::wasm::{NodeComponent, WasmEngine};

/// The file name of a bundle's main workflow.
pub const MAIN_FLOW_FILE: &str = "flow.json";

/// An invalid flow document or bundle: names the file and the field at fault.
/// Reason code `invalid_definition`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowError {
    /// The file at fault (a flow file, or the bundle directory).
    pub path: PathBuf,
    /// The field inside the file (`nodes.greet.next`); empty for the whole file.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl FlowError {
    fn new(path: &Path, field: impl Into<String>, message: impl Into<String>) -> Self {
        FlowError {
            path: path.to_path_buf(),
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FlowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid_definition: {}", self.path.display())?;
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for FlowError {}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FlowDoc {
    workflow_id: String,
    #[serde(default)]
    #[allow(dead_code)]
    description: Option<String>,
    entry: String,
    nodes: BTreeMap<String, NodeDoc>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeDoc {
    #[serde(default)]
    #[allow(dead_code)]
    description: Option<String>,
    #[serde(default)]
    component: Option<String>,
    #[serde(default)]
    config: Option<Value>,
    #[serde(default)]
    effect: Option<String>,
    #[serde(default)]
    payload: Option<Value>,
    #[serde(default)]
    result_key: Option<String>,
    #[serde(default, deserialize_with = "present")]
    complete: Option<Value>,
    #[serde(default)]
    next: Option<String>,
    #[serde(default)]
    routes: BTreeMap<String, String>,
    #[serde(default)]
    host_vars: bool,
}

/// Deserialises a field that may hold `null` as `Some(Null)`: present, unlike
/// a missing field.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// A loaded, validated workflow: ready to run.
#[derive(Debug)]
pub struct Workflow {
    /// The workflow's id.
    pub workflow_id: String,
    /// The node a new run starts at.
    pub entry: String,
    /// The nodes, by id.
    pub nodes: HashMap<String, Node>,
    /// The flow file it was loaded from.
    pub source: PathBuf,
    /// Whether a failing step leaves the run at its node (nothing
    /// committed; the driver tries again, backing off) instead of failing
    /// the run. Only the host's own embedded workflows (the automation
    /// controller) are loaded this way; a flow document cannot ask for it.
    pub steps_never_fail: bool,
    /// What loading it noticed that does not stop it from running: a
    /// route label its component does not declare (`nodes.ID.routes.LABEL:
    /// ...`).
    pub warnings: Vec<String>,
}

/// One node of a [`Workflow`].
#[derive(Debug)]
pub struct Node {
    /// The node's id.
    pub id: String,
    /// What the node does.
    pub kind: NodeKind,
    /// The default next node.
    pub next: Option<String>,
    /// Route labels a component may return as its next node, mapped to node ids.
    pub routes: BTreeMap<String, String>,
}

/// What a node does.
#[derive(Debug)]
pub enum NodeKind {
    /// Calls a WebAssembly component's `handle`.
    Component {
        /// The component, compiled and pre-instantiated.
        component: Arc<NodeComponent>,
        /// The node's static config, as the JSON text passed to the guest;
        /// `None` when the node has none (absent or `null`).
        config_json: Option<String>,
        /// Whether the guest also sees the host's bookkeeping vars
        /// (`_runtime`, `_limits`); the flow's `host_vars`.
        host_vars: bool,
    },
    /// Requests a built-in effect with a payload template.
    Effect {
        /// The effect kind.
        kind: String,
        /// The payload template (see [`template`]).
        payload: Value,
        /// Where the effect's result is written.
        result_key: Option<String>,
    },
    /// Completes the run with an output template.
    Complete {
        /// The output template.
        output: Value,
    },
}

impl Node {
    /// Resolves a next-node name returned by a component: a route label of
    /// this node, or a node id.
    pub fn resolve_route<'a>(&'a self, name: &'a str) -> &'a str {
        self.routes.get(name).map(String::as_str).unwrap_or(name)
    }
}

/// The workflows of one bundle directory.
#[derive(Debug)]
pub struct Bundle {
    /// The bundle directory (canonical).
    pub dir: PathBuf,
    /// The main workflow's id (from `flow.json`).
    pub main_workflow_id: String,
    /// Every workflow of the bundle, main first.
    pub workflows: Vec<Arc<Workflow>>,
}

impl Bundle {
    /// What loading its workflows noticed that does not stop them (see
    /// [`Workflow::warnings`]).
    pub fn warnings(&self) -> Vec<String> {
        self.workflows
            .iter()
            .flat_map(|w| w.warnings.iter().cloned())
            .collect()
    }
}

/// Loads and validates every flow file of the bundle at `dir`, compiling (or
/// loading from the cache) each component it names.
///
/// `effects` are the effect kinds an effect node may name.
pub fn load_bundle(
    dir: &Path,
    engine: &WasmEngine,
    effects: &[String],
) -> Result<Bundle, FlowError> {
    let dir = dir
        .canonicalize()
        .map_err(|e| FlowError::new(dir, "", format!("cannot open the bundle directory: {e}")))?;
    let main = dir.join(MAIN_FLOW_FILE);
    if !main.is_file() {
        return Err(FlowError::new(
            &dir,
            "",
            format!("no {MAIN_FLOW_FILE} in this directory"),
        ));
    }
    let mut files = vec![main];
    let mut extra: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| FlowError::new(&dir, "", format!("cannot list the directory: {e}")))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".flow.json"))
        })
        .collect();
    extra.sort();
    files.extend(extra);

    let mut workflows: Vec<Arc<Workflow>> = Vec::new();
    for file in files {
        add_workflow(
            &mut workflows,
            load_flow_file(&file, engine, effects)?,
            &file,
        )?;
    }
    Ok(Bundle {
        dir,
        main_workflow_id: workflows[0].workflow_id.clone(),
        workflows,
    })
}

/// Adds `wf` (read from `file`) to a bundle's `workflows`, unless one of
/// them has its id.
fn add_workflow(
    workflows: &mut Vec<Arc<Workflow>>,
    wf: Workflow,
    file: &Path,
) -> Result<(), FlowError> {
    if let Some(prev) = workflows.iter().find(|w| w.workflow_id == wf.workflow_id) {
        return Err(FlowError::new(
            file,
            "workflow_id",
            format!(
                "{:?} is already defined by {}",
                wf.workflow_id,
                prev.source.display()
            ),
        ));
    }
    workflows.push(Arc::new(wf));
    Ok(())
}

/// The largest flow document the host reads (a flow is a graph of nodes,
/// not a place for data).
pub const MAX_FLOW_FILE_BYTES: u64 = 4 << 20;

/// Loads and validates one flow file (at most [`MAX_FLOW_FILE_BYTES`]);
/// `effects` are the effect kinds an effect node may name.
pub fn load_flow_file(
    path: &Path,
    engine: &WasmEngine,
    effects: &[String],
) -> Result<Workflow, FlowError> {
    let size = std::fs::metadata(path)
        .map_err(|e| FlowError::new(path, "", format!("cannot read the file: {e}")))?
        .len();
    if size > MAX_FLOW_FILE_BYTES {
        return Err(FlowError::new(
            path,
            "",
            format!("the file is {size} bytes, over the limit of {MAX_FLOW_FILE_BYTES} for a flow document"),
        ));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| FlowError::new(path, "", format!("cannot read the file: {e}")))?;
    let base = path.parent().unwrap_or(Path::new(".")).to_path_buf();
    let load = |component: &str| {
        let file = base.join(component);
        if !file.is_file() {
            return Err(format!(
                "component file {} not found (build the guests: scripts/build-guests)",
                file.display()
            ));
        }
        engine.load_node(&file).map_err(|e| e.to_string())
    };
    flow_from_text(path, &text, &load, effects)
}

/// Parses and validates the flow document `text` (named `path` in errors).
fn flow_from_text(
    path: &Path,
    text: &str,
    load: &dyn Fn(&str) -> Result<Arc<NodeComponent>, String>,
    effects: &[String],
) -> Result<Workflow, FlowError> {
    if let Some(found) = stepwell_flat_json::find_inexact_integer(text) {
        let message = crate::core::config::inexact_message(&found.literal);
        return Err(FlowError::new(path, found.path, message));
    }
    let doc: FlowDoc = {
        let mut de = serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let field = e.path().to_string();
            let field = if field == "." { String::new() } else { field };
            FlowError::new(path, field, e.inner().to_string())
        })?
    };
    build_workflow(path, doc, load, effects)
}

/// Loads a bundle from its files in memory (as a store keeps them, see
/// [`archive`]): `flow.json` and the other `*.flow.json` files at its top,
/// each component named by its path among the files. `label` stands for
/// the bundle's directory in the workflows' sources and in errors.
pub fn load_bundle_files(
    files: &archive::BundleFiles,
    label: &Path,
    engine: &WasmEngine,
    effects: &[String],
) -> Result<Bundle, FlowError> {
    let file = |path: &str| files.files.iter().find(|f| f.path == path);
    let mut flows: Vec<&archive::BundleFile> = files
        .files
        .iter()
        .filter(|f| !f.path.contains('/') && f.path.ends_with(".flow.json"))
        .collect();
    let main = file(MAIN_FLOW_FILE)
        .ok_or_else(|| FlowError::new(label, "", format!("no {MAIN_FLOW_FILE} in the bundle")))?;
    flows.insert(0, main);
    let mut workflows: Vec<Arc<Workflow>> = Vec::new();
    for flow in flows {
        let path = label.join(&flow.path);
        if flow.bytes.len() as u64 > MAX_FLOW_FILE_BYTES {
            return Err(FlowError::new(
                &path,
                "",
                format!(
                    "the file is over the limit of {MAX_FLOW_FILE_BYTES} bytes for a flow document"
                ),
            ));
        }
        let text = std::str::from_utf8(&flow.bytes)
            .map_err(|e| FlowError::new(&path, "", format!("not UTF-8: {e}")))?;
        let load = |component: &str| {
            let found = archive::clean_path(component)
                .then(|| file(component))
                .flatten()
                .ok_or_else(|| {
                    format!("component {component:?} is not among the bundle's files")
                })?;
            engine
                .load_node_bytes(&found.bytes, &label.join(component))
                .map_err(|e| e.to_string())
        };
        add_workflow(
            &mut workflows,
            flow_from_text(&path, text, &load, effects)?,
            &path,
        )?;
    }
    Ok(Bundle {
        dir: label.to_path_buf(),
        main_workflow_id: workflows[0].workflow_id.clone(),
        workflows,
    })
}

/// Loads a flow document the host embeds (`label` names it in errors, for
/// example `builtin:automation-controller/flow.json`); its components are
/// looked up by name in `components` (name, bytes).
pub fn load_embedded_flow(
    label: &Path,
    text: &str,
    engine: &WasmEngine,
    effects: &[String],
    components: &[(&str, &[u8])],
) -> Result<Workflow, FlowError> {
    let doc: FlowDoc = {
        let mut de = serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(&mut de)
            .map_err(|e| FlowError::new(label, e.path().to_string(), e.inner().to_string()))?
    };
    let load = |component: &str| match components.iter().find(|(n, _)| *n == component) {
        None => Err(format!("the host embeds no component {component:?}")),
        Some((name, bytes)) => engine
            .load_node_bytes(bytes, &Path::new("builtin:").join(name))
            .map_err(|e| e.to_string()),
    };
    build_workflow(label, doc, &load, effects)
}

fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '@' | ':'))
}

fn build_workflow(
    path: &Path,
    doc: FlowDoc,
    load: &dyn Fn(&str) -> Result<Arc<NodeComponent>, String>,
    effects: &[String],
) -> Result<Workflow, FlowError> {
    let err = |field: String, msg: String| FlowError::new(path, field, msg);
    if !valid_id(&doc.workflow_id) {
        return Err(err(
            "workflow_id".into(),
            format!(
                "{:?} is not a valid id (letters, digits and _ - . @ : only)",
                doc.workflow_id
            ),
        ));
    }
    if doc.nodes.is_empty() {
        return Err(err(
            "nodes".into(),
            "a workflow needs at least one node".into(),
        ));
    }
    if !doc.nodes.contains_key(&doc.entry) {
        return Err(err(
            "entry".into(),
            format!("the entry node {:?} is not defined in nodes", doc.entry),
        ));
    }
    let mut nodes = HashMap::with_capacity(doc.nodes.len());
    let mut warnings = Vec::new();
    for (id, n) in &doc.nodes {
        let field = |f: &str| {
            if f.is_empty() {
                format!("nodes.{id}")
            } else {
                format!("nodes.{id}.{f}")
            }
        };
        if !valid_id(id) {
            return Err(err(field(""), format!("{id:?} is not a valid node id")));
        }
        let kinds = [
            n.component.is_some(),
            n.effect.is_some(),
            n.complete.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if kinds != 1 {
            return Err(err(
                field(""),
                "a node needs exactly one of `component`, `effect` or `complete`".into(),
            ));
        }
        if let Some(next) = &n.next {
            if !doc.nodes.contains_key(next) {
                return Err(err(
                    field("next"),
                    format!("routes to unknown node {next:?}"),
                ));
            }
        }
        for (label, target) in &n.routes {
            if !doc.nodes.contains_key(target) {
                return Err(err(
                    field(&format!("routes.{label}")),
                    format!("routes to unknown node {target:?}"),
                ));
            }
        }
        let kind = if let Some(component) = &n.component {
            if n.payload.is_some() || n.result_key.is_some() {
                return Err(err(
                    field(""),
                    "`payload` and `result_key` belong to effect nodes, not component nodes".into(),
                ));
            }
            let component = load(component).map_err(|e| err(field("component"), e))?;
            warnings.extend(undeclared_routes(path, id, &n.routes, &component));
            NodeKind::Component {
                component,
                config_json: n
                    .config
                    .as_ref()
                    .filter(|c| !c.is_null())
                    .map(Value::to_string),
                host_vars: n.host_vars,
            }
        } else if let Some(kind) = &n.effect {
            if n.config.is_some() || !n.routes.is_empty() || n.host_vars {
                return Err(err(
                    field(""),
                    "`config`, `routes` and `host_vars` belong to component nodes, not effect nodes"
                        .into(),
                ));
            }
            if !effects.iter().any(|k| k == kind) {
                return Err(err(
                    field("effect"),
                    format!("unknown effect {kind:?} (known: {})", effects.join(", ")),
                ));
            }
            if let Some(why) = n.result_key.as_deref().and_then(bad_result_key) {
                return Err(err(field("result_key"), why));
            }
            let payload = n
                .payload
                .clone()
                .unwrap_or_else(|| Value::Object(Default::default()));
            if !payload.is_object() {
                return Err(err(field("payload"), "must be a JSON object".into()));
            }
            NodeKind::Effect {
                kind: kind.clone(),
                payload,
                result_key: n.result_key.clone(),
            }
        } else {
            if n.next.is_some()
                || !n.routes.is_empty()
                || n.config.is_some()
                || n.payload.is_some()
                || n.result_key.is_some()
                || n.host_vars
            {
                return Err(err(
                    field(""),
                    "a `complete` node ends the run: it takes no `next`, `routes`, `config`, `payload` or `result_key`"
                        .into(),
                ));
            }
            NodeKind::Complete {
                output: n.complete.clone().unwrap_or(Value::Null),
            }
        };
        nodes.insert(
            id.clone(),
            Node {
                id: id.clone(),
                kind,
                next: n.next.clone(),
                routes: n.routes.clone(),
            },
        );
    }
    Ok(Workflow {
        workflow_id: doc.workflow_id,
        entry: doc.entry,
        nodes,
        source: path.to_path_buf(),
        steps_never_fail: false,
        warnings,
    })
}

/// The routes of node `id` that its component does not declare it may
/// return (it declares some): such a route is never taken unless the
/// component returns the label anyway.
fn undeclared_routes(
    path: &Path,
    id: &str,
    routes: &BTreeMap<String, String>,
    component: &NodeComponent,
) -> Vec<String> {
    let Some(declared) = component.declared_routes() else {
        return Vec::new();
    };
    routes
        .keys()
        .filter(|label| !declared.contains(label))
        .map(|label| {
            format!(
                "{}: nodes.{id}.routes.{label}: {} declares the routes {} and not {label:?}",
                path.display(),
                component.path().display(),
                declared.join(", ")
            )
        })
        .collect()
}
