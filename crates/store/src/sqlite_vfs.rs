//! The SQLite store's file layer: SQLite's own Unix files, except that what
//! one transaction writes to the write-ahead log reaches the kernel as one
//! write.
//!
//! SQLite writes each frame of the log with two calls (the frame's 24-byte
//! header, then its page), so a transaction of eight pages costs sixteen
//! system calls, each with the file system's per-call work; measured here,
//! about 40 µs against 16 µs for the same bytes in one call. This layer
//! (a VFS named [`VFS_NAME`], registered once per process, delegating
//! everything to the default Unix VFS) keeps a log file's consecutive writes
//! in a buffer and writes them at once:
//!
//! - when the page of a commit frame (a frame header whose "database size
//!   after commit" field is not zero) has been written: before the write
//!   call that completes the transaction returns, so SQLite only goes on to
//!   publish the commit (in the shared-memory index) once its frames are in
//!   the kernel, as without this layer;
//! - before any other operation on the log file (a read, a sync, a size, a
//!   truncation, a lock, a close);
//! - before the database file's shared-memory operations (`xShmBarrier` in
//!   particular, which SQLite calls between the two copies of the index
//!   header it writes to publish a commit): a safety net should a commit
//!   frame ever be written in a form the first rule does not recognise
//!   (none is known: a test fails any commit frame's page and expects the
//!   error from the write). A
//!   failed write there, where SQLite cannot be told, aborts the process
//!   rather than publish frames that are not in the file (a crash is what
//!   the store is built to survive);
//! - a write behind where the last one ended (a frame of the transaction
//!   written again: a page, a header whose checksum is rewritten) goes
//!   straight to the file, after what was gathered; a write anywhere else
//!   (the transaction's first, which may start where another process's
//!   commit ended, or at the start of a restarted log) starts a new buffer,
//!   so a commit frame is recognised wherever it starts;
//! - when the buffer reaches 1 MiB (a transaction of many pages), written
//!   in pieces of at most 64 KiB (SQLite's Unix file writes less than
//!   128 KiB per call).
//!
//! A write of gathered bytes that fails is reported, and then again by
//! every operation on the log until the transaction's write lock is
//! released (SQLite has then rolled it back): bytes SQLite was told were
//! written but never reached the file can end no transaction but that one.
//!
//! Nothing else changes: the same files, locks and shared memory, so
//! processes using this layer and processes using SQLite's default (the
//! `sqlite3` shell, other programs) share a database as before. A write the
//! kernel has not seen yet belongs to a transaction that has not committed:
//! a process that dies with a full buffer loses only that transaction, as it
//! would have without the buffer.
//!
//! # Safety
//!
//! The unsafe code here rests on SQLite's VFS contract (sqlite3.h,
//! `sqlite3_vfs` and `sqlite3_io_methods`) and on five invariants, which
//! the `SAFETY` comments name:
//!
//! - **(block)** SQLite hands `x_open` at least `szOsFile` bytes, aligned
//!   to 8 (SQLite's allocations are), to fill in. This VFS's `szOsFile` is
//!   [`REAL_OFFSET`] plus the Unix VFS's, so a [`GatherFile`] fits at the
//!   start of the block and the Unix VFS's file at `REAL_OFFSET`, both
//!   aligned (`GatherFile` asks 8 at most, checked at compile time, and
//!   `REAL_OFFSET` is a multiple of 16).
//! - **(open)** A file's methods are called only once `x_open` has
//!   written its [`GatherFile`] (that is where `pMethods` becomes
//!   [`METHODS`]), and not after `x_close` (SQLite clears `pMethods` once
//!   `xClose` returns; `sqlite3OsClose`). So a file passed to a method, or
//!   whose `pMethods` is `METHODS`, holds a live `GatherFile` whose `real`
//!   is the Unix VFS's open file. `x_close` of a log or of its database
//!   file clears the other's `peer`: a `peer` that is not null is open.
//! - **(serial)** SQLite never runs methods of one file in two threads at
//!   once: a file belongs to one pager, used by one connection at a time
//!   (or, in a shared cache, under the shared b-tree's mutex), and a
//!   connection is used by one thread at a time (rusqlite's `Connection`
//!   is not `Sync`). A log and its database file share their pager, so a
//!   `peer` is used under the same exclusion. No reference to a
//!   `GatherFile` is kept past the call that made it.
//! - **(args)** The pointers SQLite passes with a call are valid for that
//!   call as `sqlite3_io_methods` says (`data` for `amount` bytes, read by
//!   `xWrite` and written by `xRead`; `size`, `out` and `arg` as the method
//!   uses them). They go to the Unix VFS's method unchanged, with its own
//!   file, so its contract is met as SQLite would meet it.
//! - **(real)** [`REAL_VFS`] is stored (release) before this VFS is
//!   registered, as the default VFS `sqlite3_vfs_find` returned, which
//!   SQLite keeps for the life of the process; `x_open` is reached only
//!   through the registered VFS, so it loads (acquire) that pointer. The
//!   Unix VFS's `sqlite3_io_methods` are statics in SQLite.
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

use std::ffi::{c_int, c_void, CStr};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

use rusqlite::ffi;

/// The name of the VFS the store's connections open their files with.
pub(crate) const VFS_NAME: &CStr = c"stepwell-unix";

/// The most a log file's buffer holds before it is written.
const MAX_GATHERED: usize = 1 << 20;

