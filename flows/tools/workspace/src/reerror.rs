//! Why a pattern is not a regular expression, in one line and in the words
//! of Python's `re` (`missing ), unterminated subpattern at position 0`),
//! for the `Invalid regex pattern '<p>': <reason>` errors of `search_files`
//! and `edit_file`.
//!
//! The pattern is parsed again with `regex-syntax` to learn what is wrong
//! and where; the kinds Python also refuses get Python's message and
//! position (in characters). Other kinds (look-around, backreferences,
//! which Python accepts and the `regex` crate does not) keep the crate's
//! one-line description, with the same `at position N` ending.

use regex_syntax::ast::{self, ErrorKind};

/// The one-line reason `pattern` does not compile; `fallback` is the
/// `regex` crate's error, used when the parser finds nothing wrong (a size
/// limit, for one).
pub fn reason(pattern: &str, fallback: &regex::Error) -> String {
    match ast::parse::Parser::new().parse(pattern) {
        Err(e) => ast_reason(pattern, &e),
        Ok(ast) => {
            let mut translator = regex_syntax::hir::translate::Translator::new();
            match translator.translate(pattern, &ast) {
                Err(e) => format!(
                    "{} at position {}",
                    e.kind(),
                    char_pos(pattern, e.span().start.offset)
                ),
                Ok(_) => first_line(&fallback.to_string()),
            }
        }
    }
}

/// Python's wording of a parse error, where Python has one.
fn ast_reason(pattern: &str, e: &ast::Error) -> String {
    let span = e.span();
    let start = char_pos(pattern, span.start.offset);
    let text = &pattern[span.start.offset..span.end.offset];
    let at = |what: String, pos: usize| format!("{what} at position {pos}");
    match e.kind() {
        ErrorKind::GroupUnclosed => at("missing ), unterminated subpattern".into(), start),
        ErrorKind::GroupUnopened => at("unbalanced parenthesis".into(), start),
        ErrorKind::ClassUnclosed => at("unterminated character set".into(), start),
        ErrorKind::RepetitionMissing => at("nothing to repeat".into(), start),
        ErrorKind::RepetitionCountInvalid => {
            at("min repeat greater than max repeat".into(), start + 1)
        }
        ErrorKind::ClassRangeInvalid => at(format!("bad character range {text}"), start),
        ErrorKind::EscapeUnexpectedEof => at(
            "bad escape (end of pattern)".into(),
            pattern.chars().count().saturating_sub(1),
        ),
        ErrorKind::EscapeUnrecognized => at(format!("bad escape {text}"), start),
        kind => at(kind.to_string(), start),
    }
}

/// The character index of byte offset `byte` in `s`.
fn char_pos(s: &str, byte: usize) -> usize {
    s[..byte.min(s.len())].chars().count()
}

/// The first line of a possibly multi-line message, trimmed.
fn first_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("invalid pattern")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::reason;

    /// The reason for `pattern`, which must not compile.
    fn reason_of(pattern: &str) -> String {
        let err = regex::Regex::new(pattern).expect_err(pattern);
        reason(pattern, &err)
    }

    /// Each case with the text Python 3.11's `re.compile` raises.
    #[test]
    fn python_messages_and_positions() {
        let cases: &[(&str, &str)] = &[
            ("(abc", "missing ), unterminated subpattern at position 0"),
            ("é(x", "missing ), unterminated subpattern at position 1"),
            ("abc)", "unbalanced parenthesis at position 3"),
            (")", "unbalanced parenthesis at position 0"),
            ("[abc", "unterminated character set at position 0"),
            ("[]", "unterminated character set at position 0"),
            ("*abc", "nothing to repeat at position 0"),
            ("a|*", "nothing to repeat at position 2"),
            ("\\", "bad escape (end of pattern) at position 0"),
            ("\\q", "bad escape \\q at position 0"),
            ("[z-a]", "bad character range z-a at position 1"),
            ("a{3,2}", "min repeat greater than max repeat at position 2"),
        ];
        for (pattern, want) in cases {
            assert_eq!(reason_of(pattern), *want, "{pattern:?}");
        }
    }

    /// What only the `regex` crate refuses is one line, with a position.
    #[test]
    fn other_errors_are_one_line() {
        let got = reason_of("(?<=a)b");
        assert!(!got.contains('\n'), "{got}");
        assert!(got.ends_with(" at position 0"), "{got}");
    }
}
