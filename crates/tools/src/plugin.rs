//! The tools feature as a kernel plugin: the `tool_calls` and `tool_specs`
//! effects over one [`ToolCatalog`], and the freezing of every new run's
//! workspace scope.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{json, Value};

use super::effect::{ToolCalls, ToolSpecs};
use super::{scope, ToolCatalog, ToolTable};
use stepwell_runtime::core::plugin::{Install, Plugin, RunStart};
use stepwell_runtime::core::{Error, Result};
use stepwell_runtime::Runtime;

/// The tools plugin: the built-in workspace tools, a folder of third-party
/// ones, and the host tool `execute_command` when turned on.
///
/// ```
/// use std::sync::Arc;
/// use stepwell_tools::{Tools, ToolsExt};
/// use stepwell_runtime::{MemoryStore, Runtime};
///
/// # fn main() -> stepwell_runtime::Result<()> {
/// let rt = Runtime::builder(Arc::new(MemoryStore::new()))
///     .plugin(Arc::new(Tools::new()))
///     .build()?;
/// assert!(rt.effects().get("tool_calls").is_some());
/// assert!(rt.tools()?.get("read_file").is_some());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct Tools {
    dir: Option<PathBuf>,
    enable_exec: bool,
    exec_env: super::exec::ExecEnv,
    home: Option<PathBuf>,
    ruff: Option<PathBuf>,
}

impl Tools {
    /// The built-in workspace tools only; `execute_command` off.
    pub fn new() -> Self {
        Self::default()
    }

    /// The folder of third-party tool components (`*.wasm`) `tool_calls`
    /// may run, beside the built-in workspace tools (the binary's
    /// `--tool-dir` or `STEPWELL_TOOL_DIR`).
    pub fn dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// Offers the host tool `execute_command` (a shell command run with the
    /// host's rights, always after a person's approval; docs/tools.md).
    /// Default: off (the binary's `--enable-exec` or
    /// `STEPWELL_ENABLE_EXEC=1` turn it on).
    pub fn enable_exec(mut self, on: bool) -> Self {
        self.enable_exec = on;
        self
    }

    /// The environment `execute_command` gives a command, all of it
    /// (default: empty; the binary gives its own `PATH`, `HOME`, `LANG`,
    /// `LC_ALL` and `TMPDIR`, [`super::exec::PASSED_ENV`]).
    pub fn exec_env(mut self, env: super::exec::ExecEnv) -> Self {
        self.exec_env = env;
        self
    }

    /// Lints Python files after the built-in `write_file` and `edit_file`
    /// with the ruff program `program` (run by the host, in the file's
    /// folder, with the environment of [`exec_env`](Self::exec_env)), as
    /// the reference does where ruff is installed (default: none, and the
    /// notice is the reference's line for a missing ruff; the binary's
    /// `--ruff` or `STEPWELL_RUFF`).
    pub fn ruff(mut self, program: impl Into<PathBuf>) -> Self {
        self.ruff = Some(program.into());
        self
    }

    /// The host user's home folder: a `~` or `~/...` in a workspace path
    /// (the run's scope, a path a tool is given) means it, as the
    /// reference's `expanduser` (default: none, and `~` stays a name; the
    /// binary gives its `$HOME`).
    pub fn home(mut self, home: impl Into<PathBuf>) -> Self {
        self.home = Some(home.into());
        self
    }
}

impl Plugin for Tools {
    fn name(&self) -> &'static str {
        "tools"
    }

    fn install(&self, cx: &mut Install<'_>) -> Result<()> {
        let catalog = Arc::new(
            ToolCatalog::new(cx.engine().clone(), self.dir.clone(), self.enable_exec)
                .with_exec_env(self.exec_env.clone())
                .with_ruff(self.ruff.clone()),
        );
        cx.default_effect(Arc::new(ToolCalls::new(catalog.clone())));
        cx.default_effect(Arc::new(ToolSpecs::new(catalog.clone())));
        cx.set_extension(catalog);
        Ok(())
    }

    /// The workspace scope is frozen now, from the run's own vars over what
    /// a parent handed down: tools read only this snapshot, so no guest can
    /// widen its scope later.
    fn seal_run(&self, rt: &Runtime, run: &mut RunStart<'_>) -> Result<()> {
        match scope::freeze(run.vars, run.runtime.get("workspace"), self.home.as_deref())
            .map_err(|(field, why)| Error::invalid(field, why))?
        {
            Some(mut frozen) => {
                protect_host_paths(&mut frozen, &rt.config().tool_deny_paths);
                run.runtime.insert("workspace".into(), frozen);
            }
            None => {
                run.runtime.remove("workspace");
            }
        }
        Ok(())
    }
}

/// The host's own protected paths (its store) join the deny prefixes of a
/// frozen scope that has a root.
fn protect_host_paths(frozen: &mut Value, deny: &[PathBuf]) {
    if deny.is_empty() || frozen.get("workspace_root").is_none() {
        return;
    }
    let mut list = scope::path_list(frozen.get("workspace_builtin_deny_prefixes"));
    for p in deny {
        let p = p.to_string_lossy().into_owned();
        if !list.contains(&p) {
            list.push(p);
        }
    }
    frozen["workspace_builtin_deny_prefixes"] = json!(list);
    frozen["host_protected"] = json!(deny
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect::<Vec<_>>());
}

/// What the tools plugin adds to a [`Runtime`].
pub trait ToolsExt {
    /// The tools `tool_calls` runs (the built-in workspace tools and the
    /// tool folder's), loaded on first use.
    fn tools(&self) -> Result<Arc<ToolTable>>;
}

impl ToolsExt for Runtime {
    fn tools(&self) -> Result<Arc<ToolTable>> {
        let catalog = self.extension::<ToolCatalog>().ok_or_else(|| {
            Error::invalid(
                "tools",
                "this runtime has no tools plugin (stepwell::tools::Tools)",
            )
        })?;
        catalog
            .table()
            .map_err(|message| Error::invalid("tool_dir", message))
    }
}
