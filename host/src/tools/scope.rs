//! The workspace scope of a run: which directories its tools may reach, and
//! how a path a model names is resolved, refused, or rewritten (the
//! reference's workspace policy, llm-tools spec 3.9-3.10).
//!
//! The scope is read only from `_runtime.workspace`, a snapshot the host
//! takes of the run's top-level `workspace_*` vars when the run starts
//! ([`freeze`]): a guest can change the top-level vars, never its scope.
//! Paths are checked here, and then enforced by capability: a tool call's
//! sandbox preopens only the directories [`WorkspaceScope::preopens`]
//! grants its class.

use std::path::{Component, Path, PathBuf};

use serde_json::{json, Map, Value};

use super::ToolClass;
use crate::wasm::Preopen;

/// The top-level vars the host freezes into `_runtime.workspace` at start
/// (the reference's camelCase aliases are read too).
pub const SCOPE_KEYS: [&str; 9] = [
    "workspace_root",
    "workspace_access_mode",
    "workspace_allowed_paths",
    "workspace_ignored_paths",
    "workspace_builtin_deny_prefixes",
    "workspace_builtin_allow",
    "workspace_read_only",
    "workspace_read_only_paths",
    "workspace_writable_paths",
];

const ALIASES: [(&str, &str); 4] = [
    ("workspaceRoot", "workspace_root"),
    ("workspaceAccessMode", "workspace_access_mode"),
    ("workspaceAllowedPaths", "workspace_allowed_paths"),
    ("workspaceIgnoredPaths", "workspace_ignored_paths"),
];

/// How far outside its root a run's tools may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessMode {
    /// Only under the workspace root (the default).
    WorkspaceOnly,
    /// Under the root or one of the allowed paths.
    WorkspaceOrAllowed,
    /// Anywhere except the ignored paths.
    AllExceptIgnored,
}

impl AccessMode {
    /// The mode's name.
    pub fn as_str(self) -> &'static str {
        match self {
            AccessMode::WorkspaceOnly => "workspace_only",
            AccessMode::WorkspaceOrAllowed => "workspace_or_allowed",
            AccessMode::AllExceptIgnored => "all_except_ignored",
        }
    }
}

/// The `_runtime.workspace` snapshot of a new run: its own top-level
/// `workspace_*` vars over what it inherits from its parent (`inherited`:
/// the parent's snapshot). A child keeps its own root, mode, allowed and
/// ignored paths if it sets them; it can never clear a read-only parent,
/// drop a read-only mount or a host deny prefix, or add writable
/// exceptions. `None` when there is nothing to freeze.
pub fn freeze(vars: &Map<String, Value>, inherited: Option<&Value>) -> Option<Value> {
    let mut own = Map::new();
    for key in SCOPE_KEYS {
        if let Some(v) = vars.get(key).filter(|v| !v.is_null()) {
            own.insert(key.to_string(), v.clone());
        }
    }
    for (alias, key) in ALIASES {
        if !own.contains_key(key) {
            if let Some(v) = vars.get(alias).filter(|v| !v.is_null()) {
                own.insert(key.to_string(), v.clone());
            }
        }
    }
    let Some(parent) = inherited.and_then(Value::as_object) else {
        return (!own.is_empty()).then_some(Value::Object(own));
    };
    let mut out = parent.clone();
    for key in [
        "workspace_root",
        "workspace_access_mode",
        "workspace_allowed_paths",
        "workspace_ignored_paths",
    ] {
        if let Some(v) = own.get(key) {
            out.insert(key.into(), v.clone());
        }
    }
    let parent_ro = parent.get("workspace_read_only") == Some(&Value::Bool(true));
    if parent_ro || own.get("workspace_read_only") == Some(&Value::Bool(true)) {
        out.insert("workspace_read_only".into(), json!(true));
    }
    for key in [
        "workspace_builtin_deny_prefixes",
        "workspace_read_only_paths",
    ] {
        let mut union = path_list(parent.get(key));
        for p in path_list(own.get(key)) {
            if !union.contains(&p) {
                union.push(p);
            }
        }
        if !union.is_empty() {
            out.insert(key.into(), json!(union));
        }
    }
    Some(Value::Object(out))
}

