//! Panics contained: every step runs under [`catch`], so a bug the host
//! trips over on one run (or a guest finds a way to provoke) fails that run
//! with `host_panic` and the host goes on. [`install_quiet_hook`] keeps such
//! panics off stderr (the run's error and ledger carry them); panics
//! anywhere else are printed as usual.

use std::cell::{Cell, RefCell};
use std::panic::{self, AssertUnwindSafe};

thread_local! {
    static GUARDED: Cell<u32> = const { Cell::new(0) };
    static LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Runs `f`; a panic inside it comes back as `Err(message)` (with where it
/// happened, if [`install_quiet_hook`] is installed).
pub fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    GUARDED.with(|g| g.set(g.get() + 1));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(g.get().saturating_sub(1)));
    result.map_err(|payload| {
        let text = if let Some(s) = payload.downcast_ref::<&str>() {
            (*s).to_string()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "a panic without a message".to_string()
        };
        match LOCATION.with(|l| l.borrow_mut().take()) {
            Some(at) => format!("{text} (at {at})"),
            None => text,
        }
    })
}

/// Installs a panic hook that stays silent about panics [`catch`] contains
/// (remembering where they happened for the message) and hands every other
/// panic to the hook that was installed before. The `stepwell` binary
/// installs it at start; an embedding application may.
pub fn install_quiet_hook() {
    let previous = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        if GUARDED.with(|g| g.get()) > 0 {
            let at = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()));
            LOCATION.with(|l| *l.borrow_mut() = at);
        } else {
            previous(info);
        }
    }));
}
