//! Tools: what a model may ask the host to do through the `tool_calls`
//! effect. Every tool is a WebAssembly component (the `tool` world of
//! `crates/wasm/wit/tool.wit`): the built-in workspace tools (`list_files`,
//! `search_files`, `read_file`, `write_file`, `edit_file`) are embedded in
//! the host, and third-party tools are component files in a tool folder
//! (`--tool-dir` / `STEPWELL_TOOL_DIR`).
//!
//! A tool never gets more than its call needs: each call runs in a fresh
//! instance whose only directories are the ones the run's workspace scope
//! ([`scope`]) grants the tool's [`ToolClass`], preopened read-only unless
//! the tool writes and the scope lets it. The rest of the pipeline (the
//! ceiling of allowed tools, approvals, per-call results) is in [`calls`];
//! the effect itself in [`effect`], the plugin that adds it in [`Tools`].

// Every public item says what it is; every unsafe operation sits in a
// block that says why it holds (a `SAFETY:` comment).
#![deny(
    missing_docs,
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks
)]

pub mod attach;
pub mod calls;
pub mod effect;
pub mod evidence;
pub mod exec;
mod plugin;
pub mod ruff;
pub mod scope;

pub use plugin::{Tools, ToolsExt};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde::Serialize;
use serde_json::Value;

use stepwell_runtime::wasm::{ToolComponent, WasmEngine};

/// The environment variable naming the folder of third-party tools.
pub const TOOL_DIR_ENV: &str = "STEPWELL_TOOL_DIR";

/// The variable the binary reads the ruff program from (`--ruff`): the
/// built-in `write_file` and `edit_file` lint Python files with it.
pub const RUFF_ENV: &str = "STEPWELL_RUFF";

static BUILTINS: [(&str, &[u8]); 1] = [(
    "workspace",
    include_bytes!(env!("STEPWELL_BUILTIN_TOOLS_WORKSPACE")),
)];

// A tool's class and spec are what its component's contract says of it:
// they live with the sandbox that loads tools (`wasm`), named here too.
pub use stepwell_runtime::wasm::{ToolClass, ToolSpec};

/// Where a tool comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Embedded in the host.
    Builtin,
    /// Run by the host itself, outside any sandbox (`execute_command`).
    Host,
    /// A component file in the tool folder.
    File(PathBuf),
}

impl Serialize for Origin {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Origin::Builtin => s.serialize_str("builtin"),
            Origin::Host => s.serialize_str("host"),
            Origin::File(p) => s.serialize_str(&p.display().to_string()),
        }
    }
}

/// One entry of the tool table: a tool, or a component that could not be
/// used (with why).
#[derive(Debug, Clone, Serialize)]
pub struct ToolEntry {
    /// The tool's name, or the file name of a component that did not load.
    pub name: String,
    /// Where it comes from.
    pub origin: Origin,
    /// The tool's spec, when it could be read.
    pub spec: Option<ToolSpec>,
    /// Whether it can be called.
    pub available: bool,
    /// Why not, when it cannot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip)]
    component: Option<Arc<ToolComponent>>,
}

impl ToolEntry {
    /// The component that runs the tool (`None` when unavailable).
    pub fn component(&self) -> Option<&Arc<ToolComponent>> {
        self.component.as_ref()
    }
}

/// Whether `name` is a valid tool name: `[A-Za-z0-9_.-]{1,64}`.
pub fn valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Every tool the host knows: the built-ins, then the tool folder's
/// components in file-name order. A component that fails to load, traps,
/// or offers a bad or duplicate tool is listed unavailable with the reason
/// (its other tools stay usable unless the whole component failed); the
/// built-ins must load.
#[derive(Debug, Clone, Default)]
pub struct ToolTable {
    entries: Vec<ToolEntry>,
    by_name: BTreeMap<String, usize>,
}

