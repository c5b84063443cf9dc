//! The store conformance suite: the promises of the [`Store`] contract as
//! checks any backend can run (the `conformance` cargo feature; the
//! `stepwell` facade has a feature of the same name).
//!
//! Every built-in store passes it (the repository's `tests/conformance.rs`
//! runs it on the memory, SQLite, JSON-file and PostgreSQL stores). A
//! store of your own passes it too when its [`Harness`] does:
//!
//! ```no_run
//! use std::path::Path;
//! use std::sync::Arc;
//!
//! use stepwell_store::conformance::Harness;
//! use stepwell_store::{JsonFileStore, Store};
//!
//! /// My store, in the directory each check gets.
//! struct Mine;
//!
//! impl Harness for Mine {
//!     fn name(&self) -> &str {
//!         "mine"
//!     }
//!     fn open(&self, dir: &Path) -> Arc<dyn Store> {
//!         Arc::new(JsonFileStore::open(dir.join("store")).expect("open"))
//!     }
//!     fn reopens(&self) -> bool {
//!         true
//!     }
//! }
//!
//! // One `#[test]` per check, named after it, in this test binary.
//! stepwell_store::store_conformance!(Mine);
//! # fn main() {}
//! ```
//!
//! Each check ([`checks`], listed in [`CHECKS`]) gets a fresh, empty
//! directory and the harness, opens what it needs through the harness and
//! panics on the first promise the store breaks. [`run`] runs one and
//! names the check and the backend in its [`CheckFailure`]; a check that
//! needs what the harness does not have (a command store, a reopen) is
//! [skipped](Verdict::Skipped), not failed.

pub mod checks;
pub mod fixtures;

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use crate::{ArtifactStore, CommandStore, SnapshotStore, Store};

/// How the suite opens the backend under test. Each check calls it with a
/// fresh, empty directory of its own, which lives until the check ends.
pub trait Harness {
    /// The backend's name, in failure and skip messages.
    fn name(&self) -> &str;

    /// Opens the store kept under `dir` (a store that keeps no files
    /// ignores it), panicking if it cannot. Where [`Harness::reopens`],
    /// opening `dir` again gives another handle on the same data, as
    /// another process would have: a store on a server keeps in `dir` what
    /// it made for the check (the PostgreSQL harness writes the name of a
    /// fresh schema there).
    fn open(&self, dir: &Path) -> Arc<dyn Store>;

    /// Whether what [`Harness::open`] (and the stores below) opened on a
    /// directory is there when it is opened again: false for a store that
    /// lives in memory. The checks of a reopen are skipped where it is
    /// false.
    fn reopens(&self) -> bool;

    /// The command inbox that goes with the store under `dir` (the store
    /// itself where it is one), or `None` (the default): its checks are
    /// then skipped.
    fn commands(&self, dir: &Path) -> Option<Arc<dyn CommandStore>> {
        let _ = dir;
        None
    }

    /// The snapshot store that goes with the store under `dir`, or `None`
    /// (the default): its check is then skipped.
    fn snapshots(&self, dir: &Path) -> Option<Arc<dyn SnapshotStore>> {
        let _ = dir;
        None
    }

    /// The artifact store that goes with the store under `dir`, or `None`
    /// (the default): its check is then skipped.
    fn artifacts(&self, dir: &Path) -> Option<Arc<dyn ArtifactStore>> {
        let _ = dir;
        None
    }

    /// Why every check is skipped on this backend now (a database server
    /// that is not there), or `None` (the default) to run them.
    fn skip(&self) -> Option<String> {
        None
    }
}

/// What a check that did not fail found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The store kept every promise the check tests.
    Passed,
    /// The check did not apply: the harness lacks what it needs (the
    /// reason says what).
    Skipped(String),
}

/// One check of the suite: its name and its function.
#[derive(Debug, Clone, Copy)]
pub struct Check {
    /// The check's name, its function's in [`checks`].
    pub name: &'static str,
    /// The check: the harness and a fresh, empty directory; it panics on
    /// the first broken promise.
    pub run: fn(&dyn Harness, &Path) -> Verdict,
}

/// A check that failed on a backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckFailure {
    /// The check's name.
    pub check: &'static str,
    /// The backend's name ([`Harness::name`]).
    pub backend: String,
    /// What broke: the check's panic message.
    pub message: String,
}

impl fmt::Display for CheckFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "store conformance check `{}` failed on {}: {}",
            self.check, self.backend, self.message
        )
    }
}

impl std::error::Error for CheckFailure {}

/// Runs `check` on `harness` in a fresh temporary directory: its verdict,
/// or the failure (the check's panic, caught) naming the check and the
/// backend.
pub fn run(harness: &dyn Harness, check: &Check) -> Result<Verdict, CheckFailure> {
    let failure = |message: String| CheckFailure {
        check: check.name,
        backend: harness.name().to_string(),
        message,
    };
    if let Some(reason) = harness.skip() {
        return Ok(Verdict::Skipped(reason));
    }
    let dir = tempfile::tempdir().map_err(|e| failure(format!("a temporary directory: {e}")))?;
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        (check.run)(harness, dir.path())
    }))
    .map_err(|panic| {
        failure(
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic without a message".into()),
        )
    })
}