/// The most one write to the kernel carries: SQLite's Unix file writes at
/// most 128 KiB less one byte per call (it masks the length with
/// `0x1ffff`), so a larger buffer is written in pieces of this size.
const MAX_WRITE: usize = 64 * 1024;

/// The shared-memory lock a writer holds for its transaction (wal.c's
/// `WAL_WRITE_LOCK`, the first of the shared-memory locks).
const WAL_WRITE_LOCK: c_int = 0;

/// The size of a WAL frame header.
const FRAME_HEADER: c_int = 24;

/// Where the log ends for a file whose transaction has not written yet:
/// the first write of every transaction starts a gathering of its own.
const NO_END: i64 = -1;

/// Whether `bytes`, written alone, are the header of a transaction's
/// commit frame: bytes 4..8 of a frame header are the database's size in
/// pages after a commit, zero in every other frame.
fn is_commit_header(bytes: &[u8]) -> bool {
    bytes.len() == FRAME_HEADER as usize && bytes[4..8] != [0, 0, 0, 0]
}

/// One open file: SQLite's own file object follows it in the same memory.
#[repr(C)]
struct GatherFile {
    base: ffi::sqlite3_file,
    /// The Unix VFS's file (at [`REAL_OFFSET`] in the same allocation).
    real: *mut ffi::sqlite3_file,
    /// Whether this is a write-ahead log (whose writes are gathered).
    wal: bool,
    /// The last write was the header of a commit frame: its page completes
    /// the transaction.
    commit_next: bool,
    /// Where the buffered bytes go in the file.
    start: i64,
    /// Where the last write to the log ended ([`NO_END`] before a
    /// transaction's first): a write there is appended to the buffer, one
    /// behind it (a frame rewritten) goes straight to the file, one
    /// anywhere else starts a new buffer.
    end: i64,
    /// The error a write of gathered bytes met, if one did: every later
    /// operation on the log reports it until the transaction's write lock
    /// is released (SQLite has then rolled the transaction back), so no
    /// commit goes on past bytes that never reached the file.
    failed: c_int,
    /// The gathered writes (consecutive bytes from `start`).
    buf: Vec<u8>,
    /// For a log: its database file; for a database file: its open log.
    /// Both are used by one connection, which SQLite never runs in two
    /// threads at once.
    peer: *mut GatherFile,
}

/// Where SQLite's own file object starts in a file's memory.
const REAL_OFFSET: usize = std::mem::size_of::<GatherFile>().next_multiple_of(16);

// SQLite aligns a file's block to 8 bytes, all a `GatherFile` may ask
// (the "block" invariant of the module's safety notes).
const _: () = assert!(std::mem::align_of::<GatherFile>() <= 8);

thread_local! {
    /// This thread's log writes gathered, and the writes to the kernel they
    /// took (their ratio is the calls saved).
    static COUNTS: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

fn count(gathered: u64, flushed: u64) {
    COUNTS.with(|c| {
        let (g, f) = c.get();
        c.set((g + gathered, f + flushed));
    });
}

/// How many log writes this thread gathered so far, and in how many writes
/// to the kernel.
#[cfg(test)]
pub(crate) fn counts() -> (u64, u64) {
    COUNTS.with(std::cell::Cell::get)
}

/// The default VFS this one delegates to.
static REAL_VFS: AtomicPtr<ffi::sqlite3_vfs> = AtomicPtr::new(ptr::null_mut());

/// Registers the VFS (once per process); the error says why it could not be.
pub(crate) fn register() -> Result<(), String> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            // SAFETY: sqlite3_vfs_find takes a VFS name or, as here, null
            // for the default one; it initialises SQLite itself and
            // returns a pointer or null.
            let real = unsafe { ffi::sqlite3_vfs_find(ptr::null()) };
            if real.is_null() {
                return Err("SQLite has no default VFS".into());
            }
            // SAFETY: `real` is not null and points to a registered VFS,
            // which SQLite keeps for the life of the process and does not
            // change; `sqlite3_vfs` is plain data, copied here.
            let mut vfs = unsafe { *real };
            let real_size = usize::try_from(vfs.szOsFile).unwrap_or(0);
            vfs.zName = VFS_NAME.as_ptr();
            vfs.pNext = ptr::null_mut();
            vfs.szOsFile = c_int::try_from(REAL_OFFSET + real_size)
                .map_err(|_| "the VFS's file size overflows".to_string())?;
            vfs.xOpen = Some(x_open);
            REAL_VFS.store(real, Ordering::Release);
            let vfs: &'static mut ffi::sqlite3_vfs = Box::leak(Box::new(vfs));
            // SAFETY: SQLite keeps the pointer it registers: `vfs` is
            // leaked, so it outlives every connection, and its name is a
            // static string. Its methods but `xOpen` are the Unix VFS's,
            // which do not read the `sqlite3_vfs` they are given (this
            // copy); `x_open` hands the Unix `xOpen`, which does, the real
            // one. `REAL_VFS` is stored before, so `x_open` never finds it
            // null ("real" in the module's notes).
            match unsafe { ffi::sqlite3_vfs_register(vfs, 0) } {
                ffi::SQLITE_OK => Ok(()),
                rc => Err(format!("cannot register the SQLite VFS (code {rc})")),
            }
        })
        .clone()
}

