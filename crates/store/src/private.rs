//! Files and folders private to this process's user: what the store, the
//! compiled-component cache and the bundle cache keep on disk.
//!
//! - A folder is created `0700` and a file `0600`, whatever the umask;
//!   files are created through no link and over no file.
//! - A folder the host keeps its own files in (`artifacts/`, `snapshots/`,
//!   `cache/`, a JSON store's folder) is used only if it is not a symbolic
//!   link, belongs to this user and nobody else may write it
//!   ([`check_dir`]): another local user who made it first could otherwise
//!   read, replace or forge what is in it.
//! - The folder a database file lies in may be shared (`/tmp`): it must
//!   belong to this user or to root, and others may write it only if it is
//!   sticky (they cannot then move this user's files) ([`check_parent`]).
//! - A database file (and its `-wal`, `-shm`, `-journal`) is refused when it
//!   is a link, another user's or writable by others; one others may read
//!   (written by an older stepwell) is made `0600` ([`prepare_db_file`]).

use std::fmt;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::StoreError;

/// Why a file or folder is not private to this user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotPrivate {
    /// It could not be examined.
    Unreadable(String),
    /// It is a symbolic link.
    Link,
    /// It is not of the kind expected (a folder, a regular file).
    Kind(&'static str),
    /// Another user owns it.
    Owner {
        /// Its owner.
        owner: u32,
        /// This process's user.
        me: u32,
    },
    /// Group or others may write it.
    Writable {
        /// Its permission bits.
        mode: u32,
    },
}

impl fmt::Display for NotPrivate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotPrivate::Unreadable(e) => write!(f, "cannot be examined ({e})"),
            NotPrivate::Link => f.write_str("is a symbolic link"),
            NotPrivate::Kind(kind) => write!(f, "is not a {kind}"),
            NotPrivate::Owner { owner, me } => {
                write!(f, "belongs to user {owner}, not to this user ({me})")
            }
            NotPrivate::Writable { mode } => {
                write!(f, "is writable by others (mode {mode:o})")
            }
        }
    }
}

/// This process's effective user.
#[cfg(unix)]
fn me() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// What `meta` says against this user owning `path` alone: a link, another
/// kind than `dir` asks, another owner, write access for others.
#[cfg(unix)]
fn judge(meta: &std::fs::Metadata, dir: bool) -> Result<(), NotPrivate> {
    use std::os::unix::fs::MetadataExt;
    if meta.file_type().is_symlink() {
        return Err(NotPrivate::Link);
    }
    match dir {
        true if !meta.is_dir() => return Err(NotPrivate::Kind("folder")),
        false if !meta.is_file() => return Err(NotPrivate::Kind("regular file")),
        _ => {}
    }
    if meta.uid() != me() {
        return Err(NotPrivate::Owner {
            owner: meta.uid(),
            me: me(),
        });
    }
    if meta.mode() & 0o022 != 0 {
        return Err(NotPrivate::Writable {
            mode: meta.mode() & 0o7777,
        });
    }
    Ok(())
}

/// Refuses a folder that is a symbolic link, that another user owns or that
/// others may write.
#[cfg(unix)]
pub fn check_dir(dir: &Path) -> Result<(), NotPrivate> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| NotPrivate::Unreadable(e.to_string()))?;
    judge(&meta, true)
}

#[cfg(not(unix))]
pub fn check_dir(_: &Path) -> Result<(), NotPrivate> {
    Ok(())
}

/// Refuses the folder a database file lies in (links followed) when it
/// belongs to neither this user nor root, or others may write it and it is
/// not sticky.
#[cfg(unix)]
#[cfg(feature = "sqlite")]
pub fn check_parent(dir: &Path) -> Result<(), NotPrivate> {
    use std::os::unix::fs::MetadataExt;
    // A link to the folder is followed only when this user (or root) made
    // it: another user's link in a shared folder would choose where the
    // store lands.
    let link = std::fs::symlink_metadata(dir).map_err(|e| NotPrivate::Unreadable(e.to_string()))?;
    if link.file_type().is_symlink() && link.uid() != me() && link.uid() != 0 {
        return Err(NotPrivate::Owner {
            owner: link.uid(),
            me: me(),
        });
    }
    let meta = std::fs::metadata(dir).map_err(|e| NotPrivate::Unreadable(e.to_string()))?;
    if meta.uid() != me() && meta.uid() != 0 {
        return Err(NotPrivate::Owner {
            owner: meta.uid(),
            me: me(),
        });
    }
    if meta.mode() & 0o022 != 0 && meta.mode() & 0o1000 == 0 {
        return Err(NotPrivate::Writable {
            mode: meta.mode() & 0o7777,
        });
    }
    Ok(())
}

#[cfg(not(unix))]
#[cfg(feature = "sqlite")]
pub fn check_parent(_: &Path) -> Result<(), NotPrivate> {
    Ok(())
}

