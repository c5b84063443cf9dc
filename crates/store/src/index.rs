//! The run index's extra columns and who fills them.
//!
//! A store keeps, beside each run, a few columns a listing filters on
//! without reading the run's vars: its [`Attribution`] (which automation,
//! role and occurrence it belongs to, its session kind, its workspace
//! root) and the trigger connection whose events would wake it. The kernel
//! gives them no meaning: a [`RunIndexer`] derives them from the run, and
//! the feature that owns the meaning (the automations) installs one through
//! the runtime's builder, which hands it to the store
//! ([`Store::set_indexer`](super::Store::set_indexer)).
//!
//! Without an indexer a store indexes only the workspace root
//! ([`PlainIndex`]). A row written so has no session kind, and a store
//! indexes such rows again when an indexer is installed: a run a
//! kernel-only process saved is attributed by the next host that knows
//! automations.
//!
//! Which runs are the turns of a conversation ([`TurnRoots`], what
//! [`RunIndexQuery::root_only`](super::RunIndexQuery::root_only) lists) is
//! the indexer's rule too: the roles it gives are its own.

use std::sync::Arc;

use parking_lot::RwLock;

use stepwell_model::model::RunState;

/// The index columns of one run that an indexer fills.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attribution {
    /// See [`RunIndexRow::automation_id`](super::RunIndexRow::automation_id).
    pub automation_id: Option<String>,
    /// See [`RunIndexRow::role`](super::RunIndexRow::role).
    pub role: Option<String>,
    /// See [`RunIndexRow::occurrence_index`](super::RunIndexRow::occurrence_index).
    pub occurrence_index: Option<i64>,
    /// See [`RunIndexRow::session_kind`](super::RunIndexRow::session_kind).
    /// An indexer sets it on every run it indexes: a row without one was
    /// written by a process without the indexer, and is indexed again.
    pub session_kind: Option<String>,
    /// See [`RunIndexRow::workspace_root`](super::RunIndexRow::workspace_root).
    pub workspace_root: Option<String>,
    /// The trigger connection whose events would wake the run now
    /// ([`Store::list_consumers`](super::Store::list_consumers)).
    pub wakes_on: Option<String>,
}

/// Which runs of the index are turn roots (a conversation's turns, what
/// [`RunIndexQuery::root_only`](super::RunIndexQuery::root_only) lists): a
/// run with one of the roles `roots` is one, parent or not; otherwise a run
/// without a parent is one unless its role is one of `not_roots`. The
/// default (no roles) makes the runs without a parent the roots.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TurnRoots {
    /// Roles whose runs are always turn roots, even with a parent.
    pub roots: Vec<String>,
    /// Roles whose runs never are, even without a parent.
    pub not_roots: Vec<String>,
}

impl TurnRoots {
    /// Whether a run of `role` whose parent is `parent_run_id` (`None` or
    /// empty: none) is a turn root.
    pub fn is_root(&self, role: Option<&str>, parent_run_id: Option<&str>) -> bool {
        let has = |roles: &[String]| role.is_some_and(|r| roles.iter().any(|x| x == r));
        has(&self.roots) || (parent_run_id.is_none_or(str::is_empty) && !has(&self.not_roots))
    }
}

/// Derives a run's [`Attribution`] from the run. Called on every save of a
/// run, so it must be cheap and a pure function of the run.
pub trait RunIndexer: Send + Sync {
    /// The index columns of `run`.
    fn index(&self, run: &RunState) -> Attribution;

    /// Which of the roles this indexer gives make a run a turn root, or
    /// never one. The default names none: the runs without a parent are
    /// the roots.
    fn turn_roots(&self) -> TurnRoots {
        TurnRoots::default()
    }
}

/// The index of a store no feature gave an indexer: the run's top-level
/// `vars.workspace_root`, stripped, and nothing else.
#[derive(Debug, Clone, Copy, Default)]
pub struct PlainIndex;

impl RunIndexer for PlainIndex {
    fn index(&self, run: &RunState) -> Attribution {
        Attribution {
            workspace_root: workspace_root(run),
            ..Attribution::default()
        }
    }
}

/// The run's top-level `vars.workspace_root`, stripped (`None` when absent,
/// not a string or empty).
pub fn workspace_root(run: &RunState) -> Option<String> {
    run.vars
        .get("workspace_root")
        .and_then(serde_json::Value::as_str)
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// A store's indexer: [`PlainIndex`] until one is installed.
pub struct IndexerSlot(RwLock<Arc<dyn RunIndexer>>);

impl Default for IndexerSlot {
    fn default() -> Self {
        IndexerSlot(RwLock::new(Arc::new(PlainIndex)))
    }
}

impl std::fmt::Debug for IndexerSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IndexerSlot")
    }
}

impl IndexerSlot {
    /// The indexer in use.
    pub fn get(&self) -> Arc<dyn RunIndexer> {
        self.0.read().clone()
    }

    /// Uses `indexer` from now on.
    pub fn set(&self, indexer: Arc<dyn RunIndexer>) {
        *self.0.write() = indexer;
    }
}
