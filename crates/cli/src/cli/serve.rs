//! `stepwell serve`: the HTTP server over the runtime, with its log.

use std::path::PathBuf;
use std::time::Duration;

use stepwell::{Error, Runtime};

use super::render::{Report, Sink};
use super::setup::Host;

/// What `stepwell serve` was asked (its flags, docs/cli.md).
#[derive(clap::Args)]
pub(crate) struct ServeArgs {
    /// The address to listen on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub(crate) listen: std::net::SocketAddr,
    /// The bearer token's file (default: serve-token beside the
    /// database, in the user's state folder for a memory or PostgreSQL
    /// store; created with a random token, mode 0600, when missing).
    #[arg(long)]
    pub(crate) token_file: Option<PathBuf>,
    /// The driver's pause between passes, in milliseconds.
    #[arg(long, default_value_t = 200)]
    pub(crate) interval_ms: u64,
    /// Only answer the API: leave moving runs to `stepwell drive`
    /// processes.
    #[arg(long)]
    pub(crate) no_drive: bool,
    /// Log lines as text or json (filtered by RUST_LOG, default info).
    #[arg(long, default_value = "text")]
    pub(crate) log_format: String,
    /// The largest request body, in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub(crate) max_body_bytes: usize,
    /// The most connections served at once (more wait to be accepted).
    #[arg(long, default_value_t = 1024)]
    pub(crate) max_connections: usize,
    /// How long a client may take to send a request's headers, in
    /// milliseconds (slower, the connection is closed).
    #[arg(long, default_value_t = 15_000)]
    pub(crate) header_timeout_ms: u64,
    /// How long a write to a client may wait for it to read, in
    /// milliseconds (longer, the connection is closed).
    #[arg(long, default_value_t = 15_000)]
    pub(crate) write_timeout_ms: u64,
    /// How long a client may take to send a request's body, in
    /// milliseconds (slower, it is answered 408 and the connection
    /// closed).
    #[arg(long, default_value_t = 10_000)]
    pub(crate) body_timeout_ms: u64,
    /// The bytes that request bodies being read may hold across all
    /// connections (a request over it is answered 503 at once).
    #[arg(long, default_value_t = 32 << 20)]
    pub(crate) max_body_bytes_in_flight: usize,
    /// Apply this retention policy while serving (as `stepwell prune
    /// --retain`), every --prune-every, in a thread of its own.
    #[arg(long)]
    pub(crate) retain: Option<String>,
    /// How often --retain prunes (`s`, `m`, `h`, `d`).
    #[arg(long, default_value = "1h", requires = "retain")]
    pub(crate) prune_every: String,
}

/// Serves until SIGTERM or Ctrl-C; prints where, and the token file,
/// first (through the sink: the command prints as it goes).
pub(crate) fn run(rt: Runtime, host: &Host, args: ServeArgs, sink: &Sink) -> Result<Report, Error> {
    let ServeArgs {
        listen,
        token_file: _, // resolved by the set-up (host.serve_token)
        interval_ms,
        no_drive,
        // Logs were started by main before the store was opened (a wait
        // for PostgreSQL shows there); the format was checked then.
        log_format: _,
        max_body_bytes,
        max_connections,
        header_timeout_ms,
        body_timeout_ms,
        max_body_bytes_in_flight,
        write_timeout_ms,
        retain,
        prune_every,
    } = args;
    // A long-running server handles a closed connection per
    // connection, not by dying.
    #[cfg(unix)]
    // SAFETY: signal(2) takes no pointers, and SIG_IGN installs no handler,
    // so no code runs in signal context; nothing in the process relies on
    // SIGPIPE's default (a write to a closed socket then fails with EPIPE).
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let token_file = match &host.serve_token {
        Some(file) => file.clone(),
        None => host.spec.token_file(host.options.state_home.as_deref())?,
    };
    let mut options = stepwell_serve::ServeOptions::new(token_file.clone());
    options.listen = listen;
    options.drive_interval = Duration::from_millis(interval_ms.max(1));
    options.drive = !no_drive;
    options.max_body_bytes = max_body_bytes;
    options.max_connections = max_connections;
    options.header_read_timeout = Duration::from_millis(header_timeout_ms.max(1));
    options.body_read_timeout = Duration::from_millis(body_timeout_ms.max(1));
    options.write_stall_timeout = Duration::from_millis(write_timeout_ms.max(1));
    options.max_body_bytes_in_flight = max_body_bytes_in_flight;
    options.snapshots = Some(std::sync::Arc::from(host.spec.snapshots()?));
    options.dashboard_dir = super::environment::dashboard_dir();
    if let Some(policy) = retain {
        super::retention::spawn_pruner(&rt, &host.spec, &policy, &prune_every, sink.json())?;
    }
    let server = stepwell_serve::Server::bind(rt, options)?;
    let url = format!("http://{}/", server.local_addr());
    let mut banner = Report::compact(
        &serde_json::json!({"url": url, "token_file": token_file.display().to_string()}),
    )
    .line(format!("stepwell serve: {url}"))
    .line(format!("token file: {}", token_file.display()))
    .line(format!(
        "try: curl -H \"Authorization: Bearer $(cat {})\" {url}v1/runs",
        token_file.display()
    ));
    if !server.local_addr().ip().is_loopback() {
        banner.note(
            "warning: listening beyond loopback: the token travels in cleartext; put a TLS proxy in front",
        );
    }
    sink.show(&banner);
    sink.flush();
    server.run()?;
    Ok(Report::default())
}

/// Starts the `tracing` subscriber of `serve`: text or JSON lines on
/// stderr, filtered by RUST_LOG (default `info`).
pub(crate) fn init_logs(format: &str) -> Result<(), Error> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        "text" => builder.try_init(),
        "json" => builder.json().try_init(),
        other => {
            return Err(Error::InvalidInput {
                field: "--log-format".into(),
                message: format!("{other:?} is not text or json"),
            })
        }
    }
    .map_err(|e| Error::InvalidInput {
        field: "--log-format".into(),
        message: e.to_string(),
    })
}
