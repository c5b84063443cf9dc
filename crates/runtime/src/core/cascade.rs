//! How many other runs one step has executed inside itself (through
//! `emit_event` deliveries and sync `start_subworkflow` children, all
//! nesting levels together). Nested steps run on the thread of the step
//! that set them off, so the count is per thread, started afresh by every
//! step that is not itself nested.

use std::cell::Cell;

thread_local! {
    static USED: Cell<u64> = const { Cell::new(0) };
}

/// A step that is not nested inside another starts a new count.
pub(crate) fn start() {
    USED.with(|u| u.set(0));
}

/// Counts one more run executed inline if fewer than `limit` were; returns
/// whether it was counted (the run may be executed inline).
pub(crate) fn take(limit: u64) -> bool {
    USED.with(|u| {
        let used = u.get();
        if used < limit {
            u.set(used + 1);
            true
        } else {
            false
        }
    })
}
