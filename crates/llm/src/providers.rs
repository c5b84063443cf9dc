//! The providers a host may call: named profiles (a base URL, where the
//! API key comes from, a default model, a timeout), from a JSON file and
//! the usual environment variables, and the HTTP exchange with one.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The longest a request may take, in seconds, unless its profile says
/// otherwise (the reference's `DEFAULT_LLM_TIMEOUT_S`).
pub const DEFAULT_TIMEOUT_S: f64 = 7200.0;
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer body read.
const MAX_BODY_BYTES: u64 = 64 << 20;

/// One provider profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provider {
    /// Its name (`payload.provider`, `_runtime.provider`).
    pub name: String,
    /// The API's base URL, with its `/v1` (`http://localhost:11434/v1`).
    pub base_url: String,
    /// The environment variable that holds its API key, read at each call
    /// (the key itself is never stored); sent as `Authorization: Bearer`
    /// unless empty or `EMPTY`.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// The model when neither the payload nor the run names one.
    #[serde(default)]
    pub default_model: Option<String>,
    /// The longest a request may take, in seconds (default 7200).
    #[serde(default)]
    pub timeout_s: Option<f64>,
    /// Extra headers sent with every request.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The HTTP proxy this profile's requests go through
    /// (`http://[user:password@]host:port`), or `"none"` to go straight
    /// to the provider whatever the host's proxy settings say. Unset: the
    /// host's settings (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`,
    /// `NO_PROXY`).
    #[serde(default)]
    pub proxy: Option<String>,
}

impl Provider {
    /// A profile `name` at `base_url` with `default_model`, no key, the
    /// default timeout and no extra headers.
    pub fn new(name: &str, base_url: &str, default_model: Option<&str>) -> Self {
        Provider {
            name: name.to_string(),
            base_url: base_url.to_string(),
            api_key_env: None,
            default_model: default_model.map(str::to_string),
            timeout_s: None,
            headers: BTreeMap::new(),
            proxy: None,
        }
    }
}

/// The file form: `{"default": "<name>", "providers": [...]}`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProvidersFile {
    #[serde(default)]
    default: Option<String>,
    #[serde(default)]
    providers: Vec<Provider>,
}

/// Why an LLM call failed: a reason code (`llm_unavailable`,
/// `llm_request_failed`, `llm_timeout`), a message, and whether trying
/// again could help (the reference's classification: transport errors,
/// timeouts, 408, 409, 425, 429 and 5xx yes; other 4xx no).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlmError {
    /// The reason code.
    pub code: &'static str,
    /// What went wrong.
    pub message: String,
    /// Whether a later attempt may succeed.
    pub retryable: bool,
}

impl From<LlmError> for stepwell_runtime::effects::Failure {
    /// The effect's failure: the same code, message and retry verdict.
    fn from(e: LlmError) -> Self {
        stepwell_runtime::effects::Failure {
            code: e.code.to_string(),
            message: e.message,
            retryable: e.retryable,
        }
    }
}

impl LlmError {
    fn unavailable(message: impl Into<String>) -> Self {
        LlmError {
            code: "llm_unavailable",
            message: message.into(),
            retryable: false,
        }
    }
}

/// Where settings and API keys come from: the value of a name, if it has
/// one. The library reads no environment: the `stepwell` binary passes
/// its process environment, an embedder passes what it chooses.
///
/// ```
/// use std::sync::Arc;
/// use stepwell_llm::LlmCall;
/// use stepwell_llm::{Providers, Settings};
///
/// let settings = Settings::new(|name| match name {
///     "STEPWELL_LLM_PROVIDER" => Some("ollama".into()),
///     _ => None,
/// });
/// let providers = Providers::from_settings(&settings);
/// assert_eq!(providers.default_name(), Some("ollama"));
/// // Without settings: the built-in profiles, no default, no keys.
/// assert_eq!(Providers::from_settings(&Settings::default()).default_name(), None);
/// let rt = stepwell_runtime::Runtime::builder(Arc::new(stepwell_runtime::MemoryStore::new()))
///     .effect(Arc::new(LlmCall::configured(None, &settings)))
///     .build()?;
/// # drop(rt);
/// # Ok::<(), stepwell_runtime::Error>(())
/// ```
#[derive(Clone, Default)]
pub struct Settings(Option<Arc<Lookup>>);

/// A settings lookup: the value of a name.
type Lookup = dyn Fn(&str) -> Option<String> + Send + Sync;

