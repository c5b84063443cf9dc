//! The engine: compilation, the on-disk cache of compiled components, the
//! epoch ticker that enforces time limits, and the linker guests are
//! instantiated against.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, InstancePre, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::cache::{CompileCache, CompiledDigests};
use super::node::{NodeComponent, NodePre};
use super::sandbox::GuestState;
use super::tool::{ToolComponent, ToolPre};
use super::trigger::{TriggerComponent, TriggerSourcePre};
use super::{LoadError, SandboxLimits};

/// How often the epoch ticker advances the engine's epoch: the granularity
/// of time limits.
const EPOCH_TICK: Duration = Duration::from_millis(5);

/// The number of epoch ticks that cover `limit`.
pub(crate) fn ticks_for(limit: Duration) -> u64 {
    let tick = EPOCH_TICK.as_micros().max(1) as u64;
    (limit.as_micros().min(u64::MAX as u128 / 2) as u64).div_ceil(tick) + 1
}

/// How a [`WasmEngine`] is set up.
#[derive(Debug, Clone, Default)]
pub struct EngineConfig {
    /// Where compiled components are cached, keyed by the SHA-256 of the
    /// component and the engine's compatibility hash. `None` disables the
    /// on-disk cache (components are still compiled once per engine).
    pub cache_dir: Option<PathBuf>,
    /// The bounds of every guest call.
    pub limits: SandboxLimits,
    /// Where the digests of cached compiled files are kept (`None`: beside
    /// them in the cache directory). A cached file is loaded only if its
    /// digest matches.
    pub digests: Option<Arc<dyn CompiledDigests>>,
}

/// Where a loaded component's compiled code came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadOrigin {
    /// Compiled by this engine now (and written to the cache, if any).
    Compiled,
    /// Read from the on-disk cache: no compilation happened.
    DiskCache,
}

struct Ticker {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The code of a component being compiled, once it is, and where it came
/// from: what a thread loading the same bytes meanwhile waits for.
type CompileSlot = Arc<Mutex<Option<(Component, LoadOrigin)>>>;

/// A loaded file's size and modification time, and what it loaded as.
type PathStamp = (u64, std::time::SystemTime, Arc<NodeComponent>);

struct Shared {
    engine: Engine,
    linker: Linker<GuestState>,
    config: EngineConfig,
    loaded: Mutex<HashMap<[u8; 32], Arc<NodeComponent>>>,
    /// Components compiled or read from the cache, by the digest of their
    /// bytes: a thread loading the same bytes meanwhile waits on the slot
    /// and takes what it holds. A slot whose compile failed leaves the map.
    compiling: Mutex<HashMap<[u8; 32], CompileSlot>>,
    /// Components this engine compiled (not read from the cache).
    compiled: AtomicU64,
    /// What its node calls counted.
    guests: GuestMetrics,
    /// Files already loaded, with the size and modification time seen then,
    /// so loading a file again does not re-read and re-hash it.
    by_path: Mutex<HashMap<PathBuf, PathStamp>>,
    triggers: Mutex<HashMap<[u8; 32], Arc<TriggerComponent>>>,
    tools: Mutex<HashMap<[u8; 32], Arc<ToolComponent>>>,
    cache: Option<CompileCache>,
    /// Bytes of linear memory the engine's live guest stores hold.
    live_memory: Arc<std::sync::atomic::AtomicUsize>,
    /// Makes node instances ahead and drops used ones (`warm.rs`).
    worker: super::warm::Worker,
    _ticker: Ticker,
}

/// What an engine's node calls counted (relaxed atomics).
#[derive(Debug, Default)]
pub(crate) struct GuestMetrics {
    calls: AtomicU64,
    us: AtomicU64,
    instances_made: AtomicU64,
    instances_ahead: AtomicU64,
}

impl GuestMetrics {
    /// Counts one guest call that took `took`.
    pub(crate) fn call(&self, took: std::time::Duration) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let us = took.as_micros().min(u64::MAX as u128) as u64;
        self.us.fetch_add(us, Ordering::Relaxed);
    }

