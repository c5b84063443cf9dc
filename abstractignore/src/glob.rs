//! A small glob matcher with Python `fnmatch` semantics: `*` (any run of
//! characters, `/` too), `?` (any one character), `[abc]`, `[a-z]` and
//! `[!abc]`; an unclosed `[` is a literal. Case-insensitive (`fnmatch` on
//! lowercased names, as the reference's listings) or case-sensitive
//! (`fnmatchcase`, as its ignore rules).

/// One element of a compiled glob.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// `*`: any run of characters, possibly empty.
    Star,
    /// `?`: any one character.
    Any,
    /// A literal character.
    Char(char),
    /// `[...]`: one character of a set.
    Set(CharSet),
}

/// A bracket expression.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CharSet {
    /// `[!...]`: any character not in the set.
    negated: bool,
    /// Inclusive character ranges (a single character is `(c, c)`).
    ranges: Vec<(char, char)>,
}

impl CharSet {
    /// Whether `c` is matched by the set.
    fn matches(&self, c: char) -> bool {
        let inside = self.ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&c));
        inside != self.negated
    }
}

/// One element of a bracket expression before ranges are resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SetElem {
    /// A literal character.
    Lit(char),
    /// A hyphen that joins the characters on either side into a range.
    Range,
}

/// Builds the set for the bracket body `pat[i..j]` the way Python's
/// `fnmatch.translate` does: hyphens after the first character split the
/// body into chunks joined by ranges, and reversed ranges are dropped.
fn build_set(pat: &[char], i: usize, j: usize) -> CharSet {
    let stuff = &pat[i..j];
    let mut elems: Vec<SetElem> = Vec::new();
    if !stuff.contains(&'-') {
        elems.extend(stuff.iter().map(|&c| SetElem::Lit(c)));
    } else {
        let mut chunks: Vec<Vec<char>> = Vec::new();
        let mut start = i;
        let mut k = if pat[i] == '!' { i + 2 } else { i + 1 };
        while k < j {
            match pat[k..j].iter().position(|&c| c == '-') {
                Some(off) => {
                    let pos = k + off;
                    chunks.push(pat[start..pos].to_vec());
                    start = pos + 1;
                    k = pos + 3;
                }
                None => break,
            }
        }
        let tail = pat[start..j].to_vec();
        if !tail.is_empty() {
            chunks.push(tail);
        } else if let Some(last) = chunks.last_mut() {
            last.push('-');
        }
        // Remove empty (reversed) ranges, as fnmatch does.
        let mut idx = chunks.len();
        while idx > 1 {
            idx -= 1;
            let (prev_last, next_first) = (chunks[idx - 1].last(), chunks[idx].first());
            if let (Some(&a), Some(&b)) = (prev_last, next_first) {
                if a > b {
                    let next = chunks.remove(idx);
                    let prev = &mut chunks[idx - 1];
                    prev.pop();
                    prev.extend_from_slice(&next[1..]);
                }
            }
        }
        for (n, chunk) in chunks.iter().enumerate() {
            if n > 0 {
                elems.push(SetElem::Range);
            }
            elems.extend(chunk.iter().map(|&c| SetElem::Lit(c)));
        }
    }
    let negated = elems.first() == Some(&SetElem::Lit('!'));
    if negated {
        elems.remove(0);
    }
    let mut ranges = Vec::new();
    let mut n = 0;
    while n < elems.len() {
        match (elems[n], elems.get(n + 1), elems.get(n + 2)) {
            (SetElem::Lit(a), Some(SetElem::Range), Some(&SetElem::Lit(b))) => {
                ranges.push((a, b));
                n += 3;
            }
            (SetElem::Lit(a), _, _) => {
                ranges.push((a, a));
                n += 1;
            }
            (SetElem::Range, _, _) => {
                ranges.push(('-', '-'));
                n += 1;
            }
        }
    }
    CharSet { negated, ranges }
}

/// A compiled glob pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    tokens: Vec<Token>,
    /// Names are lowercased before matching (`fnmatch`), or not
    /// (`fnmatchcase`).
    fold: bool,
}

impl Glob {
    /// Compiles `pattern` (lowercased first).
    pub fn new(pattern: &str) -> Glob {
        Glob::compile(&pattern.to_lowercase(), true)
    }

