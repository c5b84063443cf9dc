//! `.abstractignore` files, read as the reference (abstractcore's
//! `AbstractIgnore`) reads them, for the built-in workspace tools and for
//! the host, which applies them to third-party tools' path arguments.
//!
//! A call's target (the directory listed or searched, the file read,
//! written or edited) is governed by the nearest `.abstractignore` in its
//! directory or a directory above it, up to the workspace's directory that
//! holds it (a tool sees nothing above its preopened directories; the host
//! stops at the same place). Its rules
//! follow the built-in ones (`.git/`, `node_modules/`, `*.d/`, ...): one
//! per line, `#` comments, `!` negates, a trailing `/` matches directories
//! only, a leading `/` or an inner `/` matches the path relative to the
//! ignore file's directory, otherwise the name; patterns are
//! case-sensitive `fnmatch` globs; the last matching rule decides.
//! Deeper `.abstractignore` files are not consulted for a walk from above.

use std::fs;
use std::path::{Path, PathBuf};

mod glob;
pub mod lines;

pub use glob::Glob;
use lines::py_splitlines;

/// The name of an ignore file.
const FILE_NAME: &str = ".abstractignore";

/// The reference's built-in rules, applied before an ignore file's.
const DEFAULT_LINES: &[&str] = &[
    ".git/",
    ".hg/",
    ".svn/",
    "__pycache__/",
    ".pytest_cache/",
    ".mypy_cache/",
    ".ruff_cache/",
    "node_modules/",
    "dist/",
    "build/",
    "target/",
    ".venv/",
    "venv/",
    "env/",
    ".env/",
    ".cursor/",
    "*.d/",
];

/// One rule of an ignore file.
struct Rule {
    /// The glob.
    glob: Glob,
    /// The pattern was anchored (`/x`) or holds a `/`: it matches the
    /// relative path rather than the name.
    on_path: bool,
    /// `!pattern`: a match un-ignores.
    negate: bool,
    /// `pattern/`: matches directories (and what is under them) only.
    dir_only: bool,
}

/// Parses ignore-file lines into rules.
fn parse<'a>(lines: impl IntoIterator<Item = &'a str>) -> Vec<Rule> {
    let mut rules = Vec::new();
    for raw in lines {
        let mut line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let negate = line.starts_with('!');
        if negate {
            line = line[1..].trim();
        }
        let dir_only = line.ends_with('/');
        if dir_only {
            line = line[..line.len() - 1].trim();
        }
        let anchored = line.starts_with('/');
        if anchored {
            line = line[1..].trim();
        }
        if line.is_empty() {
            continue;
        }
        rules.push(Rule {
            glob: Glob::case_sensitive(line),
            on_path: anchored || line.contains('/'),
            negate,
            dir_only,
        });
    }
    rules
}

/// The ignore policy for one call's target.
pub struct Policy {
    /// The ignore file's directory (or the target's directory without one).
    root: PathBuf,
    /// The built-in rules, then the file's.
    rules: Vec<Rule>,
}

impl Policy {
    /// The policy for `target` (a file or a directory).
    pub fn for_path(target: &Path) -> Policy {
        Policy::for_path_within(target, None)
    }

    /// The policy for `target`, looking for an ignore file no higher than
    /// `top` (when given and above `target`).
    pub fn for_path_within(target: &Path, top: Option<&Path>) -> Policy {
        let start = if target.is_dir() {
            target
        } else {
            target.parent().unwrap_or(target)
        };
        let mut rules = parse(DEFAULT_LINES.iter().copied());
        let within = |d: &Path| top.is_none_or(|t| !start.starts_with(t) || d.starts_with(t));
        let found = start
            .ancestors()
            .take_while(|d| within(d))
            .map(|d| d.join(FILE_NAME))
            .find(|f| f.is_file());
        let root = match found {
            Some(file) => {
                let text = fs::read_to_string(&file).unwrap_or_default();
                rules.extend(parse(py_splitlines(&text, false)));
                file.parent().unwrap_or(start).to_path_buf()
            }
            None => start.to_path_buf(),
        };
        Policy { root, rules }
    }

    /// Whether `path`, a symbolic link when `is_link`, is ignored: a link
    /// is judged by where it leads, as the reference resolves every path it
    /// checks (`path`'s directory must be resolved already).
    pub fn is_ignored_entry(&self, path: &Path, is_dir: bool, is_link: bool) -> bool {
        if is_link {
            self.is_ignored(&resolve(path), is_dir)
        } else {
            self.is_ignored(path, is_dir)
        }
    }

