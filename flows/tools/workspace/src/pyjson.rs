//! The first error Python's `json.loads` (3.11) reports for a text, with
//! its message and place, so that `edit_file`'s JSON guard words a broken
//! document as the reference does (`line 1 column 9: Expecting ',' delimiter`).
//!
//! A small recursive scanner over characters (Python counts positions in
//! characters): it accepts what `json.loads` accepts (including `NaN`,
//! `Infinity` and `-Infinity`) and stops at the first place and with the
//! message Python's decoder stops with.

/// A decoding error: Python's message and the character position it names.
#[derive(Debug, PartialEq)]
struct Fail {
    /// The message (`Expecting value`, `Extra data`, ...).
    msg: &'static str,
    /// The character offset Python reports.
    pos: usize,
}

/// Why a value could not start at a position (Python's `StopIteration`).
const EXPECTING_VALUE: &str = "Expecting value";
/// The deepest nesting accepted; deeper documents are refused like Python's
/// recursion limit refuses them (with a message of our own).
const MAX_DEPTH: usize = 900;

/// The scanner's state: the text's characters.
struct Scanner {
    /// The document.
    s: Vec<char>,
}

impl Scanner {
    /// The position of the first non-whitespace character at or after `i`.
    fn ws(&self, mut i: usize) -> usize {
        while matches!(self.s.get(i), Some(' ' | '\t' | '\n' | '\r')) {
            i += 1;
        }
        i
    }

    /// The text at `i` starts with `word`.
    fn starts(&self, i: usize, word: &str) -> bool {
        word.chars()
            .enumerate()
            .all(|(k, c)| self.s.get(i + k) == Some(&c))
    }

    /// Scans one value at `i`; the position after it.
    fn value(&self, i: usize, depth: usize) -> Result<usize, Fail> {
        if depth > MAX_DEPTH {
            return Err(Fail {
                msg: "maximum recursion depth exceeded",
                pos: i,
            });
        }
        let fail = Fail {
            msg: EXPECTING_VALUE,
            pos: i,
        };
        match self.s.get(i) {
            None => Err(fail),
            Some('"') => self.string(i + 1),
            Some('{') => self.object(i + 1, depth + 1),
            Some('[') => self.array(i + 1, depth + 1),
            Some(_) => {
                for word in ["null", "true", "false", "NaN", "Infinity", "-Infinity"] {
                    if self.starts(i, word) {
                        return Ok(i + word.chars().count());
                    }
                }
                self.number(i).ok_or(fail)
            }
        }
    }