    /// Compiles `pattern` to match case-sensitively (`fnmatch.fnmatchcase`).
    pub fn case_sensitive(pattern: &str) -> Glob {
        Glob::compile(pattern, false)
    }

    /// Compiles `pattern` as given; `fold` lowercases the names matched.
    fn compile(pattern: &str, fold: bool) -> Glob {
        let pat: Vec<char> = pattern.chars().collect();
        let mut tokens = Vec::new();
        let mut i = 0;
        while i < pat.len() {
            let c = pat[i];
            i += 1;
            match c {
                '*' => {
                    if tokens.last() != Some(&Token::Star) {
                        tokens.push(Token::Star);
                    }
                }
                '?' => tokens.push(Token::Any),
                '[' => {
                    let mut j = i;
                    if j < pat.len() && pat[j] == '!' {
                        j += 1;
                    }
                    if j < pat.len() && pat[j] == ']' {
                        j += 1;
                    }
                    while j < pat.len() && pat[j] != ']' {
                        j += 1;
                    }
                    if j >= pat.len() {
                        tokens.push(Token::Char('['));
                    } else {
                        tokens.push(Token::Set(build_set(&pat, i, j)));
                        i = j + 1;
                    }
                }
                c => tokens.push(Token::Char(c)),
            }
        }
        Glob { tokens, fold }
    }

    /// Whether `name` (lowercased first, unless case-sensitive) matches
    /// the whole pattern.
    pub fn matches(&self, name: &str) -> bool {
        let text: Vec<char> = if self.fold {
            name.to_lowercase().chars().collect()
        } else {
            name.chars().collect()
        };
        let one = |tok: &Token, c: char| match tok {
            Token::Star => false,
            Token::Any => true,
            Token::Char(x) => *x == c,
            Token::Set(set) => set.matches(c),
        };
        let (mut t, mut p) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while t < text.len() {
            if p < self.tokens.len() && one(&self.tokens[p], text[t]) {
                t += 1;
                p += 1;
            } else if p < self.tokens.len() && self.tokens[p] == Token::Star {
                star = Some((p, t));
                p += 1;
            } else if let Some((sp, st)) = star {
                p = sp + 1;
                t = st + 1;
                star = Some((sp, st + 1));
            } else {
                return false;
            }
        }
        while p < self.tokens.len() && self.tokens[p] == Token::Star {
            p += 1;
        }
        p == self.tokens.len()
    }
}

#[cfg(test)]
mod tests {
    use super::Glob;

    fn m(pattern: &str, name: &str) -> bool {
        Glob::new(pattern).matches(name)
    }

    #[test]
    fn stars_and_questions() {
        assert!(m("*", "anything"));
        assert!(m("*", ""));
        assert!(m("*.py", "main.py"));
        assert!(!m("*.py", "main.pyc"));
        assert!(m("*test*", "my_test_file.rs"));
        assert!(m("a?c", "abc"));
        assert!(!m("a?c", "ac"));
        assert!(m("**.md", "x.md"));
        assert!(m("a*b*c", "aXXbYYc"));
        assert!(!m("a*b*c", "aXXbYY"));
    }

    #[test]
    fn case_insensitive() {
        assert!(m("*.PY", "main.py"));
        assert!(m("readme*", "README.md"));
        assert!(m("*TEST*", "unit_test.py"));
    }

    #[test]
    fn bracket_sets() {
        assert!(m("[abc].txt", "b.txt"));
        assert!(!m("[abc].txt", "d.txt"));
        assert!(m("[a-c]x", "bx"));
        assert!(!m("[a-c]x", "dx"));
        assert!(m("[!a-c]x", "dx"));
        assert!(!m("[!a-c]x", "ax"));
        assert!(m("[]]", "]"));
        assert!(m("[a-]", "-"));
        assert!(m("[!-a]", "b"));
        assert!(!m("[!-a]", "-"));
        // `^` is a literal in fnmatch, not a negation.
        assert!(m("[^a]", "^"));
        // A reversed range matches nothing.
        assert!(!m("[z-a]", "m"));
        // Unclosed bracket is a literal.
        assert!(m("[abc", "[abc"));
        assert!(m("file[0-9].log", "file7.log"));
    }
}
