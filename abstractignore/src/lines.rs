//! Python's `str.splitlines()`.

/// The byte length of the line break starting at byte `i` of `s`, under
/// Python's `str.splitlines()` rules (`\r\n`, `\n`, `\r`, `\v`, `\f`,
/// U+001C..U+001E, U+0085, U+2028, U+2029), or `None`.
fn line_break_len(s: &str, i: usize) -> Option<usize> {
    let rest = &s[i..];
    let c = rest.chars().next()?;
    match c {
        '\r' if rest.as_bytes().get(1) == Some(&b'\n') => Some(2),
        '\n' | '\r' | '\u{b}' | '\u{c}' | '\u{1c}' | '\u{1d}' | '\u{1e}' | '\u{85}'
        | '\u{2028}' | '\u{2029}' => Some(c.len_utf8()),
        _ => None,
    }
}

/// Python's `str.splitlines(keepends)`: the lines of `s`, split at every
/// line boundary Python knows, with or without their line breaks.
pub fn py_splitlines(s: &str, keepends: bool) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < s.len() {
        if let Some(n) = line_break_len(s, i) {
            out.push(if keepends {
                &s[start..i + n]
            } else {
                &s[start..i]
            });
            i += n;
            start = i;
        } else {
            i += s[i..].chars().next().map_or(1, char::len_utf8);
        }
    }
    if start < s.len() {
        out.push(&s[start..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::py_splitlines;

    #[test]
    fn splitlines_follows_python() {
        assert!(py_splitlines("", false).is_empty());
        assert_eq!(py_splitlines("a\nb", false), vec!["a", "b"]);
        assert_eq!(py_splitlines("a\nb\n", false), vec!["a", "b"]);
        assert_eq!(py_splitlines("a\r\nb\rc", false), vec!["a", "b", "c"]);
        assert_eq!(
            py_splitlines("a\u{b}b\u{2028}c", false),
            vec!["a", "b", "c"]
        );
        assert_eq!(py_splitlines("a\n\nb", false), vec!["a", "", "b"]);
        assert_eq!(py_splitlines("a\r\nb\n", true), vec!["a\r\n", "b\n"]);
        assert_eq!(py_splitlines("\n", true), vec!["\n"]);
    }
}