static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: Some(x_shm_map),
    xShmLock: Some(x_shm_lock),
    xShmBarrier: Some(x_shm_barrier),
    xShmUnmap: Some(x_shm_unmap),
    xFetch: Some(x_fetch),
    xUnfetch: Some(x_unfetch),
};

/// Opens a file: the Unix VFS's own, at [`REAL_OFFSET`] in the block, and
/// this layer's [`GatherFile`] at its start.
///
/// # Safety
/// SQLite's `xOpen` contract: `file` is a block of this VFS's `szOsFile`
/// bytes, aligned to 8, for this call to fill in ("block" in the module's
/// safety notes); `name` is null or a file name valid until the file is
/// closed, `out_flags` null or writable ("args").
unsafe extern "C" fn x_open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let real_vfs = REAL_VFS.load(Ordering::Acquire);
    // SAFETY: this method is reached through the registered VFS only, so
    // `real_vfs` is the default VFS, not null and alive ("real").
    let Some(open) = (unsafe { (*real_vfs).xOpen }) else {
        return ffi::SQLITE_CANTOPEN;
    };
    // SAFETY: the block is `REAL_OFFSET` plus the Unix VFS's `szOsFile`
    // bytes ("block"): the offset stays inside it.
    let real = unsafe { file.cast::<u8>().add(REAL_OFFSET) }.cast::<ffi::sqlite3_file>();
    // SAFETY: the Unix `xOpen` gets its own VFS, SQLite's `name`, `flags`
    // and `out_flags` unchanged ("args"), and `real`: the Unix VFS's
    // `szOsFile` bytes, aligned as the block is, which nothing else uses
    // ("block").
    let rc = unsafe { open(real_vfs, name, real, flags, out_flags) };
    // SAFETY: `real` was just handed to `xOpen`, which sets its `pMethods`
    // to null or to its methods (a static) whatever it returns (sqlite3.h).
    let real_methods = unsafe { (*real).pMethods };
    if rc != ffi::SQLITE_OK || real_methods.is_null() {
        if !real_methods.is_null() {
            // SAFETY: a file whose `xOpen` failed but set its methods is
            // still closed, once, with its own `xClose` (sqlite3.h); `real`
            // is not used again.
            unsafe {
                if let Some(close) = (*real_methods).xClose {
                    close(real);
                }
            }
        }
        // SAFETY: the block starts with an `sqlite3_file` ("block"); its
        // `pMethods` null tells SQLite not to call `xClose` on it.
        unsafe { (*file).pMethods = ptr::null() };
        return if rc == ffi::SQLITE_OK {
            ffi::SQLITE_CANTOPEN
        } else {
            rc
        };
    }
    let wal = flags & ffi::SQLITE_OPEN_WAL != 0;
    let mut peer = ptr::null_mut();
    if wal && !name.is_null() {
        // The database file this log belongs to (SQLite keeps it just
        // before the log's name): if it is one of ours, it learns of its log.
        // SAFETY: `name` was passed to this `xOpen` with SQLITE_OPEN_WAL,
        // the one use `sqlite3_database_file_object` allows besides a
        // rollback journal's; it returns the pager's database file, which
        // the pager opened before its log and keeps open until after.
        let db = unsafe { ffi::sqlite3_database_file_object(name) };
        // SAFETY: `db`, not null, is that open file.
        if !db.is_null() && ptr::eq(unsafe { (*db).pMethods }, &METHODS) {
            // Its methods are ours: it holds a `GatherFile` ("open").
            peer = db.cast::<GatherFile>();
        }
    }
    let g = file.cast::<GatherFile>();
    // SAFETY: `g`, the block's start, is aligned and has room for a
    // `GatherFile` ("block"), and nothing in the block is ours to drop
    // yet: it is written whole, without reading what was there. `peer` is
    // a live `GatherFile` of the same pager as this log, so of the same
    // thread ("open", "serial").
    unsafe {
        ptr::write(
            g,
            GatherFile {
                base: ffi::sqlite3_file { pMethods: &METHODS },
                real,
                wal,
                commit_next: false,
                start: 0,
                end: NO_END,
                failed: ffi::SQLITE_OK,
                buf: Vec::new(),
                peer,
            },
        );
        if !peer.is_null() {
            (*peer).peer = g;
        }
    }
    ffi::SQLITE_OK
}

/// The file's own methods (the Unix VFS's).
///
/// # Safety
/// `file` must be one of this VFS's files, set up by `x_open` and not
/// yet closed.
unsafe fn real(
    file: *mut ffi::sqlite3_file,
) -> (*mut ffi::sqlite3_file, &'static ffi::sqlite3_io_methods) {
    // SAFETY: by this function's contract `file` holds a live `GatherFile`,
    // whose `real` is the Unix VFS's open file ("open"): `x_open` keeps
    // only a file whose `pMethods` is set, and those methods are a static
    // of SQLite's, which the Unix VFS does not change while the file is
    // open, so they may be borrowed for `'static`.
    unsafe {
        let real = (*file.cast::<GatherFile>()).real;
        (real, &*(*real).pMethods)
    }
}

