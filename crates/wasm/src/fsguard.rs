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
//! A call that creates, moves or removes a name acts inside the name's
//! folder, opened and checked first, with the one name: a link swapped on
//! the way after the check (by another guest racing this one) cannot send
//! it elsewhere. An opened file is also refused when it is a refused file
//! by another name (a hard link: same device and inode). What this does not
//! stop: such a race can make an `open-at` with CREATE leave a new empty
//! file under a refused folder (it is refused once opened).

use std::os::fd::AsRawFd;
use std::path::{Component, Path, PathBuf};

use wasmtime::component::{HasData, Resource};
use wasmtime_wasi::filesystem::{Descriptor, WasiFilesystemCtxView};
use wasmtime_wasi::p2::bindings::filesystem::types::ErrorCode;
use wasmtime_wasi::p2::bindings::sync::filesystem::types as fs;
use wasmtime_wasi::p2::bindings::sync::io::streams;
use wasmtime_wasi::p2::{FsError, FsResult};

/// Paths a guest may not open, inspect, change or move, though they may
/// lie inside a directory it was given (absolute host paths), and the
/// identities (device and inode) of those that exist, so a file opened by
/// another name (a hard link) is known too.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RefusedPaths {
    paths: Vec<PathBuf>,
    ids: Vec<(u64, u64)>,
}

