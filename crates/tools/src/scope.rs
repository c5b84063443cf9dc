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
use stepwell_runtime::wasm::{Preopen, Reach, RefusedPaths};

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

/// The arguments the host resolves and checks as paths for any tool.
const PATH_FIELDS: [&str; 5] = [
    "file_path",
    "path",
    "directory_path",
    "destination",
    "target",
];

const ALIASES: [(&str, &str); 4] = [
    ("workspaceRoot", "workspace_root"),
    ("workspaceAccessMode", "workspace_access_mode"),
    ("workspaceAllowedPaths", "workspace_allowed_paths"),
    ("workspaceIgnoredPaths", "workspace_ignored_paths"),
];

/// Host deny prefixes every scope has, whatever the run says.
pub const ALWAYS_DENIED: [&str; 3] = ["/proc", "/sys", "/dev"];

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

/// A run's own scope, with its resolved root (see [`own_scope`]).
type OwnScope = (Map<String, Value>, Option<PathBuf>);

/// The scope `vars` name themselves (aliases read), its root absolute and
/// resolved and its paths absolute (relative ones against the root, else
/// the `inherited` scope's root), and the root.
fn own_scope(
    vars: &Map<String, Value>,
    inherited: Option<&Value>,
    home: Option<&Path>,
) -> Result<OwnScope, (String, String)> {
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
    let field = |k: &str| format!("vars.{k}");
    if let Some(mode) = own.get("workspace_access_mode") {
        mode_of(Some(mode)).map_err(|e| (field("workspace_access_mode"), e))?;
    }
    // The root, absolute and resolved.
    let root = match own.get("workspace_root") {
        None => None,
        Some(Value::String(raw)) if raw.trim().is_empty() => None,
        Some(Value::String(raw)) => {
            let p = expand_home(raw.trim(), home);
            let p = if p.is_absolute() {
                p
            } else {
                std::env::current_dir()
                    .map_err(|e| (field("workspace_root"), e.to_string()))?
                    .join(p)
            };
            Some(resolve_links(&p).map_err(|e| (field("workspace_root"), e))?)
        }
        Some(_) => {
            return Err((
                field("workspace_root"),
                "must be a string (a directory)".into(),
            ))
        }
    };
    if let Some(r) = &root {
        own.insert("workspace_root".into(), json!(r.to_string_lossy()));
    } else {
        own.remove("workspace_root");
    }
    let base = root.clone().or_else(|| {
        inherited
            .and_then(|p| p.get("workspace_root"))
            .and_then(Value::as_str)
            .map(PathBuf::from)
    });
    for key in [
        "workspace_allowed_paths",
        "workspace_ignored_paths",
        "workspace_builtin_deny_prefixes",
        "workspace_builtin_allow",
    ] {
        if let Some(raw) = own.get(key) {
            let entries = match &base {
                Some(b) => resolve_entries(b, path_list(Some(raw)), home),
                None => absolute_entries(path_list(Some(raw)), home),
            };
            own.insert(key.into(), json!(texts(&entries)));
        }
    }
    for key in ["workspace_read_only_paths", "workspace_writable_paths"] {
        if let Some(raw) = own.get(key) {
            own.insert(
                key.into(),
                json!(texts(&absolute_entries(path_list(Some(raw)), home))),
            );
        }
    }
    Ok((own, root))
}

