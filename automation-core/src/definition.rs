//! The automation definition (`vars._meta.automation` of the controller
//! run): validation of a creation request, revisions, the status rule, the
//! controller's initial state and the retry backoff.
//!
//! Every check is the reference's, in the reference's order (the first
//! failure wins), with its reason code and field. Unknown keys are refused
//! at every level. Text is stripped the way Python's `str.strip()` strips,
//! and lengths count characters, not bytes.

use chrono::{DateTime, Duration, Utc};
use serde_json::{json, Map, Value};

use crate::ids::{automation_session_id, binding_id, canonical_json};
use crate::time::{format_timestamp, parse_duration};
use crate::{AutomationError, CONTROLLER_BUNDLE_REF, CONTROLLER_FLOW_ID};

/// What a definition needs of the trigger sources: a source's own check of
/// a trigger's config. The host implements it over its trigger registry;
/// an unknown source is `unknown_trigger_source` (field
/// `trigger.source_id`), a refused config the source's own reason and field.
pub trait TriggerCheck {
    /// Source `name` (`<source_id>@<version>`)'s `validate` of `config` at
    /// `now`: the config as the source normalised it.
    fn validate(&self, name: &str, config: &Value, now: &str) -> Result<Value, AutomationError>;
}

/// The definition schema this host writes (`_meta.automation.schema_version`).
pub const DEFINITION_SCHEMA_VERSION: u64 = 2;
/// The longest title, in characters.
pub const TITLE_MAX: usize = 120;
/// The longest `notify.title` kept, in characters.
pub const NOTIFY_TITLE_MAX: usize = 120;
/// The longest `notify.body` kept, in characters.
pub const NOTIFY_BODY_MAX: usize = 2000;
/// The retry policy of a definition that names none: three attempts, 30 s
/// doubling up to 10 min between them.
pub const DEFAULT_RETRY: &str =
    r#"{"max_attempts":3,"backoff":{"initial":"30s","factor":2,"max":"10m"}}"#;

const REQUEST_FIELDS: [&str; 14] = [
    "request_id",
    "tenant",
    "user",
    "title",
    "target",
    "trigger",
    "context",
    "policy",
    "notify",
    "workspace_root",
    "session_id",
    "origin_run_id",
    "one_shot",
    "untrusted_origin",
];
const REVISABLE_FIELDS: [&str; 6] = ["title", "target", "trigger", "context", "policy", "notify"];
const NOTIFY_CHANNELS: [&str; 2] = ["console", "email"];
const MAX_EMAIL_RECIPIENTS: usize = 50;
const MAX_UNTRUSTED_INPUT_TOOLS: usize = 20;

type Res<T> = Result<T, AutomationError>;

/// Python's `str.isspace()`: Unicode whitespace and the four information
/// separators U+001C..U+001F.
fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `s` stripped as Python's `str.strip()` strips it.
pub fn py_strip(s: &str) -> &str {
    s.trim_matches(py_space)
}

/// The first `n` characters of `s`.
fn cut(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

fn object<'a>(value: &'a Value, field: &str) -> Res<&'a Map<String, Value>> {
    value
        .as_object()
        .ok_or_else(|| AutomationError::invalid(field, format!("{field} must be an object")))
}

/// `value`, or `{}` when it is absent or null.
fn object_or_empty<'a>(
    value: Option<&'a Value>,
    field: &str,
    empty: &'a Value,
) -> Res<&'a Map<String, Value>> {
    match value {
        None | Some(Value::Null) => object(empty, field),
        Some(v) => object(v, field),
    }
}

/// Refuses the first unknown key (sorted) of `obj`: field `<field>.<key>`.
fn reject_unknown(obj: &Map<String, Value>, allowed: &[&str], field: &str) -> Res<()> {
    let mut unknown: Vec<&String> = obj
        .keys()
        .filter(|k| !allowed.contains(&k.as_str()))
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    unknown.sort();
    let named = if field.is_empty() {
        unknown[0].clone()
    } else {
        format!("{field}.{}", unknown[0])
    };
    let list: Vec<String> = unknown.iter().map(|k| format!("'{k}'")).collect();
    let place = if field.is_empty() { "request" } else { field };
    Err(AutomationError::invalid(
        &named,
        format!("unknown field(s) in {place}: [{}]", list.join(", ")),
    ))
}

