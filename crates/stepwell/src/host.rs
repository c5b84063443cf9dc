//! Setting up a runtime the way the `stepwell` binary does: the embedded
//! SQLite store at `.stepwell/stepwell.sqlite` (or another store you name),
//! with the compiled-component cache beside it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::core::{Error, Result};
#[cfg(feature = "postgres")]
use crate::store::PostgresStore;
#[cfg(feature = "sqlite")]
use crate::store::SqliteStore;
use crate::store::{Durability, JsonFileStore, MemoryStore, Store};
use crate::wasm::{EngineConfig, SandboxLimits, WasmEngine};
use crate::Runtime;

/// The default database, relative to the current directory.
pub const DEFAULT_DB: &str = ".stepwell/stepwell.sqlite";

/// Values larger than this (as JSON) are kept as artifacts by the CLI's
/// runtime.
pub const DEFAULT_OFFLOAD_BYTES: usize = 256 << 10;

/// The key file that seals trigger connections' secrets, beside a store's
/// files ([`StoreSpec::connection_key_file`]).
pub const CONNECTION_KEY_FILE: &str = "connections.key";

/// The file `stepwell serve` keeps its bearer token in, beside a store's
/// files ([`StoreSpec::token_file`]).
pub const TOKEN_FILE: &str = "serve-token";

/// Refuses a store this build of the library was compiled without.
#[allow(dead_code)] // with every store feature on
fn not_built(store: &str, feature: &str) -> Error {
    Error::invalid(
        "store",
        format!("this build of stepwell has no {store} store (the library's `{feature}` feature)"),
    )
}

/// The environment variable that overrides [`DEFAULT_DB`].
pub const DB_ENV: &str = "STEPWELL_DB";

/// Which store a host uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreSpec {
    /// Nothing persists beyond the process.
    Memory,
    /// A SQLite database file.
    Sqlite(PathBuf),
    /// A folder of JSON files.
    Json(PathBuf),
    /// A PostgreSQL database, by its connection URL (`postgres://...`):
    /// several hosts share it.
    Postgres(String),
}

