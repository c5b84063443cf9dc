//! What the `stepwell` binary takes from its process environment, mapped
//! onto the library's explicit settings (the library reads no environment
//! variable itself).

use std::path::PathBuf;
use std::sync::Arc;

use stepwell::effects::EffectHandler;
use stepwell::llm::Settings;
use stepwell::llm::{LlmCall, LLM_CONFIG_ENV};

/// `name`'s value, unless unset or blank.
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Whether `STEPWELL_ENABLE_EXEC=1`.
pub fn exec_enabled() -> bool {
    var(stepwell::tools::exec::ENABLE_EXEC_ENV).is_some_and(|v| v.trim() == "1")
}

/// What a command of `execute_command` gets of this process's
/// environment: its `PATH`, `HOME`, `LANG`, `LC_ALL` and `TMPDIR`.
pub fn exec_env() -> Vec<(String, std::ffi::OsString)> {
    stepwell::tools::exec::PASSED_ENV
        .iter()
        .filter_map(|k| Some((k.to_string(), std::env::var_os(k)?)))
        .collect()
}

/// The user's home folder (`$HOME`), for a `~` in a workspace path.
pub fn home() -> Option<PathBuf> {
    std::env::var_os("HOME").map(PathBuf::from)
}

/// The folder of plugin trigger sources `STEPWELL_TRIGGER_DIR` names.
pub fn trigger_dir() -> Option<PathBuf> {
    var(stepwell::triggers::PLUGIN_DIR_ENV).map(PathBuf::from)
}

/// `$HOME` when absolute: a relative one would put the user's folders
/// under the working directory.
fn absolute_home() -> Option<PathBuf> {
    var("HOME").map(PathBuf::from).filter(|p| p.is_absolute())
}

/// The user's cache folder for stepwell: `$XDG_CACHE_HOME/stepwell` (when
/// absolute, as the XDG rules ask), else `~/.cache/stepwell`; where a
/// memory or PostgreSQL store's compiled components and bundles go.
pub fn cache_home() -> Option<PathBuf> {
    let xdg = var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    let base = xdg.or_else(|| absolute_home().map(|h| h.join(".cache")))?;
    Some(base.join("stepwell"))
}

/// The user's state folder for stepwell: `$XDG_STATE_HOME/stepwell` (when
/// absolute, as the XDG rules ask), else `~/.local/state/stepwell`; where a
/// memory or PostgreSQL store's server token and connections key go.
pub fn state_home() -> Option<PathBuf> {
    let xdg = var("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    let base = xdg.or_else(|| absolute_home().map(|h| h.join(".local/state")))?;
    Some(base.join("stepwell"))
}

/// `llm_call` configured from the environment: the providers file
/// `STEPWELL_LLM_CONFIG` names, the built-in profiles' overrides
/// (`OPENAI_BASE_URL`, `STEPWELL_LLM_PROVIDER`, ...: docs/llm.md), and the
/// API keys, read from the environment at each call.
pub fn llm_call() -> Arc<dyn EffectHandler> {
    let settings = Settings::new(|name| std::env::var(name).ok());
    let file = var(LLM_CONFIG_ENV).map(PathBuf::from);
    Arc::new(LlmCall::configured(file.as_deref(), &settings))
}

/// Turns on the guests' perf map for `STEPWELL_WASM_PERFMAP=1`
/// (docs/performance.md).
pub fn apply_profiling() {
    if var("STEPWELL_WASM_PERFMAP").is_some_and(|v| v.trim() == "1") {
        stepwell::wasm::write_perf_map();
    }
}

/// The folder `STEPWELL_DASHBOARD_DIR` names: `stepwell serve` reads the
/// dashboard's files there at each request instead of the embedded ones.
pub fn dashboard_dir() -> Option<PathBuf> {
    var("STEPWELL_DASHBOARD_DIR").map(PathBuf::from)
}