/// Creates `dir` and the folders above it that are missing, each `0700`.
#[cfg(unix)]
pub fn create_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

#[cfg(not(unix))]
pub fn create_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)
}

/// `store_unsafe`, naming `path` and why.
pub fn refused(path: &Path, what: &str, why: &NotPrivate) -> StoreError {
    StoreError::unsafe_path(format!(
        "{}: {what} {why}: refusing to use it (it must be this user's, writable by nobody else, and not a link)",
        path.display()
    ))
}

/// Creates (`0700`) and checks ([`check_dir`]) a folder the store keeps its
/// own files in; `what` names it in the error. One that others may read or
/// enter (made by an older stepwell) is made `0700`.
pub fn open_dir(dir: &Path, what: &str) -> Result<(), StoreError> {
    let io = |e: std::io::Error| StoreError::io(format!("{}: {e}", dir.display()));
    create_dir(dir).map_err(io)?;
    check_dir(dir).map_err(|why| refused(dir, what, &why))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::symlink_metadata(dir)
            .map_err(io)?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
        }
    }
    Ok(())
}

/// Options that create a file `0600` whatever the umask, never through a
/// link (the caller adds how it opens it).
pub fn options() -> std::fs::OpenOptions {
    let mut options = std::fs::OpenOptions::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    }
    options
}

/// A new file only this user may read or write, never over an existing one.
pub fn create_file(file: &Path) -> std::io::Result<std::fs::File> {
    options().write(true).create_new(true).open(file)
}

/// Writes `bytes` to `file` through a temp file (`0600`) unique to this
/// process and call, synced before the rename that publishes it.
pub fn write_synced(file: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = file.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.{}-{}.tmp",
        file.file_name().and_then(|n| n.to_str()).unwrap_or("c"),
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| {
        let mut f = create_file(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, file)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// The bytes of `file` if it is a regular file (not a symbolic link) this
/// user owns and nobody else may write, read through the one descriptor
/// that was checked.
#[cfg(unix)]
pub fn read_file(file: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut f = options().read(true).open(file).ok()?;
    let meta = f.metadata().ok()?;
    judge(&meta, false).ok()?;
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    f.read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

#[cfg(not(unix))]
pub fn read_file(file: &Path) -> Option<Vec<u8>> {
    std::fs::read(file).ok()
}

/// Makes the database file `db` ready for SQLite: created `0600` when
/// missing (SQLite gives its `-wal`, `-shm` and `-journal` the database
/// file's mode); it and those of its companions that exist refused when
/// they are links, not regular files, another user's or writable by
/// others, and made `0600` when others may read them.
#[cfg(feature = "sqlite")]
pub fn prepare_db_file(db: &Path) -> Result<(), StoreError> {
    let io = |p: &Path, e: std::io::Error| StoreError::io(format!("{}: {e}", p.display()));
    match options().write(true).create_new(true).open(db) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(db, e)),
    }
    let name = db.file_name().unwrap_or_default().to_string_lossy();
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let file = db.with_file_name(format!("{name}{suffix}"));
        let meta = match std::fs::symlink_metadata(&file) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(&file, e)),
        };
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            judge(&meta, false).map_err(|why| refused(&file, "the database file", &why))?;
            if meta.permissions().mode() & 0o077 != 0 {
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
                    .map_err(|e| io(&file, e))?;
            }
        }
        let _ = meta;
    }
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
    }

    /// Folders and files come out private; an open
    /// folder, a link and a database file others may write are refused;
    /// one others may only read is tightened.
    #[test]
    fn private_whatever_the_umask() {
        let dir = tempfile::tempdir().unwrap();
        // (The umask is the process's: the attack tests set it in a
        // process of their own.)
        let made = dir.path().join("a/b");
        open_dir(&made, "the folder").unwrap();
        write_synced(&made.join("f"), b"x").unwrap();
        assert_eq!((mode(&made), mode(&made.join("f"))), (0o700, 0o600));
        std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o770)).unwrap();
        let err = open_dir(&made, "the folder").unwrap_err();
        assert_eq!(err.code, "store_unsafe");
        assert!(
            err.message.contains("writable by others (mode 770)"),
            "{err}"
        );
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&made, &link).unwrap();
        assert_eq!(check_dir(&link), Err(NotPrivate::Link));
        let db = dir.path().join("x.sqlite");
        std::fs::write(&db, b"").unwrap();
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
        prepare_db_file(&db).unwrap();
        assert_eq!(mode(&db), 0o600);
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o662)).unwrap();
        let err = prepare_db_file(&db).unwrap_err();
        assert!(
            err.message
                .contains("x.sqlite: the database file is writable by others"),
            "{err}"
        );
    }

    /// A secret file that is a link to nowhere is refused (it reads as
    /// missing, and `create_new` finds it there), not retried forever.
    #[test]
    fn a_dangling_link_is_no_secret_file() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("serve-token");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &link).unwrap();
        let err = load_or_create_secret_file(&link).unwrap_err();
        assert!(err.contains("symbolic link"), "{err}");
        assert!(!dir.path().join("nowhere").exists());
    }

    /// A secret file that is a named pipe is refused at once, not waited
    /// on; one that is a link to a private file of this user's is refused
    /// too; a private file of this user's is read.
    #[test]
    fn only_a_regular_file_is_a_secret_file() {
        let dir = tempfile::tempdir().unwrap();
        let pipe = dir.path().join("pipe");
        let c = std::ffi::CString::new(pipe.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a NUL-terminated path that lives across the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = load_or_create_secret_file(&pipe).unwrap_err();
        assert!(err.contains("not a regular file"), "{err}");
        let made = load_or_create_secret_file(&dir.path().join("token")).unwrap();
        assert_eq!(
            load_or_create_secret_file(&dir.path().join("token")).unwrap(),
            made
        );
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path().join("token"), &link).unwrap();
        let err = load_or_create_secret_file(&link).unwrap_err();
        assert!(err.contains("symbolic link"), "{err}");
    }
}