/// A string that is not blank, stripped; at most `max` characters.
fn nonempty_str(value: Option<&Value>, field: &str, max: Option<usize>) -> Res<String> {
    let text = match value {
        Some(Value::String(s)) if !py_strip(s).is_empty() => py_strip(s),
        _ => {
            return Err(AutomationError::invalid(
                field,
                format!("{field} must be a non-empty string"),
            ))
        }
    };
    if let Some(max) = max {
        if text.chars().count() > max {
            return Err(AutomationError::invalid(
                field,
                format!("{field} must be at most {max} characters"),
            ));
        }
    }
    Ok(text.to_string())
}

/// A JSON integer (not a float, not a bool).
fn integer(value: &Value) -> Option<i128> {
    match value {
        Value::Number(n) => n
            .as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from)),
        _ => None,
    }
}

/// The title: a non-blank string of at most 120 characters, stripped.
pub fn validate_title(value: Option<&Value>) -> Res<String> {
    nonempty_str(value, "title", Some(TITLE_MAX))
}

/// The target: `{workflow_id, bundle_ref, flow_id, input_data?,
/// version?}`, each id non-blank (stored stripped), `flow_id` not
/// `@default`, `input_data` an object (default `{}`), `version` the
/// deployed version every occurrence starts on (a positive integer; absent
/// or null: each occurrence starts on the version latest when it starts).
pub fn validate_target(value: Option<&Value>) -> Res<Value> {
    let missing = Value::Null;
    let target = object(value.unwrap_or(&missing), "target")?;
    reject_unknown(
        target,
        &[
            "workflow_id",
            "bundle_ref",
            "flow_id",
            "input_data",
            "version",
        ],
        "target",
    )?;
    let version = match target.get("version") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64().filter(|n| (1..=u64::from(u32::MAX)).contains(n)) {
            Some(n) => Some(n),
            None => {
                return Err(AutomationError::invalid(
                    "target.version",
                    "target.version must be a positive integer (a deployed version), or null for the latest",
                ))
            }
        },
    };
    let input_data = match target.get("input_data") {
        None => Value::Object(Map::new()),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(_) => {
            return Err(AutomationError::invalid(
                "target.input_data",
                "target.input_data must be an object",
            ))
        }
    };
    let flow_id = nonempty_str(target.get("flow_id"), "target.flow_id", None)?;
    if flow_id == "@default" {
        return Err(AutomationError::invalid(
            "target.flow_id",
            "target.flow_id '@default' must be resolved by the host before creation",
        ));
    }
    let mut out = json!({
        "workflow_id": nonempty_str(target.get("workflow_id"), "target.workflow_id", None)?,
        "bundle_ref": nonempty_str(target.get("bundle_ref"), "target.bundle_ref", None)?,
        "flow_id": flow_id,
        "input_data": input_data,
    });
    if let Some(v) = version {
        out["version"] = json!(v);
    }
    Ok(out)
}

/// The context: `{mode: independent|growing, growing: {max_tokens?}}`
/// (null is `{}`). A growing-mode `summary` is `unsupported_feature`.
pub fn validate_context(value: Option<&Value>) -> Res<Value> {
    let empty = json!({});
    let ctx = object_or_empty(value, "context", &empty)?;
    reject_unknown(ctx, &["mode", "growing"], "context")?;
    let mode = ctx.get("mode").cloned().unwrap_or(json!("independent"));
    if !matches!(mode.as_str(), Some("independent" | "growing")) {
        return Err(AutomationError::invalid(
            "context.mode",
            "context.mode must be one of ['independent', 'growing']",
        ));
    }
    let growing = object(ctx.get("growing").unwrap_or(&empty), "context.growing")?;
    reject_unknown(growing, &["summary", "max_tokens"], "context.growing")?;
    if growing.contains_key("summary") {
        return Err(AutomationError::unsupported(
            "context.growing.summary",
            "automatic growing-mode summaries are not supported in v1",
        ));
    }
    if let Some(limit) = growing.get("max_tokens") {
        if integer(limit).is_none_or(|n| n <= 0) {
            return Err(AutomationError::invalid(
                "context.growing.max_tokens",
                "Max growing context must be a positive whole number of tokens",
            ));
        }
    }
    Ok(json!({ "mode": mode, "growing": growing }))
}