    /// Counts one node instance a run needed: made ahead, or made then.
    pub(crate) fn instance(&self, ahead: bool) {
        let counter = if ahead {
            &self.instances_ahead
        } else {
            &self.instances_made
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// What an engine's node calls counted since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GuestCounts {
    /// Node calls into guest components.
    pub calls: u64,
    /// Their total wall time, in microseconds.
    pub us: u64,
    /// Node instances made when a run needed one (it waited for them).
    pub instances_made: u64,
    /// Node instances a run found made ahead.
    pub instances_ahead: u64,
}

/// Compiles, caches, pre-instantiates and calls WebAssembly components.
///
/// Cloning is cheap (one shared engine). Creating one starts a small
/// background thread that advances the epoch every 5 ms; it stops when the
/// last clone is dropped.
#[derive(Clone)]
pub struct WasmEngine {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for WasmEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmEngine")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl WasmEngine {
    /// Creates an engine. Fails only if wasmtime cannot be configured on this
    /// machine.
    pub fn new(config: EngineConfig) -> Result<Self, LoadError> {
        // The pooling allocator keeps instance slots (memories, tables) warm
        // between calls, which makes a fresh instance per call cheap. If this
        // machine cannot reserve the pool's address space, fall back to
        // allocating on demand.
        let engine = Engine::new(&engine_config(&config.limits, true))
            .or_else(|_| Engine::new(&engine_config(&config.limits, false)))
            .map_err(|e| LoadError {
                path: PathBuf::new(),
                message: format!("cannot create the wasm engine: {}", one_line(&e)),
            })?;
        let cache = match &config.cache_dir {
            Some(dir) => Some(CompileCache::open(dir, config.digests.clone()).map_err(
                |message| LoadError {
                    path: dir.clone(),
                    message,
                },
            )?),
            None => None,
        };
        let mut linker = Linker::new(&engine);
        super::sandbox::link_wasi(&mut linker).map_err(|e| LoadError {
            path: PathBuf::new(),
            message: format!("cannot link WASI: {}", one_line(&e)),
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let handle = {
            let stop = stop.clone();
            let weak = engine.weak();
            std::thread::Builder::new()
                .name("stepwell-epoch".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(EPOCH_TICK);
                        match weak.upgrade() {
                            Some(engine) => engine.increment_epoch(),
                            None => break,
                        }
                    }
                })
                .map_err(|e| LoadError {
                    path: PathBuf::new(),
                    message: format!("cannot start the epoch thread: {e}"),
                })?
        };
        Ok(WasmEngine {
            shared: Arc::new(Shared {
                engine,
                linker,
                config,
                loaded: Mutex::new(HashMap::new()),
                compiling: Mutex::new(HashMap::new()),
                compiled: AtomicU64::new(0),
                guests: GuestMetrics::default(),
                by_path: Mutex::new(HashMap::new()),
                triggers: Mutex::new(HashMap::new()),
                tools: Mutex::new(HashMap::new()),
                cache,
                live_memory: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
                worker: super::warm::Worker::default(),
                _ticker: Ticker {
                    stop,
                    handle: Some(handle),
                },
            }),
        })
    }

    /// How many components this engine has compiled (rather than read from
    /// its cache or found already loaded): the same bytes loaded by several
    /// threads at once, or by several processes sharing a cache directory,
    /// are compiled once.
    pub fn components_compiled(&self) -> u64 {
        self.shared.compiled.load(Ordering::Relaxed)
    }

    /// The limits every guest call runs under.
    pub fn limits(&self) -> SandboxLimits {
        self.shared.config.limits
    }

    /// What this engine's node calls counted so far.
    pub fn guest_counts(&self) -> GuestCounts {
        let g = &self.shared.guests;
        GuestCounts {
            calls: g.calls.load(Ordering::Relaxed),
            us: g.us.load(Ordering::Relaxed),
            instances_made: g.instances_made.load(Ordering::Relaxed),
            instances_ahead: g.instances_ahead.load(Ordering::Relaxed),
        }
    }

    /// Where this engine's node calls are counted.
    pub(crate) fn guest_metrics(&self) -> &GuestMetrics {
        &self.shared.guests
    }

    /// The count of memory the engine's live guests hold together.
    pub(crate) fn live_memory(&self) -> Arc<std::sync::atomic::AtomicUsize> {
        self.shared.live_memory.clone()
    }

    /// The worker that makes node instances ahead and drops used ones.
    pub(super) fn worker(&self) -> &super::warm::Worker {
        &self.shared.worker
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.shared.engine
    }

    /// The number of epoch ticks a call may run for.
    pub(crate) fn deadline_ticks(&self) -> u64 {
        ticks_for(self.limits().time_limit)
    }

    /// Loads the node component at `path`: compiles it (or reads the compiled
    /// code from the cache) and pre-instantiates it against the `node` world.
    /// A component with the same content loaded before by this engine is
    /// returned as is.
    pub fn load_node(&self, path: &Path) -> Result<Arc<NodeComponent>, LoadError> {
        let fail = |message: String| LoadError {
            path: path.to_path_buf(),
            message,
        };
        let stamp = std::fs::metadata(path)
            .and_then(|m| Ok((m.len(), m.modified()?)))
            .map_err(|e| fail(format!("cannot read: {e}")))?;
        let by_path = |node: &Arc<NodeComponent>| {
            self.shared
                .by_path
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(path.to_path_buf(), (stamp.0, stamp.1, node.clone()));
        };
        if let Some((len, modified, node)) = self
            .shared
            .by_path
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(path)
        {
            if (*len, *modified) == stamp {
                return Ok(node.clone());
            }
        }
        let bytes = std::fs::read(path).map_err(|e| fail(format!("cannot read: {e}")))?;
        let node = self.load_node_bytes(&bytes, path)?;
        by_path(&node);
        Ok(node)
    }

    /// Loads a node component from its bytes (`label` names it in errors
    /// and in [`NodeComponent::path`]: a file, or `builtin:<name>` for the
    /// components the host embeds). The same bytes load once per engine.
    pub fn load_node_bytes(
        &self,
        bytes: &[u8],
        label: &Path,
    ) -> Result<Arc<NodeComponent>, LoadError> {
        let fail = |message: String| LoadError {
            path: label.to_path_buf(),
            message,
        };
        let digest: [u8; 32] = Sha256::digest(bytes).into();
        if let Some(found) = self.lock_loaded().get(&digest).cloned() {
            return Ok(found);
        }
        let (pre, origin) =
            self.instantiate_pre(bytes, &digest, label, "node", NodePre::new, fail)?;
        let node = Arc::new(NodeComponent::new(
            label.to_path_buf(),
            hex::encode(digest),
            origin,
            pre,
            self.clone(),
            crate::inspect::declared_routes(bytes),
        ));
        self.lock_loaded().insert(digest, node.clone());
        Ok(node)
    }

    /// Loads a trigger-source component from its bytes (`label` names it in
    /// errors: a file path, or `builtin:<name>`), pre-instantiated against the
    /// `trigger-source` world. The same bytes load once per engine.
    pub fn load_trigger_bytes(
        &self,
        bytes: &[u8],
        label: &Path,
    ) -> Result<Arc<TriggerComponent>, LoadError> {
        let fail = |message: String| LoadError {
            path: label.to_path_buf(),
            message,
        };
        let digest: [u8; 32] = Sha256::digest(bytes).into();
        let memo = || {
            self.shared
                .triggers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
        };
        if let Some(found) = memo().get(&digest) {
            return Ok(found.clone());
        }
        let (pre, origin) = self.instantiate_pre(
            bytes,
            &digest,
            label,
            "trigger-source",
            TriggerSourcePre::new,
            fail,
        )?;
        let source = Arc::new(TriggerComponent::new(
            label.to_path_buf(),
            hex::encode(digest),
            origin,
            pre,
            self.clone(),
        ));
        memo().insert(digest, source.clone());
        Ok(source)
    }

    /// Loads a tool component from its bytes (`label` names it in errors: a
    /// file path, or `builtin:<name>`), pre-instantiated against the `tool`
    /// world. The same bytes load once per engine.
    pub fn load_tool_bytes(
        &self,
        bytes: &[u8],
        label: &Path,
    ) -> Result<Arc<ToolComponent>, LoadError> {
        let fail = |message: String| LoadError {
            path: label.to_path_buf(),
            message,
        };
        let digest: [u8; 32] = Sha256::digest(bytes).into();
        let memo = || self.shared.tools.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = memo().get(&digest) {
            return Ok(found.clone());
        }
        let (pre, origin) =
            self.instantiate_pre(bytes, &digest, label, "tool", ToolPre::new, fail)?;
        let tool = Arc::new(ToolComponent::new(
            label.to_path_buf(),
            hex::encode(digest),
            origin,
            pre,
            self.clone(),
        ));
        memo().insert(digest, tool.clone());
        Ok(tool)
    }

    /// Compiles (or reads from the cache) and pre-instantiates a component,
    /// then checks it against `world` with that world's `Pre` constructor.
    fn instantiate_pre<P>(
        &self,
        bytes: &[u8],
        digest: &[u8; 32],
        label: &Path,
        world: &str,
        typed: impl FnOnce(InstancePre<GuestState>) -> wasmtime::Result<P>,
        fail: impl Fn(String) -> LoadError,
    ) -> Result<(P, LoadOrigin), LoadError> {
        let (component, origin) = self.compile_cached(bytes, digest, label).map_err(&fail)?;
        // What the component imports beyond what guests get is linked to
        // functions that trap when called (sockets, for example).
        let mut linker = self.shared.linker.clone();
        super::sandbox::link_unknown_as_traps(
            &mut linker,
            &component,
            &self.shared.engine,
            "stepwell:",
        )
        .map_err(|e| fail(format!("cannot link the component: {}", one_line(&e))))?;
        let pre = linker
            .instantiate_pre(&component)
            .map_err(|e| fail(format!("cannot link the component: {}", one_line(&e))))?;
        let pre = typed(pre).map_err(|e| {
            fail(format!(
                "does not implement the stepwell:flow/{world} world (this host speaks {CONTRACT}): {}",
                one_line(&e)
            ))
        })?;
        Ok((pre, origin))
    }

    fn lock_loaded(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Arc<NodeComponent>>> {
        self.shared.loaded.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A component compiled, or read from the cache; the time it took is
    /// added to this thread's [`time_compiling`].
    fn compile_cached(
        &self,
        bytes: &[u8],
        digest: &[u8; 32],
        label: &Path,
    ) -> Result<(Component, LoadOrigin), String> {
        let started = std::time::Instant::now();
        let out = self.compile_or_read(bytes, digest, label);
        COMPILING.set(COMPILING.get() + started.elapsed());
        out
    }

    fn compile_or_read(
        &self,
        bytes: &[u8],
        digest: &[u8; 32],
        label: &Path,
    ) -> Result<(Component, LoadOrigin), String> {
        let engine = &self.shared.engine;
        let name = {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            engine.precompile_compatibility_hash().hash(&mut h);
            format!("{}-{:016x}.cwasm", hex::encode(digest), h.finish())
        };
        let read = || {
            self.shared
                .cache
                .as_ref()
                .and_then(|c| c.load(engine, &name))
        };
        // One compile of these bytes at a time: a thread that finds another
        // compiling them waits for its result; across processes, a host
        // waits for the one compiling them for the same cache and reads
        // what it wrote.
        let slot = self
            .shared
            .compiling
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(*digest)
            .or_default()
            .clone();
        let mut done = slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((c, origin)) = done.as_ref() {
            return Ok((c.clone(), *origin));
        }
        if let Some(c) = read() {
            *done = Some((c.clone(), LoadOrigin::DiskCache));
            return Ok((c, LoadOrigin::DiskCache));
        }
        let mut lock = self
            .shared
            .cache
            .as_ref()
            .and_then(|c| c.lock_compile(&name));
        let found = read();
        if found.is_none() && lock.as_ref().is_some_and(|l| l.waited) {
            // The host it waited for did not leave code this one can use.
            lock = None;
        }
        let out = match found {
            Some(c) => Ok((c, LoadOrigin::DiskCache)),
            None => compiling(label, bytes.len(), || Component::from_binary(engine, bytes))
                .map_err(|e| format!("not a valid WebAssembly component: {}", one_line(&e)))
                .map(|component| {
                    self.shared.compiled.fetch_add(1, Ordering::Relaxed);
                    if let Some(cache) = &self.shared.cache {
                        cache.store(&name, &component);
                    }
                    (component, LoadOrigin::Compiled)
                }),
        };
        drop(lock);
        match &out {
            // Kept: a thread loading these bytes later takes the code here
            // (the engine keeps what it loaded anyway).
            Ok(found) => *done = Some(found.clone()),
            // The next try compiles again.
            Err(_) => {
                self.shared
                    .compiling
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(digest);
            }
        }
        out
    }
}

thread_local! {
    static COMPILING: std::cell::Cell<Duration> = const { std::cell::Cell::new(Duration::ZERO) };
}

/// The time this thread has spent compiling components (or reading them
/// from the cache) so far: a driver's time per run does not count it.
pub fn time_compiling() -> Duration {
    COMPILING.get()
}

/// The WIT package this host implements (`crates/wasm/wit/stepwell.wit`): a component
/// built against another version does not load.
pub const CONTRACT: &str = "stepwell:flow@0.2.0";

/// How many guest instances may exist at once (each call holds one while it
/// runs): the bound on concurrent guest calls of one engine.
const POOL_INSTANCES: u32 = 128;

/// Bytes of each memory and table kept resident between calls.
const KEEP_RESIDENT: usize = 2 << 20;

/// Whether engines made from now on write a perf map ([`write_perf_map`]).
static PERF_MAP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes the engines this process creates from now on write
/// `/tmp/perf-PID.map`, so that `perf` names the guests' compiled functions
/// (docs/performance.md). One map per process, so a process-wide switch
/// (the binary turns it on for `STEPWELL_WASM_PERFMAP=1`).
pub fn write_perf_map() {
    PERF_MAP.store(true, std::sync::atomic::Ordering::Relaxed);
}

fn engine_config(limits: &SandboxLimits, pooling: bool) -> Config {
    let mut wt = Config::new();
    wt.epoch_interruption(true);
    wt.wasm_component_model(true);
    if PERF_MAP.load(std::sync::atomic::Ordering::Relaxed) {
        wt.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    if pooling {
        let mut pool = PoolingAllocationConfig::new();
        pool.total_component_instances(POOL_INSTANCES)
            .total_core_instances(POOL_INSTANCES * 8)
            .total_memories(POOL_INSTANCES * 2)
            .total_tables(POOL_INSTANCES * 8)
            .total_stacks(POOL_INSTANCES)
            .max_core_instances_per_component(64)
            .max_memories_per_component(8)
            .max_tables_per_component(64)
            .max_memory_size(limits.memory_limit_bytes)
            .table_elements(limits.table_elements_limit)
            .max_component_instance_size(1 << 20)
            .max_core_instance_size(4 << 20)
            // Reset the pages a call touched with memset rather than
            // madvise, so the next call does not fault them in again; with
            // PAGEMAP_SCAN (Linux 6.7+) only the touched pages are reset.
            .linear_memory_keep_resident(KEEP_RESIDENT)
            .table_keep_resident(64 << 10)
            .pagemap_scan(wasmtime::Enabled::Auto);
        wt.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    wt
}

/// An error and its causes on one line (`a: b: c`), whitespace runs as one
/// space: a parser's message may hold a multi-line dump of bytes.
fn one_line(e: &wasmtime::Error) -> String {
    let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
    chain
        .join(": ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs a compile of a component of `size` bytes. A large one (a
/// language runtime inside: seconds to compile) is announced on the
/// `stepwell::progress` log target before, and its end after, with the
/// time it took; a terminal shows them, a script or a server's log need
/// not. A small one compiles in milliseconds and says nothing.
fn compiling<T>(
    label: &Path,
    size: usize,
    compile: impl FnOnce() -> wasmtime::Result<T>,
) -> wasmtime::Result<T> {
    if size < ANNOUNCED_COMPILE_BYTES {
        return compile();
    }
    let name = label.file_name().map_or_else(
        || label.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let mib = size as f64 / (1 << 20) as f64;
    tracing::info!(target: "stepwell::progress", "compiling {name} ({mib:.1} MiB)...");
    let started = std::time::Instant::now();
    let out = compile();
    let took = started.elapsed().as_secs_f64();
    match &out {
        Ok(_) => tracing::info!(target: "stepwell::progress", "compiled {name} in {took:.1} s"),
        Err(_) => tracing::info!(target: "stepwell::progress", "{name} did not compile"),
    }
    out
}

/// The size from which a compile is announced.
const ANNOUNCED_COMPILE_BYTES: usize = 1 << 20;

#[cfg(test)]
mod tests {
    /// The version the host names in its errors is the one its bindings
    /// were generated from.
    #[test]
    fn the_contract_named_is_the_package_of_the_wit() {
        let wit = include_str!("../wit/stepwell.wit");
        assert!(
            wit.contains(&format!("package {};", super::CONTRACT)),
            "crates/wasm/wit/stepwell.wit is not {}",
            super::CONTRACT
        );
    }
}
