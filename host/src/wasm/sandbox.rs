//! The sandbox every guest call runs in: a fresh store with an empty WASI
//! context, a resource limiter and an epoch deadline, and the classification
//! of what went wrong when a call fails.

use rand::SeedableRng;
use wasmtime::component::ResourceTable;
use wasmtime::{ResourceLimiter, Store, Trap};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{
    HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView,
};

use super::{GuestError, SandboxLimits, WasmEngine};

/// How much of a guest's stderr is kept for error messages.
pub(crate) const STDERR_CAPACITY: usize = 4096;

/// The state of one guest call's store: an empty WASI context and the
/// resource limiter.
pub(crate) struct GuestState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: Limiter,
}

impl WasiView for GuestState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

struct Limiter {
    memory_limit: usize,
    table_limit: usize,
    memory_exceeded: bool,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_limit {
            self.memory_exceeded = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= self.table_limit)
    }
}

/// A clock stopped at the Unix epoch: what guests see if they read a clock.
struct EpochClock;

impl HostWallClock for EpochClock {
    fn resolution(&self) -> std::time::Duration {
        std::time::Duration::from_secs(1)
    }
    fn now(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

impl HostMonotonicClock for EpochClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

pub(crate) fn sandbox(limits: &SandboxLimits, stderr: MemoryOutputPipe) -> GuestState {
    let wasi = WasiCtxBuilder::new()
        .stderr(stderr)
        .wall_clock(EpochClock)
        .monotonic_clock(EpochClock)
        .secure_random(rand::rngs::StdRng::seed_from_u64(0))
        .insecure_random(rand::rngs::StdRng::seed_from_u64(0))
        .insecure_random_seed(0)
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .build();
    GuestState {
        wasi,
        table: ResourceTable::new(),
        limiter: Limiter {
            memory_limit: limits.memory_limit_bytes,
            table_limit: limits.table_elements_limit,
            memory_exceeded: false,
        },
    }
}

/// A store for one guest call: the sandbox, its limiter and its deadline.
pub(crate) fn new_store(engine: &WasmEngine) -> (Store<GuestState>, MemoryOutputPipe) {
    let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
    let mut store = Store::new(engine.engine(), sandbox(&engine.limits(), stderr.clone()));
    store.limiter(|s| &mut s.limiter);
    store.set_epoch_deadline(engine.deadline_ticks());
    (store, stderr)
}

pub(crate) fn classify(
    err: wasmtime::Error,
    store: &Store<GuestState>,
    limits: &SandboxLimits,
    stderr: &MemoryOutputPipe,
) -> GuestError {
    if store.data().limiter.memory_exceeded {
        return GuestError::MemoryLimit {
            limit_bytes: limits.memory_limit_bytes,
        };
    }
    if let Some(Trap::Interrupt) = err.downcast_ref::<Trap>() {
        return GuestError::Timeout {
            limit_ms: limits.time_limit.as_millis() as u64,
        };
    }
    let mut message = match err.downcast_ref::<Trap>() {
        Some(trap) => trap.to_string(),
        None => format!("{err:#}"),
    };
    let out = stderr.contents();
    let text = String::from_utf8_lossy(&out);
    let text = text.trim();
    if !text.is_empty() {
        message.push_str(" (stderr: ");
        message.push_str(text);
        message.push(')');
    }
    GuestError::Trap { message }
}
