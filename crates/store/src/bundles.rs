//! A bundle's files as one value: every store keeps the files of each
//! deployed version ([`crate::deployments`]), and a host that must run a
//! version it has not loaded reads them from the store and loads them from
//! memory, so every host runs the code the store recorded, whatever (if
//! anything) lies at the bundle's original path on that machine.
//!
//! A bundle's files are its flow files (`flow.json`, `*.flow.json`) and the
//! components they name, by their paths inside the bundle directory. The
//! digest (SHA-256 over every path and content, in path order) names the
//! bundle's contents: a store keeps one copy per digest, a host compiles
//! one per digest, and content that does not match its digest is refused.

use std::io::Write;
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

/// The most a bundle's files may hold together (a bundle is flows and their
/// components, not a place for data).
pub const MAX_BUNDLE_BYTES: u64 = 256 << 20;

/// The folder of a kept bundle that holds the components its flows name
/// outside the bundle directory.
pub const OUTSIDE: &str = ".stepwell-outside";

/// The file a cache folder holds once every other file of it is written.
const COMPLETE: &str = ".complete";

/// One file of a bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleFile {
    /// Its path inside the bundle directory, with `/` between parts (never
    /// absolute, never `..`).
    pub path: String,
    /// Its content.
    pub bytes: Vec<u8>,
}

/// The files of a bundle and their digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleFiles {
    /// SHA-256 (hex) over every file's path and content, in path order.
    pub digest: String,
    /// The files, in path order.
    pub files: Vec<BundleFile>,
}

impl BundleFiles {
    /// The files of `files` (in any order) and their digest. A path that is
    /// absolute, or leaves the bundle (`..`), or is named twice, is refused.
    pub fn new(mut files: Vec<BundleFile>) -> Result<BundleFiles, String> {
        files.sort_by(|a, b| a.path.cmp(&b.path));
        for (i, f) in files.iter().enumerate() {
            if !clean_path(&f.path) {
                return Err(format!("{:?} is not a path inside a bundle", f.path));
            }
            if i > 0 && files[i - 1].path == f.path {
                return Err(format!("{:?} is named twice", f.path));
            }
        }
        Ok(BundleFiles {
            digest: digest(&files),
            files,
        })
    }

    /// Whether the files match `digest`.
    pub fn matches(&self, digest: &str) -> bool {
        self.digest == digest && self::digest(&self.files) == digest
    }