/// Writes `amount` bytes at `offset` through the file's own method.
///
/// # Safety
/// `file` must be a set-up file of this VFS and `data` valid for `amount`
/// bytes.
unsafe fn write_through(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    #[cfg(test)]
    if tests::FAIL_WRITES_OVER
        .with(std::cell::Cell::get)
        .is_some_and(|most| amount as usize > most)
    {
        return ffi::SQLITE_IOERR_WRITE;
    }
    // SAFETY: `file` is a set-up file (this function's contract), as `real`
    // asks; the Unix `xWrite` gets its own file and `data`, readable for
    // `amount` bytes (this function's contract).
    unsafe {
        let (real, m) = real(file);
        m.xWrite
            .map_or(ffi::SQLITE_IOERR_WRITE, |w| w(real, data, amount, offset))
    }
}

/// Writes what the log file `g` gathered.
///
/// # Safety
/// `g` must be a set-up log file of this VFS, not used by another thread
/// meanwhile.
unsafe fn flush(g: *mut GatherFile) -> c_int {
    // SAFETY: `g` is a live `GatherFile`, this thread's alone (this
    // function's contract). Only its buffer is borrowed across the writes:
    // `write_through` reads `real`, another field, through the pointer,
    // and the Unix file beyond the `GatherFile`. Each piece is readable
    // for its length.
    unsafe {
        (*g).commit_next = false;
        if (*g).buf.is_empty() {
            return ffi::SQLITE_OK;
        }
        let mut rc = ffi::SQLITE_OK;
        let mut offset = (*g).start;
        let buf = &mut (*g).buf;
        for piece in buf.chunks(MAX_WRITE) {
            rc = write_through(
                g.cast(),
                piece.as_ptr().cast::<c_void>(),
                piece.len() as c_int,
                offset,
            );
            count(0, 1);
            if rc != ffi::SQLITE_OK {
                break;
            }
            offset += piece.len() as i64;
        }
        buf.clear();
        if rc != ffi::SQLITE_OK {
            (*g).failed = rc;
        }
        rc
    }
}

/// Writes what the log file gathered before an operation on it, or on its
/// database file's shared memory.
///
/// On the log itself, a write that failed earlier in the transaction is
/// reported again. On the database file nothing is then pending (a failed
/// write drops what was gathered), and its operations go on: the rollback
/// needs them.
///
/// # Safety
/// `file` must be a set-up file of this VFS, not used by another thread
/// meanwhile.
unsafe fn flush_before(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: `file` holds a live `GatherFile`, this thread's alone (this
    // function's contract); a `peer` that is not null is its open log,
    // of the same pager and so of the same thread ("open", "serial"), as
    // `flush` asks.
    unsafe {
        let g = file.cast::<GatherFile>();
        if (*g).wal {
            if (*g).failed != ffi::SQLITE_OK {
                return (*g).failed;
            }
            return flush(g);
        }
        let log = (*g).peer;
        if log.is_null() || (*log).failed != ffi::SQLITE_OK {
            return ffi::SQLITE_OK;
        }
        flush(log)
    }
}

/// Closes a file, after writing what a log gathered.
///
/// # Safety
/// SQLite's `xClose` contract: `file` is one of this VFS's open files,
/// used by this thread alone, and not used again ("open", "serial").
unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: `file` holds a live `GatherFile`, this thread's alone, as
    // `flush` and `real` ask ("open", "serial"); a `peer` that is not null
    // is open, of the same thread, and no longer points here once this
    // returns. The Unix file is closed once, with its own `xClose`. The
    // buffer, the one field that owns anything, is dropped once: SQLite
    // clears `pMethods` after this call, so no method reaches this
    // `GatherFile` again, and the block is SQLite's to free.
    unsafe {
        let g = file.cast::<GatherFile>();
        let flushed = if (*g).wal { flush(g) } else { ffi::SQLITE_OK };
        let peer = (*g).peer;
        if !peer.is_null() {
            (*peer).peer = ptr::null_mut();
        }
        let (real, m) = real(file);
        let closed = m.xClose.map_or(ffi::SQLITE_OK, |close| close(real));
        ptr::drop_in_place(ptr::addr_of_mut!((*g).buf));
        if flushed != ffi::SQLITE_OK {
            flushed
        } else {
            closed
        }
    }
}

/// Writes to a file: a log's consecutive writes are gathered (the
/// module's notes say when they reach the file), any other straight
/// through.
///
/// # Safety
/// SQLite's `xWrite` contract: `file` is one of this VFS's open files,
/// used by this thread alone; `data` is readable for `amount` bytes
/// ("open", "serial", "args").
unsafe extern "C" fn x_write(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    let g = file.cast::<GatherFile>();
    // SAFETY: `file` holds a live `GatherFile`, this thread's ("open",
    // "serial").
    let wal = unsafe { (*g).wal };
    if !wal || amount <= 0 {
        // SAFETY: `file` is open and this thread's, and `data` readable for
        // `amount` bytes ("args"), as `write_through` asks.
        return unsafe { write_through(file, data, amount, offset) };
    }
    // SAFETY: `amount` is positive here and `data` readable for that many
    // bytes during this call ("args"), which only reads them; the slice is
    // not kept past the call (what is gathered is copied).
    let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), amount as usize) };
    // SAFETY: `g` is a live `GatherFile`, this thread's alone ("open",
    // "serial"), as `flush` and `write_through` ask; its fields are reached
    // through the pointer, no reference to it held across those calls, and
    // `data` is readable for `amount` bytes ("args").
    unsafe {
        if (*g).failed != ffi::SQLITE_OK {
            return (*g).failed;
        }
        if offset < (*g).end {
            // Behind where the last write ended: a frame of this transaction
            // written again (a page, a header whose checksum is rewritten).
            // What is gathered goes first, then this write, straight to the
            // file (its outcome is its own).
            let rc = flush(g);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
            (*g).end = offset + i64::from(amount);
            let rc = write_through(file, data, amount, offset);
            // Should it be a commit frame's header, its page (next) is written
            // before its own write call returns, like any commit frame's.
            (*g).commit_next = rc == ffi::SQLITE_OK && is_commit_header(bytes);
            return rc;
        }
        if offset != (*g).end {
            // Ahead of where the last write ended, or the transaction's first
            // write (another process may have written the log since this
            // connection's last): what is gathered goes first, and a new
            // gathering starts here, so that a commit frame is recognised
            // wherever it starts.
            let rc = flush(g);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
        }
        if (*g).buf.is_empty() {
            (*g).start = offset;
        }
        (*g).end = offset + i64::from(amount);
        (*g).buf.extend_from_slice(bytes);
        count(1, 0);
        if amount == FRAME_HEADER {
            (*g).commit_next = is_commit_header(bytes);
        } else if (*g).commit_next {
            return flush(g);
        }
        if (*g).buf.len() >= MAX_GATHERED {
            return flush(g);
        }
        ffi::SQLITE_OK
    }
}

