//! The store conformance suite on [`CountingStore`]: one test per check
//! (`store_conformance!`), and what a failure looks like.

use std::path::Path;
use std::sync::Arc;

use stepwell::store::conformance::fixtures::{fence, run, save};
use stepwell::store::conformance::{self, Harness, Verdict};
use stepwell::{CommandStore, LeaseAfter, MemoryCommandStore, Store};
use stepwell_store_conformance::CountingStore;

/// How the suite opens a [`CountingStore`].
struct Counting;

impl Harness for Counting {
    fn name(&self) -> &str {
        "CountingStore"
    }

    fn open(&self, _dir: &Path) -> Arc<dyn Store> {
        Arc::new(CountingStore::new())
    }

    // In memory: nothing is there when it is opened again, so the checks
    // of a reopen are skipped.
    fn reopens(&self) -> bool {
        false
    }

    // The command inbox that goes with it; without this (the default,
    // `None`) the suite skips the inbox's checks. The snapshot and
    // artifact stores are left out: their checks are skipped.
    fn commands(&self, _dir: &Path) -> Option<Arc<dyn CommandStore>> {
        Some(Arc::new(MemoryCommandStore::new()))
    }
}

stepwell::store_conformance!(Counting);

/// The store does its own work between the suite's calls: a commit that
/// lands is counted, one the store refuses is not.
#[test]
fn commits_are_counted() {
    let store = CountingStore::new();
    let mut r = run("r1", "wf");
    store.create_if_absent(&r).unwrap();
    save(&store, &[], &mut r, 1);
    let stale = store.commit(&[], &r, fence(1, None), LeaseAfter::Release);
    assert_eq!(stale.unwrap_err().code, "conflict");
    assert_eq!(store.commits(), 1);
}

/// A harness that says its in-memory store survives a reopen fails the
/// reopen check, and the failure names the check and the backend.
#[test]
fn a_broken_promise_names_the_check_and_the_backend() {
    struct Boastful;
    impl Harness for Boastful {
        fn name(&self) -> &str {
            "a boastful CountingStore"
        }
        fn open(&self, _dir: &Path) -> Arc<dyn Store> {
            Arc::new(CountingStore::new())
        }
        fn reopens(&self) -> bool {
            true
        }
    }
    let check = conformance::CHECKS
        .iter()
        .find(|c| c.name == "a_reopened_store_has_everything")
        .unwrap();
    let failure = conformance::run(&Boastful, check).unwrap_err();
    assert_eq!(failure.check, "a_reopened_store_has_everything");
    assert_eq!(failure.backend, "a boastful CountingStore");
    assert!(
        failure.to_string().starts_with(
            "store conformance check `a_reopened_store_has_everything` failed on a boastful CountingStore: "
        ),
        "{failure}"
    );
    assert_eq!(
        conformance::run(&Counting, check).unwrap(),
        Verdict::Skipped("the store does not survive a reopen (Harness::reopens)".into())
    );
}