/// Runs `check` on `harness` as a test does: panics with the
/// [`CheckFailure`] if it fails, and says on stderr why it was skipped if
/// it was. What [`store_conformance!`](crate::store_conformance) expands
/// to.
pub fn assert_passes(harness: &dyn Harness, check: &Check) {
    match run(harness, check) {
        Ok(Verdict::Passed) => {}
        Ok(Verdict::Skipped(reason)) => eprintln!(
            "skipped: store conformance check `{}` on {}: {reason}",
            check.name,
            harness.name()
        ),
        Err(failure) => panic!("{failure}"),
    }
}

/// Runs every check of [`CHECKS`] on `harness`, in order, as one test
/// (skips are said on stderr): the failures, none if the store conforms.
pub fn run_all(harness: &dyn Harness) -> Vec<CheckFailure> {
    CHECKS
        .iter()
        .filter_map(|check| match run(harness, check) {
            Ok(Verdict::Passed) => None,
            Ok(Verdict::Skipped(reason)) => {
                eprintln!(
                    "skipped: store conformance check `{}` on {}: {reason}",
                    check.name,
                    harness.name()
                );
                None
            }
            Err(failure) => Some(failure),
        })
        .collect()
}

/// One `#[test]` per check of the suite, on the backend the expression
/// `$harness` (of a type that implements
/// [`Harness`](crate::conformance::Harness)) opens, each named
/// after its check (`runs_load_and_commit`, ...). Use it at module level
/// of a test binary; a module around it keeps several backends apart:
///
/// ```text
/// mod mine {
///     stepwell::store_conformance!(crate::MyHarness::new());
/// }
/// ```
///
/// The expression is evaluated once in each test. A failing test panics
/// with the check's and the backend's names
/// ([`CheckFailure`](crate::conformance::CheckFailure)).
#[macro_export]
macro_rules! store_conformance {
    ($harness:expr $(,)?) => {
        $crate::__store_conformance_checks! { __store_conformance_tests { $harness } }
    };
}

/// The names of the checks, in order, given to the macro `$callback` of
/// this crate after `{ $args }`: the one list [`CHECKS`] and
/// `store_conformance!` are made from.
#[doc(hidden)]
#[macro_export]
macro_rules! __store_conformance_checks {
    ($callback:ident { $($args:tt)* }) => {
        $crate::$callback! { { $($args)* }
            runs_load_and_commit,
            create_if_absent_never_overwrites,
            a_commit_lands_only_on_the_version_it_read,
            a_lease_excludes_other_holders_until_it_lapses,
            a_fence_without_a_holder_lands_and_clears_the_lease,
            run_status_is_the_stored_status,
            list_runs_filters_orders_and_limits,
            due_waits_include_deadline_carrying_event_waits,
            claimable_runs_are_running_and_unleased,
            deferred_runs_are_listed_after_their_time_and_last,
            quarantined_runs_are_set_aside,
            ended_children_and_orphans_are_found,
            consumers_are_the_controllers_an_event_would_wake,
            ledgers_append_in_order_per_run,
            a_null_result_is_kept_and_its_hash_holds,
            identical_records_of_successive_commits_all_land,
            evidence_appended_ahead_stays_through_the_next_commit,
            records_appended_since_the_last_commit_are_ahead,
            deployments_are_versioned,
            removed_versions_let_go_of_their_files,
            concurrent_deployments_get_distinct_versions,
            runs_are_counted_by_version,
            only_ended_runs_are_deleted,
            next_due_is_when_the_earliest_timed_work_falls_due,
            a_reopened_store_has_everything,
            the_ledger_chain_reports_the_first_tampered_record,
            a_compacted_ledger_keeps_its_seqs_and_chain,
            the_command_inbox_is_idempotent_and_ordered,
            concurrent_retries_are_accepted_once,
            the_event_inbox_dedupes_per_stream_and_reads_in_order,
            pruned_events_keep_their_keys_and_are_skipped,
            connections_are_created_once_and_changed_atomically,
            the_run_index_carries_attribution_and_filters,
            turn_roots_are_the_indexers,
            ledger_records_are_found_by_idempotency_key,
            snapshot_stores_search_by_run_tag_and_text,
            artifact_store_is_content_addressed,
            artifacts_are_deleted_unless_stored_lately,
        }
    };
}

/// `store_conformance!`'s tests, one per check name.
#[doc(hidden)]
#[macro_export]
macro_rules! __store_conformance_tests {
    ({ $harness:expr } $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::conformance::assert_passes(
                    &$harness,
                    &$crate::conformance::Check {
                        name: stringify!($name),
                        run: $crate::conformance::checks::$name,
                    },
                );
            }
        )*
    };
}

/// [`CHECKS`], from the list of names.
#[doc(hidden)]
#[macro_export]
macro_rules! __store_conformance_table {
    ({} $($name:ident),* $(,)?) => {
        /// Every check of the suite, in the order [`run_all`] runs them.
        pub const CHECKS: &[Check] = &[
            $( Check { name: stringify!($name), run: checks::$name } ),*
        ];
    };
}

crate::__store_conformance_checks! { __store_conformance_table {} }