/// Reads from a file, after writing what its log gathered.
///
/// # Safety
/// SQLite's `xRead` contract: `file` is one of this VFS's open files,
/// used by this thread alone; `data` is writable for `amount` bytes
/// ("open", "serial", "args").
unsafe extern "C" fn x_read(
    file: *mut ffi::sqlite3_file,
    data: *mut c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    // SAFETY: `file` is open and this thread's, as `flush_before` and
    // `real` ask; the Unix `xRead` gets its own file and `data`, writable
    // for `amount` bytes ("args").
    unsafe {
        let rc = flush_before(file);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        let (real, m) = real(file);
        m.xRead
            .map_or(ffi::SQLITE_IOERR_READ, |r| r(real, data, amount, offset))
    }
}

/// Delegates a method that returns a code, after writing what was gathered.
///
/// Expands to calls of `flush_before` and `real` on `$file` and of the Unix
/// VFS's method: used inside an `unsafe` block whose comment says why
/// `$file` is open and this thread's and the arguments valid.
macro_rules! flushed_then {
    ($file:expr, $method:ident, $missing:expr, |$f:ident, $real:ident| $call:expr) => {{
        let rc = flush_before($file);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        let ($real, m) = real($file);
        match m.$method {
            Some($f) => $call,
            None => $missing,
        }
    }};
}

/// Truncates a file, after writing what its log gathered.
///
/// # Safety
/// SQLite's `xTruncate` contract: `file` is one of this VFS's open files,
/// used by this thread alone ("open", "serial").
unsafe extern "C" fn x_truncate(file: *mut ffi::sqlite3_file, size: i64) -> c_int {
    // SAFETY: `file` is open and this thread's, as `flush_before` and
    // `real` ask; the Unix `xTruncate` gets its own file and a plain size.
    unsafe {
        flushed_then!(file, xTruncate, ffi::SQLITE_IOERR_TRUNCATE, |f, r| f(
            r, size
        ))
    }
}

/// Syncs a file, after writing what its log gathered.
///
/// # Safety
/// SQLite's `xSync` contract: `file` is one of this VFS's open files,
/// used by this thread alone ("open", "serial").
unsafe extern "C" fn x_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    // SAFETY: `file` is open and this thread's, as `flush_before` and
    // `real` ask; the Unix `xSync` gets its own file and plain flags.
    unsafe { flushed_then!(file, xSync, ffi::SQLITE_IOERR_FSYNC, |f, r| f(r, flags)) }
}

/// A file's size, after writing what its log gathered.
///
/// # Safety
/// SQLite's `xFileSize` contract: `file` is one of this VFS's open files,
/// used by this thread alone; `size` is writable ("open", "serial",
/// "args").
unsafe extern "C" fn x_file_size(file: *mut ffi::sqlite3_file, size: *mut i64) -> c_int {
    // SAFETY: `file` is open and this thread's, as `flush_before` and
    // `real` ask; the Unix `xFileSize` gets its own file and `size`,
    // writable ("args").
    unsafe { flushed_then!(file, xFileSize, ffi::SQLITE_IOERR_FSTAT, |f, r| f(r, size)) }
}

/// Takes a file lock, after writing what its log gathered.
///
/// # Safety
/// SQLite's `xLock` contract: `file` is one of this VFS's open files,
/// used by this thread alone ("open", "serial").
unsafe extern "C" fn x_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: `file` is open and this thread's, as `flush_before` and
    // `real` ask; the Unix `xLock` gets its own file and a plain level.
    unsafe { flushed_then!(file, xLock, ffi::SQLITE_IOERR_LOCK, |f, r| f(r, level)) }
}

/// Releases a file lock, after writing what its log gathered (whatever
/// that write says).
///
/// # Safety
/// SQLite's `xUnlock` contract: `file` is one of this VFS's open files,
/// used by this thread alone ("open", "serial").
unsafe extern "C" fn x_unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: `file` is open and this thread's, as `flush_before` and
    // `real` ask; the Unix `xUnlock` gets its own file and a plain level.
    unsafe {
        // Always unlocked (SQLite does not act on an unlock's error), whatever
        // writing what was gathered said.
        let flushed = flush_before(file);
        let (real, m) = real(file);
        let unlocked = m.xUnlock.map_or(ffi::SQLITE_OK, |f| f(real, level));
        if flushed != ffi::SQLITE_OK {
            flushed
        } else {
            unlocked
        }
    }
}