impl RefusedPaths {
    /// The refused paths `paths` (each with everything under it).
    pub fn new(paths: impl IntoIterator<Item = PathBuf>) -> Self {
        use std::os::unix::fs::MetadataExt;
        let paths: Vec<PathBuf> = paths.into_iter().collect();
        let ids = paths
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| (m.dev(), m.ino()))
            .collect();
        RefusedPaths { paths, ids }
    }

    /// Whether nothing is refused.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// Whether `path` is a refused path or lies under one.
    pub fn holds(&self, path: &Path) -> bool {
        self.paths.iter().any(|r| path.starts_with(r))
    }

    /// Whether `path` is refused or holds a refused path (moving or
    /// removing it would move or remove that path).
    pub fn touches(&self, path: &Path) -> bool {
        self.paths
            .iter()
            .any(|r| path.starts_with(r) || r.starts_with(path))
    }

    /// Whether the open file `file` is a refused one, by its identity.
    fn is(&self, file: &std::fs::File) -> bool {
        use std::os::unix::fs::MetadataExt;
        // A file whose identity cannot be read is taken for a refused one.
        file.metadata()
            .map_or(true, |m| self.ids.contains(&(m.dev(), m.ino())))
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
        // A path that ends in `/` (or `/.`) names where its last link
        // leads, whatever the call says.
        let dir_named = path.ends_with('/') || path.ends_with("/.");
        let follow = match how {
            Use::Reach { follow } | Use::Create { follow } => follow || dir_named,
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
    /// a refused path, or it is a refused file by another name.
    fn check_opened(&mut self, fd: Resource<fs::Descriptor>) -> FsResult<Resource<fs::Descriptor>> {
        if self.refused.is_empty() {
            return Ok(fd);
        }
        let file = match self.fs.table.get(&fd)? {
            Descriptor::File(f) => f.file.clone(),
            Descriptor::Dir(d) => d.dir.clone(),
        };
        match open_path(file.as_raw_fd()) {
            Some(p) if !self.refused.holds(&p) && !self.refused.is(&file) => Ok(fd),
            _ => {
                fs::HostDescriptor::drop(&mut self.fs, fd).map_err(FsError::trap)?;
                Err(refusal())
            }
        }
    }
}

/// Where a call that creates, moves or removes a name acts: a directory
/// (the call's own, or the name's folder opened and checked) and the one
/// name in it, so a link swapped on the way after the check cannot send it
/// elsewhere.
struct Place {
    dir: Fd,
    name: String,
    /// Whether `dir` was opened here (and is closed after the call).
    opened: bool,
}

impl Place {
    /// A borrow of the directory, for one call.
    fn dir(&self) -> Fd {
        Resource::new_borrow(self.dir.rep())
    }
}

impl Guarded<'_> {
    /// Checks `path` as a [`Use::Change`] and opens its folder: the place
    /// to act in. The folder must not be refused (by where the system says
    /// it is), nor may the name in it be or hold a refused path.
    fn place(&mut self, fd: &Fd, path: &str) -> FsResult<Place> {
        self.check(fd, path, Use::Change)?;
        let base = Resource::new_borrow(fd.rep());
        let trimmed = path.trim_end_matches('/');
        let (folder, name) = match trimmed.rsplit_once('/') {
            Some((folder, name)) => (folder, name),
            None => ("", trimmed),
        };
        // A path that names a folder itself (`.`, `x/..`: a `mkdir` of an
        // existing one) is made as it is, checked as a change above.
        if self.refused.is_empty() || matches!(name, "" | "." | "..") {
            return Ok(Place {
                dir: base,
                name: path.to_string(),
                opened: false,
            });
        }
        let (dir, opened) = if folder.is_empty() {
            (base, false)
        } else {
            let flags =
                fs::HostDescriptor::get_flags(&mut self.fs, Resource::new_borrow(fd.rep()))?;
            let dir = fs::HostDescriptor::open_at(
                &mut self.fs,
                base,
                fs::PathFlags::SYMLINK_FOLLOW,
                folder.to_string(),
                fs::OpenFlags::DIRECTORY,
                flags & (fs::DescriptorFlags::READ | fs::DescriptorFlags::MUTATE_DIRECTORY),
            )?;
            (self.check_opened(dir)?, true)
        };
        let place = Place {
            dir,
            name: name.to_string(),
            opened,
        };
        let real = match self.dir_of(&place.dir()) {
            Ok(Some(d)) => Some(d.join(name)),
            Ok(None) => None,
            Err(e) => return Err(self.leave(place, e)),
        };
        if real.is_some_and(|p| self.refused.touches(&p)) {
            return Err(self.leave(place, refusal()));
        }
        Ok(place)
    }

    /// The places of a call that names two paths (a rename, a link).
    fn two_places(
        &mut self,
        fd: &Fd,
        from: &str,
        to_fd: &Fd,
        to: &str,
    ) -> FsResult<(Place, Place)> {
        let from = self.place(fd, from)?;
        match self.place(to_fd, to) {
            Ok(to) => Ok((from, to)),
            Err(e) => Err(self.leave(from, e)),
        }
    }

    /// [`Guarded::done`] for both places of a two-path call.
    fn both_done<T>(&mut self, from: Place, to: Place, answer: FsResult<T>) -> FsResult<T> {
        let answer = self.done(to, answer);
        self.done(from, answer)
    }

    /// Closes the place's folder if it was opened here; `err` passed on.
    fn leave(&mut self, place: Place, err: FsError) -> FsError {
        if place.opened {
            if let Err(e) = fs::HostDescriptor::drop(&mut self.fs, place.dir) {
                return FsError::trap(e);
            }
        }
        err
    }

    /// Closes the place's folder if it was opened here, and returns what
    /// the call in it answered.
    fn done<T>(&mut self, place: Place, answer: FsResult<T>) -> FsResult<T> {
        match answer {
            Ok(v) => {
                if place.opened {
                    fs::HostDescriptor::drop(&mut self.fs, place.dir).map_err(FsError::trap)?;
                }
                Ok(v)
            }
            Err(e) => Err(self.leave(place, e)),
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
/// [`Use::Change`], then made in the checked folder ([`Guarded::place`]).
macro_rules! changes_one_path {
    ($( $name:ident ),*) => {
        $(
            fn $name(&mut self, fd: Fd, path: String) -> FsResult<()> {
                let at = self.place(&fd, &path)?;
                let answer = fs::HostDescriptor::$name(&mut self.fs, at.dir(), at.name.clone());
                self.done(at, answer)
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
        let (from, to) = self.two_places(&fd, &old_path, &new_fd, &new_path)?;
        let answer = fs::HostDescriptor::link_at(
            &mut self.fs,
            from.dir(),
            old_flags,
            from.name.clone(),
            to.dir(),
            to.name.clone(),
        );
        self.both_done(from, to, answer)
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
        // As wasmtime does for a truncation: no directory, and opened to
        // write.
        if oflags.contains(fs::OpenFlags::DIRECTORY) {
            return Err(FsError::from(ErrorCode::Invalid));
        }
        let opened = fs::HostDescriptor::open_at(
            &mut self.fs,
            fd,
            flags,
            path,
            oflags & !fs::OpenFlags::TRUNCATE,
            dflags | fs::DescriptorFlags::WRITE,
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
        let (from, to) = self.two_places(&fd, &old_path, &new_fd, &new_path)?;
        let answer = fs::HostDescriptor::rename_at(
            &mut self.fs,
            from.dir(),
            from.name.clone(),
            to.dir(),
            to.name.clone(),
        );
        self.both_done(from, to, answer)
    }

    fn symlink_at(&mut self, fd: Fd, target: String, path: String) -> FsResult<()> {
        // The link's text is not checked: what it names is, when it is
        // followed.
        let at = self.place(&fd, &path)?;
        let answer =
            fs::HostDescriptor::symlink_at(&mut self.fs, at.dir(), target, at.name.clone());
        self.done(at, answer)
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
