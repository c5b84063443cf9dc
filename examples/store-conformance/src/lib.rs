//! A store of one's own held to stepwell's store contract: [`CountingStore`]
//! counts the commits it forwards to a [`MemoryStore`]. Its test
//! (`tests/conformance.rs`) runs the conformance suite on it, one test per
//! check:
//!
//! ```sh
//! cargo test --release -p stepwell-store-conformance
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

use chrono::{DateTime, Utc};
use stepwell::store::bundles::BundleFile;
use stepwell::store::{
    ConnectionRecord, Deferral, Deployed, Deployment, EventAppend, InboxEvent, WorkflowVersion,
};
use stepwell::{
    Claim, Fence, LeaseAfter, LeaseRequest, MemoryStore, RunQuery, RunState, StepRecord, Store,
    StoreError,
};

/// A [`MemoryStore`] that counts the commits that landed.
#[derive(Default)]
pub struct CountingStore {
    inner: MemoryStore,
    commits: AtomicU64,
}

impl CountingStore {
    /// An empty store.
    pub fn new() -> CountingStore {
        CountingStore::default()
    }

    /// How many commits landed.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }
}

impl Store for CountingStore {
    // The run index's attribution columns come from the runtime's indexer
    // (the automations'): kept by the inner store.
    fn indexer(&self) -> std::sync::Arc<dyn stepwell::store::RunIndexer> {
        self.inner.indexer()
    }

    fn set_indexer(
        &self,
        indexer: std::sync::Arc<dyn stepwell::store::RunIndexer>,
    ) -> Result<(), StoreError> {
        self.inner.set_indexer(indexer)
    }

    fn load_run(&self, run_id: &str) -> Result<Option<RunState>, StoreError> {
        self.inner.load_run(run_id)
    }

    fn create_if_absent(&self, run: &RunState) -> Result<(RunState, bool), StoreError> {
        self.inner.create_if_absent(run)
    }

    fn claim(&self, run_id: &str, lease: &LeaseRequest<'_>) -> Result<Claim, StoreError> {
        self.inner.claim(run_id, lease)
    }

    fn renew(
        &self,
        holder: &str,
        run_ids: &[String],
        until: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.inner.renew(holder, run_ids, until)
    }

    fn release(&self, run_id: &str, holder: &str) -> Result<(), StoreError> {
        self.inner.release(run_id, holder)
    }

    fn commit(
        &self,
        records: &[StepRecord],
        run: &RunState,
        fence: Fence<'_>,
        lease: LeaseAfter,
    ) -> Result<(), StoreError> {
        self.inner.commit(records, run, fence, lease)?;
        self.commits.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn append_ahead(&self, records: &[StepRecord], fence: Fence<'_>) -> Result<(), StoreError> {
        self.inner.append_ahead(records, fence)
    }

    fn append_records(&self, records: &[StepRecord]) -> Result<(), StoreError> {
        self.inner.append_records(records)
    }

    fn list_records(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.inner.list_records(run_id)
    }

    fn list_ahead(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.inner.list_ahead(run_id)
    }

    fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunState>, StoreError> {
        self.inner.list_runs(query)
    }

    fn list_due(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<String>, StoreError> {
        self.inner.list_due(now, limit)
    }

    fn list_claimable(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<String>, StoreError> {
        self.inner.list_claimable(now, limit)
    }

    fn list_leased(&self, limit: usize) -> Result<Vec<(String, String)>, StoreError> {
        self.inner.list_leased(limit)
    }

    fn quarantine(&self, run_id: &str, reason: &str) -> Result<(), StoreError> {
        self.inner.quarantine(run_id, reason)
    }

    fn defer(
        &self,
        run_id: &str,
        reason: Option<&str>,
        until: &dyn Fn(u32) -> DateTime<Utc>,
    ) -> Result<u32, StoreError> {
        self.inner.defer(run_id, reason, until)
    }

    fn deferral(&self, run_id: &str) -> Result<Option<Deferral>, StoreError> {
        self.inner.deferral(run_id)
    }

    fn list_quarantined(&self) -> Result<Vec<(String, String)>, StoreError> {
        self.inner.list_quarantined()
    }

    // Deployed versions: which bundle files define each version of each
    // workflow. A deployment is one transaction.

    fn deploy(&self, deployment: &Deployment<'_>) -> Result<Vec<Deployed>, StoreError> {
        self.inner.deploy(deployment)
    }

    fn workflow_version(
        &self,
        workflow_id: &str,
        version: Option<u32>,
    ) -> Result<Option<WorkflowVersion>, StoreError> {
        self.inner.workflow_version(workflow_id, version)
    }

    fn workflow_versions(
        &self,
        workflow_id: Option<&str>,
    ) -> Result<Vec<WorkflowVersion>, StoreError> {
        self.inner.workflow_versions(workflow_id)
    }

    fn bundle_files(&self, digest: &str) -> Result<Vec<BundleFile>, StoreError> {
        self.inner.bundle_files(digest)
    }

    fn remove_versions(&self, versions: &[WorkflowVersion]) -> Result<usize, StoreError> {
        self.inner.remove_versions(versions)
    }

    fn delete_runs(&self, run_ids: &[String]) -> Result<stepwell::store::Deleted, StoreError> {
        self.inner.delete_runs(run_ids)
    }

    // The event inbox and the trigger connections are optional: without
    // them the store answers `store_unsupported` and the suite skips their
    // checks. This one has them.

    fn append_event(&self, event: &InboxEvent) -> Result<EventAppend, StoreError> {
        self.inner.append_event(event)
    }

    fn events_after(
        &self,
        stream: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<InboxEvent>, StoreError> {
        self.inner.events_after(stream, after, limit)
    }

    fn create_connection(&self, connection: &ConnectionRecord) -> Result<(), StoreError> {
        self.inner.create_connection(connection)
    }

    fn update_connection(
        &self,
        id: &str,
        change: &mut dyn FnMut(&mut ConnectionRecord) -> Result<(), StoreError>,
    ) -> Result<Option<ConnectionRecord>, StoreError> {
        self.inner.update_connection(id, change)
    }

    fn get_connection(&self, id: &str) -> Result<Option<ConnectionRecord>, StoreError> {
        self.inner.get_connection(id)
    }

    fn list_connections(&self) -> Result<Vec<ConnectionRecord>, StoreError> {
        self.inner.list_connections()
    }
}