fn duration(value: Option<&Value>, default: &str, field: &str) -> Res<Value> {
    match value {
        None => Ok(json!(default)),
        Some(Value::String(s)) => parse_duration(s, field).map(|_| json!(s)),
        Some(_) => Err(AutomationError::invalid(
            field,
            format!("{field} must be a duration string like '5m'"),
        )),
    }
}

/// Recipients an occurrence may email without asking: `"self"` or plain
/// addresses (`name@example.test`), at most 50, stored stripped,
/// lower-cased and de-duplicated (order kept). `field` is
/// `policy.email_allowed_recipients` or `notify.recipients`.
pub fn validate_email_recipients(value: Option<&Value>, field: &str) -> Res<Vec<String>> {
    let Some(Value::Array(items)) = value else {
        return Err(AutomationError::invalid(
            field,
            format!("{field} must be a list of 'self' or email addresses"),
        ));
    };
    if items.len() > MAX_EMAIL_RECIPIENTS {
        return Err(AutomationError::invalid(
            field,
            format!("{field} holds at most {MAX_EMAIL_RECIPIENTS} entries"),
        ));
    }
    let mut out: Vec<String> = Vec::new();
    for (i, entry) in items.iter().enumerate() {
        let at = format!("{field}[{i}]");
        let item = match entry {
            Value::String(s) if !py_strip(s).is_empty() => py_strip(s).to_lowercase(),
            _ => {
                return Err(AutomationError::invalid(
                    &at,
                    format!("{at} must be 'self' or an email address"),
                ))
            }
        };
        if item != "self" {
            let (local, domain) = item.split_once('@').unwrap_or((&item, ""));
            let plain = item.contains('@')
                && !local.is_empty()
                && !domain.is_empty()
                && !domain.contains('@')
                && domain.contains('.')
                && !item
                    .chars()
                    .any(|c| py_space(c) || "<>,;:\"()[]*".contains(c));
            if !plain {
                return Err(AutomationError::invalid(
                    &at,
                    format!("{at} must be 'self' or a plain address like name@example.test"),
                ));
            }
        }
        if !out.contains(&item) {
            out.push(item);
        }
    }
    Ok(out)
}

/// Tools named one by one that an occurrence with untrusted input may run
/// without asking: at most 20 names of 1-100 characters (letters, digits,
/// `_.-`), not `all` or `any`; order kept, de-duplicated.
pub fn validate_untrusted_input_tools(value: Option<&Value>) -> Res<Vec<String>> {
    let field = "policy.untrusted_input_tools";
    let Some(Value::Array(items)) = value else {
        return Err(AutomationError::invalid(
            field,
            format!("{field} must be a list of tool names"),
        ));
    };
    if items.len() > MAX_UNTRUSTED_INPUT_TOOLS {
        return Err(AutomationError::invalid(
            field,
            format!("{field} holds at most {MAX_UNTRUSTED_INPUT_TOOLS} entries"),
        ));
    }
    let mut out: Vec<String> = Vec::new();
    for (i, entry) in items.iter().enumerate() {
        let name = entry.as_str().map(py_strip).unwrap_or("");
        let lower = name.to_lowercase();
        if name.is_empty()
            || name.chars().count() > 100
            || lower == "all"
            || lower == "any"
            || !name
                .chars()
                .all(|c| c.is_alphanumeric() || "_.-".contains(c))
        {
            let at = format!("{field}[{i}]");
            return Err(AutomationError::invalid(
                &at,
                format!("{at} must be one tool name, such as fetch_url (not all or a pattern)"),
            ));
        }
        if !out.iter().any(|n| n == name) {
            out.push(name.to_string());
        }
    }
    Ok(out)
}