    /// Whether `path` (a directory when `is_dir`; its links resolved) is
    /// ignored.
    pub fn is_ignored(&self, path: &Path, is_dir: bool) -> bool {
        let part = |p: &std::ffi::OsStr| p.to_string_lossy().into_owned();
        let (rel, parts): (String, Vec<String>) = match path.strip_prefix(&self.root) {
            // The root itself is `.` by path and its own name by name.
            Ok(rel) if rel.as_os_str().is_empty() => (".".to_string(), Vec::new()),
            Ok(rel) => {
                let parts: Vec<String> = rel.iter().map(part).collect();
                (parts.join("/"), parts)
            }
            // Outside the root the absolute path is matched: by path
            // without its leading `/`, by parts with `/` the first one.
            Err(_) => {
                let parts: Vec<String> = path.iter().map(part).collect();
                let text = path.to_string_lossy();
                (text.trim_start_matches('/').to_string(), parts)
            }
        };
        let name = match parts.last() {
            Some(last) => last.clone(),
            None => path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        };
        let dirs = if is_dir {
            &parts[..]
        } else {
            &parts[..parts.len().saturating_sub(1)]
        };
        let mut ignored = false;
        for rule in &self.rules {
            let matched = if rule.dir_only {
                (1..=dirs.len()).any(|i| {
                    rule.glob.matches(&dirs[..i].join("/")) || rule.glob.matches(&dirs[i - 1])
                }) || (is_dir && (rule.glob.matches(&rel) || rule.glob.matches(&name)))
            } else if rule.on_path {
                rule.glob.matches(&rel)
            } else {
                rule.glob.matches(&name)
            };
            if matched {
                ignored = !rule.negate;
            }
        }
        ignored
    }
}

/// `path` with its symbolic links resolved as far as they exist (Python's
/// `Path.resolve()`): at most 40 links, `..` applied after a link.
pub fn resolve(path: &Path) -> PathBuf {
    let mut todo: Vec<std::ffi::OsString> = path
        .components()
        .rev()
        .map(|c| c.as_os_str().to_os_string())
        .collect();
    let mut out = PathBuf::from("/");
    let mut links = 0;
    while let Some(part) = todo.pop() {
        match part.to_str() {
            Some("/") => out = PathBuf::from("/"),
            Some(".") => {}
            Some("..") => {
                out.pop();
            }
            _ => {
                let next = out.join(&part);
                let link = fs::symlink_metadata(&next).is_ok_and(|m| m.file_type().is_symlink());
                match fs::read_link(&next) {
                    Ok(target) if link && links < 40 => {
                        links += 1;
                        todo.extend(
                            target
                                .components()
                                .rev()
                                .map(|c| c.as_os_str().to_os_string()),
                        );
                        if target.is_absolute() {
                            out = PathBuf::from("/");
                        }
                    }
                    _ => out = next,
                }
            }
        }
    }
    out
}

/// Whether a write or an edit of `path` is refused: the file or its
/// directory is ignored.
pub fn refuses_write(path: &Path) -> bool {
    let policy = Policy::for_path(path);
    let parent = path.parent().unwrap_or(path);
    policy.is_ignored(path, false) || policy.is_ignored(parent, true)
}

#[cfg(test)]
mod tests {
    use super::{parse, Policy};
    use std::path::{Path, PathBuf};

    /// A policy rooted at `/w` with the built-in rules and `lines`.
    fn policy(lines: &[&str]) -> Policy {
        let mut rules = parse(super::DEFAULT_LINES.iter().copied());
        rules.extend(parse(lines.iter().copied()));
        Policy {
            root: PathBuf::from("/w"),
            rules,
        }
    }

    #[test]
    fn names_paths_and_negation() {
        let p = policy(&[
            "# secrets",
            "*.key",
            "!keep.key",
            "/top.txt",
            "docs/*.md",
            "logs/",
        ]);
        let ignored = |path: &str, dir: bool| p.is_ignored(Path::new(path), dir);
        assert!(ignored("/w/a.key", false));
        assert!(ignored("/w/sub/b.key", false));
        assert!(!ignored("/w/keep.key", false));
        assert!(ignored("/w/top.txt", false));
        assert!(!ignored("/w/sub/top.txt", false));
        assert!(ignored("/w/docs/x.md", false));
        assert!(!ignored("/w/sub/docs/x.md", false));
        assert!(ignored("/w/logs", true));
        assert!(!ignored("/w/logs", false));
        assert!(ignored("/w/logs/today.txt", false));
        assert!(ignored("/w/a/node_modules/x.js", false));
        assert!(ignored("/w/runs.d", true));
        assert!(!ignored("/w/A.KEY", false));
        assert!(!ignored("/w/main.rs", false));
    }
}