    /// The cache folder of these files under `root` (`root/<digest>`),
    /// written first unless it holds exactly these files already. Writers
    /// of one digest at once (threads, processes) each write a folder of
    /// their own and rename it into place; a folder that holds anything
    /// else (a writer that died, a file changed by hand) is replaced.
    pub fn materialise(&self, root: &Path) -> std::io::Result<PathBuf> {
        // Private to this user, as the compiled-component cache: what is
        // written here is code the host runs.
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(root)?;
        crate::private::check_private_dir(root).map_err(|e| {
            std::io::Error::other(e.replace("the cache directory", "the bundle cache"))
        })?;
        let dir = root.join(&self.digest);
        if self.written_in(&dir) {
            return Ok(dir);
        }
        let scratch = |what: &str| {
            root.join(format!(
                ".{}.{what}.{}.{}",
                self.digest,
                std::process::id(),
                uuid::Uuid::new_v4().simple()
            ))
        };
        let new = scratch("new");
        let written = (|| {
            for f in &self.files {
                let path = new.join(&f.path);
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                let mut file = std::fs::File::create(&path)?;
                file.write_all(&f.bytes)?;
                file.sync_all()?;
            }
            std::fs::File::create(new.join(COMPLETE))?.sync_all()
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_dir_all(&new);
            return Err(e);
        }
        let mut last = None;
        for _ in 0..3 {
            match std::fs::rename(&new, &dir) {
                Ok(()) => return Ok(dir),
                Err(_) if self.written_in(&dir) => {
                    // Another writer was first.
                    let _ = std::fs::remove_dir_all(&new);
                    return Ok(dir);
                }
                Err(e) => {
                    // Something else is there: moved aside, then removed.
                    let old = scratch("old");
                    if std::fs::rename(&dir, &old).is_ok() {
                        let _ = std::fs::remove_dir_all(&old);
                    }
                    last = Some(e);
                }
            }
        }
        let _ = std::fs::remove_dir_all(&new);
        Err(last.unwrap_or_else(|| std::io::Error::other("cannot rename into place")))
    }

    /// The cache folder of `digest` under `root`, if it is complete and
    /// its files (every one below it) match the digest: read and hashed
    /// here, so that a host that wrote it once needs not fetch the files
    /// again.
    pub fn cached(root: &Path, digest: &str) -> Option<PathBuf> {
        Self::read_cached(root, digest).map(|(dir, _)| dir)
    }

    /// The files kept in the folder of `digest` under `root` (complete, a
    /// private `root`), as they are: the caller checks them against the
    /// digest. `None`: no such complete folder.
    pub fn read_kept(root: &Path, digest: &str) -> Option<Vec<BundleFile>> {
        crate::private::check_private_dir(root).ok()?;
        let dir = root.join(digest);
        if !dir.join(COMPLETE).is_file() {
            return None;
        }
        let mut files = Vec::new();
        read_tree(&dir, "", &mut files)?;
        files.retain(|f| f.path != COMPLETE);
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Some(files)
    }

    /// The cache folder of `digest` under `root` and its files, if it is
    /// complete and they match the digest (see [`BundleFiles::cached`]).
    pub fn read_cached(root: &Path, digest: &str) -> Option<(PathBuf, BundleFiles)> {
        let found = BundleFiles::new(Self::read_kept(root, digest)?).ok()?;
        (found.digest == digest).then(|| (root.join(digest), found))
    }

    /// Whether `dir` holds these files, complete, and nothing else.
    fn written_in(&self, dir: &Path) -> bool {
        if !dir.join(COMPLETE).is_file() {
            return false;
        }
        let same = self
            .files
            .iter()
            .all(|f| std::fs::read(dir.join(&f.path)).is_ok_and(|bytes| bytes == f.bytes));
        same && count_files(dir) == Some(self.files.len() + 1)
    }
}

/// Reads every file below `dir` into `out` (paths relative to the bundle,
/// `prefix` the folder's); `None` if anything cannot be read or is neither
/// a file nor a folder (a symbolic link).
fn read_tree(dir: &Path, prefix: &str, out: &mut Vec<BundleFile>) -> Option<()> {
    for entry in std::fs::read_dir(dir).ok()? {
        let entry = entry.ok()?;
        let name = entry.file_name().into_string().ok()?;
        let path = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let kind = entry.file_type().ok()?;
        if kind.is_dir() {
            read_tree(&entry.path(), &path, out)?;
        } else if kind.is_file() {
            let bytes = std::fs::read(entry.path()).ok()?;
            out.push(BundleFile { path, bytes });
        } else {
            return None;
        }
    }
    Some(())
}

/// How many files `dir` holds, in every folder below it (`None`: it cannot
/// be read, or holds something that is neither a file nor a folder).
fn count_files(dir: &Path) -> Option<usize> {
    let mut n = 0;
    for entry in std::fs::read_dir(dir).ok()? {
        let entry = entry.ok()?;
        let kind = entry.file_type().ok()?;
        if kind.is_dir() {
            n += count_files(&entry.path())?;
        } else if kind.is_file() {
            n += 1;
        } else {
            return None;
        }
    }
    Some(n)
}

/// SHA-256 (hex) over each file's path and content (each with its length
/// first), in the given order.
pub fn digest(files: &[BundleFile]) -> String {
    let mut h = Sha256::new();
    for f in files {
        h.update((f.path.len() as u64).to_le_bytes());
        h.update(f.path.as_bytes());
        h.update((f.bytes.len() as u64).to_le_bytes());
        h.update(&f.bytes);
    }
    hex::encode(h.finalize())
}

/// Whether `digest` has the form of a digest: 64 lowercase hex digits.
pub fn is_digest(digest: &str) -> bool {
    digest.len() == 64
        && digest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `path` (relative) with `/` between its parts, if every part is a plain
/// name in UTF-8.
pub fn slash_path(path: &Path) -> Option<String> {
    let parts: Option<Vec<&str>> = path
        .components()
        .map(|c| match c {
            Component::Normal(name) => name.to_str(),
            _ => None,
        })
        .collect();
    let parts = parts?;
    (!parts.is_empty()).then(|| parts.join("/"))
}

/// Whether `path` is a relative path of plain names (no `.`, `..`, root,
/// empty part or backslash) and not the cache's completion marker.
pub fn clean_path(path: &str) -> bool {
    !path.is_empty()
        && path != COMPLETE
        && !path.contains('\\')
        && path
            .split('/')
            .all(|p| !p.is_empty() && p != "." && p != ".." && !p.contains('\0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, bytes: &[u8]) -> BundleFile {
        BundleFile {
            path: path.into(),
            bytes: bytes.to_vec(),
        }
    }

    #[test]
    fn paths_that_leave_the_bundle_are_refused() {
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a//b",
            "./a",
            "a\\b",
            ".complete",
        ] {
            assert!(
                BundleFiles::new(vec![file(bad, b"")]).is_err(),
                "{bad:?} was accepted"
            );
        }
        assert!(BundleFiles::new(vec![file("a", b"1"), file("a", b"2")]).is_err());
        assert!(BundleFiles::new(vec![file("steps/x.wasm", b"")]).is_ok());
    }

    #[test]
    fn the_digest_covers_paths_and_contents_in_any_order() {
        let a = BundleFiles::new(vec![file("flow.json", b"{}"), file("b.wasm", b"x")]).unwrap();
        let b = BundleFiles::new(vec![file("b.wasm", b"x"), file("flow.json", b"{}")]).unwrap();
        assert_eq!(a.digest, b.digest);
        let renamed = BundleFiles::new(vec![file("flow.json", b"{}"), file("c.wasm", b"x")]);
        assert_ne!(a.digest, renamed.unwrap().digest);
        // A path's bytes cannot move into its content.
        let shifted = BundleFiles::new(vec![file("flow.json", b"{}"), file("b.wasmx", b"")]);
        assert_ne!(a.digest, shifted.unwrap().digest);
        let mut tampered = a.clone();
        tampered.files[0].bytes = b"y".to_vec();
        assert!(a.matches(&a.digest));
        assert!(!tampered.matches(&a.digest));
    }

    #[test]
    fn materialising_twice_writes_once_and_keeps_the_first() {
        let root = tempfile::tempdir().unwrap();
        let files =
            BundleFiles::new(vec![file("flow.json", b"{}"), file("steps/s.wasm", b"x")]).unwrap();
        let dir = files.materialise(root.path()).unwrap();
        assert_eq!(std::fs::read(dir.join("steps/s.wasm")).unwrap(), b"x");
        assert_eq!(files.materialise(root.path()).unwrap(), dir);
        // Only the folder itself: no scratch folder left behind.
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 1);
        // A leftover without its marker (a writer that died) is replaced.
        std::fs::remove_file(dir.join(COMPLETE)).unwrap();
        std::fs::remove_file(dir.join("flow.json")).unwrap();
        assert_eq!(files.materialise(root.path()).unwrap(), dir);
        assert!(dir.join("flow.json").is_file());
        // So is a folder whose file was changed, or that holds one more
        // (a flow file the loader would read).
        std::fs::write(dir.join("steps/s.wasm"), b"evil").unwrap();
        files.materialise(root.path()).unwrap();
        assert_eq!(std::fs::read(dir.join("steps/s.wasm")).unwrap(), b"x");
        std::fs::write(dir.join("extra.flow.json"), b"{}").unwrap();
        files.materialise(root.path()).unwrap();
        assert!(!dir.join("extra.flow.json").exists());
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 1);
        // A complete folder is found by its digest; a changed one is not.
        assert_eq!(
            BundleFiles::cached(root.path(), &files.digest),
            Some(dir.clone())
        );
        std::fs::write(dir.join("steps/s.wasm"), b"evil").unwrap();
        assert_eq!(BundleFiles::cached(root.path(), &files.digest), None);
        assert_eq!(BundleFiles::cached(root.path(), "0000"), None);
    }
}