impl Settings {
    /// Settings read from `lookup` (called again at each LLM call for the
    /// API keys, so a key is never stored).
    pub fn new(lookup: impl Fn(&str) -> Option<String> + Send + Sync + 'static) -> Self {
        Settings(Some(Arc::new(lookup)))
    }

    /// The value of `name`, unless it is blank.
    pub fn get(&self, name: &str) -> Option<String> {
        let lookup = self.0.as_ref()?;
        lookup(name).filter(|v| !v.trim().is_empty())
    }
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Settings(..)"
        } else {
            "Settings(none)"
        })
    }
}

/// The providers a host may call, and its default.
#[derive(Debug, Clone, Default)]
pub struct Providers {
    profiles: Vec<Provider>,
    default: Option<String>,
    /// Where the API keys the profiles name are read, at each call.
    keys: Settings,
    /// The host's proxy rules, for profiles that name no proxy.
    proxies: ProxyRules,
}

/// Which requests go through which HTTP proxy: the usual `HTTPS_PROXY`,
/// `HTTP_PROXY`, `ALL_PROXY` and `NO_PROXY` (lower case first, as curl
/// reads them), from the settings the host passes.
#[derive(Clone, Default)]
struct ProxyRules(Option<Arc<ProxyMatch>>);

/// The host's proxy rules, or why they cannot be used.
type ProxyMatch = Result<hyper_util::client::proxy::matcher::Matcher, String>;

impl std::fmt::Debug for ProxyRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "ProxyRules(..)"
        } else {
            "ProxyRules(none)"
        })
    }
}

impl ProxyRules {
    /// The rules `settings` hold. Under CGI (`REQUEST_METHOD` set) the
    /// upper-case `HTTP_PROXY` is ignored: a request header can set it.
    fn from_settings(settings: &Settings) -> Self {
        let first = |names: &[&str]| names.iter().find_map(|n| settings.get(n));
        let cgi = settings.get("REQUEST_METHOD").is_some();
        let http_names: &[&str] = if cgi {
            &["http_proxy"]
        } else {
            &["http_proxy", "HTTP_PROXY"]
        };
        let (all, http, https) = (
            first(&["all_proxy", "ALL_PROXY"]),
            first(http_names),
            first(&["https_proxy", "HTTPS_PROXY"]),
        );
        if all.is_none() && http.is_none() && https.is_none() {
            return ProxyRules(None);
        }
        // A proxy named but not usable is an error, never a way around it.
        for (name, value) in [
            ("ALL_PROXY", &all),
            ("HTTP_PROXY", &http),
            ("HTTPS_PROXY", &https),
        ] {
            if let Some(why) = value.as_deref().and_then(unusable_proxy) {
                return ProxyRules(Some(Arc::new(Err(format!("{name}: {why}")))));
            }
        }
        let matcher = hyper_util::client::proxy::matcher::Matcher::builder()
            .all(all.unwrap_or_default())
            .http(http.unwrap_or_default())
            .https(https.unwrap_or_default())
            .no(first(&["no_proxy", "NO_PROXY"]).unwrap_or_default())
            .build();
        ProxyRules(Some(Arc::new(Ok(matcher))))
    }

    /// The one proxy at `url`, for every destination.
    fn only(url: &str) -> Self {
        if let Some(why) = unusable_proxy(url) {
            return ProxyRules(Some(Arc::new(Err(why))));
        }
        let matcher = hyper_util::client::proxy::matcher::Matcher::builder()
            .all(url)
            .build();
        ProxyRules(Some(Arc::new(Ok(matcher))))
    }

    /// How a request to `target` goes: `Err` for a proxy this client
    /// cannot use (not `http://`).
    fn route(&self, target: &str) -> Result<crate::http::Route, String> {
        let matcher = match self.0.as_deref() {
            None => return Ok(crate::http::Route::Direct),
            Some(Err(why)) => return Err(why.clone()),
            Some(Ok(m)) => m,
        };
        let Ok(uri) = target.parse::<hyper::http::Uri>() else {
            return Ok(crate::http::Route::Direct);
        };
        let Some(intercept) = matcher.intercept(&uri) else {
            return Ok(crate::http::Route::Direct);
        };
        let proxy = intercept.uri();
        if proxy.scheme_str() != Some("http") {
            return Err("the proxy is not an http:// proxy (only those are supported)".into());
        }
        Ok(crate::http::Route::Proxy {
            uri: proxy.clone(),
            auth: intercept.basic_auth().cloned(),
        })
    }
}

