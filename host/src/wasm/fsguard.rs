//! `wasi:filesystem/types` for guests, with paths the host refuses even
//! inside a preopened directory.
//!
//! A tool scope may reach a directory that also holds something no guest
//! may touch: `all_except_ignored` preopens `/`, which holds `/proc` and
//! the folder of the host's store. Preopening such a directory whole and
//! refusing the few paths inside it keeps every other file in it reachable
//! (splitting the directory into its subdirectories, as stepwell once did,
//! left the plain files beside the store unreachable).
//!
//! Every call that names a path relative to a directory descriptor is
//! checked before it runs: the path as written (`..` folded) and the path
//! with its links resolved (the last component's too when the call follows
//! it) must not lie under a refused path. Calls that change or move things
//! (`rename`, `unlink`, `remove-directory`, `link`, `create-directory`) may
//! not name a folder that holds a refused path either, so the store cannot
//! be moved away from under the host. A descriptor `open-at` returns is
//! checked again by what the system says it is (`/proc/self/fd`), so a link
//! swapped in between the check and the open is caught too. A refusal is
//! `access` (EACCES). A path whose links cannot be resolved (a loop, a path
//! longer than the system resolves) is refused too. A file opened to be
//! truncated is truncated only once it is known not to be refused. Calls on
//! a descriptor already open are passed on; `metadata-hash-at` (asked of
//! every entry of a listing) answers a refused path with a hash made from
//! its name. Where `/proc/self/fd` is missing, every path is refused.
//!
//! What this does not stop: another process swapping a link on the way
//! between the check and the call (the opened file is checked again, but a
//! file created there stays, empty).

use std::os::fd::AsRawFd;
use std::path::{Component, Path, PathBuf};

use wasmtime::component::{HasData, Resource};
use wasmtime_wasi::filesystem::{Descriptor, WasiFilesystemCtxView};
use wasmtime_wasi::p2::bindings::filesystem::types::ErrorCode;
use wasmtime_wasi::p2::bindings::sync::filesystem::types as fs;
use wasmtime_wasi::p2::bindings::sync::io::streams;
use wasmtime_wasi::p2::{FsError, FsResult};

/// Paths a guest may not open, inspect, change or move, though they may
/// lie inside a directory it was given (absolute host paths).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RefusedPaths(Vec<PathBuf>);

impl RefusedPaths {
    /// The refused paths `paths` (each with everything under it).
    pub fn new(paths: impl IntoIterator<Item = PathBuf>) -> Self {
        RefusedPaths(paths.into_iter().collect())
    }

    /// Whether nothing is refused.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `path` is a refused path or lies under one.
    pub fn holds(&self, path: &Path) -> bool {
        self.0.iter().any(|r| path.starts_with(r))
    }

    /// Whether `path` is refused or holds a refused path (moving or
    /// removing it would move or remove that path).
    pub fn touches(&self, path: &Path) -> bool {
        self.0
            .iter()
            .any(|r| path.starts_with(r) || r.starts_with(path))
    }
}

/// What a checked call does to its path.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Use {
    /// Opens or inspects it, following a last link or not.
    Reach { follow: bool },
    /// Opens it to create it (following a last link or not: the file is
    /// created where the link leads).
    Create { follow: bool },
    /// Moves, removes or creates the name itself (a last link is not
    /// followed).
    Change,
}

/// The filesystem view of one guest store, with its refused paths.
pub(crate) struct Guarded<'a> {
    pub(crate) fs: WasiFilesystemCtxView<'a>,
    pub(crate) refused: &'a RefusedPaths,
}

/// The [`HasData`] of [`Guarded`], for the linker.
pub(crate) struct GuardedFs;

impl HasData for GuardedFs {
    type Data<'a> = Guarded<'a>;
}

fn refusal() -> FsError {
    FsError::from(ErrorCode::Access)
}

/// `path` with `.` left out and each `..` taking away the component before
/// it (without looking at the disk).
fn fold(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// How many links one path may pass through (as Linux allows).
const MAX_LINKS: usize = 40;

/// Where `path` leads with its links resolved: its folder resolved, then
/// (when `follow`) its last component's links followed one by one, so that
/// a link to a file that does not exist yet leads to where it would be
/// created. `Ok(None)`: a folder on the way does not exist (the call fails
/// on its own). `Err`: where it leads cannot be told (a path too long for
/// the system to resolve, a loop, an unreadable link): refused.
fn leads_to(path: &Path, follow: bool) -> Result<Option<PathBuf>, ()> {
    let mut path = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            // The root, or a path that ends in `..`: resolved whole.
            return match std::fs::canonicalize(&path) {
                Ok(p) => Ok(Some(p)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(_) => Err(()),
            };
        };
        let here = match std::fs::canonicalize(parent) {
            Ok(dir) => dir.join(name),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(_) => return Err(()),
        };
        if !follow {
            return Ok(Some(here));
        }
        match std::fs::symlink_metadata(&here) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&here).map_err(drop)?;
                // A relative target is read from the link's folder; an
                // absolute one replaces the path.
                path = here.parent().map_or(target.clone(), |d| d.join(&target));
            }
            Ok(_) => return Ok(Some(here)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Some(here)),
            Err(_) => return Err(()),
        }
    }
    Err(())
}