impl ToolTable {
    /// Loads the built-in tools, `execute_command` when `exec` is on, and
    /// every `*.wasm` file of `dir`.
    pub fn load(engine: &WasmEngine, dir: Option<&Path>, exec: bool) -> Result<Self, String> {
        let mut table = ToolTable::default();
        for (name, bytes) in BUILTINS {
            let label = PathBuf::from(format!("builtin:{name}"));
            let component = engine
                .load_tool_bytes(bytes, &label)
                .map_err(|e| format!("built-in tools {name}: {e}"))?;
            let specs = component
                .describe()
                .map_err(|e| format!("built-in tools {name}: {e}"))?;
            for spec in specs {
                if let Some(why) = table.refusal(&spec) {
                    return Err(format!("built-in tools {name}: {why}"));
                }
                table.add(ToolEntry {
                    name: spec.name.clone(),
                    origin: Origin::Builtin,
                    spec: Some(spec),
                    available: true,
                    reason: None,
                    component: Some(component.clone()),
                });
            }
        }
        table.add(ToolEntry {
            name: "open_attachment".into(),
            origin: Origin::Host,
            spec: Some(attach::spec()),
            available: true,
            reason: None,
            component: None,
        });
        if exec {
            table.add(ToolEntry {
                name: "execute_command".into(),
                origin: Origin::Host,
                spec: Some(exec::spec()),
                available: true,
                reason: None,
                component: None,
            });
        }
        let Some(dir) = dir else {
            return Ok(table);
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| format!("tool_dir {}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "wasm") && p.is_file())
            .collect();
        files.sort();
        for file in files {
            let origin = Origin::File(file.clone());
            let broken = |why: String| ToolEntry {
                name: file
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                origin: origin.clone(),
                spec: None,
                available: false,
                reason: Some(why),
                component: None,
            };
            let loaded = std::fs::read(&file)
                .map_err(|e| format!("cannot read: {e}"))
                .and_then(|bytes| {
                    engine
                        .load_tool_bytes(&bytes, &file)
                        .map_err(|e| e.to_string())
                })
                .and_then(|c| c.describe().map(|s| (c, s)).map_err(|e| e.to_string()));
            let (component, specs) = match loaded {
                Ok(x) => x,
                Err(why) => {
                    table.entries.push(broken(why));
                    continue;
                }
            };
            if specs.is_empty() {
                table.entries.push(broken("offers no tool".into()));
                continue;
            }
            for spec in specs {
                match table.refusal(&spec) {
                    Some(why) => table.entries.push(ToolEntry {
                        name: spec.name.clone(),
                        origin: origin.clone(),
                        spec: Some(spec),
                        available: false,
                        reason: Some(why),
                        component: None,
                    }),
                    None => table.add(ToolEntry {
                        name: spec.name.clone(),
                        origin: origin.clone(),
                        spec: Some(spec),
                        available: true,
                        reason: None,
                        component: Some(component.clone()),
                    }),
                }
            }
        }
        Ok(table)
    }

    /// Why `spec` cannot join the table, if it cannot.
    fn refusal(&self, spec: &ToolSpec) -> Option<String> {
        if !valid_tool_name(&spec.name) {
            return Some(format!(
                "the tool name {:?} is not valid ([A-Za-z0-9_.-], at most 64)",
                spec.name
            ));
        }
        if self.by_name.contains_key(&spec.name) {
            return Some(format!(
                "a tool named {:?} is already defined (the first one wins)",
                spec.name
            ));
        }
        if spec.parameters.get("type").and_then(Value::as_str) != Some("object") {
            return Some(format!(
                "tool {:?}: parameters must be a JSON Schema of type object",
                spec.name
            ));
        }
        None
    }

    fn add(&mut self, entry: ToolEntry) {
        self.by_name.insert(entry.name.clone(), self.entries.len());
        self.entries.push(entry);
    }

    /// Every entry, usable or not, in load order.
    pub fn entries(&self) -> &[ToolEntry] {
        &self.entries
    }

    /// The usable tool `name`.
    pub fn get(&self, name: &str) -> Option<&ToolEntry> {
        self.by_name.get(name).map(|&i| &self.entries[i])
    }

    /// The specs of every usable tool, in load order.
    pub fn specs(&self) -> Vec<&ToolSpec> {
        self.entries
            .iter()
            .filter(|e| e.available)
            .filter_map(|e| e.spec.as_ref())
            .collect()
    }
}

/// The tool table of a runtime, loaded on first use.
#[derive(Debug)]
pub struct ToolCatalog {
    engine: WasmEngine,
    dir: Option<PathBuf>,
    exec: bool,
    exec_env: exec::ExecEnv,
    home: Option<PathBuf>,
    ruff: Option<PathBuf>,
    table: OnceLock<Result<Arc<ToolTable>, String>>,
}

impl ToolCatalog {
    /// A catalog of the built-in tools, `execute_command` when `exec` is
    /// on, and the tools of `dir`.
    pub fn new(engine: WasmEngine, dir: Option<PathBuf>, exec: bool) -> Self {
        ToolCatalog {
            engine,
            dir,
            exec,
            exec_env: exec::ExecEnv::default(),
            home: None,
            ruff: None,
            table: OnceLock::new(),
        }
    }

    /// This catalog, its `execute_command` giving commands `env`.
    pub fn with_exec_env(mut self, env: exec::ExecEnv) -> Self {
        self.exec_env = env;
        self
    }

    /// The environment `execute_command` gives a command.
    pub fn exec_env(&self) -> &exec::ExecEnv {
        &self.exec_env
    }

    /// This catalog, the built-in `write_file` and `edit_file` linting
    /// Python files with the ruff program `ruff` (`None`: the reference's
    /// line for a missing ruff).
    pub fn with_ruff(mut self, ruff: Option<PathBuf>) -> Self {
        self.ruff = ruff;
        self
    }

    /// The ruff program the built-ins lint Python files with, if any.
    pub fn ruff(&self) -> Option<&Path> {
        self.ruff.as_deref()
    }

    /// This catalog, a `~` in a workspace path meaning `home`.
    pub fn with_home(mut self, home: Option<PathBuf>) -> Self {
        self.home = home;
        self
    }

    /// The host user's home folder, for a `~` in a workspace path.
    pub fn home(&self) -> Option<&Path> {
        self.home.as_deref()
    }

    /// The table (loaded now if it was not).
    pub fn table(&self) -> Result<Arc<ToolTable>, String> {
        self.table
            .get_or_init(|| {
                ToolTable::load(&self.engine, self.dir.as_deref(), self.exec).map(Arc::new)
            })
            .clone()
    }

    /// The engine tools run in.
    pub fn engine(&self) -> &WasmEngine {
        &self.engine
    }
}
