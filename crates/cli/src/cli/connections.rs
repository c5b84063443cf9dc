//! `stepwell connections ...`: trigger connections (a webhook endpoint and
//! its signing secret, a feed), the events of their streams, and a test
//! event.

use clap::Subcommand;
use serde_json::{json, Value};
use stepwell::triggers::Connections as _;
use stepwell::{Error, Runtime};

use super::render::Report;

/// The `connections` subcommands.
#[derive(Subcommand)]
pub enum ConnectionCommand {
    /// Create a connection of an event source; prints its id, its signing
    /// secret (a webhook's: shown this once, never again) and its endpoint
    /// path.
    #[command(after_help = r#"Examples:
  stepwell connections create webhook.received@1 --label payments
  stepwell connections create feed.item@1 --label news --config '{"url": "https://example.com/feed.xml", "every": "15m"}'"#)]
    Create {
        /// SOURCE@VERSION: webhook.received@1, feed.item@1 or an event
        /// plugin.
        source: String,
        /// A human label.
        #[arg(long)]
        label: Option<String>,
        /// The connection's config, a JSON object (webhook:
        /// {subject_path?, tolerance_s?, secret?}; feed: {url, every?,
        /// max_items?, initial_items?}).
        #[arg(long, default_value = "{}")]
        config: String,
    },
    /// List every connection (never a secret).
    List,
    /// Show one connection (never its secret).
    Show {
        /// The connection id.
        id: String,
    },
    /// Disable a connection: webhook calls get 404, a feed is not polled,
    /// no automation can be bound to it.
    Disable {
        /// The connection id.
        id: String,
    },
    /// Enable a disabled connection.
    Enable {
        /// The connection id.
        id: String,
    },
    /// A new signing secret for a webhook connection, shown this once; the
    /// old one stops working at once.
    RotateSecret {
        /// The connection id.
        id: String,
    },
    /// Append a test (or plugin) event to the connection's stream; bound
    /// automations admit it like any other.
    Send {
        /// The connection id.
        id: String,
        /// The event's data, a JSON value.
        #[arg(long, default_value = "{\"test\": true}")]
        data: String,
        /// The event's subject.
        #[arg(long)]
        subject: Option<String>,
    },
    /// The events of the connection's stream after a position.
    Events {
        /// The connection id.
        id: String,
        /// Only events after this seq.
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Poll a feed connection now, whether it is due or not; prints how
    /// many new items were appended.
    Poll {
        /// The connection id.
        id: String,
    },
}

fn parse(field: &str, text: &str) -> Result<Value, Error> {
    stepwell::core::config::check_exact_integers(field, text)?;
    serde_json::from_str(text).map_err(|e| Error::InvalidInput {
        field: field.into(),
        message: format!("is not JSON: {e}"),
    })
}

/// A connection as a line: its id, source, status and label.
fn connection_line(c: &Value) -> String {
    format!(
        "{}  {}  {}  {}",
        c["connection_id"].as_str().unwrap_or_default(),
        c["source"].as_str().unwrap_or_default(),
        c["status"].as_str().unwrap_or_default(),
        c["label"].as_str().unwrap_or_default()
    )
}

/// An answer on one line with `--json`; as text, a connection's line (when
/// it is a connection) or the value indented.
fn answer(out: &Value) -> Report {
    if out.get("connection_id").is_some() && out.get("source").is_some() {
        Report::compact(out).line(connection_line(out))
    } else {
        Report::value(out)
    }
}

/// The secret, shown this once, as text.
const SECRET_ONCE: &str = "(the secret is shown this once: keep it now)";

/// Runs a `connections` subcommand.
pub(crate) fn run(rt: &Runtime, command: ConnectionCommand) -> Result<Report, Error> {
    Ok(match command {
        ConnectionCommand::Create {
            source,
            label,
            config,
        } => {
            let created =
                rt.create_connection(&source, label.as_deref(), &parse("--config", &config)?)?;
            let mut text = vec![format!("connection {}", created.connection_id)];
            if let Some(path) = &created.path {
                text.push(format!("path       {path}"));
            }
            if let Some(secret) = &created.secret {
                text.push(format!("secret     {secret}"));
                text.push(SECRET_ONCE.into());
            }
            Report::compact(
                &json!({"connection_id": created.connection_id, "secret": created.secret,
                        "path": created.path, "connection": created.connection}),
            )
            .lines(text)
        }
        ConnectionCommand::List => {
            let all = rt.list_connections()?;
            Report::compact(&json!(all)).lines(all.iter().map(connection_line))
        }
        ConnectionCommand::Show { id } => {
            answer(&stepwell::triggers::connection_view(&rt.connection(&id)?))
        }
        ConnectionCommand::Disable { id } => answer(&rt.set_connection_status(&id, "disabled")?),
        ConnectionCommand::Enable { id } => answer(&rt.set_connection_status(&id, "active")?),
        ConnectionCommand::RotateSecret { id } => {
            let created = rt.rotate_connection_secret(&id)?;
            let text = format!(
                "secret     {}",
                created.secret.as_deref().unwrap_or_default()
            );
            Report::compact(
                &json!({"connection_id": created.connection_id, "secret": created.secret}),
            )
            .line(text)
            .line(SECRET_ONCE)
        }
        ConnectionCommand::Send { id, data, subject } => {
            answer(&rt.send_connection_event(&id, parse("--data", &data)?, subject.as_deref())?)
        }
        ConnectionCommand::Events { id, after, limit } => {
            answer(&json!(rt.connection_events(&id, after, limit)?))
        }
        ConnectionCommand::Poll { id } => {
            let n = stepwell::triggers::feed::poll(rt, &id, true)?.unwrap_or(0);
            answer(&json!({"connection_id": id, "appended": n}))
        }
    })
}