/// A metadata hash made from `name` alone.
fn made_up_hash(name: &str) -> fs::MetadataHashValue {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut h);
    let lower = h.finish();
    "refused".hash(&mut h);
    fs::MetadataHashValue {
        lower,
        upper: h.finish(),
    }
}

/// Where the open file `fd` of this process is, by the system's account.
fn open_path(fd: i32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()
}

impl Guarded<'_> {
    /// The host path of the directory `fd`; `None` if `fd` is a file (the
    /// call fails on its own) or nothing is refused.
    fn dir_of(&mut self, fd: &Resource<fs::Descriptor>) -> FsResult<Option<PathBuf>> {
        if self.refused.is_empty() {
            return Ok(None);
        }
        match self.fs.table.get(fd)? {
            Descriptor::File(_) => Ok(None),
            Descriptor::Dir(d) => match open_path(d.dir.as_raw_fd()) {
                Some(p) => Ok(Some(p)),
                // Where the directory is cannot be told: refuse.
                None => Err(refusal()),
            },
        }
    }

    /// Refuses `path` (relative to the directory `fd`) if it is, or for a
    /// [`Use::Change`] holds, a refused path.
    fn check(&mut self, fd: &Resource<fs::Descriptor>, path: &str, how: Use) -> FsResult<()> {
        let Some(dir) = self.dir_of(fd)? else {
            return Ok(());
        };
        let named = dir.join(path);
        let follow = match how {
            Use::Reach { follow } | Use::Create { follow } => follow,
            Use::Change => false,
        };
        let real = leads_to(&named, follow).map_err(|()| refusal())?;
        let refused = [Some(fold(&named)), real]
            .iter()
            .flatten()
            .any(|p| match how {
                Use::Reach { .. } => self.refused.holds(p),
                Use::Create { .. } | Use::Change => self.refused.touches(p),
            });
        if refused {
            return Err(refusal());
        }
        Ok(())
    }

    /// Closes the new descriptor `fd` and refuses if the system says it is
    /// a refused path.
    fn check_opened(&mut self, fd: Resource<fs::Descriptor>) -> FsResult<Resource<fs::Descriptor>> {
        if self.refused.is_empty() {
            return Ok(fd);
        }
        let raw = match self.fs.table.get(&fd)? {
            Descriptor::File(f) => f.file.as_raw_fd(),
            Descriptor::Dir(d) => d.dir.as_raw_fd(),
        };
        match open_path(raw) {
            Some(p) if !self.refused.holds(&p) => Ok(fd),
            _ => {
                fs::HostDescriptor::drop(&mut self.fs, fd).map_err(FsError::trap)?;
                Err(refusal())
            }
        }
    }
}

impl fs::Host for Guarded<'_> {
    fn convert_error_code(&mut self, err: FsError) -> wasmtime::Result<fs::ErrorCode> {
        fs::Host::convert_error_code(&mut self.fs, err)
    }

    fn filesystem_error_code(
        &mut self,
        err: Resource<streams::Error>,
    ) -> wasmtime::Result<Option<fs::ErrorCode>> {
        fs::Host::filesystem_error_code(&mut self.fs, err)
    }
}

/// Methods passed on to the unguarded view as they are.
macro_rules! passed_on {
    ($( fn $name:ident(&mut self $(, $arg:ident: $ty:ty)*) -> $ret:ty; )*) => {
        $(
            fn $name(&mut self $(, $arg: $ty)*) -> $ret {
                fs::HostDescriptor::$name(&mut self.fs $(, $arg)*)
            }
        )*
    };
}

/// Methods that create or remove the one path they name: checked as a
/// [`Use::Change`], then passed on.
macro_rules! changes_one_path {
    ($( $name:ident ),*) => {
        $(
            fn $name(&mut self, fd: Fd, path: String) -> FsResult<()> {
                self.check(&fd, &path, Use::Change)?;
                fs::HostDescriptor::$name(&mut self.fs, fd, path)
            }
        )*
    };
}

type Fd = Resource<fs::Descriptor>;

