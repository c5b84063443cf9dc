//! What the `stepwell` binary takes from its process environment, mapped
//! onto the library's explicit settings (the library reads no environment
//! variable itself).

use std::path::PathBuf;
use std::sync::Arc;

use stepwell::effects::EffectHandler;
use stepwell::llm::Settings;
use stepwell::llm::{LlmCall, LLM_CONFIG_ENV};
use stepwell::Error;

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

/// The tracer: spans to the OTLP/HTTP collector at `endpoint` (the
/// `--otlp-endpoint` flag), else at `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (a
/// full URL), else at `OTEL_EXPORTER_OTLP_ENDPOINT` (a base URL); as
/// `OTEL_SERVICE_NAME` (default `stepwell`), with the headers of
/// `OTEL_EXPORTER_OTLP_HEADERS` (`key=value,...`, values percent-encoded).
/// Off when no endpoint is set, or `OTEL_SDK_DISABLED=true`.
pub fn tracer(endpoint: Option<&str>) -> Result<stepwell::core::trace::Tracer, Error> {
    use stepwell::otlp::{OtlpConfig, OtlpExporter};
    let off = stepwell::core::trace::Tracer::off;
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(off());
    }
    let flag = endpoint.map(str::trim).filter(|e| !e.is_empty());
    let mut config = match (flag, var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) {
        (Some(base), _) => OtlpConfig::new(base),
        (None, Some(url)) => OtlpConfig {
            traces_url: url.trim().to_string(),
            ..OtlpConfig::new("")
        },
        (None, None) => match var("OTEL_EXPORTER_OTLP_ENDPOINT") {
            Some(base) => OtlpConfig::new(base.trim()),
            None => return Ok(off()),
        },
    };
    if !config.traces_url.starts_with("http://") && !config.traces_url.starts_with("https://") {
        return Err(Error::invalid(
            "otlp_endpoint",
            format!("{:?} is not an http:// or https:// URL", config.traces_url),
        ));
    }
    if let Some(name) = var("OTEL_SERVICE_NAME") {
        config.service_name = name;
    }
    config
        .resource
        .push(("process.pid", std::process::id().to_string()));
    if let Some(headers) = var("OTEL_EXPORTER_OTLP_HEADERS") {
        config.headers = otlp_headers(&headers)?;
    }
    let exporter = OtlpExporter::start(config)
        .map_err(|e| Error::invalid("otlp_endpoint", format!("the exporter did not start: {e}")))?;
    let exporter = Arc::new(exporter);
    let _ = EXPORTER.set(exporter.clone());
    Ok(stepwell::core::trace::Tracer::new(exporter))
}

/// The exporter [`tracer`] started, if any (to say what it dropped).
static EXPORTER: std::sync::OnceLock<Arc<stepwell::otlp::OtlpExporter>> =
    std::sync::OnceLock::new();

/// A warning for stderr when the exporter dropped spans (a collector that
/// refused them, was not there, or was too slow), once the command's spans
/// were flushed.
pub fn tracing_warning() -> Option<String> {
    use std::sync::atomic::Ordering;
    let c = EXPORTER.get()?.counters();
    let dropped = c.dropped.load(Ordering::Relaxed);
    (dropped > 0).then(|| {
        format!(
            "warning: {dropped} trace spans were not delivered to the OTLP collector ({} sent, {} requests failed)",
            c.sent.load(Ordering::Relaxed),
            c.failed_requests.load(Ordering::Relaxed)
        )
    })
}

/// `OTEL_EXPORTER_OTLP_HEADERS`: `key=value` pairs separated by commas,
/// values percent-decoded (the OpenTelemetry specification's form); a
/// name that is not an HTTP token or a value with control characters is
/// refused.
fn otlp_headers(text: &str) -> Result<Vec<(String, String)>, Error> {
    let bad = |why: String| Error::invalid("OTEL_EXPORTER_OTLP_HEADERS", why);
    let mut out = Vec::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| bad(format!("{pair:?} is not key=value")))?;
        let k = k.trim();
        let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if k.is_empty() || !k.bytes().all(token) {
            return Err(bad(format!("{k:?} is not a header name")));
        }
        let v = percent_decode(v.trim())
            .ok_or_else(|| bad(format!("the value of {k} is not percent-encoded UTF-8")))?;
        if v.chars().any(|c| c.is_control()) {
            return Err(bad(format!("the value of {k} holds a control character")));
        }
        out.push((k.to_string(), v));
    }
    Ok(out)
}

/// `%XX` sequences decoded (`None`: a bad escape, or not UTF-8).
fn percent_decode(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn otlp_headers_are_read_as_the_specification_writes_them() {
        let h = otlp_headers("api-key=secret, Authorization=Basic%20YWxh%3D,x=").unwrap();
        assert_eq!(
            h,
            [
                ("api-key".to_string(), "secret".to_string()),
                ("Authorization".to_string(), "Basic YWxh=".to_string()),
                ("x".to_string(), String::new()),
            ]
        );
        for bad in ["bad header=x", "novalue", "k=%zz", "k=%0a", "k=%ff", "=v"] {
            assert!(otlp_headers(bad).is_err(), "{bad}");
        }
    }
}
