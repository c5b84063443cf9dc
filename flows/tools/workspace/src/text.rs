//! Text helpers shared by the tools: Python-compatible formatting (`repr`,
//! `json.dumps`, `{:,}`), Python's line splitting rules, lenient UTF-8
//! decoding, a universal-newline line reader, and path display.

use std::io::{self, BufRead};

/// The most bytes any tool reads from one file.
pub const MAX_READ_BYTES: u64 = 64 << 20;

/// `n` with thousands separators, like Python's `f"{n:,}"`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Whether Python's `str.isspace()` holds for `c` (Unicode whitespace plus
/// the ASCII information separators U+001C..U+001F).
pub fn py_is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.strip()`.
pub fn py_strip(s: &str) -> &str {
    s.trim_matches(py_is_space)
}

/// Python's `str.lstrip()`.
pub fn py_lstrip(s: &str) -> &str {
    s.trim_start_matches(py_is_space)
}

/// Python's `str.rstrip()`.
pub fn py_rstrip(s: &str) -> &str {
    s.trim_end_matches(py_is_space)
}

/// Whether Python would print `c` as itself in a `repr` (an approximation
/// of `str.isprintable()`: control, format, separator and private-use
/// characters other than the plain space are escaped).
fn py_printable(c: char) -> bool {
    !(c.is_control()
        || matches!(
            c,
            '\u{a0}'
                | '\u{ad}'
                | '\u{1680}'
                | '\u{2000}'..='\u{200f}'
                | '\u{2028}'..='\u{202f}'
                | '\u{205f}'..='\u{206f}'
                | '\u{3000}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}'
                | '\u{e000}'..='\u{f8ff}'
        ))
}

/// Python's `repr()` of a string: single quotes unless the text holds a
/// single quote and no double quote, with Python's escapes.
pub fn py_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !py_printable(c) => {
                let v = c as u32;
                if v < 0x100 {
                    out.push_str(&format!("\\x{v:02x}"));
                } else if v < 0x10000 {
                    out.push_str(&format!("\\u{v:04x}"));
                } else {
                    out.push_str(&format!("\\U{v:08x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Python's `repr()` of a list of strings: `['a', 'b']`.
pub fn py_list_repr(items: &[String]) -> String {
    let inner: Vec<String> = items.iter().map(|s| py_repr(s)).collect();
    format!("[{}]", inner.join(", "))
}

/// Python's `json.dumps()` of a string (ASCII-only output: every non-ASCII
/// character becomes a `\uXXXX` escape, astral ones a surrogate pair).
pub fn json_dumps(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if !(' '..='~').contains(&c) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

pub use stepwell_abstractignore::lines::py_splitlines;

/// Decodes UTF-8, dropping invalid byte sequences (Python's
/// `errors="ignore"`).
pub fn decode_ignore(mut bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    loop {
        match std::str::from_utf8(bytes) {
            Ok(s) => {
                out.push_str(s);
                return out;
            }
            Err(e) => {
                let valid = e.valid_up_to();
                out.push_str(std::str::from_utf8(&bytes[..valid]).unwrap_or_default());
                match e.error_len() {
                    Some(n) => bytes = &bytes[valid + n..],
                    None => return out,
                }
            }
        }
    }
}

/// Whether the first bytes of a file look binary: a NUL byte, or bytes that
/// are not UTF-8 (an incomplete sequence at the very end is allowed: the
/// sample may have cut a character).
pub fn looks_binary(sample: &[u8]) -> bool {
    if sample.contains(&0) {
        return true;
    }
    match std::str::from_utf8(sample) {
        Ok(_) => false,
        Err(e) => e.error_len().is_some(),
    }
}

/// Replaces `\r\n` and lone `\r` by `\n` (Python's universal newlines).
pub fn normalize_newlines(s: &str) -> String {
    s.replace("\r\n", "\n").replace('\r', "\n")
}

/// One raw line of a file: its bytes without the line break, and whether a
/// line break ended it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawLine {
    /// The line's bytes, without the line break.
    pub bytes: Vec<u8>,
    /// Whether a line break (`\n`, `\r\n` or `\r`) ended the line.
    pub terminated: bool,
}

/// Splits one chunk read up to (and including) a `\n` into lines at `\r\n`,
/// `\n` and lone `\r`, the way Python's universal newlines split text.
pub fn split_universal(chunk: &[u8]) -> Vec<RawLine> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < chunk.len() {
        match chunk[i] {
            b'\r' => {
                out.push(RawLine {
                    bytes: chunk[start..i].to_vec(),
                    terminated: true,
                });
                i += if chunk.get(i + 1) == Some(&b'\n') {
                    2
                } else {
                    1
                };
                start = i;
            }
            b'\n' => {
                out.push(RawLine {
                    bytes: chunk[start..i].to_vec(),
                    terminated: true,
                });
                i += 1;
                start = i;
            }
            _ => i += 1,
        }
    }
    if start < chunk.len() {
        out.push(RawLine {
            bytes: chunk[start..].to_vec(),
            terminated: false,
        });
    }
    out
}

/// Reads a file's lines as Python's text mode does (universal newlines),
/// leaving decoding to the caller.
pub struct LineReader<R> {
    inner: R,
    queue: std::collections::VecDeque<RawLine>,
    done: bool,
}

impl<R: BufRead> LineReader<R> {
    /// A reader of `inner`'s lines.
    pub fn new(inner: R) -> Self {
        LineReader {
            inner,
            queue: std::collections::VecDeque::new(),
            done: false,
        }
    }
}

impl<R: BufRead> Iterator for LineReader<R> {
    type Item = io::Result<RawLine>;

    /// The next line, or an I/O error.
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(line) = self.queue.pop_front() {
                return Some(Ok(line));
            }
            if self.done {
                return None;
            }
            let mut buf = Vec::new();
            match self.inner.read_until(b'\n', &mut buf) {
                Ok(0) => self.done = true,
                Ok(_) => self.queue.extend(split_universal(&buf)),
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }
}

/// Normalizes a path's text the way Python's `pathlib` prints it: repeated
/// slashes collapse, `.` components go, a trailing slash goes (`..` stays).
pub fn normalize_path_text(p: &str) -> String {
    let absolute = p.starts_with('/');
    let parts: Vec<&str> = p
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect();
    let joined = parts.join("/");
    match (absolute, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_string(),
        (false, false) => joined,
    }
}

/// How a tool shows a path argument: absolute (relative paths are joined to
/// the current directory when there is one) and normalized like `pathlib`.
pub fn display_path(raw: &str) -> String {
    if raw.starts_with('/') {
        return normalize_path_text(raw);
    }
    match std::env::current_dir() {
        Ok(cwd) => normalize_path_text(&format!("{}/{raw}", cwd.to_string_lossy())),
        Err(_) => normalize_path_text(raw),
    }
}

/// An I/O error's message without Rust's ` (os error N)` suffix (WASI's
/// error numbers differ from the host's, so they would only mislead).
pub fn io_error_text(e: &io::Error) -> String {
    let text = e.to_string();
    match text.rfind(" (os error ") {
        Some(i) if text.ends_with(')') => text[..i].to_string(),
        _ => text,
    }
}

/// The char index of byte offset `byte` in `s` (clamped to `s`).
pub fn char_index(s: &str, byte: usize) -> usize {
    let mut b = byte.min(s.len());
    while !s.is_char_boundary(b) {
        b -= 1;
    }
    s[..b].chars().count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(thousands(120000), "120,000");
    }

    #[test]
    fn repr_matches_python() {
        assert_eq!(py_repr("abc"), "'abc'");
        assert_eq!(py_repr("it's"), "\"it's\"");
        assert_eq!(py_repr("a'b\"c"), "'a\\'b\"c'");
        assert_eq!(py_repr("a\\b\n"), "'a\\\\b\\n'");
        assert_eq!(py_repr("\u{7}é"), "'\\x07é'");
        assert_eq!(py_repr("x\u{2028}"), "'x\\u2028'");
        assert_eq!(
            py_list_repr(&["src/*.py".into(), "a".into()]),
            "['src/*.py', 'a']"
        );
    }

    #[test]
    fn json_dumps_is_ascii() {
        assert_eq!(json_dumps("a\"b"), "\"a\\\"b\"");
        assert_eq!(json_dumps("é"), "\"\\u00e9\"");
        assert_eq!(json_dumps("😀"), "\"\\ud83d\\ude00\"");
        assert_eq!(json_dumps("\u{1}\t"), "\"\\u0001\\t\"");
        assert_eq!(json_dumps("/a/b"), "\"/a/b\"");
    }

    #[test]
    fn strip_uses_python_whitespace() {
        assert_eq!(py_strip("\u{1c} a \t"), "a");
        assert_eq!(py_lstrip("  a "), "a ");
        assert_eq!(py_rstrip("  a \n"), "  a");
    }

    #[test]
    fn decode_ignore_drops_bad_bytes() {
        assert_eq!(decode_ignore(b"a\xffb"), "ab");
        assert_eq!(decode_ignore("é".as_bytes()), "é");
        assert_eq!(decode_ignore(b"ab\xc3"), "ab");
    }

    #[test]
    fn binary_sniff() {
        assert!(looks_binary(b"a\0b"));
        assert!(looks_binary(b"\xff\xfe"));
        assert!(!looks_binary(b"plain text"));
        // A character cut at the end of the sample is not binary.
        assert!(!looks_binary(&"aé".as_bytes()[..2]));
    }

    #[test]
    fn universal_newlines() {
        let lines = split_universal(b"a\rb\r\n");
        assert_eq!(
            lines,
            vec![
                RawLine {
                    bytes: b"a".to_vec(),
                    terminated: true
                },
                RawLine {
                    bytes: b"b".to_vec(),
                    terminated: true
                },
            ]
        );
        let reader = LineReader::new(&b"x\ny\r\nz"[..]);
        let got: Vec<(Vec<u8>, bool)> = reader
            .map(|l| l.unwrap())
            .map(|l| (l.bytes, l.terminated))
            .collect();
        assert_eq!(
            got,
            vec![
                (b"x".to_vec(), true),
                (b"y".to_vec(), true),
                (b"z".to_vec(), false)
            ]
        );
        assert_eq!(normalize_newlines("a\r\nb\rc\n"), "a\nb\nc\n");
    }

    #[test]
    fn path_text_is_normalized() {
        assert_eq!(normalize_path_text("/a//b/./c/"), "/a/b/c");
        assert_eq!(normalize_path_text("/"), "/");
        assert_eq!(normalize_path_text("/a/../b"), "/a/../b");
        assert_eq!(normalize_path_text("."), ".");
        assert_eq!(display_path("/w/x/"), "/w/x");
    }

    #[test]
    fn io_error_text_drops_os_error_number() {
        let e = io::Error::from_raw_os_error(2);
        assert!(!io_error_text(&e).contains("os error"));
    }

    #[test]
    fn char_index_counts_chars() {
        assert_eq!(char_index("aéb", 3), 2);
        assert_eq!(char_index("aéb", 2), 1);
        assert_eq!(char_index("ab", 10), 2);
    }
}