fn validate_tool_policy(value: &Value) -> Res<Value> {
    let policy = object(value, "policy.tool_policy")?;
    let keys = ["auto_approve_tools", "require_approval_tools"];
    reject_unknown(policy, &keys, "policy.tool_policy")?;
    let mut out = Map::new();
    for key in keys {
        let empty = json!([]);
        let names = policy.get(key).unwrap_or(&empty);
        let field = format!("policy.tool_policy.{key}");
        let list = names
            .as_array()
            .filter(|l| {
                l.iter()
                    .all(|n| n.as_str().is_some_and(|s| !py_strip(s).is_empty()))
            })
            .ok_or_else(|| {
                AutomationError::invalid(
                    &field,
                    format!("{field} must be a list of nonempty tool names"),
                )
            })?;
        let mut names: Vec<String> = list
            .iter()
            .filter_map(Value::as_str)
            .map(|s| py_strip(s).to_string())
            .collect();
        names.sort();
        names.dedup();
        out.insert(key.into(), json!(names));
    }
    Ok(Value::Object(out))
}

/// The policy (null is `{}`): `serial`, `misfire` and `failure` fixed in v1
/// (`true`, `coalesce`, `continue`; anything else `unsupported_feature`),
/// `retry` (1-10 attempts, backoff `initial`/`max` durations and a `factor`
/// of 1-10), `tool_approval` (`auto` or `ask`), `tool_policy`,
/// `email_allowed_recipients` (default `["self"]`), `untrusted_input_tools`
/// (default none). Missing fields take their defaults.
pub fn validate_policy(value: Option<&Value>) -> Res<Value> {
    let empty = json!({});
    let policy = object_or_empty(value, "policy", &empty)?;
    reject_unknown(
        policy,
        &[
            "serial",
            "misfire",
            "failure",
            "retry",
            "tool_approval",
            "email_allowed_recipients",
            "untrusted_input_tools",
            "tool_policy",
        ],
        "policy",
    )?;
    let tool_approval = policy
        .get("tool_approval")
        .cloned()
        .unwrap_or(json!("auto"));
    if !matches!(tool_approval.as_str(), Some("auto" | "ask")) {
        return Err(AutomationError::invalid(
            "policy.tool_approval",
            "policy.tool_approval must be one of ['auto', 'ask']",
        ));
    }
    // Python compares with `!=`, where 1 == True.
    let is_true = |v: &Value| v == &json!(true) || v.as_f64() == Some(1.0);
    for (key, ok, fixed) in [
        ("serial", is_true as fn(&Value) -> bool, "True"),
        ("misfire", |v: &Value| v == "coalesce", "'coalesce'"),
        ("failure", |v: &Value| v == "continue", "'continue'"),
    ] {
        if policy.get(key).is_some_and(|v| !ok(v)) {
            return Err(AutomationError::unsupported(
                &format!("policy.{key}"),
                format!("policy.{key} must be {fixed} in v1"),
            ));
        }
    }
    let retry = object(policy.get("retry").unwrap_or(&empty), "policy.retry")?;
    reject_unknown(retry, &["max_attempts", "backoff"], "policy.retry")?;
    let max_attempts = retry.get("max_attempts").cloned().unwrap_or(json!(3));
    if !integer(&max_attempts).is_some_and(|n| (1..=10).contains(&n)) {
        return Err(AutomationError::invalid(
            "policy.retry.max_attempts",
            "policy.retry.max_attempts must be an integer 1..10",
        ));
    }
    let backoff = object(
        retry.get("backoff").unwrap_or(&empty),
        "policy.retry.backoff",
    )?;
    reject_unknown(
        backoff,
        &["initial", "factor", "max"],
        "policy.retry.backoff",
    )?;
    let factor = backoff.get("factor").cloned().unwrap_or(json!(2));
    if !factor
        .as_f64()
        .filter(|_| factor.is_number())
        .is_some_and(|f| (1.0..=10.0).contains(&f))
    {
        return Err(AutomationError::invalid(
            "policy.retry.backoff.factor",
            "policy.retry.backoff.factor must be a number 1..10",
        ));
    }
    let initial = duration(
        backoff.get("initial"),
        "30s",
        "policy.retry.backoff.initial",
    )?;
    let max = duration(backoff.get("max"), "10m", "policy.retry.backoff.max")?;
    let mut out = Map::new();
    out.insert("serial".into(), json!(true));
    out.insert("misfire".into(), json!("coalesce"));
    out.insert("failure".into(), json!("continue"));
    out.insert(
        "retry".into(),
        json!({"max_attempts": max_attempts,
               "backoff": {"initial": initial, "factor": factor, "max": max}}),
    );
    match policy.get("tool_policy") {
        None | Some(Value::Null) => {}
        Some(tp) => {
            out.insert("tool_policy".into(), validate_tool_policy(tp)?);
        }
    }
    out.insert("tool_approval".into(), tool_approval);
    let self_only = json!(["self"]);
    out.insert(
        "email_allowed_recipients".into(),
        json!(validate_email_recipients(
            Some(policy.get("email_allowed_recipients").unwrap_or(&self_only)),
            "policy.email_allowed_recipients"
        )?),
    );
    let none = json!([]);
    out.insert(
        "untrusted_input_tools".into(),
        json!(validate_untrusted_input_tools(Some(
            policy.get("untrusted_input_tools").unwrap_or(&none)
        ))?),
    );
    Ok(Value::Object(out))
}