impl fs::HostDescriptor for Guarded<'_> {
    passed_on! {
        fn advise(&mut self, fd: Fd, offset: fs::Filesize, len: fs::Filesize, advice: fs::Advice) -> FsResult<()>;
        fn sync_data(&mut self, fd: Fd) -> FsResult<()>;
        fn get_flags(&mut self, fd: Fd) -> FsResult<fs::DescriptorFlags>;
        fn get_type(&mut self, fd: Fd) -> FsResult<fs::DescriptorType>;
        fn set_size(&mut self, fd: Fd, size: fs::Filesize) -> FsResult<()>;
        fn set_times(&mut self, fd: Fd, atim: fs::NewTimestamp, mtim: fs::NewTimestamp) -> FsResult<()>;
        fn read(&mut self, fd: Fd, len: fs::Filesize, offset: fs::Filesize) -> FsResult<(Vec<u8>, bool)>;
        fn write(&mut self, fd: Fd, buf: Vec<u8>, offset: fs::Filesize) -> FsResult<fs::Filesize>;
        fn read_directory(&mut self, fd: Fd) -> FsResult<Resource<fs::DirectoryEntryStream>>;
        fn sync(&mut self, fd: Fd) -> FsResult<()>;
        fn stat(&mut self, fd: Fd) -> FsResult<fs::DescriptorStat>;
        fn drop(&mut self, fd: Fd) -> wasmtime::Result<()>;
        fn read_via_stream(&mut self, fd: Fd, offset: fs::Filesize) -> FsResult<Resource<streams::InputStream>>;
        fn write_via_stream(&mut self, fd: Fd, offset: fs::Filesize) -> FsResult<Resource<streams::OutputStream>>;
        fn append_via_stream(&mut self, fd: Fd) -> FsResult<Resource<streams::OutputStream>>;
        fn is_same_object(&mut self, a: Fd, b: Fd) -> wasmtime::Result<bool>;
        fn metadata_hash(&mut self, fd: Fd) -> FsResult<fs::MetadataHashValue>;
    }

    /// An identity, nothing of the content, but a listing asks it of every
    /// entry (wasi-libc's `readdir` fills `d_ino` with it): a refused path
    /// gets one made from its name, so a folder that holds one still lists
    /// and nothing is learnt of the refused file.
    fn metadata_hash_at(
        &mut self,
        fd: Fd,
        flags: fs::PathFlags,
        path: String,
    ) -> FsResult<fs::MetadataHashValue> {
        let follow = flags.contains(fs::PathFlags::SYMLINK_FOLLOW);
        if self.check(&fd, &path, Use::Reach { follow }).is_err() {
            return Ok(made_up_hash(&path));
        }
        fs::HostDescriptor::metadata_hash_at(&mut self.fs, fd, flags, path)
    }

    changes_one_path!(create_directory_at, remove_directory_at, unlink_file_at);

    fn stat_at(
        &mut self,
        fd: Fd,
        flags: fs::PathFlags,
        path: String,
    ) -> FsResult<fs::DescriptorStat> {
        let follow = flags.contains(fs::PathFlags::SYMLINK_FOLLOW);
        self.check(&fd, &path, Use::Reach { follow })?;
        fs::HostDescriptor::stat_at(&mut self.fs, fd, flags, path)
    }

    fn set_times_at(
        &mut self,
        fd: Fd,
        flags: fs::PathFlags,
        path: String,
        atim: fs::NewTimestamp,
        mtim: fs::NewTimestamp,
    ) -> FsResult<()> {
        let follow = flags.contains(fs::PathFlags::SYMLINK_FOLLOW);
        self.check(&fd, &path, Use::Reach { follow })?;
        fs::HostDescriptor::set_times_at(&mut self.fs, fd, flags, path, atim, mtim)
    }

    fn link_at(
        &mut self,
        fd: Fd,
        old_flags: fs::PathFlags,
        old_path: String,
        new_fd: Fd,
        new_path: String,
    ) -> FsResult<()> {
        self.check(&fd, &old_path, Use::Change)?;
        self.check(&new_fd, &new_path, Use::Change)?;
        fs::HostDescriptor::link_at(&mut self.fs, fd, old_flags, old_path, new_fd, new_path)
    }

    fn open_at(
        &mut self,
        fd: Fd,
        flags: fs::PathFlags,
        path: String,
        oflags: fs::OpenFlags,
        dflags: fs::DescriptorFlags,
    ) -> FsResult<Fd> {
        let follow = flags.contains(fs::PathFlags::SYMLINK_FOLLOW);
        let how = if oflags.contains(fs::OpenFlags::CREATE) {
            Use::Create { follow }
        } else {
            Use::Reach { follow }
        };
        self.check(&fd, &path, how)?;
        if self.refused.is_empty() || !oflags.contains(fs::OpenFlags::TRUNCATE) {
            let opened =
                fs::HostDescriptor::open_at(&mut self.fs, fd, flags, path, oflags, dflags)?;
            return self.check_opened(opened);
        }
        // Truncated only once the opened file is known not to be refused
        // (a link swapped in after the check cannot make it truncate one).
        let opened = fs::HostDescriptor::open_at(
            &mut self.fs,
            fd,
            flags,
            path,
            oflags & !fs::OpenFlags::TRUNCATE,
            dflags,
        )?;
        let opened = self.check_opened(opened)?;
        let checked = Resource::<fs::Descriptor>::new_borrow(opened.rep());
        if let Err(e) = fs::HostDescriptor::set_size(&mut self.fs, checked, 0) {
            fs::HostDescriptor::drop(&mut self.fs, opened).map_err(FsError::trap)?;
            return Err(e);
        }
        Ok(opened)
    }

    fn readlink_at(&mut self, fd: Fd, path: String) -> FsResult<String> {
        self.check(&fd, &path, Use::Reach { follow: false })?;
        fs::HostDescriptor::readlink_at(&mut self.fs, fd, path)
    }

    fn rename_at(
        &mut self,
        fd: Fd,
        old_path: String,
        new_fd: Fd,
        new_path: String,
    ) -> FsResult<()> {
        self.check(&fd, &old_path, Use::Change)?;
        self.check(&new_fd, &new_path, Use::Change)?;
        fs::HostDescriptor::rename_at(&mut self.fs, fd, old_path, new_fd, new_path)
    }

    fn symlink_at(&mut self, fd: Fd, target: String, path: String) -> FsResult<()> {
        // The link's text is not checked: what it names is, when it is
        // followed.
        self.check(&fd, &path, Use::Change)?;
        fs::HostDescriptor::symlink_at(&mut self.fs, fd, target, path)
    }
}

