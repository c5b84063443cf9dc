//! The trigger sources as a kernel plugin: the catalog of sources (the
//! built-in ones and a plugin folder's) and the state of event connections
//! (the key that seals their secrets, refused webhook calls not yet
//! written, the last sweep).

use std::path::PathBuf;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::webhook::RefusalThrottle;
use super::{SealingKey, TriggerRegistry};
use crate::TriggerCatalog;
use stepwell_runtime::core::plugin::{Install, Plugin};
use stepwell_runtime::core::{Error, Result};
use stepwell_runtime::Runtime;

/// The triggers plugin.
///
/// ```
/// use std::sync::Arc;
/// use stepwell_automation::triggers::{SealingKey, Triggers, TriggersExt};
/// use stepwell_runtime::{MemoryStore, Runtime};
///
/// # fn main() -> stepwell_runtime::Result<()> {
/// let rt = Runtime::builder(Arc::new(MemoryStore::new()))
///     .plugin(Arc::new(Triggers::new().sealing_key(SealingKey::random())))
///     .build()?;
/// assert!(rt.triggers()?.get("schedule@1").is_ok());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct Triggers {
    dir: Option<PathBuf>,
    sealing: Option<SealingKey>,
}

impl Triggers {
    /// The built-in sources only; no sealing key.
    pub fn new() -> Self {
        Self::default()
    }

    /// The folder of plugin trigger sources (`*.wasm`) automations may
    /// bind, beside the built-in ones (the binary's `STEPWELL_TRIGGER_DIR`).
    pub fn dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// The key that seals trigger connections' secrets (a webhook's signing
    /// secret). Default: none, and creating a connection with a secret is
    /// refused; `stepwell::host::open_runtime` uses `connections.key` beside
    /// the database.
    pub fn sealing_key(mut self, key: SealingKey) -> Self {
        self.sealing = Some(key);
        self
    }
}

/// What the triggers plugin keeps in a runtime.
pub struct TriggerState {
    pub(crate) catalog: Arc<TriggerCatalog>,
    pub(crate) sealing: Option<SealingKey>,
    pub(crate) last_sweep: parking_lot::Mutex<Option<DateTime<Utc>>>,
    /// Refused webhook calls not yet written to their connection.
    pub(crate) refusals: RefusalThrottle,
}

impl std::fmt::Debug for TriggerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TriggerState")
            .field("catalog", &self.catalog)
            .field("sealing", &self.sealing)
            .finish_non_exhaustive()
    }
}

impl Plugin for Triggers {
    fn name(&self) -> &'static str {
        "triggers"
    }

    fn install(&self, cx: &mut Install<'_>) -> Result<()> {
        cx.set_extension(Arc::new(TriggerState {
            catalog: Arc::new(TriggerCatalog::new(cx.engine().clone(), self.dir.clone())),
            sealing: self.sealing.clone(),
            last_sweep: parking_lot::Mutex::new(None),
            refusals: RefusalThrottle::default(),
        }));
        Ok(())
    }
}

/// What the triggers plugin adds to a [`Runtime`].
pub trait TriggersExt {
    /// The trigger sources automations bind (the built-in ones and the
    /// plugin folder's), loaded on first use.
    fn triggers(&self) -> Result<Arc<TriggerRegistry>>;
}

impl TriggersExt for Runtime {
    fn triggers(&self) -> Result<Arc<TriggerRegistry>> {
        trigger_state(self)?.catalog.registry()
    }
}

/// The triggers plugin's state in `rt`.
pub(crate) fn trigger_state(rt: &Runtime) -> Result<Arc<TriggerState>> {
    rt.extension::<TriggerState>().ok_or_else(|| {
        Error::invalid(
            "triggers",
            "this runtime has no triggers plugin (stepwell::triggers::Triggers)",
        )
    })
}
