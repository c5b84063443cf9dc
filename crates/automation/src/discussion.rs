//! Discussions: a conversation about an automation's occurrence that never
//! changes the automation.
//!
//! [`start_discussion`] starts a new root run of the occurrence's workflow,
//! with its frozen inputs and the person's prompt, in a session of its own
//! (`discussion-session:<run id>`, run id `uuid5(automation_id,
//! "discuss:<request_id>")`). The run is seeded once with the automation's
//! timeline through that occurrence ([`automation_timeline_messages`]: one
//! `[user, assistant]` pair per finished occurrence, in the history
//! window). It works in its own writable workspace; the automation's
//! workspace is mounted beside it, readable and read-only (enforced by the
//! tool sandbox: the mount is preopened read-only). The automation's grant
//! of tools does not ride into it: tools ask as in any chat. Nothing is
//! written to the automation.
//!
//! Later root runs started in the discussion's session are anchored to its
//! root ([`crate::sessions::anchor_discussion`]): they get its provenance
//! and its workspace policy, whatever their caller passed.
//!
//! Behaviour and texts are the reference implementation's (abstractruntime
//! 0.13.0, `automations/service.py` `start_discussion` and
//! `automation_timeline_messages`).

use std::path::Path;

use serde_json::{json, Map, Value};
use stepwell_automation_core::admission::{apply_context_mode, GRANT_SOURCE};
use stepwell_automation_core::history::{fold_history_window, WindowReport};
use stepwell_automation_core::ids::{discussion_ids, record_key, request_digest};
use stepwell_automation_core::outcome::{normalize_occurrence_output, ChildView};

use super::queries::{automation_records, find_record};
use super::AutomationError;
use stepwell_runtime::core::config::StartOptions;
use stepwell_runtime::core::runtime::Runtime;
use stepwell_runtime::core::{Error, Result};
use stepwell_tools::scope::resolve_lenient;

/// What [`start_discussion`] is asked.
#[derive(Debug, Clone, Default)]
pub struct DiscussionRequest {
    /// The automation.
    pub automation_id: String,
    /// The occurrence discussed (its history through this one is the seed).
    pub occurrence_index: i64,
    /// The caller's id for this discussion: the same request again gives
    /// the same discussion; another one under the same id is an
    /// `identity_conflict`.
    pub request_id: String,
    /// The person's first message.
    pub prompt: String,
    /// The discussion's own writable workspace (absolute; not the
    /// automation's).
    pub workspace_root: String,
    /// Who starts it.
    pub actor_id: Option<String>,
}

/// What [`start_discussion`] started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discussion {
    /// `discussion-session:<run id>`.
    pub session_id: String,
    /// The discussion's root run.
    pub run_id: String,
}

impl Discussion {
    /// `{session_id, run_id, session_kind: "discussion"}`.
    pub fn to_json(&self) -> Value {
        json!({"session_id": self.session_id, "run_id": self.run_id, "session_kind": "discussion"})
    }

    /// [`Discussion::to_json`] with the `status` and `output` of its run's
    /// `state` (after its first tick): what `automations discuss` and the
    /// HTTP API answer.
    pub fn with_state(&self, state: &stepwell_runtime::RunState) -> Value {
        let mut out = self.to_json();
        out["status"] = json!(state.status.as_str());
        out["output"] = state.output.clone().unwrap_or(Value::Null);
        out
    }
}

fn refused(reason: &str, field: &str, message: impl Into<String>) -> Error {
    Error::from(AutomationError::new(reason, Some(field), message))
}