/// Whether another connection holds a reserved lock, after writing what
/// the log gathered.
///
/// # Safety
/// SQLite's `xCheckReservedLock` contract: `file` is one of this VFS's
/// open files, used by this thread alone; `out` is writable ("open",
/// "serial", "args").
unsafe extern "C" fn x_check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    // SAFETY: `file` is open and this thread's, as `flush_before` and
    // `real` ask; the Unix `xCheckReservedLock` gets its own file and
    // `out`, writable ("args").
    unsafe {
        flushed_then!(
            file,
            xCheckReservedLock,
            ffi::SQLITE_IOERR_CHECKRESERVEDLOCK,
            |f, r| f(r, out)
        )
    }
}

/// A file control, after writing what the log gathered.
///
/// # Safety
/// SQLite's `xFileControl` contract: `file` is one of this VFS's open
/// files, used by this thread alone; `arg` is what `op` asks ("open",
/// "serial", "args").
unsafe extern "C" fn x_file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: `file` is open and this thread's, as `flush_before` and
    // `real` ask; the Unix `xFileControl` gets its own file, `op` and
    // `arg`, valid for `op` as SQLite passed them ("args").
    unsafe {
        flushed_then!(file, xFileControl, ffi::SQLITE_NOTFOUND, |f, r| f(
            r, op, arg
        ))
    }
}

/// The file's sector size (the Unix VFS's).
///
/// # Safety
/// SQLite's `xSectorSize` contract: `file` is one of this VFS's open
/// files, used by this thread alone ("open", "serial").
unsafe extern "C" fn x_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: `file` is open, as `real` asks; the Unix `xSectorSize` gets
    // its own file.
    unsafe {
        let (real, m) = real(file);
        m.xSectorSize.map_or(4096, |f| f(real))
    }
}

/// The file's device characteristics (the Unix VFS's).
///
/// # Safety
/// SQLite's `xDeviceCharacteristics` contract: `file` is one of this
/// VFS's open files, used by this thread alone ("open", "serial").
unsafe extern "C" fn x_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: `file` is open, as `real` asks; the Unix
    // `xDeviceCharacteristics` gets its own file.
    unsafe {
        let (real, m) = real(file);
        m.xDeviceCharacteristics.map_or(0, |f| f(real))
    }
}

/// Maps a region of the shared memory, after writing what the log
/// gathered.
///
/// # Safety
/// SQLite's `xShmMap` contract: `file` is one of this VFS's open files,
/// used by this thread alone; `out` is writable ("open", "serial",
/// "args").
unsafe extern "C" fn x_shm_map(
    file: *mut ffi::sqlite3_file,
    page: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    // SAFETY: `file` is open and this thread's, as `flush_before` and
    // `real` ask; the Unix `xShmMap` gets its own file and `out`, writable
    // ("args").
    unsafe {
        flushed_then!(file, xShmMap, ffi::SQLITE_IOERR_SHMMAP, |f, r| f(
            r, page, size, extend, out
        ))
    }
}

/// Takes or releases shared-memory locks, after writing what the log
/// gathered; the release of the write lock ends the log's transaction.
///
/// # Safety
/// SQLite's `xShmLock` contract: `file` is one of this VFS's open files,
/// used by this thread alone ("open", "serial").
unsafe extern "C" fn x_shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: `file` holds a live `GatherFile`, this thread's alone, as
    // `flush_before` and `real` ask ("open", "serial"); its `peer`, if not
    // null, is its open log, of the same thread: its fields are reached
    // through the pointer, no reference kept. The Unix `xShmLock` gets its
    // own file and plain numbers.
    unsafe {
        let g = file.cast::<GatherFile>();
        let flushed = flush_before(file);
        let unlock = flags & ffi::SQLITE_SHM_UNLOCK != 0;
        if flushed != ffi::SQLITE_OK && !unlock {
            return flushed;
        }
        let log = (*g).peer;
        if unlock && offset == WAL_WRITE_LOCK && !(*g).wal && !log.is_null() {
            // The transaction is over (committed, or rolled back after a failed
            // write): the next one starts clean, and where the log ends is
            // learnt from its first write (other processes may write first).
            (*log).failed = ffi::SQLITE_OK;
            (*log).buf.clear();
            (*log).end = NO_END;
            (*log).commit_next = false;
        }
        // An unlock always happens (SQLite does not act on its error).
        let (real, m) = real(file);
        let locked = m
            .xShmLock
            .map_or(ffi::SQLITE_IOERR_SHMLOCK, |f| f(real, offset, n, flags));
        if flushed != ffi::SQLITE_OK {
            flushed
        } else {
            locked
        }
    }
}