/// Refuses a cache directory that is a symbolic link, that another user
/// owns or that others may write (the compiled-component and bundle
/// caches: what is read from them is code the host runs).
pub fn check_private_dir(dir: &Path) -> Result<(), String> {
    check_dir(dir).map_err(|why| match &why {
        NotPrivate::Link => format!(
            "the cache directory {why}: refusing to load compiled code through it (name the directory itself)"
        ),
        NotPrivate::Writable { .. } => format!(
            "the cache directory {why}: refusing to load compiled code from it (chmod go-w, or remove it)"
        ),
        NotPrivate::Unreadable(e) => format!("cannot read: {e}"),
        _ => format!("the cache directory {why}: refusing to load compiled code from it"),
    })
}

/// The secret in file `path`, one line of at least 16 characters (the
/// server's token, the connections' key): created with 32 random bytes as
/// 64 hex digits, mode 0600, when missing (another process creating it
/// first wins), in a folder created `0700` when missing; refused when it is
/// a symbolic link, belongs to another user or others may read it (why,
/// without the file's name).
pub fn load_or_create_secret_file(path: &Path) -> Result<String, String> {
    const NOT_A_FILE: &str =
        "the secret file is a symbolic link or not a regular file: name the file itself";
    // Opened without following a link or waiting on a pipe, and judged by
    // what was opened (not by its name again, which another process could
    // have pointed elsewhere in between).
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    let opened = options.open(path).and_then(|mut file| {
        let meta = file.metadata()?;
        let mut text = String::new();
        if meta.is_file() {
            std::io::Read::read_to_string(&mut file, &mut text)?;
        }
        Ok((meta, text))
    });
    match opened {
        #[cfg(unix)]
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Err(NOT_A_FILE.to_string()),
        Ok((meta, text)) => {
            if !meta.is_file() {
                return Err(NOT_A_FILE.to_string());
            }
            #[cfg(unix)]
            {
                use std::os::unix::fs::MetadataExt;
                use std::os::unix::fs::PermissionsExt;
                // SAFETY: geteuid has no preconditions.
                let me = unsafe { libc::geteuid() };
                if meta.uid() != me {
                    return Err(format!(
                        "the secret file belongs to user {}, not to this process's user {me}",
                        meta.uid()
                    ));
                }
                let mode = meta.permissions().mode();
                if mode & 0o077 != 0 {
                    return Err(format!(
                        "the secret file is readable by others (mode {:o}): chmod 600 it",
                        mode & 0o777
                    ));
                }
            }
            let token = text.trim().to_string();
            if token.len() < 16 || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(
                    "the secret must be one line of at least 16 characters without spaces"
                        .to_string(),
                );
            }
            Ok(token)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                create_dir(dir).map_err(|e| e.to_string())?;
            }
            let bytes: [u8; 32] = rand::random();
            let token = hex::encode(bytes);
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                options.mode(0o600);
            }
            let mut file = match options.open(path) {
                Ok(f) => f,
                // Another process created it first: use theirs. A link
                // that points nowhere is there too (`create_new` does not
                // follow it) but reads as missing: refused, not read again.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    if std::fs::symlink_metadata(path).is_ok_and(|m| !m.is_file()) {
                        return Err(NOT_A_FILE.to_string());
                    }
                    return load_or_create_secret_file(path);
                }
                Err(e) => return Err(e.to_string()),
            };
            std::io::Write::write_all(&mut file, format!("{token}\n").as_bytes())
                .and_then(|_| file.sync_all())
                .map_err(|e| e.to_string())?;
            Ok(token)
        }
        Err(e) => Err(e.to_string()),
    }
}