impl Providers {
    /// The built-in profiles, with the overrides `settings` holds (the
    /// `stepwell` binary's are its environment variables):
    ///
    /// - `openai`: `OPENAI_BASE_URL` (else `https://api.openai.com/v1`),
    ///   key `OPENAI_API_KEY`, model `OPENAI_MODEL`;
    /// - `openai-compatible`: `OPENAI_COMPATIBLE_BASE_URL` (else
    ///   `http://localhost:1234/v1`), key `OPENAI_COMPATIBLE_API_KEY`;
    /// - `lmstudio` (`http://localhost:1234/v1`), `ollama`
    ///   (`OLLAMA_BASE_URL` + `/v1`, else `http://localhost:11434/v1`),
    ///   `vllm` (`http://localhost:8000/v1`).
    ///
    /// The default is `STEPWELL_LLM_PROVIDER`, else `openai` when
    /// `OPENAI_BASE_URL` or `OPENAI_API_KEY` is set; `STEPWELL_LLM_MODEL`
    /// sets the default profile's model.
    pub fn from_settings(settings: &Settings) -> Self {
        let env = |name: &str| settings.get(name);
        let ollama = env("OLLAMA_BASE_URL")
            .map(|u| format!("{}/v1", u.trim_end_matches('/').trim_end_matches("/v1")))
            .unwrap_or_else(|| "http://localhost:11434/v1".into());
        let profile =
            |name: &str, url: String, key: Option<&str>, model: Option<String>| Provider {
                api_key_env: key.map(str::to_string),
                ..Provider::new(name, &url, model.as_deref())
            };
        let profiles = vec![
            profile(
                "openai",
                env("OPENAI_BASE_URL").unwrap_or_else(|| "https://api.openai.com/v1".into()),
                Some("OPENAI_API_KEY"),
                env("OPENAI_MODEL"),
            ),
            profile(
                "openai-compatible",
                env("OPENAI_COMPATIBLE_BASE_URL")
                    .unwrap_or_else(|| "http://localhost:1234/v1".into()),
                Some("OPENAI_COMPATIBLE_API_KEY"),
                None,
            ),
            profile("lmstudio", "http://localhost:1234/v1".into(), None, None),
            profile("ollama", ollama, None, None),
            profile("vllm", "http://localhost:8000/v1".into(), None, None),
        ];
        let default = env("STEPWELL_LLM_PROVIDER").or_else(|| {
            (env("OPENAI_BASE_URL").is_some() || env("OPENAI_API_KEY").is_some())
                .then(|| "openai".to_string())
        });
        let mut p = Providers {
            profiles,
            default,
            keys: settings.clone(),
            proxies: ProxyRules::from_settings(settings),
        };
        if let Some(model) = env("STEPWELL_LLM_MODEL") {
            p.set_default_model(&model);
        }
        p
    }

    /// The built-in profiles ([`Providers::from_settings`]) with the
    /// profiles of the JSON file at `path` over them (a profile of the same
    /// name replaces the built-in one; the file's `default` wins over the
    /// settings', but `STEPWELL_LLM_PROVIDER` wins over both).
    pub fn load(path: &Path, settings: &Settings) -> Result<Self, String> {
        let env = |name: &str| settings.get(name);
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
        let file: ProvidersFile =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut p = Providers::from_settings(settings);
        for profile in file.providers {
            p = p.with(profile);
        }
        if env("STEPWELL_LLM_PROVIDER").is_none() {
            if let Some(d) = file.default {
                p.default = Some(d);
            }
        }
        if let Some(model) = env("STEPWELL_LLM_MODEL") {
            p.set_default_model(&model);
        }
        Ok(p)
    }

    /// `profile` alone, the default.
    pub fn only(profile: Provider) -> Self {
        let name = profile.name.clone();
        Providers::default().with(profile).with_default(&name)
    }

    /// These providers with their API keys read from `keys` (at each
    /// call; without, no profile has a key).
    pub fn with_keys(mut self, keys: Settings) -> Self {
        self.keys = keys;
        self
    }

    /// These providers with the host's proxy rules read from `settings`
    /// (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, `NO_PROXY`, lower case
    /// first), for the profiles that name no proxy of their own.
    /// [`Providers::from_settings`] and [`Providers::load`] read them.
    pub fn with_proxies(mut self, settings: &Settings) -> Self {
        self.proxies = ProxyRules::from_settings(settings);
        self
    }

