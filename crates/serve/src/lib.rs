#![deny(missing_docs)]

//! `stepwell serve`: one process that drives the store (due waits,
//! children, automations: the loop of `stepwell drive`) and answers an HTTP
//! API over it, with live streams (Server-Sent Events), the Agent Host
//! Protocol's automation-run channel (a WebSocket), Prometheus metrics and
//! the web dashboard.
//!
//! The server is one more process on the store: every call goes through the
//! same run transaction as the CLI's, so CLI calls, drivers and other
//! servers beside it are safe. Every route but the health check, the
//! OpenAPI document and the dashboard's static shell needs the bearer
//! token kept in a file (created with a random token, mode 0600, when
//! missing). `docs/http.md` lists the routes, `docs/ahp.md` the channel.
//!
//! ```no_run
//! use std::sync::Arc;
//! use stepwell_serve::{Server, ServeOptions};
//! use stepwell::{Runtime, SqliteStore};
//!
//! # fn main() -> Result<(), stepwell::Error> {
//! let store = Arc::new(SqliteStore::open(".stepwell/stepwell.sqlite")?);
//! let runtime = stepwell::builder(store).build()?;
//! let options = ServeOptions::new(".stepwell/serve-token".into());
//! let server = Server::bind(runtime, options)?;
//! println!("listening on http://{}/", server.local_addr());
//! server.run()?; // until SIGTERM or Ctrl-C
//! # Ok(()) }
//! ```

mod ahp;
mod api;
mod body;
mod conn;
mod error;
mod listing;
mod openapi;
mod stream;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stepwell::core::{Error, Result};
use stepwell::store::SnapshotStore;
use stepwell::Runtime;

pub use ahp::{project_occurrences, AHP_PROTOCOL_VERSION};
pub use error::ApiError;
pub use openapi::{documented_routes, openapi_document};

/// How a server listens and behaves.
pub struct ServeOptions {
    /// The address to listen on (port 0: any free port).
    pub listen: SocketAddr,
    /// The file holding the bearer token (created when missing).
    pub token_file: PathBuf,
    /// The pause between the driver's passes when nothing wakes it.
    pub drive_interval: Duration,
    /// The largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// How long a request may take to send its body: a slower sender is
    /// answered 408 and its connection closed.
    pub body_read_timeout: Duration,
    /// The bytes that request bodies being read may hold across all
    /// connections: a request whose body would go over it is answered 503
    /// at once (at least `max_body_bytes`).
    pub max_body_bytes_in_flight: usize,
    /// Where snapshots are kept (`None`: in memory, for this process).
    pub snapshots: Option<Arc<dyn SnapshotStore>>,
    /// Run the driver loop in this process (off: only answer the API, and
    /// let `stepwell drive` processes move the runs).
    pub drive: bool,
    /// How often streams look at the store for commits of other processes.
    pub poll_interval: Duration,
    /// The most connections served at once (more wait to be accepted).
    pub max_connections: usize,
    /// How long a client may take to send a request's headers (a
    /// connection that sends them slower, or never, is closed).
    pub header_read_timeout: Duration,
    /// How long a write to a client may wait for it to read (a client
    /// that reads nothing of an answer or a stream for that long has its
    /// connection closed).
    pub write_stall_timeout: Duration,
    /// A folder whose `index.html`, `app.js` and `app.css` replace the
    /// embedded dashboard's, read at each request (for working on the
    /// dashboard without rebuilding). Default: none.
    pub dashboard_dir: Option<PathBuf>,
}

impl ServeOptions {
    /// The defaults: 127.0.0.1:8080, the driver on with a 200 ms pause,
    /// 1 MiB bodies sent within 10 s and 32 MiB of them in flight, streams
    /// looking every 250 ms.
    pub fn new(token_file: PathBuf) -> Self {
        ServeOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            token_file,
            drive_interval: Duration::from_millis(200),
            max_body_bytes: 1 << 20,
            body_read_timeout: Duration::from_secs(10),
            max_body_bytes_in_flight: 32 << 20,
            snapshots: None,
            drive: true,
            poll_interval: Duration::from_millis(250),
            max_connections: 1024,
            header_read_timeout: Duration::from_secs(15),
            write_stall_timeout: Duration::from_secs(15),
            dashboard_dir: None,
        }
    }
}