/// The shared-memory barrier, after writing what the log gathered (or
/// stopping the process should that fail: a commit is being published).
///
/// # Safety
/// SQLite's `xShmBarrier` contract: `file` is one of this VFS's open
/// files, used by this thread alone ("open", "serial").
unsafe extern "C" fn x_shm_barrier(file: *mut ffi::sqlite3_file) {
    // SAFETY: `file` is open and this thread's, as `flush_before` and
    // `real` ask; the Unix `xShmBarrier` gets its own file.
    unsafe {
        if flush_before(file) != ffi::SQLITE_OK {
            // SQLite is publishing a commit whose frames could not be written,
            // and this call cannot say so: stop here rather than let readers
            // take what is in the file for the commit.
            eprintln!("stepwell: a write to the SQLite write-ahead log failed while a commit was published; stopping");
            std::process::abort();
        }
        let (real, m) = real(file);
        if let Some(f) = m.xShmBarrier {
            f(real);
        }
    }
}

/// Unmaps the shared memory, after writing what the log gathered.
///
/// # Safety
/// SQLite's `xShmUnmap` contract: `file` is one of this VFS's open files,
/// used by this thread alone ("open", "serial").
unsafe extern "C" fn x_shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    // SAFETY: `file` is open and this thread's, as `flush_before` and
    // `real` ask; the Unix `xShmUnmap` gets its own file and a plain flag.
    unsafe { flushed_then!(file, xShmUnmap, ffi::SQLITE_OK, |f, r| f(r, delete)) }
}

/// A page of the file's memory map (the Unix VFS's), or none.
///
/// # Safety
/// SQLite's `xFetch` contract: `file` is one of this VFS's open files,
/// used by this thread alone; `out` is writable ("open", "serial",
/// "args").
unsafe extern "C" fn x_fetch(
    file: *mut ffi::sqlite3_file,
    offset: i64,
    amount: c_int,
    out: *mut *mut c_void,
) -> c_int {
    // SAFETY: `file` is open, as `real` asks; the Unix `xFetch` (a version
    // 3 method) gets its own file and `out`, which is writable ("args"),
    // as it is for the null written when there is no such method.
    unsafe {
        let (real, m) = real(file);
        match m.xFetch {
            Some(f) if m.iVersion >= 3 => f(real, offset, amount, out),
            _ => {
                *out = ptr::null_mut();
                ffi::SQLITE_OK
            }
        }
    }
}