impl StoreSpec {
    /// Parses `memory`, `sqlite:PATH`, `json:DIR` or a PostgreSQL URL
    /// (`postgres://...` or `postgresql://...`): the `--store` syntax.
    pub fn parse(text: &str) -> Result<StoreSpec> {
        let bad = || Error::InvalidInput {
            field: "--store".into(),
            message: format!(
                "{:?} is not memory, sqlite:PATH, json:DIR or postgres://...",
                redact_url(text)
            ),
        };
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            return Ok(StoreSpec::Postgres(text.to_string()));
        }
        match text.split_once(':') {
            None if text == "memory" => Ok(StoreSpec::Memory),
            Some(("sqlite", p)) if !p.is_empty() => Ok(StoreSpec::Sqlite(p.into())),
            Some(("json", p)) if !p.is_empty() => Ok(StoreSpec::Json(p.into())),
            _ => Err(bad()),
        }
    }

    /// Opens the store, creating or migrating its schema, and returns the
    /// schema version it is at (`None` for the memory and JSON stores,
    /// which keep none).
    pub fn migrate(&self, durability: Option<Durability>) -> Result<Option<i64>> {
        Ok(match self {
            StoreSpec::Memory | StoreSpec::Json(_) => {
                self.open(durability)?;
                None
            }
            #[cfg(feature = "sqlite")]
            StoreSpec::Sqlite(_) => {
                self.open(durability)?;
                Some(crate::store::SQLITE_SCHEMA_VERSION)
            }
            #[cfg(feature = "postgres")]
            StoreSpec::Postgres(url) => Some(PostgresStore::open(url)?.schema_version()?),
            #[cfg(not(all(feature = "sqlite", feature = "postgres")))]
            other => {
                other.open(durability)?;
                None
            }
        })
    }

    /// Gives the space deleted runs left back to the file system, where
    /// the store needs to be asked: SQLite's file is rewritten
    /// ([`SqliteStore::vacuum`]): its size before and after. `None` for
    /// the others (JSON files delete theirs, PostgreSQL's autovacuum
    /// reclaims its pages, memory has no file).
    pub fn vacuum(&self) -> Result<Option<(u64, u64)>> {
        match self {
            #[cfg(feature = "sqlite")]
            StoreSpec::Sqlite(path) if !path.is_file() => Err(Error::invalid(
                "db",
                format!("{}: no store there (vacuum creates none)", path.display()),
            )),
            #[cfg(feature = "sqlite")]
            StoreSpec::Sqlite(path) => Ok(Some(SqliteStore::open(path)?.vacuum()?)),
            _ => Ok(None),
        }
    }

    /// Opens the store. `durability` applies to SQLite (`None`: normal) and
    /// JSON files (`None`: full).
    pub fn open(&self, durability: Option<Durability>) -> Result<Arc<dyn Store>> {
        Ok(match self {
            StoreSpec::Memory => Arc::new(MemoryStore::new()),
            #[cfg(feature = "sqlite")]
            StoreSpec::Sqlite(path) => Arc::new(SqliteStore::open_with(
                path,
                durability.unwrap_or(Durability::Normal),
            )?),
            #[cfg(not(feature = "sqlite"))]
            StoreSpec::Sqlite(_) => return Err(not_built("SQLite", "sqlite")),
            StoreSpec::Json(dir) => Arc::new(JsonFileStore::open_with(
                dir,
                durability.unwrap_or(Durability::Full),
            )?),
            #[cfg(feature = "postgres")]
            StoreSpec::Postgres(url) => Arc::new(PostgresStore::open(url)?),
            #[cfg(not(feature = "postgres"))]
            StoreSpec::Postgres(_) => return Err(not_built("PostgreSQL", "postgres")),
        })
    }

    /// The artifact store that goes with this store: `artifacts/` beside the
    /// database or inside the JSON store folder, in memory for the memory
    /// store.
    pub fn artifacts(&self) -> Result<Arc<dyn crate::store::ArtifactStore>> {
        Ok(match self {
            StoreSpec::Memory => Arc::new(crate::store::MemoryArtifactStore::new()),
            StoreSpec::Sqlite(path) => Arc::new(crate::store::FileArtifactStore::open(
                path.parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .unwrap_or(Path::new("."))
                    .join("artifacts"),
            )?),
            StoreSpec::Json(dir) => Arc::new(crate::store::FileArtifactStore::open(
                dir.join("artifacts"),
            )?),
            #[cfg(feature = "postgres")]
            StoreSpec::Postgres(url) => Arc::new(PostgresStore::open(url)?),
            #[cfg(not(feature = "postgres"))]
            StoreSpec::Postgres(_) => return Err(not_built("PostgreSQL", "postgres")),
        })
    }

    /// What no tool may reach: the store's files and the folders beside
    /// them (artifacts, snapshots, compiled components, the server's
    /// token), absolute; for a memory or PostgreSQL store, its caches under
    /// `cache_home` and its files under `state_home`.
    pub fn protected_paths(
        &self,
        cache_home: Option<&Path>,
        state_home: Option<&Path>,
    ) -> Vec<PathBuf> {
        let absolute = |p: PathBuf| std::path::absolute(&p).unwrap_or(p);
        match self {
            StoreSpec::Memory | StoreSpec::Postgres(_) => [
                self.cache_dir(cache_home),
                // Protected whatever the state folder is like.
                self.state_dir(state_home, TOKEN_FILE)
                    .ok()
                    .map(|d| d.join(TOKEN_FILE)),
                matches!(self, StoreSpec::Postgres(_))
                    .then(|| self.state_dir(state_home, CONNECTION_KEY_FILE).ok())
                    .flatten()
                    .map(|d| d.join(CONNECTION_KEY_FILE)),
            ]
            .into_iter()
            .flatten()
            .map(absolute)
            .collect(),
            StoreSpec::Sqlite(path) => {
                let dir = path
                    .parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .unwrap_or(Path::new("."));
                let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
                let mut out: Vec<PathBuf> = [
                    "artifacts",
                    "snapshots",
                    "cache",
                    TOKEN_FILE,
                    CONNECTION_KEY_FILE,
                ]
                .iter()
                .map(|d| dir.join(d))
                .collect();
                if let Some(name) = name {
                    for suffix in ["", "-wal", "-shm", "-journal"] {
                        out.push(dir.join(format!("{name}{suffix}")));
                    }
                }
                out.into_iter().map(absolute).collect()
            }
            StoreSpec::Json(dir) => vec![absolute(dir.clone())],
        }
    }

    /// The snapshot store that goes with this store: `snapshots/` beside the
    /// database or inside the JSON store folder, in memory for the memory
    /// store.
    pub fn snapshots(&self) -> Result<Box<dyn crate::store::SnapshotStore>> {
        Ok(match self {
            StoreSpec::Memory => Box::new(crate::store::MemorySnapshotStore::new()),
            StoreSpec::Sqlite(path) => Box::new(crate::store::JsonSnapshotStore::open(
                path.parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .unwrap_or(Path::new("."))
                    .join("snapshots"),
            )?),
            StoreSpec::Json(dir) => Box::new(crate::store::JsonSnapshotStore::open(
                dir.join("snapshots"),
            )?),
            #[cfg(feature = "postgres")]
            StoreSpec::Postgres(url) => Box::new(PostgresStore::open(url)?),
            #[cfg(not(feature = "postgres"))]
            StoreSpec::Postgres(_) => return Err(not_built("PostgreSQL", "postgres")),
        })
    }

    /// The key file that seals trigger connections' secrets:
    /// `connections.key` beside the database, inside a JSON store folder,
    /// or in `state_home` for a PostgreSQL store. A memory store keeps its
    /// key in memory (no file), and a PostgreSQL store given no
    /// `state_home` has no file either: both are refused (`invalid_input`,
    /// naming `state_home`).
    pub fn connection_key_file(&self, state_home: Option<&Path>) -> Result<PathBuf> {
        match self {
            StoreSpec::Memory => Err(Error::invalid(
                "state_home",
                "a memory store keeps its connections key in memory, in no file",
            )),
            _ => self.secret_file(state_home, CONNECTION_KEY_FILE),
        }
    }

    /// Where `stepwell serve` keeps its bearer token unless told otherwise:
    /// `serve-token` beside the database, inside a JSON store folder, or in
    /// `state_home` for the memory and PostgreSQL stores (without one, it
    /// is refused: `invalid_input`, naming `state_home`).
    pub fn token_file(&self, state_home: Option<&Path>) -> Result<PathBuf> {
        self.secret_file(state_home, TOKEN_FILE)
    }

    /// The folder of the store's own files: the database's folder, the JSON
    /// store folder, or `state_home` for the memory and PostgreSQL stores,
    /// which have none ([`StoreSpec::own_dir`]); refused without one (the
    /// library writes nowhere it was not told to), naming `file`, what was
    /// to go there.
    fn state_dir(&self, state_home: Option<&Path>, file: &str) -> Result<PathBuf> {
        let store = match self {
            StoreSpec::Memory => "memory",
            _ => "PostgreSQL",
        };
        if let Some(dir) = self.own_dir() {
            return Ok(dir);
        }
        let dir = state_home.map(Path::to_path_buf).ok_or_else(|| {
            Error::invalid(
                "state_home",
                format!(
                    "a {store} store has no folder of its own for its `{file}` file, and no state folder was given (HostOptions::state_home)"
                ),
            )
        })?;
        Ok(dir)
    }

    /// `file` in [`StoreSpec::state_dir`], once a state folder that exists
    /// is checked: another user's, or one others may write, could have the
    /// secret replaced or read beside it (it is created 0700 when missing).
    fn secret_file(&self, state_home: Option<&Path>, file: &str) -> Result<PathBuf> {
        let dir = self.state_dir(state_home, file)?;
        if self.own_dir().is_none() && dir.exists() {
            crate::store::private::check_dir(&dir)
                .map_err(|why| crate::store::private::refused(&dir, "the state folder", &why))?;
        }
        Ok(dir.join(file))
    }

    /// The folder the store's files are in: the database's folder or the
    /// JSON store folder; `None` for the memory and PostgreSQL stores.
    fn own_dir(&self) -> Option<PathBuf> {
        match self {
            StoreSpec::Memory | StoreSpec::Postgres(_) => None,
            StoreSpec::Sqlite(path) => Some(
                path.parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .unwrap_or(Path::new("."))
                    .to_path_buf(),
            ),
            StoreSpec::Json(dir) => Some(dir.clone()),
        }
    }

    /// Where compiled components are cached for this store: `cache/` beside
    /// the database or inside a JSON store folder; for the memory and
    /// PostgreSQL stores `cache/` under `cache_home` (the binary passes the
    /// user's cache folder, `$XDG_CACHE_HOME/stepwell` or
    /// `~/.cache/stepwell`), and without one nowhere: components are
    /// compiled in memory, nothing is written where it was not asked for.
    pub fn cache_dir(&self, cache_home: Option<&Path>) -> Option<PathBuf> {
        match self {
            StoreSpec::Memory | StoreSpec::Postgres(_) => cache_home.map(|h| h.join("cache")),
            StoreSpec::Sqlite(_) | StoreSpec::Json(_) => self.own_dir().map(|d| d.join("cache")),
        }
    }
}