/// A path list as hosts send it: a JSON array, a JSON array in a string,
/// or newline-separated text; blank entries dropped.
pub fn path_list(raw: Option<&Value>) -> Vec<String> {
    match raw {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_str)
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect(),
        Some(Value::String(text)) => {
            let text = text.trim();
            if text.starts_with('[') {
                if let Ok(Value::Array(items)) = serde_json::from_str::<Value>(text) {
                    return path_list(Some(&Value::Array(items)));
                }
            }
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect()
        }
        _ => Vec::new(),
    }
}

/// `~` and `~/...` expanded with `$HOME`.
fn expand_home(raw: &str) -> PathBuf {
    if raw == "~" || raw.starts_with("~/") {
        if let Some(home) = std::env::var_os("HOME") {
            return PathBuf::from(home).join(raw.trim_start_matches('~').trim_start_matches('/'));
        }
    }
    PathBuf::from(raw)
}

/// An absolute path with `.` and `..` applied and every symlink that exists
/// resolved, without requiring the path to exist (Python's
/// `Path.resolve(strict=False)`).
pub fn resolve_lenient(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    let mut hops = 0;
    for c in path.components() {
        match c {
            Component::RootDir | Component::Prefix(_) | Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(part) => {
                out.push(part);
                let is_link = std::fs::symlink_metadata(&out)
                    .map(|m| m.file_type().is_symlink())
                    .unwrap_or(false);
                if is_link && hops < 40 {
                    hops += 1;
                    if let Ok(real) = std::fs::canonicalize(&out) {
                        out = real;
                    }
                }
            }
        }
    }
    out
}

fn is_under(path: &Path, root: &Path) -> bool {
    path != root && path.starts_with(root)
}

fn under_or_equal(path: &Path, root: &Path) -> bool {
    path.starts_with(root)
}

/// The effective scope of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceScope {
    /// The workspace root (absolute, resolved).
    pub root: PathBuf,
    /// The access mode.
    pub mode: AccessMode,
    /// Paths refused even under the root or an allowed path.
    pub ignored: Vec<PathBuf>,
    /// Other roots (reachable in `workspace_or_allowed`).
    pub allowed: Vec<PathBuf>,
    /// The host's deny prefixes (never disclosed, never preopened).
    pub deny: Vec<PathBuf>,
    /// Exceptions to the deny prefixes.
    pub deny_allow: Vec<PathBuf>,
    /// Whether the whole workspace is read-only.
    pub read_only: bool,
    /// Read-only mounts: write tools may not write under them.
    pub read_only_paths: Vec<PathBuf>,
    /// Writable exceptions strictly inside read-only mounts.
    pub writable_paths: Vec<PathBuf>,
}