/// Gives back a page `x_fetch` returned (the Unix VFS's).
///
/// # Safety
/// SQLite's `xUnfetch` contract: `file` is one of this VFS's open files,
/// used by this thread alone; `p` is null or a page `x_fetch` returned
/// ("open", "serial", "args").
unsafe extern "C" fn x_unfetch(file: *mut ffi::sqlite3_file, offset: i64, p: *mut c_void) -> c_int {
    // SAFETY: `file` is open, as `real` asks; the Unix `xUnfetch` gets its
    // own file and `p`, a page its own `xFetch` returned, or null ("args").
    unsafe {
        let (real, m) = real(file);
        match m.xUnfetch {
            Some(f) if m.iVersion >= 3 => f(real, offset, p),
            _ => ffi::SQLITE_OK,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlite::{configure, open_connection};
    use crate::Durability;
    use std::cell::Cell;

    thread_local! {
        /// Makes this thread's writes through the layer of more than this
        /// many bytes fail (as a full disk would), without touching the
        /// file.
        pub(super) static FAIL_WRITES_OVER: Cell<Option<usize>> = const { Cell::new(None) };
    }

    fn fail_writes_over(bytes: Option<usize>) {
        FAIL_WRITES_OVER.with(|f| f.set(bytes));
    }

    fn rows(conn: &rusqlite::Connection) -> Vec<i64> {
        conn.prepare("SELECT x FROM t ORDER BY x")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    fn integrity(conn: &rusqlite::Connection) -> String {
        conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap()
    }

    fn open(path: &std::path::Path) -> rusqlite::Connection {
        let conn = open_connection(path).unwrap();
        configure(&conn, Durability::Normal).unwrap();
        conn
    }

    /// A new database at `path` with a table `t` holding the row 1.
    fn with_one_row(path: &std::path::Path) -> rusqlite::Connection {
        let conn = open(path);
        conn.execute_batch("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1);")
            .unwrap();
        conn
    }

    /// The file object SQLite keeps for `op` (the database file or its log).
    ///
    /// # Safety
    /// `op` must be a file control that writes one `sqlite3_file` pointer
    /// to its argument (`SQLITE_FCNTL_FILE_POINTER`,
    /// `SQLITE_FCNTL_JOURNAL_POINTER`). The pointer returned is valid only
    /// while the file stays open in `conn`.
    unsafe fn file_of(conn: &rusqlite::Connection, op: c_int) -> *mut ffi::sqlite3_file {
        // SAFETY: `conn.handle()` is the connection's open handle and
        // "main" a NUL-terminated name; `op` writes one pointer to `file`,
        // a local of that type (this function's contract). SQLite sets the
        // pointer to an open file, or null, which the assertion refuses
        // before it is read.
        unsafe {
            let mut file: *mut ffi::sqlite3_file = ptr::null_mut();
            let rc = ffi::sqlite3_file_control(
                conn.handle(),
                c"main".as_ptr(),
                op,
                ptr::addr_of_mut!(file).cast(),
            );
            assert_eq!(rc, ffi::SQLITE_OK);
            assert!(!file.is_null());
            assert!(ptr::eq((*file).pMethods, &METHODS), "not the store's layer");
            file
        }
    }

    /// A write of gathered bytes that fails where SQLite is not told at
    /// once (here: the operation that wrote them reports it, but SQLite
    /// may call another method next) is remembered: every later operation
    /// on the log reports it, even once the kernel would take the bytes,
    /// so the transaction cannot commit past bytes that never reached the
    /// file. The transaction's end (its write lock released) forgets it.
    #[test]
    fn a_failed_write_of_gathered_bytes_fails_the_rest_of_its_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.sqlite");
        let conn = with_one_row(&path);
        conn.execute_batch("BEGIN IMMEDIATE; INSERT INTO t VALUES (2);")
            .unwrap();
        // SAFETY: `file_of` is asked for the two file-pointer controls; the
        // files are the connection's own, set up by `x_open`, and stay
        // open throughout (a transaction keeps its log open, a failed
        // commit too). Their methods are called as SQLite would: from this
        // thread, the one that uses `conn`, between its statements, with
        // buffers valid for the lengths given.
        unsafe {
            let log = file_of(&conn, ffi::SQLITE_FCNTL_JOURNAL_POINTER);
            let db = file_of(&conn, ffi::SQLITE_FCNTL_FILE_POINTER);
            let g = log.cast::<GatherFile>();
            assert!((*g).wal && !(*db.cast::<GatherFile>()).wal);
            let m = &*(*log).pMethods;
            // Bytes of a frame that does not end the transaction: gathered.
            let bytes = [7u8; 100];
            let end = (*g).end;
            assert_eq!(
                m.xWrite.unwrap()(log, bytes.as_ptr().cast(), 100, end),
                ffi::SQLITE_OK
            );
            assert_eq!((*g).buf.len(), 100);
            // Their write fails.
            let mut size = 0i64;
            fail_writes_over(Some(0));
            let rc = m.xFileSize.unwrap()(log, &mut size);
            fail_writes_over(None);
            assert_eq!(rc, ffi::SQLITE_IOERR_WRITE);
            assert!((*g).buf.is_empty(), "the failed bytes are dropped");
            // Remembered: the kernel would take writes again, yet every
            // operation on the log reports the failure.
            let mut header = [0u8; 32];
            assert_eq!(
                m.xRead.unwrap()(log, header.as_mut_ptr().cast(), 32, 0),
                ffi::SQLITE_IOERR_WRITE
            );
            assert_eq!(
                m.xSync.unwrap()(log, ffi::SQLITE_SYNC_NORMAL),
                ffi::SQLITE_IOERR_WRITE
            );
            assert_eq!(
                m.xFileSize.unwrap()(log, &mut size),
                ffi::SQLITE_IOERR_WRITE
            );
            assert_eq!(
                m.xWrite.unwrap()(log, bytes.as_ptr().cast(), 100, end),
                ffi::SQLITE_IOERR_WRITE
            );
            assert!((*g).buf.is_empty(), "nothing gathered after the failure");
            // The database file's own operations go on: the rollback needs them.
            let dm = &*(*db).pMethods;
            assert_eq!(dm.xFileSize.unwrap()(db, &mut size), ffi::SQLITE_OK);
            // The commit's frames meet the remembered failure: it fails,
            // and the transaction is rolled back.
            let err = conn.execute_batch("COMMIT").unwrap_err();
            assert!(err.to_string().contains("disk I/O error"), "{err}");
            if !conn.is_autocommit() {
                conn.execute_batch("ROLLBACK").unwrap();
            }
            // The write lock is released: the failure is forgotten. (The
            // log's file object is still SQLite's: a failed commit leaves
            // the log open.)
            assert_eq!((*g).failed, ffi::SQLITE_OK);
        }
        conn.execute_batch("INSERT INTO t VALUES (3);").unwrap();
        drop(conn);
        // A fresh connection finds the first and last rows only, and a
        // whole database.
        let conn = open(&path);
        assert_eq!(rows(&conn), vec![1, 3]);
        assert_eq!(integrity(&conn), "ok");
    }

    /// A transaction's first write to the log does not start where this
    /// connection's last ended (another connection, or process, committed
    /// since): its commit frame must still be recognised, so that the
    /// frame's page is written, or fails, before the write call that
    /// completes the commit returns. (Written straight, the 24-byte header
    /// of a one-frame commit got through and its page was left for the
    /// shared-memory barrier, where a full disk aborted the process.)
    #[test]
    fn a_commit_whose_frames_start_where_another_connection_ended_fails_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.sqlite");
        let a = with_one_row(&path);
        let b = open(&path);
        assert_eq!(rows(&b), vec![1]);
        a.execute_batch("INSERT INTO t VALUES (2);").unwrap();
        // A full disk that still takes a frame's 24-byte header but not
        // its page: b's one-frame commit fails, with an error, and the
        // process goes on.
        fail_writes_over(Some(FRAME_HEADER as usize));
        let err = b.execute_batch("INSERT INTO t VALUES (3);").unwrap_err();
        fail_writes_over(None);
        assert!(err.to_string().contains("disk I/O error"), "{err}");
        assert!(b.is_autocommit(), "the failed commit was rolled back");
        // The disk has room again: both connections commit, in turns.
        b.execute_batch("INSERT INTO t VALUES (4);").unwrap();
        a.execute_batch("INSERT INTO t VALUES (5);").unwrap();
        b.execute_batch("INSERT INTO t VALUES (6);").unwrap();
        drop((a, b));
        let conn = open(&path);
        assert_eq!(rows(&conn), vec![1, 2, 4, 5, 6]);
        assert_eq!(integrity(&conn), "ok");
    }
}
