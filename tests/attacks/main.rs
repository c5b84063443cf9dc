//! Attacks from a hostile neighbour (issue: hostile neighbours), each tried
//! against the real binary or library the way an attacker would: a caller
//! without credentials, a guest naming ids it does not own, another local
//! user beside the store's files, a reader of a very long ledger. Every test
//! here fails with its defence removed.

mod files;
mod http;
mod ids;
mod parsers;
