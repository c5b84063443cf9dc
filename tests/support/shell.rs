//! The `stepwell` CLI as the tests run it: each command a real process on
//! a scratch SQLite file, from the repository root, with the environment
//! variables that would choose another store or trigger folder removed.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;
use stepwell::host::{open_runtime, HostOptions, StoreSpec};
use stepwell::Runtime;

use crate::{repo, stepwell_binary};

/// A scratch folder whose `db.sqlite` every command of this shell uses.
pub struct Shell {
    /// The scratch folder (removed when the shell is dropped).
    pub dir: tempfile::TempDir,
}

impl Default for Shell {
    fn default() -> Self {
        Self::new()
    }
}

impl Shell {
    /// A shell over a new scratch folder.
    pub fn new() -> Shell {
        Shell {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// The database its commands use.
    pub fn db(&self) -> PathBuf {
        self.dir.path().join("db.sqlite")
    }

    /// `stepwell --db <db> <args>`, not started yet.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(stepwell_binary());
        crate::scratch_home(&mut c, self.dir.path())
            .arg("--db")
            .arg(self.db())
            .args(args)
            .current_dir(repo())
            .env_remove("STEPWELL_DB")
            .env_remove("STEPWELL_STORE")
            .env_remove("STEPWELL_TRIGGER_DIR");
        c
    }

    /// Runs `stepwell <args>` to its end.
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    /// Runs `stepwell <args>` (which ask for `--json`) and parses what it
    /// prints; panics with its output unless it exits 0.
    pub fn json(&self, args: &[&str]) -> Value {
        let out = self.run(args);
        assert!(out.status.success(), "{args:?}: {}", output_text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The store, as another process opens it.
    pub fn runtime(&self) -> Runtime {
        open_runtime(&StoreSpec::Sqlite(self.db()), &HostOptions::default()).unwrap()
    }
}

/// What a command printed: its standard output, then its standard error.
pub fn output_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