/// Reads the token in `path`, or creates the file with a new random token
/// (64 hex digits, mode 0600) when it does not exist. A token file that
/// others can read, or that holds fewer than 16 characters, is refused.
pub fn load_or_create_token(path: &Path) -> Result<String> {
    stepwell::core::config::load_or_create_secret_file(path)
}

/// Wakes the driver before its pause ends (a run was started or resumed,
/// a command arrived).
#[derive(Clone, Default)]
pub(crate) struct Wake(Arc<(parking_lot::Mutex<bool>, parking_lot::Condvar)>);

impl Wake {
    pub(crate) fn wake(&self) {
        let (flag, cv) = &*self.0;
        *flag.lock() = true;
        cv.notify_all();
    }

    /// Waits up to `timeout` for a wake; clears it.
    fn wait(&self, timeout: Duration) {
        let (flag, cv) = &*self.0;
        let mut woken = flag.lock();
        if !*woken {
            cv.wait_for(&mut woken, timeout);
        }
        *woken = false;
    }
}

/// What the request handlers share.
pub(crate) struct Shared {
    pub(crate) rt: Runtime,
    pub(crate) token: String,
    pub(crate) snapshots: Arc<dyn SnapshotStore>,
    pub(crate) wake: Wake,
    /// Bumped after every commit of this process, and (on a store that
    /// keeps a change feed) whenever the feed moves: streams look again.
    pub(crate) commits: tokio::sync::watch::Receiver<u64>,
    /// The store keeps a change feed ([`stepwell::Store::feed_head`]): one
    /// watcher per server sees every process's commits, and the streams
    /// need no timers of their own.
    pub(crate) has_feed: bool,
    /// Set when the server is shutting down: streams end.
    pub(crate) shutdown: tokio::sync::watch::Receiver<bool>,
    pub(crate) poll_interval: Duration,
    /// Where the dashboard's files are read at each request, if not the
    /// embedded ones.
    pub(crate) dashboard_dir: Option<PathBuf>,
    pub(crate) http: api::HttpCounters,
    /// Request bodies of the routes behind the token: their limit,
    /// deadline and budget.
    pub(crate) bodies: body::BodyBudget,
    /// Request bodies of the open webhook route: a quarter of the budget
    /// of its own, so that callers without a token cannot take the budget
    /// of those with one.
    pub(crate) hook_bodies: body::BodyBudget,
}

/// A bound server, not yet serving.
pub struct Server {
    shared: Arc<Shared>,
    listener: std::net::TcpListener,
    drive: bool,
    drive_interval: Duration,
    shutdown_tx: tokio::sync::watch::Sender<bool>,
    commits_tx: tokio::sync::watch::Sender<u64>,
    tokio_rt: tokio::runtime::Runtime,
    signals: Signals,
    stop: Arc<tokio::sync::Notify>,
    limits: ConnectionLimits,
}

/// What one connection may take: how many are served at once, how long
/// headers may take to arrive and a write to be read.
#[derive(Clone, Copy)]
struct ConnectionLimits {
    max_connections: usize,
    header_read_timeout: Duration,
    write_stall: Duration,
}

/// Stops a running [`Server`] as SIGTERM does (for an application that
/// embeds one, and for tests and benchmarks).
#[derive(Clone)]
pub struct Stopper(Arc<tokio::sync::Notify>);

impl Stopper {
    /// Asks the server to stop; [`Server::run`] returns once it has.
    pub fn stop(&self) {
        self.0.notify_one();
    }
}

