//! The errors the runtime API returns. Each has a stable reason code
//! ([`Error::reason_code`]) matching the reference implementation's codes where
//! one exists.

/// What went wrong with a runtime call. Nothing is written when a call fails
/// with one of these, except where the variant says otherwise.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No run has this id.
    #[error("run_not_found: no run with id {run_id:?}")]
    RunNotFound {
        /// The id that was asked for.
        run_id: String,
    },
    /// A resume that came too late or for the wrong wait: the run is no longer
    /// waiting (someone resumed it first), or waits on another key.
    #[error("stale_resume: run {run_id}: {reason}")]
    StaleResume {
        /// The run that was to be resumed.
        run_id: String,
        /// Why the resume was refused ("Run is not waiting", ...).
        reason: String,
    },
    /// The run changed under the call, or another thread or process was
    /// executing it for longer than the call would wait: the call lost a
    /// race and changed nothing. Trying again later is safe.
    #[error("conflict: run {run_id}: {reason}")]
    Conflict {
        /// The run.
        run_id: String,
        /// What the call found.
        reason: String,
    },
    /// The run was set aside because it cannot be read or committed; no
    /// call executes it.
    #[error("quarantined: run {run_id}: {reason}")]
    Quarantined {
        /// The run.
        run_id: String,
        /// Why it was set aside.
        reason: String,
    },
    /// A run id was already used by a run with a different identity.
    #[error("identity_conflict: run {run_id} already exists with a different {field}")]
    IdentityConflict {
        /// The explicit run id.
        run_id: String,
        /// The first identity field that differs (`workflow_id`, `session_id`, ...).
        field: String,
    },
    /// A step failed in a run whose workflow's steps never fail it (the
    /// automation controller's): nothing was committed, the run stays at
    /// its node, and the driver tries it again.
    #[error("controller_seam: the step failed and the run is left at its node to be tried again: {message}")]
    StepHeld {
        /// Why the step failed.
        message: String,
    },
    /// The host has no room for the work asked of it now (as many effects
    /// in flight as it allows): nothing was done; try again shortly.
    #[error("busy: {reason}")]
    Busy {
        /// What is full.
        reason: String,
    },
    /// A flow document is invalid.
    #[error(transparent)]
    Flow(#[from] crate::flow::FlowError),
    /// No loaded bundle defines this workflow.
    #[error("unknown_workflow: no version of workflow {workflow_id:?} is deployed (deploy its bundle: stepwell deploy DIR)")]
    UnknownWorkflow {
        /// The workflow id that was asked for.
        workflow_id: String,
    },
    /// The store keeps no such version of this workflow.
    #[error("unknown_version: workflow {workflow_id:?} has no deployed version {version}")]
    UnknownVersion {
        /// The workflow id.
        workflow_id: String,
        /// The version that was asked for.
        version: u32,
    },
    /// An upgrade would move a run to a version that lacks a node the run
    /// is at or comes back to; nothing was changed.
    #[error("upgrade_incompatible: run {run_id}: version {to} has no node {}", missing.join(", "))]
    UpgradeIncompatible {
        /// The run.
        run_id: String,
        /// The version it was to move to.
        to: u32,
        /// The nodes the new version lacks.
        missing: Vec<String>,
    },
    /// A fork was asked of a point of a run's history it cannot start
    /// from (not the start of a node's execution, or a ledger that does
    /// not hold the vars there); nothing was created.
    #[error("not_forkable: run {run_id}: {reason}")]
    NotForkable {
        /// The source run.
        run_id: String,
        /// Why, naming the points that can be forked from.
        reason: String,
    },
    /// An argument is invalid (a malformed run id, a payload of the wrong type, ...).
    #[error("invalid_input: {field}: {message}")]
    InvalidInput {
        /// The argument or field at fault.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// A WebAssembly component could not be loaded.
    #[error(transparent)]
    Wasm(crate::wasm::LoadError),
    /// The store failed.
    #[error(transparent)]
    Store(crate::store::StoreError),
    /// An error of a feature built on the kernel (a trigger source's
    /// refusal, an automation's failure, ...), with its own reason code
    /// and detail: the kernel knows no feature's error type.
    #[error("{0}")]
    Extension(Box<dyn ExtensionError>),
}

/// An error of a feature built on the kernel, carried by
/// [`Error::Extension`] (the model crate's trait, so a feature's own
/// crates can implement it without the kernel).
pub use stepwell_model::ExtensionError;

/// Any error below the runtime or of a feature: the store's and the
/// sandbox's into their own variants, the rest as [`Error::Extension`].
/// (One conversion for all: the stores and the sandbox are crates of their
/// own, and a second `From` impl could overlap this one.)
impl<E: ExtensionError> From<E> for Error {
    fn from(e: E) -> Self {
        let any: Box<dyn std::any::Any> = Box::new(e);
        let any = match any.downcast::<crate::store::StoreError>() {
            Ok(e) => return Error::Store(*e),
            Err(any) => any,
        };
        match any.downcast::<crate::wasm::LoadError>() {
            Ok(e) => Error::Wasm(*e),
            Err(any) => match any.downcast::<E>() {
                Ok(e) => Error::Extension(e),
                Err(_) => unreachable!("the value is an E"),
            },
        }
    }
}

impl Error {
    /// The stable reason code of this error (`stale_resume`, `identity_conflict`, ...).
    pub fn reason_code(&self) -> &'static str {
        match self {
            Error::RunNotFound { .. } => "run_not_found",
            Error::StaleResume { .. } => "stale_resume",
            Error::Conflict { .. } => "conflict",
            Error::Quarantined { .. } => "quarantined",
            Error::IdentityConflict { .. } => "identity_conflict",
            Error::StepHeld { .. } => "controller_seam",
            Error::Busy { .. } => "busy",
            Error::Flow(_) => "invalid_definition",
            Error::UnknownWorkflow { .. } => "unknown_workflow",
            Error::UnknownVersion { .. } => "unknown_version",
            Error::UpgradeIncompatible { .. } => "upgrade_incompatible",
            Error::NotForkable { .. } => "not_forkable",
            Error::InvalidInput { .. } => "invalid_input",
            Error::Wasm(_) => "component_load_failed",
            Error::Store(e) => e.reason_code(),
            Error::Extension(e) => e.reason_code(),
        }
    }

    /// The feature error of type `T` this is, if it is one.
    pub fn extension<T: 'static>(&self) -> Option<&T> {
        match self {
            Error::Extension(e) => e.as_any().downcast_ref(),
            _ => None,
        }
    }

    /// An [`Error::InvalidInput`] naming the `field` that was refused and why.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::InvalidInput {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// A convenience alias for runtime results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