/// `url` without its password (for messages).
pub use crate::store::redact_url;

impl std::fmt::Display for StoreSpec {
    /// The `--store` text (a URL without its password).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreSpec::Memory => f.write_str("memory"),
            StoreSpec::Sqlite(p) => write!(f, "sqlite:{}", p.display()),
            StoreSpec::Json(p) => write!(f, "json:{}", p.display()),
            StoreSpec::Postgres(url) => f.write_str(&redact_url(url)),
        }
    }
}

/// How [`open_runtime`] sets a host up, beyond the store.
#[derive(Clone, Default)]
pub struct HostOptions {
    /// The bounds of every guest call.
    pub limits: SandboxLimits,
    /// The store's durability (`None`: the store's default).
    pub durability: Option<Durability>,
    /// The runtime's configuration.
    pub config: crate::RuntimeConfig,
    /// The runtime's clock (`None`: the system clock); a fixed clock
    /// makes a command act at a chosen time (`stepwell --now`).
    pub clock: Option<Arc<dyn crate::Clock>>,
    /// The folder of third-party tool components, if any (the `tools`
    /// feature).
    pub tool_dir: Option<std::path::PathBuf>,
    /// The folder of plugin trigger sources, if any (the `automation`
    /// feature).
    pub trigger_dir: Option<std::path::PathBuf>,
    /// Offer the host tool `execute_command` (off by default; the `tools`
    /// feature).
    pub enable_exec: bool,
    /// The whole environment `execute_command` gives a command (the
    /// library reads none of its own process's; the binary passes its
    /// `PATH`, `HOME`, `LANG`, `LC_ALL` and `TMPDIR`).
    pub exec_env: Vec<(String, std::ffi::OsString)>,
    /// The ruff program the built-in `write_file` and `edit_file` lint
    /// Python files with (`None`: their notice says ruff is not installed;
    /// the `tools` feature).
    pub ruff: Option<std::path::PathBuf>,
    /// The host user's home folder, for a `~` in a workspace path (the
    /// binary passes its `$HOME`; `None`: `~` stays a name).
    pub home: Option<std::path::PathBuf>,
    /// Where a memory or PostgreSQL store's compiled components and bundles
    /// are cached (`None`: components are compiled in memory, and bundles
    /// the store keeps are written into a temporary folder of the
    /// runtime's own). The binary passes the user's cache folder.
    pub cache_home: Option<std::path::PathBuf>,
    /// Where the files of a memory or PostgreSQL store go, which has no
    /// folder of its own: the server's token (`serve-token`) and, for
    /// PostgreSQL, the connections key (`connections.key`). `None`: there
    /// are no such files; a PostgreSQL runtime then has no sealing key (a
    /// connection with a secret is refused) and its server's token file
    /// must be named. The binary passes the user's state folder.
    pub state_home: Option<std::path::PathBuf>,
    /// Effect handlers to register over the built-in ones (the binary's
    /// `llm_call`, configured from its environment).
    pub effects: Vec<Arc<dyn crate::effects::EffectHandler>>,
    /// Where the runtime's spans go (default: off). The binary gives an
    /// OTLP exporter when `--otlp-endpoint` (or
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`) is set.
    pub tracer: crate::core::trace::Tracer,
}

impl std::fmt::Debug for HostOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostOptions")
            .field("limits", &self.limits)
            .field("durability", &self.durability)
            .field("config", &self.config)
            .field("clock", &self.clock.as_ref().map(|c| c.now()))
            .field("tool_dir", &self.tool_dir)
            .field("trigger_dir", &self.trigger_dir)
            .field("enable_exec", &self.enable_exec)
            .field("exec_env", &self.exec_env)
            .field("ruff", &self.ruff)
            .field("home", &self.home)
            .field("cache_home", &self.cache_home)
            .field("state_home", &self.state_home)
            .field(
                "effects",
                &self.effects.iter().map(|e| e.kind()).collect::<Vec<_>>(),
            )
            .field("tracer", &self.tracer)
            .finish()
    }
}

/// What a host's runtime keeps its state in: the store, the digests of
/// its compiled components (if the store keeps them), its artifacts.
type Backing = (
    Arc<dyn Store>,
    Option<Arc<dyn crate::wasm::CompiledDigests>>,
    Arc<dyn crate::store::ArtifactStore>,
);

/// Opens the store and builds a runtime over it with an engine that caches
/// compiled components on disk, and the store's artifact store for values
/// larger than [`DEFAULT_OFFLOAD_BYTES`].
pub fn open_runtime(spec: &StoreSpec, options: &HostOptions) -> Result<Runtime> {
    // A SQLite store also keeps the digests of the compiled files cached
    // beside it (the cache loads only files they vouch for).
    // PostgreSQL keeps them, and the artifacts, in the database itself.
    let (store, digests, artifacts): Backing = match spec {
        #[cfg(feature = "sqlite")]
        StoreSpec::Sqlite(path) => {
            let db = Arc::new(SqliteStore::open_with(
                path,
                options.durability.unwrap_or(Durability::Normal),
            )?);
            (db.clone(), Some(db), spec.artifacts()?)
        }
        #[cfg(feature = "postgres")]
        StoreSpec::Postgres(url) => {
            let db = Arc::new(PostgresStore::open(url)?);
            (db.clone(), Some(db.clone()), db)
        }
        other => (other.open(options.durability)?, None, spec.artifacts()?),
    };
    let cache_home = options.cache_home.as_deref();
    let state_home = options.state_home.as_deref();
    let engine = WasmEngine::new(EngineConfig {
        cache_dir: spec.cache_dir(cache_home),
        limits: options.limits,
        digests,
    })?;
    let mut config = options.config.clone();
    config
        .tool_deny_paths
        .extend(spec.protected_paths(cache_home, state_home));
    let mut builder = crate::builder(store)
        .engine(engine)
        .config(config)
        .artifacts(artifacts, DEFAULT_OFFLOAD_BYTES)
        .tracer(options.tracer.clone());
    for handler in &options.effects {
        builder = builder.effect(handler.clone());
    }
    if let Some(clock) = &options.clock {
        builder = builder.clock(clock.clone());
    }
    #[cfg(not(feature = "tools"))]
    if options.tool_dir.is_some() || options.enable_exec || options.ruff.is_some() {
        return Err(Error::invalid(
            "tool_dir",
            "this build of stepwell has no tools (the library's `tools` feature)",
        ));
    }
    #[cfg(not(feature = "automation"))]
    if options.trigger_dir.is_some() {
        return Err(Error::invalid(
            "trigger_dir",
            "this build of stepwell has no trigger sources (the library's `automation` feature)",
        ));
    }
    #[cfg(feature = "tools")]
    {
        let env = (options.exec_env.iter())
            .fold(crate::tools::exec::ExecEnv::default(), |env, (k, v)| {
                env.var(k.clone(), v.clone())
            });
        let mut tools = crate::tools::Tools::new()
            .enable_exec(options.enable_exec)
            .exec_env(env);
        if let Some(home) = &options.home {
            tools = tools.home(home.clone());
        }
        if let Some(dir) = &options.tool_dir {
            tools = tools.dir(dir.clone());
        }
        if let Some(ruff) = &options.ruff {
            tools = tools.ruff(ruff.clone());
        }
        builder = builder.plugin(Arc::new(tools));
    }
    #[cfg(feature = "automation")]
    {
        let mut triggers = crate::triggers::Triggers::new();
        match spec {
            StoreSpec::Memory => {
                triggers = triggers.sealing_key(crate::triggers::SealingKey::random());
            }
            _ => {
                if let Ok(file) = spec.connection_key_file(state_home) {
                    triggers = triggers.sealing_key(crate::triggers::SealingKey::File(file));
                }
            }
        }
        if let Some(dir) = &options.trigger_dir {
            triggers = triggers.dir(dir.clone());
        }
        builder = builder.plugin(Arc::new(triggers));
    }
    builder.build()
}

/// An error as the `stepwell` binaries print it with `--json` (the value
/// of `{"error": ...}` on standard error): its code and message; a
/// feature's error with its own fields (an automation's own code, not the
/// API's family of it).
pub fn error_json(e: &Error) -> serde_json::Value {
    #[cfg(feature = "automation")]
    if let Some(a) = e.extension::<crate::automation::AutomationError>() {
        let mut detail = a.to_json();
        detail["code"] = serde_json::json!(a.reason_code);
        return detail;
    }
    match e {
        Error::Extension(x) => x.to_json(),
        _ => serde_json::json!({ "code": e.reason_code(), "message": e.to_string() }),
    }
}

#[cfg(test)]
mod state_tests {
    use std::path::{Path, PathBuf};

    use super::StoreSpec;

    /// A store without a folder of its own keeps its files where it is
    /// told, and without a state folder it has none (nothing in `.`).
    /// A state folder that others may write, or another user's, is
    /// refused (`store_unsafe`) before a secret is kept in it; its files
    /// are protected all the same.
    #[cfg(unix)]
    #[test]
    fn an_unsafe_state_folder_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("stepwell");
        std::fs::create_dir(&state).unwrap();
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
        let pg = StoreSpec::Postgres("postgres://h/db".into());
        for spec in [&StoreSpec::Memory, &pg] {
            let err = spec.token_file(Some(&state)).unwrap_err();
            assert_eq!(err.reason_code(), "store_unsafe", "{err}");
            assert!(err.to_string().contains("the state folder"), "{err}");
        }
        assert_eq!(
            pg.connection_key_file(Some(&state))
                .unwrap_err()
                .reason_code(),
            "store_unsafe"
        );
        assert_eq!(
            pg.protected_paths(None, Some(&state)),
            [state.join("serve-token"), state.join("connections.key")]
        );
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(
            StoreSpec::Memory.token_file(Some(&state)).unwrap(),
            state.join("serve-token")
        );
    }

    #[test]
    fn files_of_a_store_without_a_folder_go_to_the_state_folder() {
        let state = Path::new("/state/stepwell");
        let pg = StoreSpec::Postgres("postgres://h/db".into());
        for spec in [&StoreSpec::Memory, &pg] {
            assert_eq!(
                spec.token_file(Some(state)).unwrap(),
                state.join("serve-token")
            );
            let err = spec.token_file(None).unwrap_err();
            assert_eq!(err.reason_code(), "invalid_input");
            assert!(err.to_string().contains("HostOptions::state_home"), "{err}");
            assert_eq!(spec.protected_paths(None, None), Vec::<PathBuf>::new());
        }
        assert_eq!(
            pg.connection_key_file(Some(state)).unwrap(),
            state.join("connections.key")
        );
        assert!(pg.connection_key_file(None).is_err());
        // The memory store's key is kept in memory.
        assert!(StoreSpec::Memory.connection_key_file(Some(state)).is_err());
        assert_eq!(
            StoreSpec::Memory.protected_paths(None, Some(state)),
            [state.join("serve-token")]
        );
        // A database's files stay beside it, whatever the state folder.
        let db = StoreSpec::Sqlite("/data/x.sqlite".into());
        assert_eq!(
            db.token_file(Some(state)).unwrap(),
            Path::new("/data/serve-token")
        );
        assert_eq!(
            db.connection_key_file(None).unwrap(),
            Path::new("/data/connections.key")
        );
    }
}

#[cfg(test)]
mod redact_tests {
    use super::redact_url;

    #[test]
    fn no_password_is_shown() {
        for (url, shown) in [
            ("postgres://u@h:5432/db", "postgres://u@h:5432/db"),
            ("postgres://u:hunter2@h/db", "postgres://u:***@h/db"),
            // A password holding `@`: the user part ends at the last one.
            ("postgres://u:hun@ter2@h:1/db", "postgres://u:***@h:1/db"),
            (
                "postgres://u@h/db?password=hunter2&connect_timeout=2",
                "postgres://u@h/db?password=***&connect_timeout=2",
            ),
            (
                "host=h user=u password=hunter2 dbname=d",
                "host=h user=u password=*** dbname=d",
            ),
            (
                "host=h PASSWORD='hun ter2' dbname=d",
                "host=h PASSWORD=*** dbname=d",
            ),
            // Mistyped: only the scheme.
            ("postgres:/u:hunter2@x/db", "postgres:***"),
            ("memory", "memory"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }
}

/// Raises this process's soft limit of open files to its hard limit (at
/// most 65,536): every model call in flight holds a connection, and the
/// usual soft limit (1,024) is below the runtime's default
/// `max_in_flight`. The library never calls it: a binary does, at its
/// start (`stepwell` and `stepwell-bench` do).
pub fn raise_open_files() {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit(2) writes one `rlimit` through a pointer to a
        // live local of that type.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
            return;
        }
        let wanted = limit.rlim_max.min(65_536);
        if limit.rlim_cur < wanted {
            limit.rlim_cur = wanted;
            // SAFETY: setrlimit(2) reads one `rlimit` through a pointer to
            // a live local; a refusal leaves the limit as it was.
            unsafe {
                libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
            }
        }
    }
}
