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
//! The unsafe code here relies on SQLite's VFS contract (sqlite3.h, "OS
//! Interface Object") and on how the store uses its connections:
//!
//! - SQLite allocates `szOsFile` bytes for each file (this VFS asks for a
//!   [`GatherFile`] and the Unix VFS's own file object after it, at
//!   [`REAL_OFFSET`]) and passes them to `x_open` to set up; every other
//!   method is called with a file `x_open` set up, until `x_close` returns.
//! - SQLite calls one file's methods from one thread at a time: a
//!   connection is used by one thread at a time (the store holds it behind
//!   a mutex), and a log and its database file belong to one connection, so
//!   `peer` is read and written by that thread only; `x_close` of either
//!   clears the other's.
//! - The pointers passed with a call (`data` of `amount` bytes, `out`,
//!   `size`) are valid for that call.
//! - [`REAL_VFS`] is set before this VFS is registered, to the default VFS,
//!   which lives as long as the process.
#![deny(unsafe_op_in_unsafe_fn)]

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
            // SAFETY: sqlite3_vfs_find initialises SQLite and returns a
            // VFS that lives as long as the process (or null). The copy
            // is leaked: a registered VFS must outlive every connection.
            unsafe {
                let real = ffi::sqlite3_vfs_find(ptr::null());
                if real.is_null() {
                    return Err("SQLite has no default VFS".into());
                }
                let real_size = usize::try_from((*real).szOsFile).unwrap_or(0);
                let mut vfs = *real;
                vfs.zName = VFS_NAME.as_ptr();
                vfs.pNext = ptr::null_mut();
                vfs.szOsFile = c_int::try_from(REAL_OFFSET + real_size)
                    .map_err(|_| "the VFS's file size overflows".to_string())?;
                vfs.xOpen = Some(x_open);
                REAL_VFS.store(real, Ordering::Release);
                let vfs: &'static mut ffi::sqlite3_vfs = Box::leak(Box::new(vfs));
                match ffi::sqlite3_vfs_register(vfs, 0) {
                    ffi::SQLITE_OK => Ok(()),
                    rc => Err(format!("cannot register the SQLite VFS (code {rc})")),
                }
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

unsafe extern "C" fn x_open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: SQLite passes `file`, a block of this VFS's `szOsFile` bytes, for `x_open`
    // to set up: the Unix VFS opens its file at `REAL_OFFSET` in it, and a `GatherFile`
    // is written at its start; `REAL_VFS` was set before the VFS was registered; `name`
    // and `out_flags` are as SQLite passes them to the Unix VFS (module docs, "Safety").
    unsafe {
        let real_vfs = REAL_VFS.load(Ordering::Acquire);
        let Some(open) = (*real_vfs).xOpen else {
            return ffi::SQLITE_CANTOPEN;
        };
        let real = file
            .cast::<u8>()
            .add(REAL_OFFSET)
            .cast::<ffi::sqlite3_file>();
        let rc = open(real_vfs, name, real, flags, out_flags);
        if rc != ffi::SQLITE_OK || (*real).pMethods.is_null() {
            if !(*real).pMethods.is_null() {
                if let Some(close) = (*(*real).pMethods).xClose {
                    close(real);
                }
            }
            (*file).pMethods = ptr::null();
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
            let db = ffi::sqlite3_database_file_object(name);
            if !db.is_null() && ptr::eq((*db).pMethods, &METHODS) {
                peer = db.cast::<GatherFile>();
            }
        }
        let g = file.cast::<GatherFile>();
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
        ffi::SQLITE_OK
    }
}

