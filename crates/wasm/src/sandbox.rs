//! The sandbox every guest call runs in: a store with an empty WASI context,
//! a resource limiter and an epoch deadline; the WASI interfaces a guest is
//! linked with (and how none of them can make it wait); and the
//! classification of what went wrong when a call fails.
//!
//! What a guest gets of WASI:
//!
//! - `wasi:cli` (`environment` is empty, `exit` ends the call, `stdin` is
//!   closed, `stdout` a sink, `stderr` kept to 4 KiB for error messages,
//!   `terminal-*` report no terminal), `wasi:io/error` and `wasi:io/streams`
//!   over those, `wasi:filesystem` with no preopened directory (so no file
//!   can be opened), and `wasi:random` as a deterministic stream seeded per
//!   step (the same step of the same run gets the same bytes, also on
//!   replay; never use them for secrets);
//! - `wasi:clocks`: both clocks are stopped at 0 (the Unix epoch): the time
//!   reaches a guest only as the `now` of its input;
//! - `wasi:io/poll` and the monotonic clock's subscriptions never block: a
//!   pollable that is not ready at once (a sleep, a wait on a deadline)
//!   ends the call with `guest_blocked` instead of waiting;
//! - anything else a component imports (sockets, HTTP, ...) is linked to a
//!   function that traps when called.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use rand::{Rng, SeedableRng};
use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime::{ResourceLimiter, Store, Trap};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{
    HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView,
};
use wasmtime_wasi_io::poll::DynPollable;

use super::fsguard::{Guarded, GuardedFs, RefusedPaths};
use super::{GuestError, SandboxLimits, WasmEngine};

/// What a guest may copy to the host in one call beyond
/// `max_output_bytes` (the rest of a step plan, a WASI call's arguments).
const HOSTCALL_MARGIN: usize = 1 << 20;

/// The end of the message wasmtime fails a call with when the host stopped
/// copying data out of the guest (its hostcall fuel ran out).
const HOSTCALL_FUEL_EXHAUSTED: &str = "fuel allocated for hostcalls has been exhausted";

/// How much of a guest's stderr is kept for error messages.
pub(crate) const STDERR_CAPACITY: usize = 4096;

/// The state of one guest store: an empty WASI context, its resources, the
/// resource limiter and the random stream.
pub(crate) struct GuestState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: Limiter,
    rng: StepRng,
    /// Paths the guest may not reach inside its preopened directories.
    refused: RefusedPaths,
}

impl GuestState {
    /// The guest's view of `wasi:filesystem/types`: the preopens, less the
    /// refused paths.
    fn guarded_fs(&mut self) -> Guarded<'_> {
        Guarded {
            fs: wasmtime_wasi::filesystem::WasiFilesystemCtxView {
                ctx: self.wasi.filesystem(),
                table: &mut self.table,
            },
            refused: &self.refused,
        }
    }

    /// Bytes of linear memory the store's instances hold now.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.limiter.memory_total
    }
}

