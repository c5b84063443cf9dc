//! `|`-separated glob patterns (`list_files`' and `search_files`'
//! `pattern` and `file_pattern`), each matched case-insensitively with
//! Python `fnmatch` semantics.

pub use stepwell_abstractignore::Glob;

/// Several globs separated by `|` (each trimmed); a name matches when any
/// of them does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobSet {
    globs: Vec<Glob>,
}

impl GlobSet {
    /// Compiles the `|`-separated `patterns`.
    pub fn new(patterns: &str) -> GlobSet {
        GlobSet {
            globs: split_patterns(patterns)
                .iter()
                .map(|p| Glob::new(p))
                .collect(),
        }
    }

    /// Whether any of the globs matches `name`.
    pub fn matches(&self, name: &str) -> bool {
        self.globs.iter().any(|g| g.matches(name))
    }
}

/// The `|`-separated patterns of `patterns`, each trimmed.
pub fn split_patterns(patterns: &str) -> Vec<String> {
    patterns
        .split('|')
        .map(|p| crate::text::py_strip(p).to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_sets() {
        let set = GlobSet::new("*.py | *.md|README*");
        assert!(set.matches("a.py"));
        assert!(set.matches("b.MD"));
        assert!(set.matches("readme.txt"));
        assert!(!set.matches("c.rs"));
        assert_eq!(split_patterns("a| b |c"), vec!["a", "b", "c"]);
    }
}