impl fs::HostDirectoryEntryStream for Guarded<'_> {
    fn read_directory_entry(
        &mut self,
        stream: Resource<fs::DirectoryEntryStream>,
    ) -> FsResult<Option<fs::DirectoryEntry>> {
        fs::HostDirectoryEntryStream::read_directory_entry(&mut self.fs, stream)
    }

    fn drop(&mut self, stream: Resource<fs::DirectoryEntryStream>) -> wasmtime::Result<()> {
        fs::HostDirectoryEntryStream::drop(&mut self.fs, stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folding_and_holding() {
        assert_eq!(fold(Path::new("/a/b/../c/./d")), PathBuf::from("/a/c/d"));
        assert_eq!(fold(Path::new("/a/../../b")), PathBuf::from("/b"));
        let r = RefusedPaths::new([PathBuf::from("/srv/proj/store.sqlite")]);
        assert!(r.holds(Path::new("/srv/proj/store.sqlite")));
        assert!(r.holds(Path::new("/srv/proj/store.sqlite/x")));
        assert!(!r.holds(Path::new("/srv/proj/store.sqlite-notes")));
        assert!(!r.holds(Path::new("/srv/proj")));
        assert!(r.touches(Path::new("/srv/proj")));
        assert!(r.touches(Path::new("/srv")));
        assert!(!r.touches(Path::new("/srv/other")));
    }

    #[test]
    fn links_are_followed_to_where_they_lead() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().canonicalize().unwrap();
        std::fs::create_dir(base.join("d")).unwrap();
        std::fs::write(base.join("store"), "s").unwrap();
        std::os::unix::fs::symlink(base.join("store"), base.join("link")).unwrap();
        // A link to a file not there yet leads to where it would be made.
        std::os::unix::fs::symlink("../fresh", base.join("d/dangling")).unwrap();
        let to = |p: &str, follow| leads_to(&base.join(p), follow);
        assert_eq!(to("link", true), Ok(Some(base.join("store"))));
        assert_eq!(to("link", false), Ok(Some(base.join("link"))));
        assert_eq!(to("d/dangling", true), Ok(Some(base.join("fresh"))));
        assert_eq!(to("missing/x", true), Ok(None));
        assert_eq!(to("new", true), Ok(Some(base.join("new"))));
        assert_eq!(to("d/..", true), Ok(Some(base.clone())));
        // A loop is refused (a path whose folder is too deep to resolve
        // too: tests/tools.rs makes one through links).
        std::os::unix::fs::symlink("loop", base.join("loop")).unwrap();
        assert_eq!(to("loop", true), Err(()));
    }
}