/// SIGTERM and SIGINT, caught from the moment the server is bound (a
/// signal that arrives before `run` still stops it gracefully).
struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Signals {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    async fn recv(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

impl Server {
    /// Reads (or creates) the token and binds the address.
    pub fn bind(rt: Runtime, options: ServeOptions) -> Result<Server> {
        let token = load_or_create_token(&options.token_file)?;
        let tokio_rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("stepwell-http")
            .build()
            .map_err(|e| Error::invalid("serve", format!("cannot start the runtime: {e}")))?;
        let signals = {
            let _entered = tokio_rt.enter();
            Signals::new()
                .map_err(|e| Error::invalid("serve", format!("cannot catch signals: {e}")))?
        };
        let listener = std::net::TcpListener::bind(options.listen)
            .map_err(|e| Error::invalid("--listen", format!("{}: {e}", options.listen)))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::invalid("--listen", e.to_string()))?;
        let (shutdown_tx, shutdown) = tokio::sync::watch::channel(false);
        let (commits_tx, commits) = tokio::sync::watch::channel(0u64);
        let has_feed = rt.store().feed_head()?.is_some();
        let snapshots = options
            .snapshots
            .unwrap_or_else(|| Arc::new(stepwell::store::MemorySnapshotStore::new()));
        Ok(Server {
            shared: Arc::new(Shared {
                rt,
                token,
                snapshots,
                wake: Wake::default(),
                commits,
                has_feed,
                shutdown,
                poll_interval: options.poll_interval,
                dashboard_dir: options.dashboard_dir.clone(),
                http: api::HttpCounters::default(),
                bodies: body::BodyBudget::new(
                    options.max_body_bytes_in_flight,
                    options.max_body_bytes,
                    options.body_read_timeout,
                ),
                hook_bodies: body::BodyBudget::new(
                    options.max_body_bytes_in_flight / 4,
                    options.max_body_bytes,
                    options.body_read_timeout,
                ),
            }),
            listener,
            drive: options.drive,
            drive_interval: options.drive_interval,
            shutdown_tx,
            commits_tx,
            tokio_rt,
            signals,
            stop: Arc::new(tokio::sync::Notify::new()),
            limits: ConnectionLimits {
                max_connections: options.max_connections,
                header_read_timeout: options.header_read_timeout,
                write_stall: options.write_stall_timeout,
            },
        })
    }

    /// A handle that stops the server from another thread.
    pub fn stopper(&self) -> Stopper {
        Stopper(self.stop.clone())
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Serves until SIGTERM, SIGINT (Ctrl-C) or its [`Stopper`]: then stops accepting,
    /// ends the streams, lets the requests in hand finish, and lets the
    /// driver finish its pass (its runs' leases are released as each tick
    /// ends), and returns.
    pub fn run(self) -> Result<()> {
        let tokio_rt = self.tokio_rt;
        let signals = self.signals;
        let asked = self.stop.clone();
        let stop = Arc::new(AtomicBool::new(false));
        // Commits of this process wake the streams at once (other
        // processes' are seen by polling).
        let feed = self.shared.rt.subscribe_ledger(None);
        let commits_tx = self.commits_tx.clone();
        let feeder = std::thread::Builder::new()
            .name("stepwell-feed".into())
            .spawn(move || {
                while feed.recv().is_ok() {
                    while feed.try_recv().is_ok() {}
                    commits_tx.send_modify(|n| *n += 1);
                    if commits_tx.is_closed() {
                        break;
                    }
                }
            })
            .map_err(|e| Error::invalid("serve", e.to_string()))?;
        // Listen for other hosts' signals before the driver's first pass.
        if self.drive {
            self.shared.rt.store().wait_for_work(Duration::ZERO);
        }
        let driver = if self.drive {
            let rt = self.shared.rt.clone();
            let stop = stop.clone();
            let wake = self.shared.wake.clone();
            let interval = self.drive_interval;
            Some(
                std::thread::Builder::new()
                    .name("stepwell-driver".into())
                    .spawn(move || drive_loop(&rt, &stop, &wake, interval))
                    .map_err(|e| Error::invalid("serve", e.to_string()))?,
            )
        } else {
            None
        };
        // Other hosts' signals of new work (PostgreSQL) wake the driver.
        if self.drive && self.shared.rt.store().signals_work() {
            let (rt, stop) = (self.shared.rt.clone(), stop.clone());
            let wake = self.shared.wake.clone();
            std::thread::Builder::new()
                .name("stepwell-signals".into())
                .spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        if rt.store().wait_for_work(Duration::from_secs(1)) {
                            wake.wake();
                        }
                    }
                })
                .map_err(|e| Error::invalid("serve", e.to_string()))?;
        }
        // Feeds are polled beside the driver, never in its way.
        let poller = if self.drive {
            let (rt, stop) = (self.shared.rt.clone(), stop.clone());
            Some(
                std::thread::Builder::new()
                    .name("stepwell-feeds".into())
                    .spawn(move || stepwell::triggers::run_feed_poller(rt, stop))
                    .map_err(|e| Error::invalid("serve", e.to_string()))?,
            )
        } else {
            None
        };
        let shared = self.shared.clone();
        let shutdown_tx = self.shutdown_tx;
        let listener = self.listener;
        let stopping = self.shared.shutdown.clone();
        let limits = self.limits;
        if self.shared.has_feed {
            // The one look at the store for other processes' commits: the
            // feed's newest position, every poll interval.
            tokio_rt.spawn(watch_feed(self.shared.clone(), self.commits_tx.clone()));
        }
        let served = tokio_rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener)
                .map_err(|e| Error::invalid("--listen", e.to_string()))?;
            let app = api::router(shared);
            // Stop requests (signals, the stopper), counted: the first
            // drains, a second (or the drain's time limit) closes what is
            // still open.
            let (asks_tx, asks) = tokio::sync::watch::channel(0u32);
            let mut signals = signals;
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = signals.recv() => {}
                        _ = asked.notified() => {}
                    }
                    asks_tx.send_modify(|n| *n += 1);
                }
            });
            let mut first = asks.clone();
            let signal = async move {
                let _ = first.wait_for(|n| *n >= 1).await;
                tracing::info!("shutting down: no new requests; streams end");
                let _ = shutdown_tx.send(true);
            };
                        let server = async move {
                                let accepting = accept_loop(listener, app, stopping, limits);
                tokio::join!(signal, accepting);
            };
            let mut again = asks;
            let forced = async move {
                let _ = again.wait_for(|n| *n >= 1).await;
                tokio::select! {
                    _ = again.wait_for(|n| *n >= 2) => {
                        tracing::warn!("a second stop request: closing the connections still open");
                    }
                    _ = tokio::time::sleep(SHUTDOWN_GRACE) => {
                        tracing::warn!(grace_s = SHUTDOWN_GRACE.as_secs(), "connections still open after the grace period: closing them");
                    }
                }
            };
                        tokio::select! {
                _ = server => Ok(()),
                _ = forced => Ok(()),
            }
        });
        stop.store(true, Ordering::SeqCst);
        self.shared.wake.wake();
        if let Some(d) = driver {
            let _ = d.join();
        }
        // Effects in flight (model calls, approved tool batches) land and
        // are recorded before the process ends, within the grace period;
        // past it they are left to the crash semantics (done again).
        let flying = self.shared.rt.in_flight();
        if flying > 0 {
            tracing::info!(flying, "waiting for the effects in flight to land");
            if !self.shared.rt.wait_in_flight(SHUTDOWN_GRACE) {
                tracing::warn!(
                    grace_s = SHUTDOWN_GRACE.as_secs(),
                    "effects still in flight after the grace period: they will be done again"
                );
            }
        }
        if let Some(p) = poller {
            let _ = p.join();
        }
        drop(self.commits_tx);
        drop(feeder);
        tokio_rt.shutdown_timeout(Duration::from_secs(5));
        tracing::info!("stopped");
        served
    }
}