/// `path` without `.` segments, doubled or trailing separators, and with
/// `..` folded (Python's `os.path.normpath`, lexically).
fn normpath(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

/// The automation's conversation through occurrence `through`, whatever
/// its context mode: one `[user, assistant]` pair per occurrence 1..N that
/// was admitted and has finished, oldest first, folded into the history
/// window (`max_tokens`); the first kept user message starts with the
/// summary line (`[Automation "<title>": <n> occurrence(s) through
/// occurrence <N>, showing the last <K>. ...]`). The user message is the
/// occurrence's frozen prompt (else its trigger header); the answer is the
/// occurrence's answer, or what became of it (failed, stopped).
pub fn automation_timeline_messages(
    rt: &Runtime,
    automation_id: &str,
    through: i64,
    own_workspace: &str,
    mounted_workspace: &str,
    max_tokens: u64,
) -> Result<(Vec<Value>, WindowReport)> {
    let controller = super::service::controller_run(rt, automation_id)?;
    let title = controller.vars["_meta"]["automation"]["title"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let records = rt.get_ledger(automation_id)?;
    let mut admitted: std::collections::BTreeMap<i64, &Value> = Default::default();
    let mut completed: std::collections::BTreeMap<i64, &Value> = Default::default();
    for rec in automation_records(&records, &["automation.admitted", "automation.completed"]) {
        let Some(i) = rec.payload["index"].as_i64() else {
            continue;
        };
        if rec.name == "automation.admitted" {
            admitted.insert(i, rec.payload);
        } else {
            completed.insert(i, rec.payload);
        }
    }
    let mut pairs: Vec<Vec<Value>> = Vec::new();
    for (&index, done) in completed.iter().filter(|(i, _)| **i <= through) {
        let Some(adm) = admitted.get(&index) else {
            continue;
        };
        let envelope = &adm["trigger_envelope"];
        let user = match adm["prepared"]["input_data"]["prompt"].as_str() {
            Some(p) if !p.trim().is_empty() => p.to_string(),
            _ => format!(
                "[Trigger {}@{} · occurrence {index} · fired {}]",
                py(&envelope["source_id"]),
                py(&envelope["source_version"]),
                py(&envelope["fired_at"])
            ),
        };
        let run_id = done["run_id"].as_str().unwrap_or_default();
        let answer = match done["status"].as_str() {
            Some("completed") => match rt.get_state(run_id) {
                Ok(child) => {
                    let view = ChildView::of(
                        &child.run_id,
                        child.status.as_str(),
                        child.output.as_ref(),
                        child.error.as_deref(),
                    );
                    let answer = normalize_occurrence_output(&view).answer;
                    if answer.trim().is_empty() {
                        "(The occurrence completed without a text answer.)".to_string()
                    } else {
                        answer
                    }
                }
                // Retention deleted it (an old occurrence of an independent
                // automation): the timeline says so rather than refuse every
                // discussion after a prune.
                Err(Error::RunNotFound { .. }) => {
                    format!("(The run of this occurrence, {run_id}, was deleted by retention.)")
                }
                Err(e) => return Err(e),
            },
            Some("failed") => {
                let body = done["attention"]["body"]
                    .as_str()
                    .filter(|b| !b.is_empty())
                    .unwrap_or("no error recorded");
                format!(
                    "(This occurrence failed after {} attempt(s): {body})",
                    py(&done["attempts"])
                )
            }
            _ => "(This occurrence was stopped before it finished.)".to_string(),
        };
        let meta =
            json!({"kind": "automation_occurrence", "run_id": run_id, "occurrence_index": index});
        pairs.push(vec![
            json!({"role": "user", "content": user, "metadata": meta}),
            json!({"role": "assistant", "content": answer, "metadata": meta}),
        ]);
    }
    let (mut kept, report) = fold_history_window(&pairs, max_tokens, false)
        .map_err(|e| refused("invalid_request", "max_tokens", e))?;
    let shown = kept.len();
    if let Some(first) = kept.first_mut().and_then(|p| p.first_mut()) {
        let summary = format!(
            "[Automation \"{title}\": {} occurrence(s) through occurrence {through}, showing the last {}. The automation's files are mounted READ-ONLY at {mounted_workspace}; your own workspace {own_workspace} is writable.]\n",
            pairs.len(),
            shown
        );
        let content = first["content"].as_str().unwrap_or_default();
        first["content"] = json!(format!("{summary}{content}"));
    }
    Ok((kept.into_iter().flatten().collect(), report))
}

/// A value as Python's `str()` shows it in a header.
fn py(v: &Value) -> String {
    stepwell_automation_core::outcome::py_str(v)
}

/// Starts (or finds again) a discussion of occurrence
/// `request.occurrence_index` of an automation (see the module's docs).
///
/// Checked in order: a non-blank prompt and request id
/// (`invalid_request`), an absolute workspace (`invalid_definition`), the
/// automation (`automation_not_found`), the occurrence's admission
/// (`occurrence_not_found`), a workspace other than the occurrence's
/// (`invalid_request`), the occurrence's workflow (`unknown_workflow`),
/// then the seed, read strictly. The same request again finds the same
/// discussion; a different prompt or workspace under the same request id
/// is an `identity_conflict` on `request_id`.
pub fn start_discussion(rt: &Runtime, request: &DiscussionRequest) -> Result<Discussion> {
    let own = checked_request(request)?;
    let automation_id = request.automation_id.as_str();
    super::service::controller_run(rt, automation_id)?;
    let index = request.occurrence_index;
    let occurrence = Occurrence::find(rt, automation_id, index)?;
    let mounts = apart_from_mounts(rt, &own, &occurrence)?;
    let workflow_id = occurrence.prepared()["workflow_id"]
        .as_str()
        .unwrap_or_default();
    rt.workflow(workflow_id)?;
    let (seed, report) = automation_timeline_messages(
        rt,
        automation_id,
        index,
        &own,
        &occurrence.mounted,
        stepwell_automation_core::history::HISTORY_REPLAY_MAX_TOKENS,
    )?;
    let (run_id, session_id) = discussion_ids(automation_id, &request.request_id);
    let seeded = Seeded {
        request,
        own: &own,
        occurrence: &occurrence,
        run_id: &run_id,
        seed: &seed,
    };
    let (input, runtime) = seeded.vars(&mounts, &report);
    session_is_free(rt, &run_id, &session_id)?;
    let options = StartOptions {
        vars: input,
        run_id: Some(run_id.clone()),
        actor_id: request.actor_id.clone(),
        session_id: Some(session_id.clone()),
        parent_run_id: None,
        runtime,
        ..StartOptions::default()
    };
    match rt.start(workflow_id, options) {
        Ok(_) => Ok(Discussion { session_id, run_id }),
        Err(Error::IdentityConflict { .. }) => {
            let mut shown = String::new();
            stepwell_automation_core::outcome::py_repr_str(&request.request_id, &mut shown);
            Err(refused(
                "identity_conflict",
                "request_id",
                format!(
                    "request_id {shown} was already used for a different discussion of this automation"
                ),
            ))
        }
        Err(e) => Err(e),
    }
}

/// The request's own workspace, trimmed, once the prompt, the request id
/// and the workspace are checked.
fn checked_request(request: &DiscussionRequest) -> Result<String> {
    if request.prompt.trim().is_empty() {
        return Err(refused(
            "invalid_request",
            "prompt",
            "prompt must be a non-empty string",
        ));
    }
    if request.request_id.trim().is_empty() {
        return Err(refused(
            "invalid_request",
            "request_id",
            "request_id must be a non-empty string",
        ));
    }
    let own = request.workspace_root.trim().to_string();
    if own.is_empty() {
        return Err(refused(
            "invalid_definition",
            "workspace_root",
            "workspace_root must be a non-empty string",
        ));
    }
    if !Path::new(&own).is_absolute() {
        return Err(refused(
            "invalid_definition",
            "workspace_root",
            "workspace_root must be an absolute path",
        ));
    }
    Ok(own)
}

/// The occurrence a discussion is about, as the controller's ledger tells.
struct Occurrence {
    /// Its `automation.admitted` record's payload.
    admitted: Value,
    /// The run whose answer seeds the discussion: the completed attempt's,
    /// else the admitted one's.
    seed_run_id: Value,
    /// The occurrence's workspace, mounted read-only in the discussion.
    mounted: String,
}

impl Occurrence {
    /// Occurrence `index` of `automation_id` (`occurrence_not_found` when
    /// it was never admitted).
    fn find(rt: &Runtime, automation_id: &str, index: i64) -> Result<Occurrence> {
        let records = rt.get_ledger(automation_id)?;
        let key = |name: &str| record_key(name, automation_id, &index.to_string());
        let Some(admitted) = find_record(&records, &key("automation.admitted")) else {
            return Err(refused(
                "occurrence_not_found",
                "occurrence_index",
                format!("Automation {automation_id} has no occurrence {index}."),
            ));
        };
        let admitted = admitted.payload.clone();
        let seed_run_id = find_record(&records, &key("automation.completed"))
            .map(|c| c.payload["run_id"].clone())
            .unwrap_or_else(|| admitted["run_id"].clone());
        let mounted = admitted["prepared"]["workspace_root"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        Ok(Occurrence {
            admitted,
            seed_run_id,
            mounted,
        })
    }

    /// What the occurrence was prepared with (its workflow, its inputs).
    fn prepared(&self) -> &Value {
        &self.admitted["prepared"]
    }
}

/// The occurrence's mounts (its workspace, then its other allowed paths,
/// resolved), once the discussion's own workspace `own` is checked to be
/// apart from each of them and from the host's store.
fn apart_from_mounts(
    rt: &Runtime,
    own: &str,
    occurrence: &Occurrence,
) -> Result<Vec<std::path::PathBuf>> {
    let mounted = &occurrence.mounted;
    if normpath(own) == normpath(mounted) {
        return Err(refused(
            "invalid_request",
            "workspace_root",
            "a discussion needs its own workspace, not the automation's",
        ));
    }
    // Beyond the reference's textual check: the two directories, resolved
    // (links followed), may not contain one another, nor the host's store.
    // A discussion inside the mount could write nothing; one around it
    // would hold the mount in a writable root.
    // The occurrence's other allowed paths are the automation's too: they
    // are mounted read-only beside its workspace (a discussion never
    // changes the automation), and the own workspace must be apart from
    // every mount (a writable root holding a mount would open it).
    let own_real = resolve_lenient(Path::new(own));
    let mut mounts: Vec<std::path::PathBuf> = vec![resolve_lenient(Path::new(mounted))];
    let allowed = occurrence.prepared()["input_data"].get("workspace_allowed_paths");
    for raw in stepwell_tools::scope::path_list(allowed) {
        let p = resolve_lenient(&Path::new(mounted).join(&raw));
        if !mounts.contains(&p) {
            mounts.push(p);
        }
    }
    if let Some(m) = mounts
        .iter()
        .find(|m| own_real.starts_with(m) || m.starts_with(&own_real))
    {
        return Err(refused(
            "invalid_request",
            "workspace_root",
            format!(
                "a discussion needs its own workspace, apart from the automation's: {} and {} contain one another",
                own_real.display(),
                m.display()
            ),
        ));
    }
    if let Some(p) = rt
        .config()
        .tool_deny_paths
        .iter()
        .find(|p| resolve_lenient(p).starts_with(&own_real))
    {
        return Err(refused(
            "invalid_request",
            "workspace_root",
            format!(
                "{} holds the host's store ({}): a discussion's workspace may not",
                own_real.display(),
                p.display()
            ),
        ));
    }
    Ok(mounts)
}

/// A discussion's root run about to be made: what its vars are built from.
struct Seeded<'a> {
    request: &'a DiscussionRequest,
    own: &'a str,
    occurrence: &'a Occurrence,
    run_id: &'a str,
    seed: &'a [Value],
}

impl Seeded<'_> {
    /// The root run's vars and its `_runtime`: the occurrence's inputs with
    /// the prompt, the seed, the discussion's identity and its workspace
    /// (its own, with the occurrence's mounts read-only).
    fn vars(
        &self,
        mounts: &[std::path::PathBuf],
        report: &WindowReport,
    ) -> (Map<String, Value>, Map<String, Value>) {
        let mut input: Map<String, Value> = self.occurrence.prepared()["input_data"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        input.insert("prompt".into(), json!(self.request.prompt));
        // The automation's unattended grant never rides into a discussion.
        if let Some(Value::Object(runtime)) = input.get_mut("_runtime") {
            let granted = runtime
                .get("tool_policy")
                .and_then(|p| p.get("source"))
                .and_then(Value::as_str)
                == Some(GRANT_SOURCE);
            if granted {
                runtime.remove("tool_policy");
            }
        }
        apply_context_mode(&mut input, "discussion");
        let mut context = input
            .get("context")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        context.insert("messages".into(), json!(self.seed));
        input.insert("context".into(), Value::Object(context));
        let meta = self.meta(input.remove("_meta"));
        input.insert("_meta".into(), Value::Object(meta));
        self.workspace(&mut input);
        let runtime = match input.remove("_runtime") {
            Some(Value::Object(m)) => m,
            _ => Map::new(),
        };
        (input, self.runtime(runtime, mounts, report))
    }

    /// The root's `_meta`: the occurrence's, with the discussion and the
    /// digest of what created it.
    fn meta(&self, meta: Option<Value>) -> Map<String, Value> {
        let (request, occurrence) = (self.request, self.occurrence);
        let mut meta = match meta {
            Some(Value::Object(m)) => m,
            _ => Map::new(),
        };
        meta.insert(
            "discussion".into(),
            json!({
                "automation_id": request.automation_id,
                "occurrence_index": request.occurrence_index,
                "revision": occurrence.admitted["revision"],
                "seed_run_id": occurrence.seed_run_id,
                "request_id": request.request_id,
                "discussion_root_run_id": self.run_id,
                "mounted_workspace": occurrence.mounted,
                "seed_messages": self.seed,
            }),
        );
        meta.insert(
            "creation_digest".into(),
            json!(request_digest(&json!({
                "automation_id": request.automation_id,
                "occurrence_index": request.occurrence_index,
                "request_id": request.request_id,
                "prompt": request.prompt,
                "workspace_root": self.own,
            }))),
        );
        meta
    }

    /// The discussion's workspace in `input`: its own root, the
    /// occurrence's workspace among the allowed paths, no writable
    /// exception of the occurrence.
    fn workspace(&self, input: &mut Map<String, Value>) {
        let (own, mounted) = (self.own, &self.occurrence.mounted);
        input.insert("workspace_root".into(), json!(own));
        input.insert(
            "workspace_access_mode".into(),
            json!("workspace_or_allowed"),
        );
        let mut allowed: Vec<Value> = input
            .get("workspace_allowed_paths")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter(|v| v.is_string()).cloned().collect())
            .unwrap_or_default();
        if !allowed.contains(&json!(mounted)) {
            allowed.push(json!(mounted));
        }
        input.insert("workspace_allowed_paths".into(), json!(allowed));
        if input
            .get("workspace_builtin_deny_prefixes")
            .is_some_and(|v| stepwell_automation_core::outcome::truthy(Some(v)))
        {
            input.insert("workspace_builtin_allow".into(), json!([own, mounted]));
        }
        input.remove("workspace_read_only");
        // No writable exception of the occurrence rides into the discussion
        // (it could lie inside the mount), nor a scope the target's inputs
        // claimed as inherited: the discussion's scope is frozen from these
        // vars alone.
        input.remove("workspace_writable_paths");
    }

    /// The root's `_runtime`: the occurrence's, without its workspace
    /// settings, with every mount read-only and the seed's receipt.
    fn runtime(
        &self,
        mut runtime: Map<String, Value>,
        mounts: &[std::path::PathBuf],
        report: &WindowReport,
    ) -> Map<String, Value> {
        for key in [
            "workspace_read_only",
            "workspace_writable_paths",
            "workspace",
        ] {
            runtime.remove(key);
        }
        let mut read_only = vec![json!(self.occurrence.mounted)];
        read_only.extend(mounts.iter().skip(1).map(|m| json!(m.to_string_lossy())));
        runtime.insert("workspace_read_only_paths".into(), Value::Array(read_only));
        let mut receipt = match report.to_json() {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        receipt.insert("strict".into(), json!(true));
        receipt.insert("session_kind".into(), json!("discussion"));
        runtime.insert("session_history".into(), Value::Object(receipt));
        runtime
    }
}

/// Refuses a discussion whose session already holds a root run other than
/// `run_id`: the session is the discussion's alone, since a run planted in
/// it before (its id can be computed) would otherwise steer the root's
/// anchoring or its seed. (Once the root exists, its later turns share it.)
fn session_is_free(rt: &Runtime, run_id: &str, session_id: &str) -> Result<()> {
    if rt.store().load_run(run_id)?.is_some() {
        return Ok(());
    }
    // Only a root run steers a session's anchoring (a child is no turn of
    // it).
    let planted = rt
        .store()
        .list_run_index(&stepwell_runtime::store::RunIndexQuery {
            session_id: Some(session_id.to_string()),
            root_only: true,
            limit: Some(1),
            ..Default::default()
        })?;
    match planted.first() {
        Some(other) => Err(refused(
            "session_attribution_failed",
            "request_id",
            format!(
                "session {session_id} already holds run {}, which is not this discussion's root",
                other.run_id
            ),
        )),
        None => Ok(()),
    }
}