/// Where attention items go (null is `{}`): `channels` (a non-empty list
/// of `console`/`email`, default `["console"]`, stored in that order),
/// `always` (only `true` is kept), `title` and `body` (stripped, cut to 120
/// and 2,000 characters, kept when not blank), `recipients` (as
/// [`validate_email_recipients`], at least one).
pub fn validate_notify(value: Option<&Value>) -> Res<Value> {
    let empty = json!({});
    let notify = object_or_empty(value, "notify", &empty)?;
    reject_unknown(
        notify,
        &["channels", "recipients", "always", "title", "body"],
        "notify",
    )?;
    let default = json!(["console"]);
    let channels = match notify.get("channels").unwrap_or(&default) {
        Value::Array(l) if !l.is_empty() => l,
        _ => {
            return Err(AutomationError::invalid(
                "notify.channels",
                "notify.channels must be a non-empty list of ['console', 'email']",
            ))
        }
    };
    for (i, ch) in channels.iter().enumerate() {
        if !ch.as_str().is_some_and(|c| NOTIFY_CHANNELS.contains(&c)) {
            let at = format!("notify.channels[{i}]");
            return Err(AutomationError::invalid(
                &at,
                format!("{at} must be one of ['console', 'email']"),
            ));
        }
    }
    let mut out = Map::new();
    let kept: Vec<&str> = NOTIFY_CHANNELS
        .into_iter()
        .filter(|c| channels.iter().any(|ch| ch == *c))
        .collect();
    out.insert("channels".into(), json!(kept));
    match notify.get("always") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(always)) => {
            if *always {
                out.insert("always".into(), json!(true));
            }
        }
        Some(_) => {
            return Err(AutomationError::invalid(
                "notify.always",
                "notify.always must be true or false",
            ))
        }
    }
    for (key, limit) in [("title", NOTIFY_TITLE_MAX), ("body", NOTIFY_BODY_MAX)] {
        match notify.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => {
                if !py_strip(s).is_empty() {
                    out.insert(key.into(), json!(cut(py_strip(s), limit)));
                }
            }
            Some(_) => {
                let field = format!("notify.{key}");
                return Err(AutomationError::invalid(
                    &field,
                    format!("{field} must be text"),
                ));
            }
        }
    }
    if notify.contains_key("recipients") {
        let recipients = validate_email_recipients(notify.get("recipients"), "notify.recipients")?;
        if recipients.is_empty() {
            return Err(AutomationError::invalid(
                "notify.recipients",
                "Choose at least one result recipient",
            ));
        }
        out.insert("recipients".into(), json!(recipients));
    }
    Ok(Value::Object(out))
}

