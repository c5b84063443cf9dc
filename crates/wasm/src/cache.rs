//! The on-disk cache of compiled components, trusted only when proven.
//!
//! Compiled code is native code: loading a file of it is as good as running
//! whatever it holds. So the cache
//!
//! - lives in a directory this process's user owns and nobody else may
//!   write: created `0700`, and refused (with an error naming it) when it
//!   is a symbolic link, belongs to another user or is writable by group or
//!   others, checked again before every load;
//! - reads a cached file (and its digest file) only if it is a regular
//!   file, not a link, owned by this user and writable by nobody else;
//! - loads a file only when the SHA-256 of its bytes matches the digest
//!   recorded when this host wrote it ([`CompiledDigests`]: in the run
//!   store when the host has a SQLite store, else in a `<file>.sha256`
//!   beside it), and deserializes those very bytes (never the file again);
//!   a file that does not match is ignored and compiled anew;
//! - writes through a temp file unique to the process and thread, created
//!   `0600` whatever the umask (never through a link, never over a file),
//!   synced before it is renamed into place, and vouches for it only after;
//! - compiles a component under an advisory lock of `.<name>.lock` in the
//!   directory, so that hosts started together compile it once and the
//!   others read it ([`CompileLock`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use stepwell_store::private::{self, read_file as read_private_file, write_synced};

use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::Engine;

pub use stepwell_store::CompiledDigests;

/// Digests kept beside the cached files, as `<name>.sha256`.
#[derive(Debug)]
pub(crate) struct SidecarDigests {
    dir: PathBuf,
}

impl CompiledDigests for SidecarDigests {
    fn vouched(&self, name: &str) -> Option<[u8; 32]> {
        check_private_dir(&self.dir).ok()?;
        let bytes = read_private_file(&self.dir.join(format!("{name}.sha256")))?;
        let text = String::from_utf8(bytes).ok()?;
        hex::decode(text.trim()).ok()?.try_into().ok()
    }

    fn vouch(&self, name: &str, digest: &[u8; 32]) {
        let _ = write_synced(
            &self.dir.join(format!("{name}.sha256")),
            hex::encode(digest).as_bytes(),
        );
    }
}

/// The compile cache of one engine.
#[derive(Debug)]
pub(crate) struct CompileCache {
    dir: PathBuf,
    digests: Arc<dyn CompiledDigests>,
}

impl CompileCache {
    /// Opens (creating `0700` if needed) the cache directory `dir`, refusing
    /// one this user does not own or others may write. `digests` keeps the
    /// digests (`None`: beside the files).
    pub fn open(dir: &Path, digests: Option<Arc<dyn CompiledDigests>>) -> Result<Self, String> {
        private::create_dir(dir).map_err(|e| format!("cannot create the cache directory: {e}"))?;
        check_private_dir(dir)?;
        let digests = digests.unwrap_or_else(|| {
            Arc::new(SidecarDigests {
                dir: dir.to_path_buf(),
            })
        });
        Ok(CompileCache {
            dir: dir.to_path_buf(),
            digests,
        })
    }

    /// The compiled code of the component whose cache file is `name`, if
    /// the cache holds a file the digests vouch for.
    pub fn load(&self, engine: &Engine, name: &str) -> Option<Component> {
        // Checked again at every load: the directory may have changed since
        // it was opened.
        check_private_dir(&self.dir).ok()?;
        let bytes = read_private_file(&self.dir.join(name))?;
        let vouched = self.digests.vouched(name)?;
        let digest: [u8; 32] = Sha256::digest(&bytes).into();
        if digest != vouched {
            return None;
        }
        // SAFETY: these bytes are, digest for digest, what this host wrote
        // with `Component::serialize` for an engine of this configuration
        // (the name carries the compatibility hash; wasmtime checks its
        // header and version too). They are deserialized from memory, so
        // the file cannot change between the check and the load.
        unsafe { Component::deserialize(engine, &bytes) }.ok()
    }

    /// Writes the compiled code of `component` as `name` and vouches for
    /// it. The cache is an optimisation: a failure is not an error.
    pub fn store(&self, name: &str, component: &Component) {
        if check_private_dir(&self.dir).is_err() {
            return;
        }
        let Ok(bytes) = component.serialize() else {
            return;
        };
        if write_synced(&self.dir.join(name), &bytes).is_ok() {
            self.digests.vouch(name, &Sha256::digest(&bytes).into());
        }
    }
}

/// Held while one process compiles a component for this cache: the lock
/// of `.<name>.lock` in the cache directory, released when dropped (or when
/// the process ends, however it ends). A host that had to wait for it and
/// then still finds nothing in the cache (the other host keeps its digests
/// elsewhere, or failed) lets it go before compiling: hosts that cannot
/// share what they compile do not compile one after another.
pub(crate) struct CompileLock {
    #[cfg(unix)]
    _file: std::fs::File,
    /// Whether another process held it when it was asked for.
    pub waited: bool,
}

/// How long a host waits for another process compiling the same component
/// before it compiles it too.
const COMPILE_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

impl CompileCache {
    /// Waits until no other process is compiling `name` for this cache and
    /// takes its compile lock, so that hosts started together compile a
    /// component once and the others read it from the cache. `None` (go on
    /// without it) if the lock file cannot be had, or after
    /// [`COMPILE_LOCK_WAIT`] (a process stuck while compiling).
    #[cfg(unix)]
    pub fn lock_compile(&self, name: &str) -> Option<CompileLock> {
        use std::os::unix::fs::OpenOptionsExt;
        check_private_dir(&self.dir).ok()?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(self.dir.join(format!(".{name}.lock")))
            .ok()?;
        let fd = std::os::unix::io::AsRawFd::as_raw_fd(&file);
        let started = std::time::Instant::now();
        let (mut busy, mut said) = (false, false);
        loop {
            // SAFETY: `fd` is the open descriptor of `file`, which outlives
            // this call.
            if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Some(CompileLock {
                    _file: file,
                    waited: busy,
                });
            }
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EWOULDBLOCK)
                && err.kind() != std::io::ErrorKind::Interrupted
            {
                return None;
            }
            busy = true;
            let waited = started.elapsed();
            if waited > COMPILE_LOCK_WAIT {
                tracing::warn!(
                    component = name,
                    "another process has been compiling this component for {} s: compiling it here too",
                    waited.as_secs()
                );
                return None;
            }
            if !said && waited > std::time::Duration::from_secs(5) {
                said = true;
                tracing::info!(
                    component = name,
                    "waiting for another process compiling this component for the same cache"
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Without advisory locks, every process compiles for itself.
    #[cfg(not(unix))]
    pub fn lock_compile(&self, _name: &str) -> Option<CompileLock> {
        None
    }
}

pub(crate) use stepwell_store::private::check_private_dir;
