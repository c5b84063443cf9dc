//! The command inbox: an append-only, idempotent store of control commands
//! (pause, resume, run now, ...) for gateways and workers that must accept
//! retries safely. Each command is keyed by its `command_id`: a retried
//! append is recognised as a duplicate and gets the original sequence
//! number, never a second entry. Consumers keep a cursor (the last sequence
//! number they applied).
//!
//! Backends: [`MemoryCommandStore`], [`JsonlCommandStore`] (a `commands.jsonl`
//! file and a `command_cursors.json` in a folder) and the SQLite store
//! ([`super::SqliteStore`] implements [`CommandStore`] too).

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::StoreError;

/// One command of the inbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandRecord {
    /// The caller's idempotency key.
    pub command_id: String,
    /// The position in the inbox, from 1.
    pub seq: u64,
    /// What to do (`pause`, `resume`, `run_now`, ...).
    pub kind: String,
    /// What it applies to (an automation or run id), if anything.
    pub target: Option<String>,
    /// The command's arguments.
    pub payload: Value,
    /// When it was accepted (RFC 3339).
    pub created_at: String,
}

/// What an append did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AppendResult {
    /// A new command was stored.
    pub accepted: bool,
    /// The `command_id` was already in the inbox: nothing was stored.
    pub duplicate: bool,
    /// The command's sequence number (the original one for a duplicate).
    pub seq: u64,
}

/// An append-only, idempotent command inbox with consumer cursors.
pub trait CommandStore: Send + Sync {
    /// Appends `command` (its `seq` is ignored and assigned) unless its
    /// `command_id` is already present.
    fn append_command(&self, command: &CommandRecord) -> Result<AppendResult, StoreError>;
    /// Commands with `seq > after`, oldest first, at most `limit`.
    fn commands_after(&self, after: u64, limit: usize) -> Result<Vec<CommandRecord>, StoreError>;
    /// The command with this id, if any.
    fn find_command(&self, command_id: &str) -> Result<Option<CommandRecord>, StoreError>;
    /// The last sequence number `consumer` applied (0 before any).
    fn cursor(&self, consumer: &str) -> Result<u64, StoreError>;
    /// Records that `consumer` applied everything up to `seq`.
    fn set_cursor(&self, consumer: &str, seq: u64) -> Result<(), StoreError>;
}

/// The inbox in process memory.
#[derive(Debug, Default)]
pub struct MemoryCommandStore {
    inner: Mutex<(Vec<CommandRecord>, HashMap<String, u64>)>,
}

impl MemoryCommandStore {
    /// An empty inbox.
    pub fn new() -> Self {
        Self::default()
    }
}

impl CommandStore for MemoryCommandStore {
    fn append_command(&self, command: &CommandRecord) -> Result<AppendResult, StoreError> {
        let mut inner = self.inner.lock();
        if let Some(found) = inner.0.iter().find(|c| c.command_id == command.command_id) {
            return Ok(AppendResult {
                accepted: false,
                duplicate: true,
                seq: found.seq,
            });
        }
        let seq = inner.0.len() as u64 + 1;
        inner.0.push(CommandRecord {
            seq,
            ..command.clone()
        });
        Ok(AppendResult {
            accepted: true,
            duplicate: false,
            seq,
        })
    }

    fn commands_after(&self, after: u64, limit: usize) -> Result<Vec<CommandRecord>, StoreError> {
        let inner = self.inner.lock();
        Ok(inner
            .0
            .iter()
            .filter(|c| c.seq > after)
            .take(limit)
            .cloned()
            .collect())
    }

    fn find_command(&self, command_id: &str) -> Result<Option<CommandRecord>, StoreError> {
        Ok(self
            .inner
            .lock()
            .0
            .iter()
            .find(|c| c.command_id == command_id)
            .cloned())
    }

    fn cursor(&self, consumer: &str) -> Result<u64, StoreError> {
        Ok(self.inner.lock().1.get(consumer).copied().unwrap_or(0))
    }

    fn set_cursor(&self, consumer: &str, seq: u64) -> Result<(), StoreError> {
        self.inner.lock().1.insert(consumer.to_string(), seq);
        Ok(())
    }
}

/// The inbox as a JSON-lines file in a folder: `commands.jsonl` (one
/// command per line, appended) and `command_cursors.json`. One writer
/// process per folder.
#[derive(Debug)]
pub struct JsonlCommandStore {
    dir: PathBuf,
    write: Mutex<()>,
}

fn io(path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::io(format!("{}: {e}", path.display()))
}

impl JsonlCommandStore {
    /// Opens (creating if needed) the inbox in `dir`.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        let dir = dir.as_ref().to_path_buf();
        fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
        Ok(JsonlCommandStore {
            dir,
            write: Mutex::new(()),
        })
    }

    fn all(&self) -> Result<Vec<CommandRecord>, StoreError> {
        super::jsonl::read_lines(&self.dir.join("commands.jsonl"))
    }

    fn cursors(&self) -> Result<HashMap<String, u64>, StoreError> {
        let path = self.dir.join("command_cursors.json");
        match fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map_err(|e| StoreError::corrupt(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(HashMap::new()),
            Err(e) => Err(io(&path, e)),
        }
    }
}

impl CommandStore for JsonlCommandStore {
    fn append_command(&self, command: &CommandRecord) -> Result<AppendResult, StoreError> {
        let _w = self.write.lock();
        let all = self.all()?;
        if let Some(found) = all.iter().find(|c| c.command_id == command.command_id) {
            return Ok(AppendResult {
                accepted: false,
                duplicate: true,
                seq: found.seq,
            });
        }
        let seq = all.last().map_or(0, |c| c.seq) + 1;
        let path = self.dir.join("commands.jsonl");
        // Drop a torn last line (a crash during its append): that command
        // was never accepted.
        super::jsonl::drop_torn_tail(&path)?;
        let line = serde_json::to_string(&CommandRecord {
            seq,
            ..command.clone()
        })
        .map_err(|e| io(&path, e))?;
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| io(&path, e))?;
        f.write_all(format!("{line}\n").as_bytes())
            .map_err(|e| io(&path, e))?;
        Ok(AppendResult {
            accepted: true,
            duplicate: false,
            seq,
        })
    }

    fn commands_after(&self, after: u64, limit: usize) -> Result<Vec<CommandRecord>, StoreError> {
        Ok(self
            .all()?
            .into_iter()
            .filter(|c| c.seq > after)
            .take(limit)
            .collect())
    }

    fn find_command(&self, command_id: &str) -> Result<Option<CommandRecord>, StoreError> {
        Ok(self.all()?.into_iter().find(|c| c.command_id == command_id))
    }

    fn cursor(&self, consumer: &str) -> Result<u64, StoreError> {
        Ok(self.cursors()?.get(consumer).copied().unwrap_or(0))
    }

    fn set_cursor(&self, consumer: &str, seq: u64) -> Result<(), StoreError> {
        let _w = self.write.lock();
        let mut cursors = self.cursors()?;
        cursors.insert(consumer.to_string(), seq);
        let path = self.dir.join("command_cursors.json");
        let tmp = self
            .dir
            .join(format!(".tmp-cursors-{}", std::process::id()));
        fs::write(
            &tmp,
            serde_json::to_vec(&cursors).map_err(|e| io(&path, e))?,
        )
        .map_err(|e| io(&tmp, e))?;
        fs::rename(&tmp, &path).map_err(|e| io(&path, e))
    }
}
