//! Setting up a runtime the way the `stepwell` binary does: the embedded
//! SQLite store at `.stepwell/stepwell.sqlite` (or a path you give), with the
//! compiled-component cache beside it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::core::Result;
use crate::store::{MemoryStore, SqliteStore, Store};
use crate::wasm::{EngineConfig, SandboxLimits, WasmEngine};
use crate::Runtime;

/// The default database, relative to the current directory.
pub const DEFAULT_DB: &str = ".stepwell/stepwell.sqlite";

/// The environment variable that overrides [`DEFAULT_DB`].
pub const DB_ENV: &str = "STEPWELL_DB";

/// Which store a host uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreSpec {
    /// Nothing persists beyond the process.
    Memory,
    /// A SQLite database file.
    Sqlite(PathBuf),
}

impl StoreSpec {
    /// Opens the store.
    pub fn open(&self) -> Result<Arc<dyn Store>> {
        Ok(match self {
            StoreSpec::Memory => Arc::new(MemoryStore::new()),
            StoreSpec::Sqlite(path) => Arc::new(SqliteStore::open(path)?),
        })
    }

    /// Where compiled components are cached for this store: `cache/` beside
    /// the database, or `.stepwell/cache` for the memory store.
    pub fn cache_dir(&self) -> PathBuf {
        match self {
            StoreSpec::Memory => Path::new(".stepwell").join("cache"),
            StoreSpec::Sqlite(path) => path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .join("cache"),
        }
    }
}

/// Opens the store and builds a runtime over it with an engine that caches
/// compiled components on disk.
pub fn open_runtime(spec: &StoreSpec, limits: SandboxLimits) -> Result<Runtime> {
    let store = spec.open()?;
    let engine = WasmEngine::new(EngineConfig {
        cache_dir: Some(spec.cache_dir()),
        limits,
    })?;
    Runtime::builder(store).engine(engine).build()
}