impl WasiView for GuestState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Bounds the memory (all of an instance's memories together) and tables a
/// guest may grow.
struct Limiter {
    memory_limit: usize,
    table_limit: usize,
    /// Bytes of linear memory the store's instances hold now.
    memory_total: usize,
    /// The bytes all live stores of the engine hold, and their limit.
    live: Arc<AtomicUsize>,
    live_limit: usize,
    /// Which limit the last refused growth hit, if any.
    exceeded: Option<Exceeded>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Exceeded {
    Own,
    Shared,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = self.memory_total - current.min(self.memory_total) + desired;
        if total > self.memory_limit {
            self.exceeded = Some(Exceeded::Own);
            return Ok(false);
        }
        let more = total.saturating_sub(self.memory_total);
        let before = self.live.fetch_add(more, Ordering::Relaxed);
        if before.saturating_add(more) > self.live_limit {
            self.live.fetch_sub(more, Ordering::Relaxed);
            self.exceeded = Some(Exceeded::Shared);
            return Ok(false);
        }
        self.memory_total = total;
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

impl Drop for Limiter {
    fn drop(&mut self) {
        // The store and its instances go: so does their memory.
        self.live.fetch_sub(self.memory_total, Ordering::Relaxed);
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

/// The random stream of a store, reseeded before every call. The stream is
/// made from its seed when the guest first reads it: most calls never do,
/// and seeding the generator costs more than the rest of preparing a call.
#[derive(Clone)]
struct StepRng(Arc<Mutex<Stream>>);

/// A seed, and the generator made from it once it is read.
struct Stream {
    seed: u64,
    rng: Option<rand::rngs::StdRng>,
}

impl StepRng {
    fn new() -> Self {
        StepRng(Arc::new(Mutex::new(Stream { seed: 0, rng: None })))
    }

    fn reseed(&self, seed: u64) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Stream { seed, rng: None };
    }

    /// Runs `f` on the stream, started from its seed if it was not yet.
    fn with<T>(&self, f: impl FnOnce(&mut rand::rngs::StdRng) -> T) -> T {
        let mut stream = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let seed = stream.seed;
        f(stream
            .rng
            .get_or_insert_with(|| rand::rngs::StdRng::seed_from_u64(seed)))
    }
}

impl rand::TryRng for StepRng {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok(self.with(|rng| rng.next_u32()))
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        Ok(self.with(|rng| rng.next_u64()))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        self.with(|rng| rng.fill_bytes(dst));
        Ok(())
    }
}

/// A directory a guest call may reach (tools only): the host directory,
/// the path the guest names it by, and whether it may write there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preopen {
    /// The directory on the host.
    pub host: std::path::PathBuf,
    /// The path the guest opens it by (stepwell uses the host path itself).
    pub guest: String,
    /// Whether files and directories under it may be created or changed.
    pub writable: bool,
}

/// What a guest call may reach of the host's files: its preopened
/// directories, less the refused paths inside them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reach {
    /// The directories, each under the path the guest names it by.
    pub preopens: Vec<Preopen>,
    /// What stays out of reach inside them (the host's store, `/proc`).
    pub refused: RefusedPaths,
}

fn sandbox(
    limits: &SandboxLimits,
    stderr: MemoryOutputPipe,
    live: Arc<AtomicUsize>,
    reach: &Reach,
) -> wasmtime::Result<GuestState> {
    let rng = StepRng::new();
    let mut builder = WasiCtxBuilder::new();
    // File operations run on the calling thread: guest calls are
    // synchronous, and the epoch deadline still stops the guest between
    // them.
    builder.allow_blocking_current_thread(true);
    for p in &reach.preopens {
        let perms = if p.writable {
            wasmtime_wasi::FsPerms::ReadWrite
        } else {
            wasmtime_wasi::FsPerms::ReadOnly
        };
        builder.preopened_dir(&p.host, &p.guest, perms)?;
    }
    let wasi = builder
        .stderr(stderr)
        .wall_clock(EpochClock)
        .monotonic_clock(EpochClock)
        .secure_random(rng.clone())
        .insecure_random(rng.clone())
        .insecure_random_seed(0)
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .build();
    Ok(GuestState {
        wasi,
        table: ResourceTable::new(),
        limiter: Limiter {
            memory_limit: limits.memory_limit_bytes,
            table_limit: limits.table_elements_limit,
            memory_total: 0,
            live,
            live_limit: limits.total_memory_bytes,
            exceeded: None,
        },
        rng,
        refused: reach.refused.clone(),
    })
}

/// A store for guest calls: the sandbox, its limiter and its deadline.
pub(crate) fn new_store(engine: &WasmEngine) -> (Store<GuestState>, MemoryOutputPipe) {
    new_store_with(engine, &Reach::default(), engine.deadline_ticks())
        .expect("a sandbox without preopened directories always builds")
}

/// A store for one guest call that reaches what `reach` gives, with a
/// deadline of `ticks` epoch ticks. Fails if a directory cannot be opened.
pub(crate) fn new_store_with(
    engine: &WasmEngine,
    reach: &Reach,
    ticks: u64,
) -> wasmtime::Result<(Store<GuestState>, MemoryOutputPipe)> {
    let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
    let mut store = Store::new(
        engine.engine(),
        sandbox(
            &engine.limits(),
            stderr.clone(),
            engine.live_memory(),
            reach,
        )?,
    );
    store.limiter(|s| &mut s.limiter);
    store.set_epoch_deadline(ticks);
    // What the host copies out of the guest in one call (its output, or
    // what it passes to a WASI call) is bounded: past the output limit
    // (and some room for the rest of the plan), the copy stops and the call
    // fails. The host never holds more of a guest's output than this.
    store.set_hostcall_fuel(
        engine
            .limits()
            .max_output_bytes
            .saturating_add(HOSTCALL_MARGIN),
    );
    Ok((store, stderr))
}

/// Gets a store ready for its next call: a fresh deadline and the step's
/// random stream.
pub(crate) fn prepare_call(store: &mut Store<GuestState>, engine: &WasmEngine, seed: u64) {
    store.set_epoch_deadline(engine.deadline_ticks());
    store.data_mut().limiter.exceeded = None;
    store.data().rng.reseed(seed);
}

/// Why a call ended early: the guest asked to wait.
#[derive(Debug)]
pub(crate) struct Blocked(String);

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Blocked {}

/// Polls `future` once: its value if it is ready, else the call ends with
/// [`Blocked`] (`what` the guest tried to wait on).
fn now_or_never<T>(
    what: &str,
    future: impl Future<Output = wasmtime::Result<T>>,
) -> wasmtime::Result<T> {
    let mut future = std::pin::pin!(future);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(out) => out,
        Poll::Pending => Err(wasmtime::Error::new(Blocked(what.to_string()))),
    }
}