    /// These providers with `profile` added (replacing one of its name).
    pub fn with(mut self, profile: Provider) -> Self {
        self.profiles.retain(|p| p.name != profile.name);
        self.profiles.push(profile);
        self
    }

    /// These providers with `name` the default.
    pub fn with_default(mut self, name: &str) -> Self {
        self.default = Some(name.to_string());
        self
    }

    fn set_default_model(&mut self, model: &str) {
        let name = self.default.clone();
        if let Some(p) = self
            .profiles
            .iter_mut()
            .find(|p| Some(&p.name) == name.as_ref())
        {
            p.default_model = Some(model.to_string());
        }
    }

    /// The profiles, in order.
    pub fn profiles(&self) -> &[Provider] {
        &self.profiles
    }

    /// The default profile's name, if there is one.
    pub fn default_name(&self) -> Option<&str> {
        self.default.as_deref()
    }

    /// The profile `name`, or the default one: `llm_unavailable` when
    /// there is no such profile (`Unknown provider: <name>`) or no default.
    pub fn resolve(&self, name: Option<&str>) -> Result<&Provider, LlmError> {
        let name = match name.or(self.default.as_deref()) {
            Some(n) => n,
            None => {
                return Err(LlmError::unavailable(
                    "no default LLM provider is configured (set STEPWELL_LLM_PROVIDER, OPENAI_BASE_URL or OPENAI_API_KEY, or name a provider)",
                ))
            }
        };
        self.profiles
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| LlmError::unavailable(format!("Unknown provider: {name}")))
    }

    /// Sends chat-completions request `body` to `provider` and returns the
    /// answer's JSON body (blocking this thread until it comes).
    pub fn call(&self, provider: &Provider, body: &Value) -> Result<Value, LlmError> {
        crate::http::block_on(self.exchange(provider, body).send())
    }

    /// The request `body` to `provider` makes, ready to send (the key is
    /// read now).
    pub(crate) fn exchange(&self, provider: &Provider, body: &Value) -> Exchange {
        let target = format!(
            "{}/chat/completions",
            provider.base_url.trim_end_matches('/')
        );
        // At most a day and a half, whatever the file says.
        let timeout = provider
            .timeout_s
            .unwrap_or(DEFAULT_TIMEOUT_S)
            .clamp(0.001, 129_600.0);
        let mut headers = vec![("Content-Type".to_string(), "application/json".to_string())];
        headers.extend(provider.headers.iter().map(|(k, v)| (k.clone(), v.clone())));
        let key = provider
            .api_key_env
            .as_deref()
            .and_then(|name| self.keys.get(name));
        if let Some(key) = key.filter(|k| k != "EMPTY") {
            headers.push(("Authorization".into(), format!("Bearer {key}")));
        }
        let route = match provider.proxy.as_deref().map(str::trim) {
            None | Some("") => self.proxies.route(&target),
            Some(none) if none.eq_ignore_ascii_case("none") => Ok(crate::http::Route::Direct),
            Some(url) => ProxyRules::only(url)
                .route(&target)
                .map_err(|why| format!("profile {}: proxy: {why}", provider.name)),
        };
        Exchange {
            // What messages and records say: never the URL's credentials.
            shown: shown_url(&target),
            target,
            route,
            timeout,
            headers,
            body: serde_json::to_vec(body).unwrap_or_default(),
        }
    }
}