/// The file's own methods (the Unix VFS's).
///
/// # Safety
/// `file` must be one of this VFS's files, set up by `x_open` and not
/// yet closed.
unsafe fn real(
    file: *mut ffi::sqlite3_file,
) -> (*mut ffi::sqlite3_file, &'static ffi::sqlite3_io_methods) {
    // SAFETY: as this function's contract says, `file` is a set-up file: its `GatherFile`
    // names the Unix VFS's open file, whose methods live as long as the process.
    unsafe {
        let g = file.cast::<GatherFile>();
        let real = (*g).real;
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
    // SAFETY: `file` is a set-up file and `data` holds `amount` bytes (this function's
    // contract).
    unsafe {
        #[cfg(test)]
        if tests::FAIL_WRITES_OVER
            .with(std::cell::Cell::get)
            .is_some_and(|most| amount as usize > most)
        {
            return ffi::SQLITE_IOERR_WRITE;
        }
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
    // SAFETY: `g` is a set-up log file used by this thread alone (this function's
    // contract); its buffer is written through its own Unix file.
    unsafe {
        let gf = &mut *g;
        gf.commit_next = false;
        if gf.buf.is_empty() {
            return ffi::SQLITE_OK;
        }
        let mut rc = ffi::SQLITE_OK;
        let mut offset = gf.start;
        for piece in gf.buf.chunks(MAX_WRITE) {
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
        gf.buf.clear();
        if rc != ffi::SQLITE_OK {
            gf.failed = rc;
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
    // SAFETY: `file` is a set-up file used by this thread alone, and so is its `peer`
    // while it is not null (x_close clears it).
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

unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: `file` is one of this VFS's files, set up by `x_open` and not yet closed,
    // used by one thread at a time; the pointers SQLite passes with it are valid as its
    // VFS contract says (module docs, "Safety").
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

unsafe extern "C" fn x_write(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    // SAFETY: `file` is one of this VFS's files, set up by `x_open` and not yet closed,
    // used by one thread at a time; the pointers SQLite passes with it are valid as its
    // VFS contract says (module docs, "Safety").
    unsafe {
        let g = file.cast::<GatherFile>();
        if !(*g).wal || amount <= 0 {
            return write_through(file, data, amount, offset);
        }
        let gf = &mut *g;
        if gf.failed != ffi::SQLITE_OK {
            return gf.failed;
        }
        if offset < gf.end {
            // Behind where the last write ended: a frame of this transaction
            // written again (a page, a header whose checksum is rewritten).
            // What is gathered goes first, then this write, straight to the
            // file (its outcome is its own).
            let rc = flush(g);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
            let gf = &mut *g;
            gf.end = offset + i64::from(amount);
            let rc = write_through(file, data, amount, offset);
            // Should it be a commit frame's header, its page (next) is written
            // before its own write call returns, like any commit frame's.
            let bytes = std::slice::from_raw_parts(data.cast::<u8>(), amount as usize);
            gf.commit_next = rc == ffi::SQLITE_OK && is_commit_header(bytes);
            return rc;
        }
        if offset != gf.end {
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
        let gf = &mut *g;
        if gf.buf.is_empty() {
            gf.start = offset;
        }
        gf.end = offset + i64::from(amount);
        let bytes = std::slice::from_raw_parts(data.cast::<u8>(), amount as usize);
        gf.buf.extend_from_slice(bytes);
        count(1, 0);
        if amount == FRAME_HEADER {
            gf.commit_next = is_commit_header(bytes);
        } else if gf.commit_next {
            return flush(g);
        }
        if gf.buf.len() >= MAX_GATHERED {
            return flush(g);
        }
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn x_read(
    file: *mut ffi::sqlite3_file,
    data: *mut c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    // SAFETY: `file` is one of this VFS's files, set up by `x_open` and not yet closed,
    // used by one thread at a time; the pointers SQLite passes with it are valid as its
    // VFS contract says (module docs, "Safety").
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

unsafe extern "C" fn x_truncate(file: *mut ffi::sqlite3_file, size: i64) -> c_int {
    // SAFETY: `file` is one of this VFS's files, set up by `x_open` and not yet closed,
    // used by one thread at a time; the pointers SQLite passes with it are valid as its
    // VFS contract says (module docs, "Safety").
    unsafe {
        flushed_then!(file, xTruncate, ffi::SQLITE_IOERR_TRUNCATE, |f, r| f(
            r, size
        ))
    }
}

unsafe extern "C" fn x_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    // SAFETY: `file` is one of this VFS's files, set up by `x_open` and not yet closed,
    // used by one thread at a time; the pointers SQLite passes with it are valid as its
    // VFS contract says (module docs, "Safety").
    unsafe { flushed_then!(file, xSync, ffi::SQLITE_IOERR_FSYNC, |f, r| f(r, flags)) }
}

unsafe extern "C" fn x_file_size(file: *mut ffi::sqlite3_file, size: *mut i64) -> c_int {
    // SAFETY: `file` is one of this VFS's files, set up by `x_open` and not yet closed,
    // used by one thread at a time; the pointers SQLite passes with it are valid as its
    // VFS contract says (module docs, "Safety").
    unsafe { flushed_then!(file, xFileSize, ffi::SQLITE_IOERR_FSTAT, |f, r| f(r, size)) }
}

unsafe extern "C" fn x_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: `file` is one of this VFS's files, set up by `x_open` and not yet closed,
    // used by one thread at a time; the pointers SQLite passes with it are valid as its
    // VFS contract says (module docs, "Safety").
    unsafe { flushed_then!(file, xLock, ffi::SQLITE_IOERR_LOCK, |f, r| f(r, level)) }
}

unsafe extern "C" fn x_unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: `file` is one of this VFS's files, set up by `x_open` and not yet closed,
    // used by one thread at a time; the pointers SQLite passes with it are valid as its
    // VFS contract says (module docs, "Safety").
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

unsafe extern "C" fn x_check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    // SAFETY: `file` is one of this VFS's files, set up by `x_open` and not yet closed,
    // used by one thread at a time; the pointers SQLite passes with it are valid as its
    // VFS contract says (module docs, "Safety").
    unsafe {
        flushed_then!(
            file,
            xCheckReservedLock,
            ffi::SQLITE_IOERR_CHECKRESERVEDLOCK,
            |f, r| f(r, out)
        )
    }
}

unsafe extern "C" fn x_file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: `file` is one of this VFS's files, set up by `x_open` and not yet closed,
    // used by one thread at a time; the pointers SQLite passes with it are valid as its
    // VFS contract says (module docs, "Safety").
    unsafe {
        flushed_then!(file, xFileControl, ffi::SQLITE_NOTFOUND, |f, r| f(
            r, op, arg
        ))
    }
}

unsafe extern "C" fn x_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: `file` is one of this VFS's files, set up by `x_open` and not yet closed,
    // used by one thread at a time; the pointers SQLite passes with it are valid as its
    // VFS contract says (module docs, "Safety").
    unsafe {
        let (real, m) = real(file);
        m.xSectorSize.map_or(4096, |f| f(real))
    }
}

unsafe extern "C" fn x_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: `file` is one of this VFS's files, set up by `x_open` and not yet closed,
    // used by one thread at a time; the pointers SQLite passes with it are valid as its
    // VFS contract says (module docs, "Safety").
    unsafe {
        let (real, m) = real(file);
        m.xDeviceCharacteristics.map_or(0, |f| f(real))
    }
}

unsafe extern "C" fn x_shm_map(
    file: *mut ffi::sqlite3_file,
    page: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    // SAFETY: `file` is one of this VFS's files, set up by `x_open` and not yet closed,
    // used by one thread at a time; the pointers SQLite passes with it are valid as its
    // VFS contract says (module docs, "Safety").
    unsafe {
        flushed_then!(file, xShmMap, ffi::SQLITE_IOERR_SHMMAP, |f, r| f(
            r, page, size, extend, out
        ))
    }
}

unsafe extern "C" fn x_shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: `file` is one of this VFS's files, set up by `x_open` and not yet closed,
    // used by one thread at a time; the pointers SQLite passes with it are valid as its
    // VFS contract says (module docs, "Safety").
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

unsafe extern "C" fn x_shm_barrier(file: *mut ffi::sqlite3_file) {
    // SAFETY: `file` is one of this VFS's files, set up by `x_open` and not yet closed,
    // used by one thread at a time; the pointers SQLite passes with it are valid as its
    // VFS contract says (module docs, "Safety").
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

unsafe extern "C" fn x_shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    // SAFETY: `file` is one of this VFS's files, set up by `x_open` and not yet closed,
    // used by one thread at a time; the pointers SQLite passes with it are valid as its
    // VFS contract says (module docs, "Safety").
    unsafe { flushed_then!(file, xShmUnmap, ffi::SQLITE_OK, |f, r| f(r, delete)) }
}

unsafe extern "C" fn x_fetch(
    file: *mut ffi::sqlite3_file,
    offset: i64,
    amount: c_int,
    out: *mut *mut c_void,
) -> c_int {
    // SAFETY: `file` is one of this VFS's files, set up by `x_open` and not yet closed,
    // used by one thread at a time; the pointers SQLite passes with it are valid as its
    // VFS contract says (module docs, "Safety").
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

unsafe extern "C" fn x_unfetch(file: *mut ffi::sqlite3_file, offset: i64, p: *mut c_void) -> c_int {
    // SAFETY: `file` is one of this VFS's files, set up by `x_open` and not yet closed,
    // used by one thread at a time; the pointers SQLite passes with it are valid as its
    // VFS contract says (module docs, "Safety").
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
    unsafe fn file_of(conn: &rusqlite::Connection, op: c_int) -> *mut ffi::sqlite3_file {
        // SAFETY: the handle is the connection's own and the file-control call only reads
        // its file pointer into `p`.
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
        // SAFETY: the files are the connection's own, set up by `x_open`
        // and open while `conn` is; this thread alone uses the connection,
        // and the buffers passed live across each call.
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
