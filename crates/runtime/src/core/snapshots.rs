//! Snapshots of a run's state, taken and restored through the runtime.

use serde_json::json;

use super::clock::format_time;
use super::keys::runtime_vars;
use super::model::{RunState, StepRecord};
use super::runtime::Runtime;
use super::{Error, Result};
use crate::store::{Snapshot, SnapshotStore};

impl Runtime {
    /// Takes a snapshot of the run's current state into `snapshots`.
    pub fn create_snapshot(
        &self,
        snapshots: &dyn SnapshotStore,
        run_id: &str,
        name: &str,
        description: &str,
        tags: Vec<String>,
    ) -> Result<Snapshot> {
        let run = self.get_state(run_id)?;
        let snapshot = Snapshot {
            snapshot_id: uuid::Uuid::new_v4().to_string(),
            run_id: run_id.to_string(),
            step_id: self
                .store()
                .list_records(run_id)?
                .last()
                .map(|r| r.step_id.clone()),
            name: name.to_string(),
            description: description.to_string(),
            tags,
            created_at: format_time(self.now()),
            run_state: run,
        };
        snapshots.save_snapshot(&snapshot)?;
        Ok(snapshot)
    }

    /// Restores a snapshot: its run state becomes the run's state again,
    /// under the run's lease, with a `completed` ledger record
    /// `{"restored": {"snapshot_id", "name", "step_id", "workflow_version"}}`
    /// (and the restored user vars in its `input`)
    /// as evidence (`workflow_version`: `{"from", "to"}` when the snapshot's
    /// version is not the run's current one, else null). The run goes back
    /// to the snapshot's version, which must still be deployed
    /// (`unknown_version`).
    ///
    /// A snapshot whose state is of another run than it names is refused
    /// (`store_corrupt`); a file-backed snapshot store reads only snapshots
    /// it sealed itself ([`crate::store::JsonSnapshotStore`]), so the run's
    /// host-owned vars never come from a file someone edited.
    pub fn restore_snapshot(
        &self,
        snapshots: &dyn SnapshotStore,
        snapshot_id: &str,
    ) -> Result<RunState> {
        let snapshot = snapshots.load_snapshot(snapshot_id)?.ok_or_else(|| {
            Error::invalid(
                "snapshot_id",
                format!("no snapshot with id {snapshot_id:?}"),
            )
        })?;
        if snapshot.run_state.run_id != snapshot.run_id {
            return Err(crate::store::StoreError::corrupt(format!(
                "snapshot {snapshot_id}: its state is of run {:?}, not of run {:?}: refusing it",
                snapshot.run_state.run_id, snapshot.run_id
            ))
            .into());
        }
        let (mut txn, current) = self.claim(&snapshot.run_id, self.config().lease_wait)?;
        let mut run = snapshot.run_state.clone();
        // The snapshot's state runs on the snapshot's version: it must
        // still be deployed, and a change of version is said in the record.
        if let Some(v) = run.workflow_version {
            if self
                .store()
                .workflow_version(&run.workflow_id, Some(v))?
                .is_none()
            {
                return Err(Error::UnknownVersion {
                    workflow_id: run.workflow_id.clone(),
                    version: v,
                });
            }
        }
        let moved = (run.workflow_version != current.workflow_version)
            .then(|| json!({"from": current.workflow_version, "to": run.workflow_version}));
        let restores = [Some(&run), Some(&current)]
            .into_iter()
            .flatten()
            .filter_map(|r| r.vars.get("_runtime")?.get("restores")?.as_u64())
            .max()
            .unwrap_or(0)
            + 1;
        runtime_vars(&mut run).insert("restores".into(), json!(restores));
        let now = format_time(self.now());
        run.updated_at = now.clone();
        // The restored vars go in the record too (`input`), so the ledger
        // alone still rebuilds the vars of every later step (forks).
        let input = super::keys::user_vars(&run.vars);
        let record = StepRecord {
            result: Some(json!({ "restored": {
                "snapshot_id": snapshot.snapshot_id,
                "name": snapshot.name,
                "step_id": snapshot.step_id,
                "workflow_version": moved,
            }})),
            input: Some(super::secrets::redact_all(&serde_json::Value::Object(
                input,
            ))),
            ended_at: Some(now.clone()),
            ..self.record(&run, run.current_node.clone(), &now)
        };
        txn.keep = false;
        txn.commit(vec![record], &mut run)?;
        Ok(run)
    }
}
