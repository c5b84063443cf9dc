//! Directory reading shared by `list_files` and `search_files`: a bounded,
//! depth-first walk in the order of Python's `os.walk` (each directory's
//! entries in read order, then its subdirectories one by one), never
//! following symbolic links into directories.

use std::fs;
use std::path::{Path, PathBuf};

/// What the host excludes from this call: its `_exclude` argument (ignored
/// paths and host deny prefixes, which may lie inside the directories it
/// preopened) and its `_include` argument (the roots and allowed paths that
/// re-open a more specific place inside an excluded one).
#[derive(Debug, Default)]
struct Exclusions {
    exclude: Vec<PathBuf>,
    include: Vec<PathBuf>,
}

thread_local! {
    static EXCLUSIONS: std::cell::RefCell<Exclusions> = std::cell::RefCell::new(Exclusions::default());
}

/// Sets what this call must not show or enter.
pub fn set_excluded(exclude: Vec<PathBuf>, include: Vec<PathBuf>) {
    EXCLUSIONS.with(|e| *e.borrow_mut() = Exclusions { exclude, include });
}

/// Whether the host excluded `path`: the longest excluded or included path
/// containing it is an excluded one (an exclusion wins a tie).
pub fn is_excluded(path: &Path) -> bool {
    EXCLUSIONS.with(|e| {
        let e = e.borrow();
        let longest = |list: &[PathBuf]| {
            list.iter()
                .filter(|x| path.starts_with(x))
                .map(|x| x.as_os_str().len())
                .max()
        };
        match (longest(&e.exclude), longest(&e.include)) {
            (Some(x), Some(i)) => x >= i,
            (Some(_), None) => true,
            _ => false,
        }
    })
}

/// The most directory entries one call examines before it stops walking.
pub const MAX_WALK_ENTRIES: usize = 50_000;

/// One directory entry.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The entry's file name (lossily converted to UTF-8).
    pub name: String,
    /// The entry's path (its directory's path joined with the name).
    pub path: PathBuf,
    /// Whether it is a directory, following symbolic links.
    pub is_dir: bool,
    /// Whether it is a regular file, following symbolic links.
    pub is_file: bool,
    /// Whether the entry itself is a symbolic link.
    pub is_symlink: bool,
}

/// A budget of directory entries shared by one call's reads.
#[derive(Debug, Clone)]
pub struct Budget {
    left: usize,
    /// Whether a read stopped because the budget ran out.
    pub exhausted: bool,
}

impl Budget {
    /// A budget of `entries` directory entries.
    pub fn new(entries: usize) -> Self {
        Budget {
            left: entries,
            exhausted: false,
        }
    }
}

/// Reads the entries of `dir` in read order, spending one unit of `budget`
/// per entry and stopping when it runs out.
pub fn read_entries(dir: &Path, budget: &mut Budget) -> std::io::Result<Vec<Entry>> {
    let mut out = Vec::new();
    for item in fs::read_dir(dir)? {
        if budget.left == 0 {
            budget.exhausted = true;
            break;
        }
        budget.left -= 1;
        let Ok(item) = item else { continue };
        let path = item.path();
        if is_excluded(&path) {
            continue;
        }
        let file_type = item.file_type().ok();
        let is_symlink = file_type.is_some_and(|t| t.is_symlink());
        let (is_dir, is_file) = if is_symlink {
            fs::metadata(&path).map_or((false, false), |m| (m.is_dir(), m.is_file()))
        } else {
            file_type.map_or((false, false), |t| (t.is_dir(), t.is_file()))
        };
        out.push(Entry {
            name: item.file_name().to_string_lossy().into_owned(),
            path,
            is_dir,
            is_file,
            is_symlink,
        });
    }
    Ok(out)
}

/// One directory reached by a [`Walker`]: its subdirectories and its other
/// entries, each in read order.
#[derive(Debug, Clone)]
pub struct DirListing {
    /// Its subdirectories (including symbolic links to directories).
    pub dirs: Vec<Entry>,
    /// Its other entries.
    pub files: Vec<Entry>,
}

/// A depth-first, top-down walk like `os.walk(top)`: the caller takes each
/// directory with [`Walker::next_dir`], prunes its `dirs`, and hands the
/// kept ones back with [`Walker::descend`]. Unreadable directories are
/// skipped silently, as `os.walk` does.
#[derive(Debug)]
pub struct Walker {
    stack: Vec<PathBuf>,
    /// The entry budget; `budget.exhausted` tells whether the walk stopped
    /// early.
    pub budget: Budget,
}

impl Walker {
    /// A walk of `top` spending at most `entries` directory entries.
    pub fn new(top: &Path, entries: usize) -> Self {
        Walker {
            stack: vec![top.to_path_buf()],
            budget: Budget::new(entries),
        }
    }

    /// The next directory of the walk, or `None` when the walk is over (or
    /// the budget ran out).
    pub fn next_dir(&mut self) -> Option<DirListing> {
        while let Some(path) = self.stack.pop() {
            if self.budget.exhausted {
                self.stack.clear();
                return None;
            }
            let Ok(entries) = read_entries(&path, &mut self.budget) else {
                continue;
            };
            let (dirs, files): (Vec<Entry>, Vec<Entry>) =
                entries.into_iter().partition(|e| e.is_dir);
            return Some(DirListing { dirs, files });
        }
        None
    }

    /// Queues the kept subdirectories `dirs` of the directory just taken,
    /// so they are walked next, in order; symbolic links are not followed.
    pub fn descend(&mut self, dirs: &[Entry]) {
        for d in dirs.iter().rev() {
            if !d.is_symlink {
                self.stack.push(d.path.clone());
            }
        }
    }
}

/// `path` relative to `base`, with `/` separators (the file name when
/// `path` is not under `base`).
pub fn relative_display(path: &Path, base: &Path) -> String {
    match path.strip_prefix(base) {
        Ok(rel) => rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/"),
        Err(_) => path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths() {
        assert_eq!(
            relative_display(Path::new("/w/a/b.txt"), Path::new("/w")),
            "a/b.txt"
        );
        assert_eq!(
            relative_display(Path::new("/x/b.txt"), Path::new("/w")),
            "b.txt"
        );
    }
}