/// `wasi:io/poll` for guests: answers at once, never waits.
struct NonBlocking<'a>(&'a mut ResourceTable);

struct NonBlockingIo;

impl HasData for NonBlockingIo {
    type Data<'a> = NonBlocking<'a>;
}

impl wasmtime_wasi::p2::bindings::sync::io::poll::Host for NonBlocking<'_> {
    fn poll(&mut self, pollables: Vec<Resource<DynPollable>>) -> wasmtime::Result<Vec<u32>> {
        now_or_never(
            "wasi:io/poll.poll",
            wasmtime_wasi_io::bindings::wasi::io::poll::Host::poll(self.0, pollables),
        )
    }
}

impl wasmtime_wasi::p2::bindings::sync::io::poll::HostPollable for NonBlocking<'_> {
    fn ready(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<bool> {
        now_or_never(
            "wasi:io/poll.pollable.ready",
            wasmtime_wasi_io::bindings::wasi::io::poll::HostPollable::ready(self.0, pollable),
        )
    }

    fn block(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        now_or_never(
            "wasi:io/poll.pollable.block",
            wasmtime_wasi_io::bindings::wasi::io::poll::HostPollable::block(self.0, pollable),
        )
    }

    fn drop(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        wasmtime_wasi_io::bindings::wasi::io::poll::HostPollable::drop(self.0, pollable)
    }
}

/// A deadline of the stopped monotonic clock: ready only if it is not in
/// the future (that is, it is 0 ns away).
struct Deadline {
    nanos: u64,
}

#[wasmtime_wasi::async_trait]
impl wasmtime_wasi_io::poll::Pollable for Deadline {
    async fn ready(&mut self) {
        if self.nanos > 0 {
            std::future::pending::<()>().await;
        }
    }
}

/// `wasi:clocks/monotonic-clock` for guests: stopped at 0; its
/// subscriptions are pollables that never become ready (see
/// [`NonBlocking`]).
struct StoppedClock<'a>(&'a mut ResourceTable);

struct StoppedClockIo;

impl HasData for StoppedClockIo {
    type Data<'a> = StoppedClock<'a>;
}

impl StoppedClock<'_> {
    fn deadline(&mut self, nanos: u64) -> wasmtime::Result<Resource<DynPollable>> {
        let deadline = self.0.push(Deadline { nanos })?;
        wasmtime_wasi_io::poll::subscribe(self.0, deadline)
    }
}

impl wasmtime_wasi::p2::bindings::clocks::monotonic_clock::Host for StoppedClock<'_> {
    fn now(&mut self) -> wasmtime::Result<u64> {
        Ok(0)
    }

    fn resolution(&mut self) -> wasmtime::Result<u64> {
        Ok(1_000_000_000)
    }

    fn subscribe_instant(&mut self, when: u64) -> wasmtime::Result<Resource<DynPollable>> {
        self.deadline(when)
    }

    fn subscribe_duration(&mut self, duration: u64) -> wasmtime::Result<Resource<DynPollable>> {
        self.deadline(duration)
    }
}