/// `{source_id, source_version, config}` → the binding `{binding_id,
/// source_id, source_version, config}` with the config as the source's
/// `validate` returned it.
fn validate_trigger(
    value: Option<&Value>,
    now: DateTime<Utc>,
    binding: &str,
    triggers: &dyn TriggerCheck,
) -> Res<Value> {
    let missing = Value::Null;
    let trig = object(value.unwrap_or(&missing), "trigger")?;
    reject_unknown(trig, &["source_id", "source_version", "config"], "trigger")?;
    let source_id = nonempty_str(trig.get("source_id"), "trigger.source_id", None)?;
    let version = trig
        .get("source_version")
        .and_then(integer)
        .ok_or_else(|| {
            AutomationError::invalid(
                "trigger.source_version",
                "trigger.source_version must be an integer",
            )
        })?;
    let name = format!("{source_id}@{version}");
    let empty = json!({});
    let config = object(trig.get("config").unwrap_or(&empty), "trigger.config")?;
    let config = triggers.validate(
        &name,
        &Value::Object(config.clone()),
        &format_timestamp(now),
    )?;
    Ok(json!({
        "binding_id": binding,
        "source_id": source_id,
        "source_version": version,
        "config": config,
    }))
}

/// Validates creation request `request` of automation `automation_id` and
/// builds revision 1 of its definition (`vars._meta.automation`), as of
/// `now`. `triggers` knows the trigger sources (their `validate` checks
/// the trigger's config).
///
/// The request's keys: `request_id`, `title`, `target`, `trigger`,
/// `workspace_root` (required), `tenant`, `user`, `context`, `policy`,
/// `notify`, and the wake fields `session_id` (growing context only),
/// `origin_run_id`, `one_shot`, `untrusted_origin`.
pub fn build_definition(
    request: &Value,
    automation_id: &str,
    now: DateTime<Utc>,
    triggers: &dyn TriggerCheck,
) -> Res<Value> {
    let req = object(request, "request")?;
    reject_unknown(req, &REQUEST_FIELDS, "")?;
    nonempty_str(req.get("request_id"), "request_id", None)?;
    let title = validate_title(req.get("title"))?;
    let target = validate_target(req.get("target"))?;
    let trigger = validate_trigger(
        req.get("trigger"),
        now,
        &binding_id(automation_id, 1),
        triggers,
    )?;
    let context = validate_context(req.get("context"))?;
    let policy = validate_policy(req.get("policy"))?;
    let notify = validate_notify(req.get("notify"))?;
    let workspace_root = nonempty_str(req.get("workspace_root"), "workspace_root", None)?;
    if !workspace_root.starts_with('/') {
        return Err(AutomationError::invalid(
            "workspace_root",
            "workspace_root must be an absolute path",
        ));
    }
    let growing = context["mode"] == "growing";
    let mut definition = json!({
        "schema_version": DEFINITION_SCHEMA_VERSION,
        "revision": 1,
        "title": title,
        "controller": {"bundle_ref": CONTROLLER_BUNDLE_REF, "flow_id": CONTROLLER_FLOW_ID},
        "target": target,
        "trigger": trigger,
        "context": context,
        "policy": policy,
        "notify": notify,
        "session_id": automation_session_id(automation_id),
        "workspace_root": workspace_root,
        "created_at": format_timestamp(now),
        "archived_at": null,
    });
    if req.get("session_id").is_some_and(|v| !v.is_null()) {
        if !growing {
            return Err(AutomationError::invalid(
                "session_id",
                "session_id is only meaningful with context.mode growing",
            ));
        }
        definition["session_id"] = json!(nonempty_str(req.get("session_id"), "session_id", None)?);
    }
    if req.get("origin_run_id").is_some_and(|v| !v.is_null()) {
        definition["origin_run_id"] = json!(nonempty_str(
            req.get("origin_run_id"),
            "origin_run_id",
            None
        )?);
    }
    for flag in ["one_shot", "untrusted_origin"] {
        match req.get(flag) {
            None | Some(Value::Null) | Some(Value::Bool(false)) => {}
            Some(Value::Bool(true)) => definition[flag] = json!(true),
            Some(_) => {
                return Err(AutomationError::invalid(
                    flag,
                    format!("{flag} must be true or false"),
                ))
            }
        }
    }
    Ok(definition)
}