fn resolve_entries(root: &Path, raw: Vec<String>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for s in raw {
        let p = expand_home(&s);
        let p = if p.is_absolute() { p } else { root.join(p) };
        let p = resolve_lenient(&p);
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

fn absolute_entries(raw: Vec<String>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = raw
        .into_iter()
        .map(|s| expand_home(&s))
        .filter(|p| p.is_absolute())
        .map(|p| resolve_lenient(&p))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// A mount alias: the last path segment as `[a-z0-9_-]`, at most 32.
fn slug(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    s = s.trim_matches(|c| c == '_' || c == '-').to_string();
    s.truncate(32);
    if s.is_empty() {
        "mount".into()
    } else {
        s
    }
}

impl WorkspaceScope {
    /// The scope of a run, from its `_runtime` (`workspace`, plus the
    /// host-set `workspace_read_only`, `workspace_read_only_paths` and
    /// `workspace_writable_paths`). `Ok(None)`: the run has no workspace
    /// root, so its tools reach no directory at all. A writable root that
    /// does not exist is created; the errors are the reference's texts
    /// (reason code `workspace_policy`).
    pub fn from_runtime(runtime: Option<&Value>) -> Result<Option<WorkspaceScope>, String> {
        let empty = Map::new();
        let runtime = runtime.and_then(Value::as_object).unwrap_or(&empty);
        let frozen = runtime
            .get("workspace")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let read_only = frozen.get("workspace_read_only") == Some(&Value::Bool(true))
            || runtime.get("workspace_read_only") == Some(&Value::Bool(true));
        let mut mounts = path_list(frozen.get("workspace_read_only_paths"));
        mounts.extend(path_list(runtime.get("workspace_read_only_paths")));
        let mut writable = path_list(frozen.get("workspace_writable_paths"));
        writable.extend(path_list(runtime.get("workspace_writable_paths")));
        let raw_root = frozen
            .get("workspace_root")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|s| !s.is_empty());
        let Some(raw) = raw_root else {
            if !mounts.is_empty() {
                return Err(
                    "workspace_read_only_paths is set but the run has no workspace_root".into(),
                );
            }
            if read_only {
                return Err("workspace_read_only is set but the run has no workspace_root".into());
            }
            return Ok(None);
        };
        let root = expand_home(raw);
        let root = if root.is_absolute() {
            root
        } else {
            std::env::current_dir()
                .map_err(|e| format!("workspace_root {raw}: {e}"))?
                .join(root)
        };
        let root = resolve_lenient(&root);
        if root.exists() && !root.is_dir() {
            return Err(format!(
                "workspace_root must be a directory (got file): {raw}"
            ));
        }
        if read_only {
            if !root.is_dir() {
                return Err(format!("read-only workspace_root does not exist: {raw}"));
            }
        } else {
            std::fs::create_dir_all(&root)
                .map_err(|e| format!("cannot create workspace_root {raw}: {e}"))?;
        }
        let mode = match frozen
            .get("workspace_access_mode")
            .and_then(Value::as_str)
            .map(|s| s.trim().to_ascii_lowercase())
            .unwrap_or_default()
            .as_str()
        {
            "" | "workspace_only" => AccessMode::WorkspaceOnly,
            "workspace_or_allowed" => AccessMode::WorkspaceOrAllowed,
            "all_except_ignored" => AccessMode::AllExceptIgnored,
            _ => {
                let shown = frozen
                    .get("workspace_access_mode")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                return Err(format!(
                    "Invalid workspace_access_mode: '{shown}' (expected one of: ['all_except_ignored', 'workspace_only', 'workspace_or_allowed'])"
                ));
            }
        };
        Ok(Some(WorkspaceScope {
            ignored: resolve_entries(&root, path_list(frozen.get("workspace_ignored_paths"))),
            allowed: resolve_entries(&root, path_list(frozen.get("workspace_allowed_paths"))),
            deny: resolve_entries(
                &root,
                path_list(frozen.get("workspace_builtin_deny_prefixes")),
            ),
            deny_allow: resolve_entries(&root, path_list(frozen.get("workspace_builtin_allow"))),
            read_only,
            read_only_paths: absolute_entries(mounts),
            writable_paths: absolute_entries(writable),
            mode,
            root,
        }))
    }

    /// Mount aliases of the allowed roots outside the root (used by
    /// relative paths in `workspace_or_allowed`), sorted by alias.
    pub fn mounts(&self) -> Vec<(String, PathBuf)> {
        let outside: Vec<&PathBuf> = self
            .allowed
            .iter()
            .filter(|p| !is_under(p, &self.root))
            .collect();
        let mut out: Vec<(String, PathBuf)> = Vec::new();
        for p in &outside {
            let base = slug(p);
            let shared = outside.iter().filter(|q| slug(q) == base).count() > 1;
            let name = if shared {
                use sha2::{Digest, Sha256};
                let digest = hex::encode(Sha256::digest(p.to_string_lossy().as_bytes()));
                format!("{}_{}", &base[..base.len().min(23)], &digest[..8])
            } else {
                base
            };
            out.push((name, (*p).clone()));
        }
        out.sort();
        out
    }

    fn builtin_denied(&self, path: &Path) -> bool {
        self.deny.iter().any(|d| under_or_equal(path, d))
            && !self.deny_allow.iter().any(|a| under_or_equal(path, a))
    }

    /// The longest row containing `path` decides; an ignored entry wins a
    /// tie. Returns whether an ignored entry refuses it.
    fn refused_by_row(&self, path: &Path) -> bool {
        let mut best: Option<(usize, bool)> = None;
        let mut consider = |entry: &Path, refuse: bool| {
            if under_or_equal(path, entry) {
                let n = entry.as_os_str().len();
                match best {
                    Some((m, _)) if n < m || (n == m && !refuse) => {}
                    _ => best = Some((n, refuse)),
                }
            }
        };
        consider(&self.root, false);
        if self.mode != AccessMode::WorkspaceOnly {
            for a in &self.allowed {
                consider(a, false);
            }
        }
        for i in &self.ignored {
            consider(i, true);
        }
        best.is_some_and(|(_, refuse)| refuse)
    }

    fn ensure_allowed(&self, path: &Path) -> Result<(), String> {
        if self.builtin_denied(path) {
            return Err(format!(
                "Path is not accessible (protected by the host): '{}'",
                path.display()
            ));
        }
        if self.refused_by_row(path) {
            return Err(format!(
                "Path is blocked by workspace_ignored_paths: '{}'",
                path.display()
            ));
        }
        Ok(())
    }

    /// Resolves a path a model named to an absolute path inside the scope,
    /// or refuses it with the reference's text.
    pub fn resolve(&self, user_path: &str) -> Result<PathBuf, String> {
        let raw = user_path.trim();
        if raw.is_empty() {
            return Err("Empty path".into());
        }
        let raw = raw.strip_prefix('@').map(str::trim_start).unwrap_or(raw);
        let p = expand_home(raw);
        if p.is_absolute() {
            let resolved = resolve_lenient(&p);
            match self.mode {
                AccessMode::WorkspaceOnly if !under_or_equal(&resolved, &self.root) => {
                    return Err(format!(
                        "Path escapes workspace_root: '{user_path}' — if you meant a file inside the workspace, retry with a path relative to '{}' (absolute paths must stay under it; the host can grant outside directories).",
                        self.root.display()
                    ));
                }
                AccessMode::WorkspaceOrAllowed
                    if !under_or_equal(&resolved, &self.root)
                        && !self.allowed.iter().any(|a| under_or_equal(&resolved, a)) =>
                {
                    return Err(format!(
                        "Path is outside workspace roots: '{user_path}' — use one of the authorized roots below, not its parent.\n{}",
                        self.describe()
                    ));
                }
                _ => {}
            }
            self.ensure_allowed(&resolved)?;
            return Ok(resolved);
        }
        // Relative: under the root, or under a mount alias's root.
        let mut base = self.root.clone();
        let mut rel = p.clone();
        let first = p
            .components()
            .next()
            .and_then(|c| match c {
                Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
                _ => None,
            })
            .unwrap_or_default();
        let mut matched = false;
        if self.mode == AccessMode::WorkspaceOrAllowed {
            if let Some((_, root)) = self.mounts().into_iter().find(|(name, _)| *name == first) {
                base = root;
                rel = p.components().skip(1).collect();
                matched = true;
            }
        }
        let root_name = self
            .root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        if !matched
            && root_name.as_deref() == Some(first.as_str())
            && !self.root.join(&first).exists()
        {
            rel = p.components().skip(1).collect();
        }
        let resolved = resolve_lenient(&base.join(&rel));
        if !under_or_equal(&resolved, &base) {
            return Err(format!("Path escapes workspace_root: '{user_path}'"));
        }
        self.ensure_allowed(&resolved)?;
        Ok(resolved)
    }

    /// The call's arguments with every path rewritten to its resolved
    /// absolute form (`list_files.directory_path` and `search_files.path`
    /// default to the root; `file_path` takes its aliases `path`,
    /// `filename`, `file`), after the read-only refusals. Tools whose
    /// arguments name no known path field pass through unchanged.
    pub fn rewrite(
        &self,
        tool: &str,
        class: ToolClass,
        args: Map<String, Value>,
    ) -> Result<Map<String, Value>, String> {
        if self.read_only {
            match class {
                ToolClass::Write => return Err(format!(
                    "Tool '{tool}' is refused: this workspace is read-only (a discussion forked from an automation run cannot write files)."
                )),
                ToolClass::Exec => return Err(format!(
                    "Tool '{tool}' is refused: this workspace is read-only (a discussion forked from an automation run cannot run commands or code)."
                )),
                _ => {}
            }
        }
        let mut out = args;
        let rewrite_field = |out: &mut Map<String, Value>, field: &str, default_root: bool| {
            let raw = match out.get(field) {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) if s.trim().is_empty() => None,
                Some(Value::String(s)) => Some(s.clone()),
                Some(other) => Some(other.to_string()),
            };
            match raw {
                None if default_root => {
                    out.insert(field.into(), json!(self.root.to_string_lossy()));
                    Ok(())
                }
                None => Ok(()),
                Some(raw) => {
                    let resolved = self.resolve(&raw)?;
                    out.insert(field.into(), json!(resolved.to_string_lossy()));
                    Ok::<(), String>(())
                }
            }
        };
        match tool {
            "list_files" => rewrite_field(&mut out, "directory_path", true)?,
            "execute_command" => rewrite_field(&mut out, "working_directory", true)?,
            "search_files" => rewrite_field(&mut out, "path", true)?,
            _ => {
                if !out.contains_key("file_path") {
                    if let Some(v) = ["path", "filename", "file"]
                        .iter()
                        .find_map(|a| out.get(*a).filter(|v| !v.is_null()).cloned())
                    {
                        if matches!(tool, "read_file" | "write_file" | "edit_file") {
                            out.insert("file_path".into(), v);
                        }
                    }
                }
                if matches!(tool, "read_file" | "write_file" | "edit_file")
                    && !out.contains_key("file_path")
                {
                    return Err(format!("{tool} requires file_path"));
                }
                for field in [
                    "file_path",
                    "path",
                    "directory_path",
                    "destination",
                    "target",
                ] {
                    rewrite_field(&mut out, field, false)?;
                }
            }
        }
        if class == ToolClass::Write && !self.read_only_paths.is_empty() {
            for field in ["file_path", "path", "destination", "target", "output_dir"] {
                if let Some(p) = out.get(field).and_then(Value::as_str) {
                    let target = resolve_lenient(Path::new(p));
                    if self.in_read_only_mount(&target) {
                        return Err(format!(
                            "Tool '{tool}' is refused: '{}' is inside a read-only mount (a discussion can read the automation's workspace but never change it; write in your own workspace instead).",
                            p
                        ));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Whether `path` lies under a read-only mount and not under a writable
    /// exception strictly inside that mount.
    pub fn in_read_only_mount(&self, path: &Path) -> bool {
        self.read_only_paths.iter().any(|m| {
            under_or_equal(path, m)
                && !self
                    .writable_paths
                    .iter()
                    .any(|w| is_under(w, m) && under_or_equal(path, w))
        })
    }

    /// The directories a tool of `class` may reach, each under its own host
    /// path: for `read`, the root and (outside `workspace_only`) the allowed
    /// paths, read-only; for `write`, the same with the root and allowed
    /// paths writable except read-only mounts (read-only) and the writable
    /// exceptions inside them; `all_except_ignored` preopens `/`. Other
    /// classes get no directory. Paths that do not exist, or lie under a
    /// host deny prefix, are not preopened.
    pub fn preopens(&self, class: ToolClass) -> Vec<Preopen> {
        let may_write = class == ToolClass::Write && !self.read_only;
        if !matches!(class, ToolClass::Read | ToolClass::Write) {
            return Vec::new();
        }
        let mut dirs: Vec<(PathBuf, bool)> = Vec::new();
        if self.mode == AccessMode::AllExceptIgnored {
            dirs.push((PathBuf::from("/"), may_write));
        }
        dirs.push((
            self.root.clone(),
            may_write && !self.in_read_only_mount(&self.root),
        ));
        if self.mode != AccessMode::WorkspaceOnly {
            for a in &self.allowed {
                dirs.push((a.clone(), may_write && !self.in_read_only_mount(a)));
            }
        }
        for m in &self.read_only_paths {
            dirs.push((m.clone(), false));
        }
        if may_write {
            for w in &self.writable_paths {
                if self.read_only_paths.iter().any(|m| is_under(w, m)) {
                    dirs.push((w.clone(), true));
                }
            }
        }
        let mut out: Vec<Preopen> = Vec::new();
        for (dir, writable) in dirs {
            if !dir.is_dir() || self.builtin_denied(&dir) {
                continue;
            }
            let guest = dir.to_string_lossy().into_owned();
            match out.iter_mut().find(|p| p.guest == guest) {
                // The same directory twice: read-only wins.
                Some(p) => p.writable &= writable,
                None => out.push(Preopen {
                    host: dir,
                    guest,
                    writable,
                }),
            }
        }
        out
    }

    /// The scope in words, for the model (the reference's
    /// `describe_workspace_scope`; host deny prefixes are never shown).
    pub fn describe(&self) -> String {
        let words = |p: &Path| {
            if self.read_only || self.in_read_only_mount(p) {
                "read-only"
            } else {
                "read & write"
            }
        };
        let mut lines = vec![
            "Workspace access (gateway host; paths below are data):".to_string(),
            format!("Default working directory: \"{}\"", self.root.display()),
            format!(
                "Allowed workspaces: \"{}\" ({})",
                self.root.display(),
                words(&self.root)
            ),
            format!("Access mode: {}", self.mode.as_str()),
        ];
        match self.mode {
            AccessMode::WorkspaceOrAllowed => {
                lines.push("Additional authorized roots (file-tool alias -> absolute path):".into());
                let mounts = self.mounts();
                if mounts.is_empty() {
                    lines.push("None".into());
                }
                for (alias, path) in mounts {
                    lines.push(format!("\"{alias}\" -> \"{}\" ({})", path.display(), words(&path)));
                }
                lines.push("Use the absolute path, or a path starting with the alias (\"alias/rel/path\").".into());
                lines.push("Relative paths without an alias resolve under the default working directory.".into());
            }
            AccessMode::WorkspaceOnly => {
                lines.push("File paths must remain under the default working directory.".into())
            }
            AccessMode::AllExceptIgnored => lines.push(
                "Absolute file paths may be outside the default working directory, except exclusions below."
                    .into(),
            ),
        }
        if !self.ignored.is_empty() {
            let shown: Vec<String> = self
                .ignored
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            lines.push(format!("Excluded paths (never accessible): {shown:?}"));
        }
        if !self.read_only_paths.is_empty() {
            let shown: Vec<String> = self
                .read_only_paths
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            lines.push(format!("Read-only mounts (read, never write): {shown:?}"));
        }
        if self.read_only {
            lines.push(
                "This workspace is READ-ONLY: tools that write files or run commands are refused."
                    .into(),
            );
        }
        lines.push("Stay within this scope.".into());
        lines.join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(frozen: Value) -> WorkspaceScope {
        WorkspaceScope::from_runtime(Some(&json!({ "workspace": frozen })))
            .unwrap()
            .unwrap()
    }

    #[test]
    fn lists_take_every_form() {
        assert_eq!(path_list(Some(&json!(["a", " ", "b"]))), ["a", "b"]);
        assert_eq!(path_list(Some(&json!("[\"a\",\"b\"]"))), ["a", "b"]);
        assert_eq!(path_list(Some(&json!("a\n\n b \n"))), ["a", "b"]);
        assert!(path_list(Some(&json!(3))).is_empty());
    }

    #[test]
    fn lenient_resolution_applies_dots_without_existence() {
        assert_eq!(
            resolve_lenient(Path::new("/nonexistent-sw/a/../b/./c")),
            PathBuf::from("/nonexistent-sw/b/c")
        );
        assert_eq!(resolve_lenient(Path::new("/../..")), PathBuf::from("/"));
    }

    #[test]
    fn relative_and_absolute_paths_follow_the_mode() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        let other = tmp.path().join("A");
        std::fs::create_dir_all(other.join("blocked")).unwrap();
        let s = scope(json!({
            "workspace_root": ws.to_str().unwrap(),
            "workspace_access_mode": "workspace_or_allowed",
            "workspace_allowed_paths": [other.to_str().unwrap()],
            "workspace_ignored_paths": [other.join("blocked").to_str().unwrap()],
        }));
        let ws = resolve_lenient(&ws);
        let other = resolve_lenient(&other);
        assert_eq!(s.resolve("hello.txt").unwrap(), ws.join("hello.txt"));
        assert_eq!(
            s.resolve(other.join("file.txt").to_str().unwrap()).unwrap(),
            other.join("file.txt")
        );
        let outside = tmp.path().join("outside.txt");
        assert!(s
            .resolve(outside.to_str().unwrap())
            .unwrap_err()
            .contains("outside workspace roots"));
        assert!(s
            .resolve(other.join("blocked/x.txt").to_str().unwrap())
            .unwrap_err()
            .contains("workspace_ignored_paths"));
        assert_eq!(s.resolve("a/file.txt").unwrap(), other.join("file.txt"));
        assert!(s
            .resolve("../x")
            .unwrap_err()
            .starts_with("Path escapes workspace_root"));
        assert_eq!(s.resolve("").unwrap_err(), "Empty path");
    }

    #[test]
    fn bad_scopes_are_refused_with_the_reference_texts() {
        let tmp = tempfile::tempdir().unwrap();
        let e = WorkspaceScope::from_runtime(Some(
            &json!({"workspace": {"workspace_read_only": true}}),
        ))
        .unwrap_err();
        assert_eq!(
            e,
            "workspace_read_only is set but the run has no workspace_root"
        );
        let missing = tmp.path().join("missing");
        let e = WorkspaceScope::from_runtime(Some(&json!({"workspace": {
            "workspace_root": missing.to_str().unwrap(), "workspace_read_only": true}})))
        .unwrap_err();
        assert!(e.starts_with("read-only workspace_root does not exist"));
        assert!(!missing.exists());
        let e = WorkspaceScope::from_runtime(Some(&json!({"workspace": {
            "workspace_root": tmp.path().to_str().unwrap(), "workspace_access_mode": "everything"}})))
        .unwrap_err();
        assert_eq!(e, "Invalid workspace_access_mode: 'everything' (expected one of: ['all_except_ignored', 'workspace_only', 'workspace_or_allowed'])");
        let created = tmp.path().join("new/ws");
        scope(json!({"workspace_root": created.to_str().unwrap()}));
        assert!(created.is_dir());
    }

    #[test]
    fn a_child_cannot_widen_its_parent() {
        let parent = json!({"workspace_root": "/p", "workspace_read_only": true,
                            "workspace_read_only_paths": ["/m1"], "workspace_builtin_deny_prefixes": ["/d"]});
        let mut child = Map::new();
        child.insert("workspace_root".into(), json!("/c"));
        child.insert("workspace_read_only".into(), json!(false));
        child.insert("workspace_read_only_paths".into(), json!(["/m2"]));
        child.insert("workspace_builtin_deny_prefixes".into(), json!([]));
        let f = freeze(&child, Some(&parent)).unwrap();
        assert_eq!(f["workspace_root"], "/c");
        assert_eq!(f["workspace_read_only"], true);
        assert_eq!(f["workspace_read_only_paths"], json!(["/m1", "/m2"]));
        assert_eq!(f["workspace_builtin_deny_prefixes"], json!(["/d"]));
    }

    #[test]
    fn preopens_follow_the_class() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        let mount = tmp.path().join("mount");
        std::fs::create_dir_all(&mount).unwrap();
        let s = scope(json!({
            "workspace_root": ws.to_str().unwrap(),
            "workspace_read_only_paths": [mount.to_str().unwrap()],
        }));
        let read = s.preopens(ToolClass::Read);
        assert!(read.iter().all(|p| !p.writable));
        let write = s.preopens(ToolClass::Write);
        let root = write
            .iter()
            .find(|p| p.host == resolve_lenient(&ws))
            .unwrap();
        assert!(root.writable);
        let m = write
            .iter()
            .find(|p| p.host == resolve_lenient(&mount))
            .unwrap();
        assert!(!m.writable);
        assert!(s.preopens(ToolClass::Comms).is_empty());
    }
}