    /// Matches Python's number pattern
    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?` at `i`.
    fn number(&self, i: usize) -> Option<usize> {
        let digits = |from: usize| {
            let mut j = from;
            while self.s.get(j).is_some_and(char::is_ascii_digit) {
                j += 1;
            }
            j
        };
        let mut j = i + usize::from(self.s.get(i) == Some(&'-'));
        match self.s.get(j) {
            Some('0') => j += 1,
            Some('1'..='9') => j = digits(j),
            _ => return None,
        }
        if self.s.get(j) == Some(&'.') && digits(j + 1) > j + 1 {
            j = digits(j + 1);
        }
        if matches!(self.s.get(j), Some('e' | 'E')) {
            let k = j + 1 + usize::from(matches!(self.s.get(j + 1), Some('+' | '-')));
            if digits(k) > k {
                j = digits(k);
            }
        }
        Some(j)
    }

    /// Scans a string's body after its opening quote at `i - 1`.
    fn string(&self, i: usize) -> Result<usize, Fail> {
        let begin = i - 1;
        let unterminated = Fail {
            msg: "Unterminated string starting at",
            pos: begin,
        };
        let mut j = i;
        loop {
            match self.s.get(j) {
                None => return Err(unterminated),
                Some('"') => return Ok(j + 1),
                Some('\\') => j = self.escape(j + 1, begin)?,
                Some(&c) if (c as u32) < 0x20 => {
                    return Err(Fail {
                        msg: "Invalid control character at",
                        pos: j,
                    })
                }
                Some(_) => j += 1,
            }
        }
    }

    /// Scans an escape whose letter is at `j`; the position after it.
    fn escape(&self, j: usize, begin: usize) -> Result<usize, Fail> {
        match self.s.get(j) {
            None => Err(Fail {
                msg: "Unterminated string starting at",
                pos: begin,
            }),
            Some('"' | '\\' | '/' | 'b' | 'f' | 'n' | 'r' | 't') => Ok(j + 1),
            Some('u') => {
                let hex = (1..=4).all(|k| self.s.get(j + k).is_some_and(char::is_ascii_hexdigit));
                if hex {
                    Ok(j + 5)
                } else {
                    Err(Fail {
                        msg: "Invalid \\uXXXX escape",
                        pos: j,
                    })
                }
            }
            Some(_) => Err(Fail {
                msg: "Invalid \\escape",
                pos: j - 1,
            }),
        }
    }

    /// Scans an object's members after its `{` at `i - 1`.
    fn object(&self, i: usize, depth: usize) -> Result<usize, Fail> {
        let expecting_name = |pos| Fail {
            msg: "Expecting property name enclosed in double quotes",
            pos,
        };
        let mut j = self.ws(i);
        match self.s.get(j) {
            Some('}') => return Ok(j + 1),
            Some('"') => {}
            _ => return Err(expecting_name(j)),
        }
        loop {
            j = self.ws(self.string(j + 1)?);
            if self.s.get(j) != Some(&':') {
                return Err(Fail {
                    msg: "Expecting ':' delimiter",
                    pos: j,
                });
            }
            j = self.ws(self.value(self.ws(j + 1), depth)?);
            match self.s.get(j) {
                Some('}') => return Ok(j + 1),
                Some(',') => {}
                _ => {
                    return Err(Fail {
                        msg: "Expecting ',' delimiter",
                        pos: j,
                    })
                }
            }
            j = self.ws(j + 1);
            if self.s.get(j) != Some(&'"') {
                return Err(expecting_name(j));
            }
        }
    }

    /// Scans an array's items after its `[` at `i - 1`.
    fn array(&self, i: usize, depth: usize) -> Result<usize, Fail> {
        let mut j = self.ws(i);
        if self.s.get(j) == Some(&']') {
            return Ok(j + 1);
        }
        loop {
            j = self.ws(self.value(j, depth)?);
            match self.s.get(j) {
                Some(']') => return Ok(j + 1),
                Some(',') => j = self.ws(j + 1),
                _ => {
                    return Err(Fail {
                        msg: "Expecting ',' delimiter",
                        pos: j,
                    })
                }
            }
        }
    }

    /// Decodes the whole document as `json.loads` does.
    fn document(&self) -> Result<(), Fail> {
        if self.s.first() == Some(&'\u{feff}') {
            return Err(Fail {
                msg: "Unexpected UTF-8 BOM (decode using utf-8-sig)",
                pos: 0,
            });
        }
        let end = self.ws(self.value(self.ws(0), 0)?);
        if end != self.s.len() {
            return Err(Fail {
                msg: "Extra data",
                pos: end,
            });
        }
        Ok(())
    }
}

/// The reference's detail of why `text` is not JSON (`line L column C:
/// message`, positions as Python counts them), or `None` when it parses.
pub fn error_detail(text: &str) -> Option<String> {
    let scanner = Scanner {
        s: text.chars().collect(),
    };
    let fail = scanner.document().err()?;
    let before = &scanner.s[..fail.pos];
    let line = before.iter().filter(|&&c| c == '\n').count() + 1;
    let column = match before.iter().rposition(|&c| c == '\n') {
        Some(nl) => fail.pos - nl,
        None => fail.pos + 1,
    };
    Some(format!("line {line} column {column}: {}", fail.msg))
}

#[cfg(test)]
mod tests {
    use super::error_detail;

    /// Each case with the detail Python 3.11's `json.loads` gives
    /// (`line {e.lineno} column {e.colno}: {e.msg}`).
    #[test]
    fn python_messages_and_places() {
        let cases: &[(&str, &str)] = &[
            (
                "{\"a\": 1 \"b\": 2}",
                "line 1 column 9: Expecting ',' delimiter",
            ),
            (
                "{\"a\": 1,}",
                "line 1 column 9: Expecting property name enclosed in double quotes",
            ),
            ("{\"a\" 1}", "line 1 column 6: Expecting ':' delimiter"),
            ("{\"a\": }", "line 1 column 7: Expecting value"),
            ("[1, 2,]", "line 1 column 7: Expecting value"),
            ("[1 2]", "line 1 column 4: Expecting ',' delimiter"),
            ("", "line 1 column 1: Expecting value"),
            ("{\"a\": 1}\n{}", "line 2 column 1: Extra data"),
            (
                "{\"a\": \"b",
                "line 1 column 7: Unterminated string starting at",
            ),
            (
                "{\"a\": \"b\tc\"}",
                "line 1 column 9: Invalid control character at",
            ),
            ("[\"\\x\"]", "line 1 column 3: Invalid \\escape"),
            ("[\"\\u12g4\"]", "line 1 column 4: Invalid \\uXXXX escape"),
            ("[\"\\", "line 1 column 2: Unterminated string starting at"),
            ("{\"a\":1", "line 1 column 7: Expecting ',' delimiter"),
            ("[1,", "line 1 column 4: Expecting value"),
            ("{\"a\"", "line 1 column 5: Expecting ':' delimiter"),
            (
                "{\"a\":1,",
                "line 1 column 8: Expecting property name enclosed in double quotes",
            ),
            ("  \n  x", "line 2 column 3: Expecting value"),
            (
                "\u{feff}{}",
                "line 1 column 1: Unexpected UTF-8 BOM (decode using utf-8-sig)",
            ),
            (
                "{\n  \"é\": 1\n  \"b\": 2\n}",
                "line 3 column 3: Expecting ',' delimiter",
            ),
            (
                "{'a': 1}",
                "line 1 column 2: Expecting property name enclosed in double quotes",
            ),
            ("[01]", "line 1 column 3: Expecting ',' delimiter"),
            ("[-]", "line 1 column 2: Expecting value"),
        ];
        for (text, want) in cases {
            assert_eq!(error_detail(text).as_deref(), Some(*want), "{text:?}");
        }
    }

    /// What Python accepts parses here too.
    #[test]
    fn accepts_what_python_accepts() {
        for text in [
            "{}",
            " [1, -2.5e3, true, false, null, NaN, -Infinity, \"\\u00e9\\n\"] ",
            "{\"a\": {\"b\": [[], {}]}}\n",
            "1.",
        ] {
            let got = error_detail(text);
            if text == "1." {
                assert_eq!(got.as_deref(), Some("line 1 column 2: Extra data"));
            } else {
                assert_eq!(got, None, "{text:?}");
            }
        }
    }
}