/// How long a stopping server waits for the requests in hand before it
/// closes the connections still open.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Bumps `commits` whenever the store's change feed moves (a commit of any
/// process), looking every poll interval, until the server stops.
async fn watch_feed(shared: Arc<Shared>, commits: tokio::sync::watch::Sender<u64>) {
    let mut last = None;
    loop {
        let s = shared.clone();
        let head = api::read(move || Ok(s.rt.store().feed_head()?)).await;
        match head {
            Ok(head) if head != last => {
                if last.is_some() {
                    commits.send_modify(|n| *n += 1);
                }
                last = head;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e.detail, "reading the change feed"),
        }
        tokio::select! {
            _ = tokio::time::sleep(shared.poll_interval) => {}
            _ = stopped(shared.shutdown.clone()) => return,
        }
    }
}

/// Resolves once `stopping` says the server stops.
async fn stopped(mut stopping: tokio::sync::watch::Receiver<bool>) {
    let _ = stopping.wait_for(|s| *s).await;
}

/// Accepts connections until `stopping`, at most `max_connections` at once
/// (more wait in the listen backlog), and serves each over HTTP/1.1 (with
/// upgrades, for the WebSocket) with a time limit on reading headers and on
/// a write waiting for the client to read; then lets the connections finish
/// their requests and waits for them.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    stopping: tokio::sync::watch::Receiver<bool>,
    limits: ConnectionLimits,
) {
    use tower::ServiceExt;
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    // Each connection holds a clone of `open`: when all are dropped, the
    // last connection has ended.
    let (open_tx, open) = tokio::sync::watch::channel(());
    loop {
        let stop = stopping.clone();
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = stopped(stop.clone()) => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors, a reset before accept: wait
                    // a little rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stopped(stop.clone()) => break,
        };
        let service =
            app.clone()
                .map_request(move |mut req: axum::http::Request<hyper::body::Incoming>| {
                    req.extensions_mut()
                        .insert(axum::extract::ConnectInfo(peer));
                    req.map(axum::body::Body::new)
                });
        let service = hyper_util::service::TowerToHyperService::new(service);
        let open = open.clone();
        let stop = stopping.clone();
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout);
            let conn = builder
                .serve_connection(
                    hyper_util::rt::TokioIo::new(conn::WriteDeadline::new(
                        stream,
                        limits.write_stall,
                    )),
                    service,
                )
                .with_upgrades();
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = stopped(stop.clone()) => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            drop(permit);
            drop(open);
        });
    }
    drop(open);
    open_tx.closed().await;
}

/// The driver loop: a pass, then a pause (cut short by a wake), until
/// `stop`.
fn drive_loop(rt: &Runtime, stop: &AtomicBool, wake: &Wake, interval: Duration) {
    while !stop.load(Ordering::SeqCst) {
        if let Err(e) = stepwell::triggers::sweep_once(rt) {
            tracing::error!(error = %e, "the sweep of event-bound automations failed");
        }
        match rt.drive_once() {
            Ok(report) => {
                if report.moved_anything() {
                    tracing::debug!(
                        due = report.due_resumed.len(),
                        ticked = report.ticked.len(),
                        parents = report.parents_resumed.len(),
                        "driver pass"
                    );
                }
                for e in &report.errors {
                    tracing::warn!(run_id = %e.run_id, error = %e.error, "driver");
                }
                for q in &report.quarantined {
                    tracing::error!(run_id = %q.run_id, error = %q.error, "quarantined");
                }
                // More may be ready at once (a chain of controller steps).
                if report.moved_anything() {
                    continue;
                }
            }
            Err(e) => tracing::error!(error = %e, "driver pass failed"),
        }
        wake.wait(rt.idle_pause(interval));
    }
}