/// Links the WASI interfaces guests get (see the module docs) into
/// `linker`; a component's other imports are made traps when it is loaded.
pub(crate) fn link_wasi(linker: &mut Linker<GuestState>) -> wasmtime::Result<()> {
    use wasmtime_wasi::cli::{WasiCli, WasiCliView};
    use wasmtime_wasi::clocks::{WasiClocks, WasiClocksView};
    use wasmtime_wasi::filesystem::{WasiFilesystem, WasiFilesystemView};
    use wasmtime_wasi::p2::bindings::{cli, clocks, filesystem, random, sync};
    use wasmtime_wasi::random::WasiRandom;

    struct Table;
    impl HasData for Table {
        type Data<'a> = &'a mut ResourceTable;
    }

    let l = linker;
    wasmtime_wasi_io::bindings::wasi::io::error::add_to_linker::<GuestState, Table>(l, |t| {
        &mut t.table
    })?;
    sync::io::streams::add_to_linker::<GuestState, Table>(l, |t| &mut t.table)?;
    sync::io::poll::add_to_linker::<GuestState, NonBlockingIo>(l, |t| NonBlocking(&mut t.table))?;
    clocks::monotonic_clock::add_to_linker::<GuestState, StoppedClockIo>(l, |t| {
        StoppedClock(&mut t.table)
    })?;
    clocks::wall_clock::add_to_linker::<GuestState, WasiClocks>(l, GuestState::clocks)?;
    random::random::add_to_linker::<GuestState, WasiRandom>(l, |t| t.wasi.random())?;
    random::insecure::add_to_linker::<GuestState, WasiRandom>(l, |t| t.wasi.random())?;
    random::insecure_seed::add_to_linker::<GuestState, WasiRandom>(l, |t| t.wasi.random())?;
    cli::exit::add_to_linker::<GuestState, WasiCli>(l, GuestState::cli)?;
    cli::environment::add_to_linker::<GuestState, WasiCli>(l, GuestState::cli)?;
    cli::stdin::add_to_linker::<GuestState, WasiCli>(l, GuestState::cli)?;
    cli::stdout::add_to_linker::<GuestState, WasiCli>(l, GuestState::cli)?;
    cli::stderr::add_to_linker::<GuestState, WasiCli>(l, GuestState::cli)?;
    cli::terminal_input::add_to_linker::<GuestState, WasiCli>(l, GuestState::cli)?;
    cli::terminal_output::add_to_linker::<GuestState, WasiCli>(l, GuestState::cli)?;
    cli::terminal_stdin::add_to_linker::<GuestState, WasiCli>(l, GuestState::cli)?;
    cli::terminal_stdout::add_to_linker::<GuestState, WasiCli>(l, GuestState::cli)?;
    cli::terminal_stderr::add_to_linker::<GuestState, WasiCli>(l, GuestState::cli)?;
    filesystem::preopens::add_to_linker::<GuestState, WasiFilesystem>(l, GuestState::filesystem)?;
    sync::filesystem::types::add_to_linker::<GuestState, GuardedFs>(l, GuestState::guarded_fs)?;
    Ok(())
}

/// The WASI interfaces [`link_wasi`] provides, by name without version (the
/// linker matches semver-compatible versions itself).
const LINKED_INTERFACES: &[&str] = &[
    "wasi:io/error",
    "wasi:io/streams",
    "wasi:io/poll",
    "wasi:clocks/monotonic-clock",
    "wasi:clocks/wall-clock",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "wasi:cli/exit",
    "wasi:cli/environment",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:filesystem/preopens",
    "wasi:filesystem/types",
];

/// Whether `import` (an instance import's name, such as
/// `wasi:io/streams@0.2.0`) names an interface [`link_wasi`] provides.
fn is_linked_interface(import: &str) -> bool {
    let name = import.split('@').next().unwrap_or(import);
    LINKED_INTERFACES.contains(&name)
}