/// The `_runtime.workspace` snapshot of a new run: its own top-level
/// `workspace_*` vars over what it inherits from its parent (`inherited`:
/// the parent's snapshot), with every path made absolute now (a relative
/// root against the starting process's directory, relative entries against
/// the root), so the scope never moves with the directory of whichever
/// process runs a later step. `Ok(None)` when there is nothing to freeze.
///
/// A child can only narrow its parent: its root and allowed paths must lie
/// within the parent's reach, its access mode may not be wider, ignored
/// paths, host deny prefixes and read-only mounts add up, a read-only
/// parent keeps it read-only, and the writable exceptions and deny
/// exceptions are the parent's. Anything else is refused with why (the
/// field is named in the text).
pub fn freeze(
    vars: &Map<String, Value>,
    inherited: Option<&Value>,
    home: Option<&Path>,
) -> Result<Option<Value>, (String, String)> {
    let (own, root) = own_scope(vars, inherited, home)?;
    let field = |k: &str| format!("vars.{k}");
    let Some(parent) = inherited.and_then(Value::as_object) else {
        return Ok((!own.is_empty()).then_some(Value::Object(own)));
    };
    // A child: only narrower.
    let p_mode = mode_of(parent.get("workspace_access_mode")).unwrap_or(AccessMode::WorkspaceOnly);
    let p_root = parent
        .get("workspace_root")
        .and_then(Value::as_str)
        .map(PathBuf::from);
    let p_allowed: Vec<PathBuf> = path_list(parent.get("workspace_allowed_paths"))
        .into_iter()
        .map(PathBuf::from)
        .collect();
    let p_ignored: Vec<PathBuf> = path_list(parent.get("workspace_ignored_paths"))
        .into_iter()
        .map(PathBuf::from)
        .collect();
    // A parent without a root reaches nothing, so its child may not name
    // one.
    let within_parent = |p: &Path| -> bool {
        if p_root.is_none() || p_ignored.iter().any(|i| under_or_equal(p, i)) {
            return false;
        }
        match p_mode {
            AccessMode::AllExceptIgnored => true,
            AccessMode::WorkspaceOrAllowed => {
                p_root.as_deref().is_some_and(|r| under_or_equal(p, r))
                    || p_allowed.iter().any(|a| under_or_equal(p, a))
            }
            AccessMode::WorkspaceOnly => p_root.as_deref().is_some_and(|r| under_or_equal(p, r)),
        }
    };
    let mut out = parent.clone();
    if let Some(r) = &root {
        if !within_parent(r) {
            return Err((
                field("workspace_root"),
                format!(
                    "{} is outside the parent run's workspace scope: a child run can only narrow it",
                    r.display()
                ),
            ));
        }
        out.insert("workspace_root".into(), json!(r.to_string_lossy()));
    }
    if let Some(m) = own.get("workspace_access_mode") {
        let mode = mode_of(Some(m)).map_err(|e| (field("workspace_access_mode"), e))?;
        let rank = |m: AccessMode| match m {
            AccessMode::WorkspaceOnly => 0,
            AccessMode::WorkspaceOrAllowed => 1,
            AccessMode::AllExceptIgnored => 2,
        };
        if rank(mode) > rank(p_mode) {
            return Err((
                field("workspace_access_mode"),
                format!(
                    "{} is wider than the parent run's {}: a child run can only narrow its scope",
                    mode.as_str(),
                    p_mode.as_str()
                ),
            ));
        }
        out.insert("workspace_access_mode".into(), json!(mode.as_str()));
    }
    if let Some(allowed) = own.get("workspace_allowed_paths") {
        for a in path_list(Some(allowed)) {
            if !within_parent(Path::new(&a)) {
                return Err((
                    field("workspace_allowed_paths"),
                    format!("{a} is outside the parent run's workspace scope: a child run can only narrow it"),
                ));
            }
        }
        out.insert("workspace_allowed_paths".into(), allowed.clone());
    }
    if parent.get("workspace_read_only") == Some(&Value::Bool(true))
        || own.get("workspace_read_only") == Some(&Value::Bool(true))
    {
        out.insert("workspace_read_only".into(), json!(true));
    }
    for key in [
        "workspace_ignored_paths",
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
    Ok(Some(Value::Object(out)))
}

fn texts(paths: &[PathBuf]) -> Vec<String> {
    paths
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect()
}

/// The access mode a value names (absent or blank: `workspace_only`), or
/// the reference's refusal.
fn mode_of(raw: Option<&Value>) -> Result<AccessMode, String> {
    let text = match raw {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.trim().to_ascii_lowercase(),
        Some(other) => other.to_string(),
    };
    match text.as_str() {
        "" | "workspace_only" => Ok(AccessMode::WorkspaceOnly),
        "workspace_or_allowed" => Ok(AccessMode::WorkspaceOrAllowed),
        "all_except_ignored" => Ok(AccessMode::AllExceptIgnored),
        _ => {
            let shown = match raw {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            };
            Err(format!(
                "Invalid workspace_access_mode: '{shown}' (expected one of: ['all_except_ignored', 'workspace_only', 'workspace_or_allowed'])"
            ))
        }
    }
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

/// `~` and `~/...` expanded with the host user's home folder `home` (the
/// application's: [`crate::Tools::home`]; the binary gives its
/// `$HOME`), as the reference's `expanduser`; left as they are without one.
fn expand_home(raw: &str, home: Option<&Path>) -> PathBuf {
    if raw == "~" || raw.starts_with("~/") {
        if let Some(home) = home {
            return home.join(raw.trim_start_matches('~').trim_start_matches('/'));
        }
    }
    PathBuf::from(raw)
}

/// `path` (absolute) if it still resolves to itself; else the refusal: a
/// link appeared on the way since the path was frozen.
fn stable(path: &Path, what: &str) -> Result<PathBuf, String> {
    let now = resolve_links(path)?;
    if now != path {
        return Err(format!(
            "{what} '{}' now resolves to '{}': a symbolic link was put on its way after the run started; refusing",
            path.display(),
            now.display()
        ));
    }
    Ok(now)
}

/// The most symbolic links one path may go through.
const MAX_LINKS: usize = 40;

/// [`resolve_links`], with a path that goes through too many links
/// resolved to a place that cannot exist (so it is under no root and
/// nothing can be written there).
pub fn resolve_lenient(path: &Path) -> PathBuf {
    resolve_links(path).unwrap_or_else(|_| PathBuf::from("/\u{0}too-many-links"))
}

/// An absolute path with `.` and `..` applied and every symbolic link
/// followed, also one whose target does not exist yet (the target's path
/// is spliced in and walked on), without requiring the path to exist:
/// Python's `os.path.realpath(strict=False)`. More than 40 links (a loop,
/// or a chain made to outrun the check) is an error.
pub fn resolve_links(path: &Path) -> Result<PathBuf, String> {
    use std::collections::VecDeque;
    use std::ffi::OsString;
    fn parts(p: &Path) -> Vec<OsString> {
        p.components()
            .filter_map(|c| match c {
                Component::Normal(s) => Some(s.to_os_string()),
                Component::ParentDir => Some(OsString::from("..")),
                _ => None,
            })
            .collect()
    }
    let mut out = PathBuf::from("/");
    let mut pending: VecDeque<OsString> = parts(path).into();
    let mut hops = 0;
    while let Some(part) = pending.pop_front() {
        if part == ".." {
            out.pop();
            continue;
        }
        out.push(&part);
        if let Ok(target) = std::fs::read_link(&out) {
            hops += 1;
            if hops > MAX_LINKS {
                return Err(format!(
                    "Too many levels of symbolic links: '{}'",
                    path.display()
                ));
            }
            out.pop();
            if target.is_absolute() {
                out = PathBuf::from("/");
            }
            for p in parts(&target).into_iter().rev() {
                pending.push_front(p);
            }
        }
    }
    Ok(out)
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
    /// The host's own files (its store): never preopened.
    pub protected: Vec<PathBuf>,
    /// The host user's home folder, for a `~` in a path a tool is given.
    pub home: Option<PathBuf>,
}

fn resolve_entries(root: &Path, raw: Vec<String>, home: Option<&Path>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for s in raw {
        let p = expand_home(&s, home);
        let p = if p.is_absolute() { p } else { root.join(p) };
        let p = resolve_lenient(&p);
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

fn absolute_entries(raw: Vec<String>, home: Option<&Path>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = raw
        .into_iter()
        .map(|s| expand_home(&s, home))
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
    pub fn from_runtime(
        runtime: Option<&Value>,
        home: Option<&Path>,
    ) -> Result<Option<WorkspaceScope>, String> {
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
        let root = expand_home(raw, home);
        let root = if root.is_absolute() {
            root
        } else {
            std::env::current_dir()
                .map_err(|e| format!("workspace_root {raw}: {e}"))?
                .join(root)
        };
        // Frozen resolved at start: if it resolves elsewhere now, a
        // symbolic link was planted on its way since, and the scope would
        // move with it.
        let root = stable(&root, "workspace_root")?;
        if root.exists() && !root.is_dir() {
            return Err(format!(
                "workspace_root must be a directory (got file): {raw}"
            ));
        }
        if read_only && !root.is_dir() {
            return Err(format!("read-only workspace_root does not exist: {raw}"));
        }
        let mode = mode_of(frozen.get("workspace_access_mode"))?;
        let mut allowed = Vec::new();
        for raw in path_list(frozen.get("workspace_allowed_paths")) {
            let p = expand_home(&raw, home);
            let p = if p.is_absolute() { p } else { root.join(p) };
            let p = stable(&p, "workspace_allowed_paths")?;
            if !allowed.contains(&p) {
                allowed.push(p);
            }
        }
        // The host's store must not lie where tools can write: a root (or
        // a reachable allowed path) holding it is refused.
        // Each as named and with its links resolved (a store named through
        // a link or a `..` is refused where it really is, too).
        let protected: Vec<PathBuf> = path_list(frozen.get("host_protected"))
            .into_iter()
            .map(PathBuf::from)
            .flat_map(|p| {
                let real = resolve_lenient(&p);
                if real == p {
                    vec![p]
                } else {
                    vec![p, real]
                }
            })
            .collect();
        for p in &protected {
            let reached = under_or_equal(p, &root)
                || (mode == AccessMode::WorkspaceOrAllowed
                    && allowed.iter().any(|a| under_or_equal(p, a)));
            if reached {
                return Err(format!(
                    "the workspace holds the host's store ('{}'): a tool could change it; put the workspace outside the store's folder (or the store, --db, outside the workspace)",
                    p.display()
                ));
            }
        }
        if !read_only {
            std::fs::create_dir_all(&root)
                .map_err(|e| format!("cannot create workspace_root {raw}: {e}"))?;
        }
        Ok(Some(WorkspaceScope {
            ignored: resolve_entries(
                &root,
                path_list(frozen.get("workspace_ignored_paths")),
                home,
            ),
            allowed,
            deny: {
                let mut d = resolve_entries(
                    &root,
                    path_list(frozen.get("workspace_builtin_deny_prefixes")),
                    home,
                );
                // The host's own: process, kernel and device files (the
                // host's environment is in /proc/self/environ).
                for p in ALWAYS_DENIED {
                    let p = PathBuf::from(p);
                    if !d.contains(&p) {
                        d.push(p);
                    }
                }
                d
            },
            deny_allow: resolve_entries(
                &root,
                path_list(frozen.get("workspace_builtin_allow")),
                home,
            ),
            read_only,
            read_only_paths: absolute_entries(mounts, home),
            protected,
            writable_paths: absolute_entries(writable, home),
            mode,
            root,
            home: home.map(Path::to_path_buf),
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
        let p = expand_home(raw, self.home.as_deref());
        if p.is_absolute() {
            let resolved = resolve_links(&p)?;
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
        let resolved = resolve_links(&base.join(&rel))?;
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
                for field in PATH_FIELDS {
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

    /// The `.abstractignore` refusal of a third-party tool's rewritten path
    /// arguments (the built-ins check their own targets, in their own
    /// words): `Path '<p>' is ignored by .abstractignore policy` when the
    /// nearest ignore file the tool could see (no higher than the
    /// outermost directory preopened for it that holds the path) ignores
    /// the path or, for a `write` tool, its directory, as the reference's
    /// tools refuse. Paths outside the tool's preopened directories (it
    /// cannot reach them) are left alone.
    pub fn ignore_file_refusal(
        &self,
        class: ToolClass,
        args: &Map<String, Value>,
    ) -> Option<String> {
        let preopens = self.preopens(class);
        for field in PATH_FIELDS {
            let Some(p) = args.get(field).and_then(Value::as_str) else {
                continue;
            };
            let path = Path::new(p);
            let Some(top) = preopens
                .iter()
                .map(|o| o.host.as_path())
                .filter(|h| path.starts_with(h))
                .min_by_key(|h| h.as_os_str().len())
            else {
                continue;
            };
            let policy = stepwell_abstractignore::Policy::for_path_within(path, Some(top));
            let ignored = policy.is_ignored(path, path.is_dir())
                || (class == ToolClass::Write
                    && path.parent().is_some_and(|d| policy.is_ignored(d, true)));
            if ignored {
                return Some(format!("Path '{p}' is ignored by .abstractignore policy"));
            }
        }
        None
    }

    /// What a tool must not show or enter although it may lie inside a
    /// preopened directory: the ignored paths and the host's deny prefixes;
    /// and what re-opens a more specific place inside them (the root, the
    /// reachable allowed paths, the deny exceptions). The longest
    /// containing entry decides; an exclusion wins a tie.
    pub fn exclusions(&self) -> (Vec<String>, Vec<String>) {
        let text = |p: &PathBuf| p.to_string_lossy().into_owned();
        let exclude = self.ignored.iter().chain(&self.deny).map(text).collect();
        let mut include: Vec<String> = vec![text(&self.root)];
        if self.mode != AccessMode::WorkspaceOnly {
            include.extend(self.allowed.iter().map(text));
        }
        include.extend(self.deny_allow.iter().map(text));
        (exclude, include)
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
    /// host deny prefix or the host's store, are not preopened; the
    /// [`refused_paths`](Self::refused_paths) inside a preopened directory
    /// are refused by the sandbox.
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
        // A mount is preopened (read-only) only where the scope reaches.
        let reach: Vec<PathBuf> = dirs.iter().map(|(d, _)| d.clone()).collect();
        for m in &self.read_only_paths {
            if reach.iter().any(|r| under_or_equal(m, r)) {
                dirs.push((m.clone(), false));
            }
        }
        if may_write {
            for w in &self.writable_paths {
                if self.read_only_paths.iter().any(|m| is_under(w, m))
                    && reach.iter().any(|r| under_or_equal(w, r))
                {
                    dirs.push((w.clone(), true));
                }
            }
        }
        let mut out: Vec<Preopen> = Vec::new();
        for (dir, writable) in dirs.into_iter().filter(|(d, _)| self.may_preopen(d)) {
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

    /// What a tool of `class` may reach: its [`preopens`](Self::preopens),
    /// less the [`refused_paths`](Self::refused_paths) inside them.
    pub fn reach(&self, class: ToolClass) -> Reach {
        Reach {
            preopens: self.preopens(class),
            refused: self.refused_paths(),
        }
    }

    /// What no tool may reach even inside a preopened directory: the
    /// system's own (`/proc`, `/sys`, `/dev`) and the host's store. The
    /// sandbox refuses them call by call, so the rest of a directory that
    /// holds them stays reachable.
    pub fn refused_paths(&self) -> RefusedPaths {
        RefusedPaths::new(
            ALWAYS_DENIED
                .iter()
                .map(PathBuf::from)
                .chain(self.protected.iter().cloned()),
        )
    }

    /// Whether `dir` can be preopened: it is a directory, and neither lies
    /// under a host deny prefix nor under the host's store.
    fn may_preopen(&self, dir: &Path) -> bool {
        dir.is_dir()
            && !self.builtin_denied(dir)
            && !self.protected.iter().any(|p| under_or_equal(dir, p))
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

    #[test]
    fn a_tilde_is_the_home_folder_the_application_gave() {
        let tmp = tempfile::tempdir().unwrap();
        let base = resolve_lenient(tmp.path());
        let (ws, home) = (base.join("ws"), base.join("home"));
        std::fs::create_dir_all(home.join("proj")).unwrap();
        let frozen = json!({"workspace": {"workspace_root": ws.to_str().unwrap()}});
        let given = WorkspaceScope::from_runtime(Some(&frozen), Some(&home))
            .unwrap()
            .unwrap();
        let e = given.resolve("~/notes.txt").unwrap_err();
        assert!(
            e.starts_with("Path escapes workspace_root: '~/notes.txt'"),
            "{e}"
        );
        let none = WorkspaceScope::from_runtime(Some(&frozen), None)
            .unwrap()
            .unwrap();
        assert_eq!(none.resolve("~/notes.txt").unwrap(), ws.join("~/notes.txt"));
        let vars = json!({"workspace_root": "~/proj"});
        let f = freeze(vars.as_object().unwrap(), None, Some(&home))
            .unwrap()
            .unwrap();
        assert_eq!(f["workspace_root"], home.join("proj").to_str().unwrap());
    }

    fn scope(frozen: Value) -> WorkspaceScope {
        WorkspaceScope::from_runtime(Some(&json!({ "workspace": frozen })), None)
            .unwrap()
            .unwrap()
    }

    #[test]
    fn dangling_links_are_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let base = resolve_lenient(tmp.path());
        std::fs::create_dir_all(base.join("ws/ro")).unwrap();
        std::os::unix::fs::symlink(base.join("ws/ro/new.txt"), base.join("ws/link")).unwrap();
        std::os::unix::fs::symlink("ro/other.txt", base.join("ws/rel")).unwrap();
        std::os::unix::fs::symlink("loop", base.join("ws/loop")).unwrap();
        assert_eq!(
            resolve_lenient(&base.join("ws/link")),
            base.join("ws/ro/new.txt")
        );
        assert_eq!(
            resolve_lenient(&base.join("ws/rel")),
            base.join("ws/ro/other.txt")
        );
        resolve_lenient(&base.join("ws/loop/x"));
    }

    #[test]
    fn the_system_directories_are_refused_inside_slash() {
        let s = scope(json!({"workspace_root": "/", "workspace_read_only": true}));
        let reach = s.reach(ToolClass::Read);
        let hosts: Vec<PathBuf> = reach.preopens.iter().map(|p| p.host.clone()).collect();
        assert_eq!(hosts, [PathBuf::from("/")]);
        for d in ALWAYS_DENIED {
            assert!(reach.refused.holds(Path::new(d)), "{d} is reachable");
            assert!(reach.refused.holds(&Path::new(d).join("self/environ")));
        }
        assert!(!reach.refused.holds(Path::new("/etc/hostname")));
    }

    #[test]
    fn too_many_links_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let base = resolve_lenient(tmp.path());
        for i in 0..45 {
            std::os::unix::fs::symlink(
                base.join(format!("c{}", i + 1)),
                base.join(format!("c{i}")),
            )
            .unwrap();
        }
        std::fs::write(base.join("c45"), "x").unwrap();
        let e = resolve_links(&base.join("c0")).unwrap_err();
        assert!(e.starts_with("Too many levels of symbolic links"), "{e}");
        let s = scope(json!({"workspace_root": base.to_str().unwrap()}));
        assert!(s.resolve("c0").is_err());
    }

    #[test]
    fn a_workspace_holding_the_store_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = resolve_lenient(tmp.path());
        let e = WorkspaceScope::from_runtime(
            Some(&json!({"workspace": {
            "workspace_root": ws.to_str().unwrap(),
            "host_protected": [ws.join(".stepwell/stepwell.sqlite").to_str().unwrap()]}})),
            None,
        )
        .unwrap_err();
        assert!(e.starts_with("the workspace holds the host's store"), "{e}");
        // Elsewhere, the store is refused inside what reaches it, and the
        // files beside it stay reachable.
        let store = ws.join("store.sqlite");
        let s = WorkspaceScope::from_runtime(
            Some(&json!({"workspace": {
            "workspace_root": ws.join("ws").to_str().unwrap(),
            "workspace_access_mode": "all_except_ignored",
            "host_protected": [store.to_str().unwrap()]}})),
            None,
        )
        .unwrap()
        .unwrap();
        let reach = s.reach(ToolClass::Read);
        assert!(reach.preopens.iter().any(|p| p.host == Path::new("/")));
        assert!(reach.refused.holds(&store));
        assert!(!reach.refused.holds(&ws.join("notes.txt")));
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

    /// A third-party tool's path arguments obey the nearest
    /// `.abstractignore` within its reach, as the reference's tools do:
    /// an ignored file, or for a write one in an ignored directory, is
    /// refused; one above the workspace is out of sight.
    #[test]
    fn ignore_files_refuse_third_party_paths() {
        let tmp = tempfile::tempdir().unwrap();
        let base = resolve_lenient(tmp.path());
        let ws = base.join("ws");
        std::fs::create_dir_all(ws.join("private")).unwrap();
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::fs::write(base.join(".abstractignore"), "*.txt\n").unwrap();
        std::fs::write(ws.join(".abstractignore"), "*.key\nprivate/\n").unwrap();
        std::fs::write(ws.join("sub/.abstractignore"), "*.log\n").unwrap();
        let s = scope(json!({"workspace_root": ws.to_str().unwrap()}));
        let refusal = |class: ToolClass, path: &Path| {
            let args = json!({"file_path": path.to_str().unwrap()});
            s.ignore_file_refusal(class, args.as_object().unwrap())
        };
        let api = ws.join("api.key");
        assert_eq!(
            refusal(ToolClass::Read, &api),
            Some(format!(
                "Path '{}' is ignored by .abstractignore policy",
                api.display()
            ))
        );
        assert_eq!(refusal(ToolClass::Read, &ws.join("notes.txt")), None);
        assert!(refusal(ToolClass::Read, &ws.join("private")).is_some());
        // Everything inside an ignored folder is ignored too.
        assert!(refusal(ToolClass::Read, &ws.join("private/p.md")).is_some());
        assert!(refusal(ToolClass::Write, &ws.join("private/new.md")).is_some());
        // The nearest file governs: `sub/` ignores logs, not keys.
        assert_eq!(refusal(ToolClass::Read, &ws.join("sub/b.key")), None);
        assert!(refusal(ToolClass::Read, &ws.join("sub/b.log")).is_some());
        // Classes that reach no file are left alone.
        assert_eq!(refusal(ToolClass::Comms, &api), None);
        // An ignore file above the workspace is out of the tool's sight.
        let ws2 = base.join("ws2");
        std::fs::create_dir_all(&ws2).unwrap();
        let s2 = scope(json!({"workspace_root": ws2.to_str().unwrap()}));
        let args = json!({"path": ws2.join("notes.txt").to_str().unwrap()});
        assert_eq!(
            s2.ignore_file_refusal(ToolClass::Read, args.as_object().unwrap()),
            None
        );
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
        let e = WorkspaceScope::from_runtime(
            Some(&json!({"workspace": {"workspace_read_only": true}})),
            None,
        )
        .unwrap_err();
        assert_eq!(
            e,
            "workspace_read_only is set but the run has no workspace_root"
        );
        let missing = tmp.path().join("missing");
        let e = WorkspaceScope::from_runtime(
            Some(&json!({"workspace": {
            "workspace_root": missing.to_str().unwrap(), "workspace_read_only": true}})),
            None,
        )
        .unwrap_err();
        assert!(e.starts_with("read-only workspace_root does not exist"));
        assert!(!missing.exists());
        let e = WorkspaceScope::from_runtime(Some(&json!({"workspace": {
            "workspace_root": tmp.path().to_str().unwrap(), "workspace_access_mode": "everything"}})), None)
        .unwrap_err();
        assert_eq!(e, "Invalid workspace_access_mode: 'everything' (expected one of: ['all_except_ignored', 'workspace_only', 'workspace_or_allowed'])");
        let created = tmp.path().join("new/ws");
        scope(json!({"workspace_root": created.to_str().unwrap()}));
        assert!(created.is_dir());
    }

    #[test]
    fn a_child_cannot_widen_its_parent() {
        let parent = json!({"workspace_root": "/nonexistent-sw/p", "workspace_read_only": true,
                            "workspace_read_only_paths": ["/m1"], "workspace_builtin_deny_prefixes": ["/d"],
                            "workspace_ignored_paths": ["/nonexistent-sw/p/secret"]});
        let child = |v: Value| freeze(v.as_object().unwrap(), Some(&parent), None);
        let f = child(json!({"workspace_root": "/nonexistent-sw/p/c", "workspace_read_only": false,
                             "workspace_read_only_paths": ["/m2"], "workspace_builtin_deny_prefixes": [],
                             "workspace_ignored_paths": []}))
        .unwrap()
        .unwrap();
        assert_eq!(f["workspace_root"], "/nonexistent-sw/p/c");
        assert_eq!(f["workspace_read_only"], true);
        assert_eq!(f["workspace_read_only_paths"], json!(["/m1", "/m2"]));
        assert_eq!(f["workspace_builtin_deny_prefixes"], json!(["/d"]));
        assert_eq!(
            f["workspace_ignored_paths"],
            json!(["/nonexistent-sw/p/secret"])
        );
        let (field, why) = child(json!({"workspace_root": "/"})).unwrap_err();
        assert_eq!(field, "vars.workspace_root");
        assert!(why.contains("only narrow"), "{why}");
        assert!(child(json!({"workspace_root": "/nonexistent-sw/p/secret/x"})).is_err());
        let (field, _) = child(json!({"workspace_access_mode": "all_except_ignored"})).unwrap_err();
        assert_eq!(field, "vars.workspace_access_mode");
        assert!(child(json!({"workspace_allowed_paths": ["/etc"]})).is_err());
        // A parent without a workspace reaches nothing.
        let none = json!({});
        let (field, _) = freeze(
            json!({"workspace_root": "/"}).as_object().unwrap(),
            Some(&none),
            None,
        )
        .unwrap_err();
        assert_eq!(field, "vars.workspace_root");
        // Nothing of its own: the parent's scope as it is.
        assert_eq!(
            child(json!({})).unwrap().unwrap()["workspace_root"],
            "/nonexistent-sw/p"
        );
    }

    #[test]
    fn relative_paths_are_frozen_absolute() {
        let here = std::env::current_dir().unwrap();
        let f = freeze(
            json!({"workspace_root": "rel-ws", "workspace_ignored_paths": ["x"]})
                .as_object()
                .unwrap(),
            None,
            None,
        )
        .unwrap()
        .unwrap();
        let root = resolve_lenient(&here.join("rel-ws"));
        assert_eq!(f["workspace_root"], root.to_str().unwrap());
        assert_eq!(
            f["workspace_ignored_paths"],
            json!([root.join("x").to_str().unwrap()])
        );
        let (field, why) = freeze(
            json!({"workspace_access_mode": "everywhere"})
                .as_object()
                .unwrap(),
            None,
            None,
        )
        .unwrap_err();
        assert_eq!(field, "vars.workspace_access_mode");
        assert!(why.starts_with("Invalid workspace_access_mode: 'everywhere'"));
    }

    #[test]
    fn host_deny_prefixes_refuse_and_are_never_preopened() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        let secret = tmp.path().join("secret");
        std::fs::create_dir_all(secret.join("mine")).unwrap();
        let s = scope(json!({
            "workspace_root": ws.to_str().unwrap(),
            "workspace_access_mode": "workspace_or_allowed",
            "workspace_allowed_paths": [secret.to_str().unwrap()],
            "workspace_builtin_deny_prefixes": [secret.to_str().unwrap()],
            "workspace_builtin_allow": [secret.join("mine").to_str().unwrap()],
        }));
        let secret = resolve_lenient(&secret);
        let e = s
            .resolve(secret.join("x.txt").to_str().unwrap())
            .unwrap_err();
        assert_eq!(
            e,
            format!(
                "Path is not accessible (protected by the host): '{}'",
                secret.join("x.txt").display()
            )
        );
        assert!(s
            .resolve(secret.join("mine/x.txt").to_str().unwrap())
            .is_ok());
        assert!(s.preopens(ToolClass::Read).iter().all(|p| p.host != secret));
        assert!(
            !s.describe().contains(secret.to_str().unwrap())
                || s.describe().contains("\"secret\" ->")
        );
    }

    #[test]
    fn preopens_follow_the_class() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        let mount = tmp.path().join("mount");
        std::fs::create_dir_all(&mount).unwrap();
        // A mount the scope does not reach is not preopened at all.
        let unreached = scope(json!({
            "workspace_root": ws.to_str().unwrap(),
            "workspace_read_only_paths": [mount.to_str().unwrap()],
        }));
        assert!(unreached
            .preopens(ToolClass::Read)
            .iter()
            .all(|p| p.host != resolve_lenient(&mount)));
        let s = scope(json!({
            "workspace_root": ws.to_str().unwrap(),
            "workspace_access_mode": "workspace_or_allowed",
            "workspace_allowed_paths": [mount.to_str().unwrap()],
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

/// Property tests: any path a model may name, against scopes whose
/// workspace holds links out of it, into it and in a loop.
#[cfg(test)]
mod path_properties {
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    /// A workspace `base/ws` (with `sub/f.txt`, an ignored `secret`, links
    /// `out` and `rel` to `base/outside`, `inner` to `sub`, `loop` to
    /// itself) and an allowed `base/other` (with an ignored `blocked`):
    /// the scopes `workspace_only` and `workspace_or_allowed` of it.
    struct Fixture {
        _tmp: tempfile::TempDir,
        base: PathBuf,
        scopes: [WorkspaceScope; 2],
    }

    fn fixture() -> Fixture {
        use std::os::unix::fs::symlink;
        let tmp = tempfile::tempdir().unwrap();
        let base = resolve_lenient(tmp.path());
        let ws = base.join("ws");
        for dir in ["ws/sub", "ws/secret", "outside", "other/blocked"] {
            std::fs::create_dir_all(base.join(dir)).unwrap();
        }
        std::fs::write(ws.join("sub/f.txt"), "x").unwrap();
        symlink(base.join("outside"), ws.join("out")).unwrap();
        symlink("../outside", ws.join("rel")).unwrap();
        symlink("sub", ws.join("inner")).unwrap();
        symlink("loop", ws.join("loop")).unwrap();
        let scope = |mode: &str| {
            WorkspaceScope::from_runtime(Some(&json!({"workspace": {
                "workspace_root": ws.to_str().unwrap(),
                "workspace_access_mode": mode,
                "workspace_allowed_paths": [base.join("other").to_str().unwrap()],
                "workspace_ignored_paths": ["secret", base.join("other/blocked").to_str().unwrap()],
            }})), None)
            .unwrap()
            .unwrap()
        };
        Fixture {
            scopes: [scope("workspace_only"), scope("workspace_or_allowed")],
            _tmp: tmp,
            base,
        }
    }

    /// A runner of `cases` cases that writes no regression file.
    fn runner(cases: u32) -> TestRunner {
        TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        })
    }

    /// Where `path` really is, as the system resolves it: the real path of
    /// its deepest existing ancestor, and the rest as named.
    fn real_location(path: &Path) -> PathBuf {
        let mut rest = Vec::new();
        let mut at = path;
        loop {
            if let Ok(real) = std::fs::canonicalize(at) {
                return rest.iter().rev().fold(real, |p, part| p.join(part));
            }
            let Some(parent) = at.parent() else {
                return path.to_path_buf();
            };
            rest.push(at.file_name().unwrap_or_default().to_os_string());
            at = parent;
        }
    }

    /// Paths of the fixture's names (links, `..`, `.`, the workspace's own
    /// name, the mount alias), relative or under the fixture's folders, or
    /// any text at all.
    fn user_path(base: &Path) -> impl Strategy<Value = String> {
        let names = prop::sample::select(vec![
            "sub", "f.txt", "..", ".", "", "out", "rel", "inner", "loop", "ws", "other", "secret",
            "blocked", "outside", "x y", "~",
        ]);
        let base = base.to_string_lossy().into_owned();
        let prefix = prop::sample::select(vec![
            String::new(),
            "/".into(),
            "@".into(),
            "~/".into(),
            format!("{base}/"),
            format!("{base}/ws/"),
        ]);
        prop_oneof![
            4 => (prefix, prop::collection::vec(names, 1..6))
                .prop_map(|(prefix, names)| format!("{prefix}{}", names.join("/"))),
            1 => any::<String>(),
        ]
    }

    /// Whatever path a model names, resolving it never panics, and a path
    /// accepted is absolute, free of `.` and `..`, and passes through no
    /// link (it resolves to itself); where the system finds it is inside
    /// the root (or, in `workspace_or_allowed`, the allowed path), and
    /// outside every ignored path and the system's own.
    #[test]
    fn an_accepted_path_stays_in_its_scope() {
        let f = fixture();
        let real = |p: &str| real_location(&f.base.join(p));
        let ignored = [real("ws/secret"), real("other/blocked")];
        let mut runner = runner(512);
        runner
            .run(&user_path(&f.base), |raw| {
                for (i, scope) in f.scopes.iter().enumerate() {
                    let Ok(resolved) = scope.resolve(&raw) else {
                        continue;
                    };
                    prop_assert!(resolved.is_absolute(), "{raw:?}: {resolved:?}");
                    prop_assert!(
                        resolved
                            .components()
                            .all(|c| matches!(c, Component::RootDir | Component::Normal(_))),
                        "{:?}: {:?}",
                        raw,
                        resolved
                    );
                    prop_assert_eq!(resolve_links(&resolved), Ok(resolved.clone()));
                    let at = real_location(&resolved);
                    let inside =
                        at.starts_with(real("ws")) || (i == 1 && at.starts_with(real("other")));
                    prop_assert!(inside, "{:?} escapes to {:?} ({:?})", raw, at, scope.mode);
                    for refused in ignored
                        .iter()
                        .map(PathBuf::as_path)
                        .chain(ALWAYS_DENIED.map(Path::new))
                    {
                        prop_assert!(!at.starts_with(refused), "{:?} reaches {:?}", raw, at);
                    }
                }
                Ok(())
            })
            .unwrap();
    }

    /// A relative path of plain names, through no link, is the path under
    /// the root, in either mode.
    #[test]
    fn a_plain_relative_path_is_under_the_root() {
        let f = fixture();
        let names = prop::sample::select(vec!["sub", "f.txt", "x y", "new", "."]);
        let mut runner = runner(256);
        runner
            .run(&prop::collection::vec(names, 1..5), |names| {
                let raw = names.join("/");
                for scope in &f.scopes {
                    prop_assert_eq!(scope.resolve(&raw), Ok(scope.root.join(&raw)));
                }
                Ok(())
            })
            .unwrap();
    }
}