/// The next revision of `definition` with `changes` applied (`title`,
/// `target`, `trigger`, `context`, `notify` replaced whole; `policy`
/// merged into the current one, so unsent fields keep their values), as of
/// `now`. A trigger whose source, version or config changes gets a new
/// binding id (`binding:<new revision>`); an unchanged one keeps its id.
pub fn revise_definition(
    definition: &Value,
    changes: &Value,
    automation_id: &str,
    now: DateTime<Utc>,
    triggers: &dyn TriggerCheck,
) -> Res<Value> {
    let ch = object(changes, "changes")?;
    reject_unknown(ch, &REVISABLE_FIELDS, "changes")?;
    if ch.is_empty() {
        return Err(AutomationError::invalid(
            "changes",
            "changes must name at least one field",
        ));
    }
    let mut new = definition.clone();
    let revision = definition["revision"]
        .as_u64()
        .or_else(|| {
            definition["revision"]
                .as_f64()
                .filter(|r| r.fract() == 0.0 && *r >= 1.0)
                .map(|r| r as u64)
        })
        .ok_or_else(|| {
            AutomationError::invalid("revision", "the stored definition has no readable revision")
        })?
        + 1;
    new["revision"] = json!(revision);
    new["schema_version"] = json!(DEFINITION_SCHEMA_VERSION);
    new["notify"] = validate_notify(definition.get("notify"))?;
    if ch.contains_key("title") {
        new["title"] = json!(validate_title(ch.get("title"))?);
    }
    if ch.contains_key("target") {
        new["target"] = validate_target(ch.get("target"))?;
    }
    if ch.contains_key("context") {
        new["context"] = validate_context(ch.get("context"))?;
    }
    if let Some(changed) = ch.get("policy") {
        let mut merged = definition
            .get("policy")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        for (k, v) in object(changed, "changes.policy")? {
            merged.insert(k.clone(), v.clone());
        }
        new["policy"] = validate_policy(Some(&Value::Object(merged)))?;
    }
    if ch.contains_key("notify") {
        new["notify"] = validate_notify(ch.get("notify"))?;
    }
    if ch.contains_key("trigger") {
        let old = &definition["trigger"];
        let old_binding = old["binding_id"].as_str().unwrap_or_default();
        let mut candidate = validate_trigger(ch.get("trigger"), now, old_binding, triggers)?;
        let same = candidate["source_id"] == old["source_id"]
            && candidate["source_version"] == old["source_version"]
            && canonical_json(&candidate["config"]) == canonical_json(&old["config"]);
        if !same {
            candidate["binding_id"] = json!(binding_id(automation_id, revision));
        }
        new["trigger"] = candidate;
    }
    Ok(new)
}

/// Whether the revision from `old` to `new` re-bound the trigger.
pub fn trigger_changed(old: &Value, new: &Value) -> bool {
    old["trigger"]["binding_id"] != new["trigger"]["binding_id"]
}

/// The keys every source's state shares with the controller's state.
pub const SHARED_TRIGGER_KEYS: [&str; 4] = ["anchor", "tick", "scheduled_count", "exhausted"];