/// One chat-completions request, ready to send.
pub(crate) struct Exchange {
    target: String,
    /// How it goes (`Err`: a proxy that cannot be used, and why).
    route: Result<crate::http::Route, String>,
    shown: String,
    timeout: f64,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Exchange {
    /// Sends it and returns the answer's JSON body. Dropping the future
    /// drops the request.
    pub(crate) async fn send(self) -> Result<Value, LlmError> {
        let Exchange {
            target,
            route,
            shown,
            timeout,
            headers,
            body,
        } = self;
        let route = route.map_err(LlmError::unavailable)?;
        // Where it went, as messages say it: through which proxy.
        let url = match &route {
            crate::http::Route::Direct => shown,
            crate::http::Route::Proxy { uri, .. } => {
                format!("{shown} (through the proxy {})", proxy_shown(uri))
            }
        };
        let answer = crate::http::post(crate::http::Post {
            url: &target,
            route: &route,
            headers,
            body,
            timeout: Duration::from_secs_f64(timeout),
            connect_timeout: CONNECT_TIMEOUT,
            max_body: MAX_BODY_BYTES,
        })
        .await;
        // A transport failure or a timeout, sending or reading: worth
        // another try.
        let (status, bytes) = answer.map_err(|e| match e {
            crate::http::HttpError::Timeout => LlmError {
                code: "llm_timeout",
                message: format!("{url}: no answer within {timeout} s"),
                retryable: true,
            },
            crate::http::HttpError::Transport(e) => LlmError {
                code: "llm_request_failed",
                message: format!("{url}: {e}"),
                retryable: true,
            },
        })?;
        let text = String::from_utf8_lossy(&bytes);
        let json: Option<Value> = serde_json::from_str(&text).ok();
        if !(200..300).contains(&status) {
            let said = json
                .as_ref()
                .and_then(|j| j["error"]["message"].as_str().or(j["error"].as_str()))
                .map(str::to_string)
                .unwrap_or_else(|| text.chars().take(500).collect());
            return Err(LlmError {
                code: "llm_request_failed",
                message: format!("API error ({status}) from {url}: {said}"),
                retryable: status_retryable(status, &said),
            });
        }
        json.ok_or_else(|| LlmError {
            code: "llm_request_failed",
            message: format!("{url}: the answer (HTTP {status}) is not JSON"),
            retryable: true,
        })
    }
}

/// A proxy's `host:port`, as messages name it.
fn proxy_shown(uri: &hyper::http::Uri) -> String {
    match (uri.host(), uri.port_u16()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h.to_string(),
        _ => String::new(),
    }
}

/// Why proxy URL `text` cannot be used (never echoing it: it may hold a
/// password), if it cannot: it must be `http://[user:password@]host[:port]`
/// (no scheme means `http://`), its credentials percent-encoded.
fn unusable_proxy(text: &str) -> Option<String> {
    let text = text.trim();
    let with_scheme = match text.split_once("://") {
        Some((scheme, _)) if !scheme.eq_ignore_ascii_case("http") => {
            return Some(format!(
                "a {scheme}:// proxy is not supported (only http:// proxies are)"
            ))
        }
        Some(_) => text.to_string(),
        None => format!("http://{text}"),
    };
    let bad = || {
        Some(
            "not a proxy URL (http://[user:password@]host:port, the credentials percent-encoded)"
                .to_string(),
        )
    };
    let Ok(uri) = with_scheme.parse::<hyper::http::Uri>() else {
        return bad();
    };
    let path_ok = matches!(uri.path(), "" | "/") && uri.query().is_none();
    // A port that is not a number: a password with an unencoded `/`.
    let host_port = uri
        .authority()
        .map(|a| {
            a.as_str()
                .rsplit('@')
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .unwrap_or_default();
    let port_ok = match host_port.rsplit_once(':') {
        Some((h, p)) if !h.starts_with('[') || h.ends_with(']') => p.parse::<u16>().is_ok(),
        _ => true,
    };
    if uri.host().is_none_or(str::is_empty) || !path_ok || !port_ok {
        return bad();
    }
    None
}

/// `url` without the credentials it may carry (`https://user:key@host/...`
/// reads `https://host/...`).
pub fn shown_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

/// The reference's retry classification of an HTTP error: 4xx fail at once
/// except 408, 409, 425 and 429 (and a 400 naming a known generation
/// artifact); every other status is worth another try.
fn status_retryable(status: u16, message: &str) -> bool {
    let artifact = [
        "unexpected tokens remaining in message header",
        "harmonyerror",
        "harmony generation artifact",
    ];
    let message = message.to_ascii_lowercase();
    if artifact.iter().any(|a| message.contains(a)) {
        return true;
    }
    !(400..500).contains(&status) || matches!(status, 408 | 409 | 425 | 429)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_classified_as_the_reference_does() {
        for s in [400, 401, 403, 404, 422] {
            assert!(!status_retryable(s, "bad"), "{s}");
        }
        for s in [408, 409, 425, 429, 500, 502, 503] {
            assert!(status_retryable(s, "busy"), "{s}");
        }
        assert!(status_retryable(
            400,
            "HarmonyError: unexpected tokens remaining in message header"
        ));
        assert!(status_retryable(400, "harmonyerror"));
        assert_eq!(
            shown_url("https://user:sk-1@api.example.com/v1/chat/completions"),
            "https://api.example.com/v1/chat/completions"
        );
        assert_eq!(shown_url("http://127.0.0.1:8/v1"), "http://127.0.0.1:8/v1");
    }
}