/// Links every import of `component` that is not one of the stepwell world's
/// own interfaces nor a WASI interface guests get to a function that traps
/// when called: a component that imports sockets or HTTP loads, and fails
/// only if it really tries to use them.
///
/// Unlike wasmtime's `define_unknown_imports_as_traps`, a resource an unknown
/// interface only `use`s from a linked one (`wasi:io/streams`'s
/// `input-stream` in `wasi:sockets/tcp`, say) is left to the linked
/// definition, so the two stay one type.
pub(crate) fn link_unknown_as_traps(
    linker: &mut Linker<GuestState>,
    component: &wasmtime::component::Component,
    engine: &wasmtime::Engine,
    own_prefix: &str,
) -> wasmtime::Result<()> {
    use wasmtime::component::types::ComponentItem;
    use wasmtime::component::ResourceType;

    let ty = component.component_type();
    let unknown = |name: &str| !is_linked_interface(name) && !name.starts_with(own_prefix);
    // The resources linked interfaces define or use.
    let mut linked_resources: Vec<ResourceType> = Vec::new();
    for (name, item) in ty.imports(engine) {
        if unknown(name) {
            continue;
        }
        if let ComponentItem::ComponentInstance(instance) = item.ty {
            for (_, export) in instance.exports(engine) {
                if let ComponentItem::Resource(resource) = export.ty {
                    linked_resources.push(resource);
                }
            }
        }
    }
    for (name, item) in ty.imports(engine) {
        if !unknown(name) {
            continue;
        }
        match item.ty {
            ComponentItem::ComponentInstance(instance) => {
                let mut target = linker.instance(name)?;
                for (export, item) in instance.exports(engine) {
                    match item.ty {
                        ComponentItem::ComponentFunc(_) => {
                            let what = format!("{name}#{export}");
                            target.func_new(export, move |_, _, _, _| {
                                Err(wasmtime::format_err!(
                                    "`{what}` is not available to stepwell guests"
                                ))
                            })?;
                        }
                        ComponentItem::Resource(resource)
                            if !linked_resources.contains(&resource) =>
                        {
                            target.resource(export, ResourceType::host::<()>(), |_, _| Ok(()))?;
                        }
                        _ => {}
                    }
                }
            }
            ComponentItem::ComponentFunc(_) => {
                let what = name.to_string();
                linker.root().func_new(name, move |_, _, _, _| {
                    Err(wasmtime::format_err!(
                        "`{what}` is not available to stepwell guests"
                    ))
                })?;
            }
            ComponentItem::Resource(resource) if !linked_resources.contains(&resource) => {
                linker
                    .root()
                    .resource(name, ResourceType::host::<()>(), |_, _| Ok(()))?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// The memory limit, if the store refused a memory growth during the
/// call under way.
pub(crate) fn memory_refused(
    store: &Store<GuestState>,
    limits: &SandboxLimits,
) -> Option<GuestError> {
    match store.data().limiter.exceeded? {
        Exceeded::Own => Some(GuestError::MemoryLimit {
            limit_bytes: limits.memory_limit_bytes,
            shared: false,
        }),
        Exceeded::Shared => Some(GuestError::MemoryLimit {
            limit_bytes: limits.total_memory_bytes,
            shared: true,
        }),
    }
}

/// What went wrong in a guest call.
pub(crate) fn classify(
    err: wasmtime::Error,
    store: &Store<GuestState>,
    limits: &SandboxLimits,
    stderr: &MemoryOutputPipe,
) -> GuestError {
    if let Some(limit) = memory_refused(store, limits) {
        return limit;
    }
    if let Some(Trap::Interrupt) = err.downcast_ref::<Trap>() {
        return GuestError::Timeout {
            limit_ms: limits.time_limit.as_millis() as u64,
        };
    }
    if let Some(Blocked(what)) = err.downcast_ref::<Blocked>() {
        return GuestError::Blocked { what: what.clone() };
    }
    if format!("{err:#}").contains(HOSTCALL_FUEL_EXHAUSTED) {
        return GuestError::OutputTooLarge {
            bytes: None,
            limit_bytes: limits.max_output_bytes,
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

#[cfg(test)]
mod tests {
    use super::*;
    use rand::TryRng;

    /// A step's random bytes are a function of its seed alone, whenever
    /// the guest reads them and whatever an earlier call read: the bytes
    /// pinned here are what every earlier build gave (replays depend on
    /// them).
    #[test]
    fn the_random_stream_is_the_seeds_whenever_it_is_read() {
        let mut rng = StepRng::new();
        rng.reseed(42);
        let mut first = [0u8; 16];
        rng.try_fill_bytes(&mut first).unwrap();
        assert_eq!(first, PINNED_42, "{first:?}");
        // Read more, then reseeded: the same bytes again.
        rng.try_next_u64().unwrap();
        rng.reseed(42);
        let mut again = [0u8; 16];
        rng.try_fill_bytes(&mut again).unwrap();
        assert_eq!(again, first);
        // Reseeded without a read in between: the last seed counts.
        rng.reseed(1);
        rng.reseed(7);
        let mut seven = rand::rngs::StdRng::seed_from_u64(7);
        assert_eq!(rng.try_next_u64().unwrap(), seven.next_u64());
        assert_eq!(rng.try_next_u32().unwrap(), seven.next_u32());
    }

    const PINNED_42: [u8; 16] = [
        162, 36, 39, 34, 99, 119, 204, 134, 125, 81, 173, 63, 19, 10, 240, 138,
    ];
}