/// A source's state as the controller keeps it: its shared keys
/// ([`SHARED_TRIGGER_KEYS`]) as they are, and every other key of its own
/// (a plugin's cursor, say) in `source_state`, merged with a
/// `source_state` object the source returned itself. `schedule@1` and
/// `manual@1` keep only shared keys: their state is the reference's.
pub fn stored_trigger_state(source: &Value) -> Map<String, Value> {
    let mut out = Map::new();
    let Some(m) = source.as_object() else {
        return out;
    };
    let mut own = match m.get("source_state") {
        Some(Value::Object(o)) => o.clone(),
        _ => Map::new(),
    };
    for (k, v) in m {
        if SHARED_TRIGGER_KEYS.contains(&k.as_str()) {
            out.insert(k.clone(), v.clone());
        } else if k != "source_state" {
            own.insert(k.clone(), v.clone());
        }
    }
    if !own.is_empty() {
        out.insert("source_state".into(), Value::Object(own));
    }
    out
}

/// The state the controller hands its trigger source: the shared keys
/// `{anchor, tick, scheduled_count, exhausted}` (defaults `null`, 0, 0,
/// false) and the keys of `source_state` (the source's own) beside them.
pub fn trigger_state_of(state: &Value) -> Value {
    let mut out = json!({
        "anchor": state.get("anchor").cloned().unwrap_or(Value::Null),
        "tick": state.get("tick").and_then(Value::as_u64).unwrap_or(0),
        "scheduled_count": state.get("scheduled_count").and_then(Value::as_u64).unwrap_or(0),
        "exhausted": state.get("exhausted").and_then(Value::as_bool).unwrap_or(false),
    });
    if let Some(Value::Object(own)) = state.get("source_state") {
        for (k, v) in own {
            if !SHARED_TRIGGER_KEYS.contains(&k.as_str()) {
                out[k] = v.clone();
            }
        }
    }
    out
}

/// The controller's state at creation (`vars._runtime.automation`), from
/// the definition and the trigger's initial state.
pub fn initial_state(definition: &Value, trigger_state: &Value) -> Value {
    let stored = stored_trigger_state(trigger_state);
    let shared = |k: &str, default: Value| stored.get(k).cloned().unwrap_or(default);
    let mut state = json!({
        "state_version": 0,
        "active_revision": definition["revision"].as_u64().unwrap_or(1),
        "pending_occurrence": null,
        "anchor": shared("anchor", Value::Null),
        "tick": shared("tick", json!(0)),
        "next_index": 1,
        "scheduled_count": shared("scheduled_count", json!(0)),
        "paused": false,
        "attention_seq": 0,
        "exhausted": shared("exhausted", json!(false)),
        "manual_pending": null,
        "last_outcome": null,
        "intent": null,
    });
    if let Some(s) = stored.get("source_state") {
        state["source_state"] = s.clone();
    }
    state
}

/// The wait before the attempt after `attempt` (1-based) under `policy`:
/// `min(initial * factor^(attempt - 1), max)`, to the microsecond.
pub fn backoff_delay(policy: &Value, attempt: u32) -> Res<Duration> {
    let backoff = &policy["retry"]["backoff"];
    let seconds = |key: &str| -> Res<f64> {
        let field = format!("policy.retry.backoff.{key}");
        let text = backoff[key].as_str().unwrap_or_default();
        Ok(parse_duration(text, &field)?.num_seconds() as f64)
    };
    let (initial, cap) = (seconds("initial")?, seconds("max")?);
    let factor = backoff["factor"].as_f64().unwrap_or(2.0);
    // C's pow (as Python's math.pow), then timedelta(seconds=x): whole
    // seconds exactly, the fraction rounded to the microsecond, half to even.
    let raw = initial * factor.powf(f64::from(attempt.saturating_sub(1)));
    let seconds = raw.min(cap);
    let whole = seconds.trunc();
    let micros = ((seconds - whole) * 1e6).round_ties_even();
    Ok(Duration::seconds(whole as i64) + Duration::microseconds(micros as i64))
}
