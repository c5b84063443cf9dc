//! Python `re.sub` replacement templates for `edit_file`'s regex mode:
//! models write `\1`, `\g<name>` and `\n` the Python way, so the template
//! is parsed as Python's `re._parser.parse_template` does (including its
//! error texts) and expanded over the `regex` crate's captures.

use std::collections::HashMap;

use regex::{Captures, Regex};

use crate::text::py_repr;

/// One piece of a parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    /// Literal text.
    Lit(String),
    /// A group's text (empty when the group did not match).
    Group(usize),
}

/// A parsed replacement template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pieces: Vec<Piece>,
}

/// Python's `re.error` text: `msg at position P`, with line and column
/// when the template has several lines.
fn template_error(msg: &str, source: &[char], pos: usize) -> String {
    crate::reerror::at_position(msg, source, pos)
}

/// Whether `name` is a Python identifier (approximately: a letter or `_`,
/// then letters, digits or `_`).
pub fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_alphabetic() || c == '_')
        && chars.all(|c| c.is_alphanumeric() || c == '_')
}

/// The replacement for a Python escape letter (`\n`, `\t`, ...), if any.
fn escape_char(c: char) -> Option<char> {
    match c {
        'a' => Some('\u{7}'),
        'b' => Some('\u{8}'),
        'f' => Some('\u{c}'),
        'n' => Some('\n'),
        'r' => Some('\r'),
        't' => Some('\t'),
        'v' => Some('\u{b}'),
        '\\' => Some('\\'),
        _ => None,
    }
}

impl Template {
    /// Parses `source` for a pattern with `groups` capture groups and the
    /// named groups `names`. Errors are Python's texts.
    pub fn parse(
        source: &str,
        groups: usize,
        names: &HashMap<String, usize>,
    ) -> Result<Template, String> {
        let src: Vec<char> = source.chars().collect();
        let n = src.len();
        let mut pieces = Vec::new();
        let mut lit = String::new();
        let add_group = |pieces: &mut Vec<Piece>, lit: &mut String, index: usize, pos: usize| {
            if index > groups {
                return Err(template_error(
                    &format!("invalid group reference {index}"),
                    &src,
                    pos,
                ));
            }
            if !lit.is_empty() {
                pieces.push(Piece::Lit(std::mem::take(lit)));
            }
            pieces.push(Piece::Group(index));
            Ok(())
        };
        let mut i = 0;
        while i < n {
            let c = src[i];
            if c != '\\' {
                lit.push(c);
                i += 1;
                continue;
            }
            let start = i;
            let Some(&d) = src.get(i + 1) else {
                return Err(template_error("bad escape (end of pattern)", &src, n - 1));
            };
            i += 2;
            match d {
                'g' => {
                    if src.get(i) != Some(&'<') {
                        return Err(template_error("missing <", &src, i));
                    }
                    i += 1;
                    let mut name = String::new();
                    loop {
                        let Some(&ch) = src.get(i) else {
                            if name.is_empty() {
                                return Err(template_error("missing group name", &src, i));
                            }
                            let len = name.chars().count();
                            return Err(template_error(
                                "missing >, unterminated name",
                                &src,
                                i - len,
                            ));
                        };
                        i += 1;
                        if ch == '>' {
                            if name.is_empty() {
                                return Err(template_error("missing group name", &src, i - 1));
                            }
                            break;
                        }
                        name.push(ch);
                    }
                    let name_pos = i - name.chars().count() - 1;
                    let index = if is_identifier(&name) {
                        match names.get(&name) {
                            Some(index) => *index,
                            None => return Err(format!("unknown group name {}", py_repr(&name))),
                        }
                    } else {
                        match name.trim().parse::<usize>() {
                            Ok(index) => index,
                            Err(_) => {
                                return Err(template_error(
                                    &format!("bad character in group name {}", py_repr(&name)),
                                    &src,
                                    name_pos,
                                ))
                            }
                        }
                    };
                    add_group(&mut pieces, &mut lit, index, name_pos)?;
                }
                '0' => {
                    let mut value = 0u32;
                    for _ in 0..2 {
                        match src.get(i).and_then(|c| c.to_digit(8)) {
                            Some(v) => {
                                value = value * 8 + v;
                                i += 1;
                            }
                            None => break,
                        }
                    }
                    lit.push(char::from_u32(value & 0xff).unwrap_or('\0'));
                }
                '1'..='9' => {
                    let mut digits = d.to_string();
                    if let Some(&e) = src.get(i).filter(|c| c.is_ascii_digit()) {
                        digits.push(e);
                        i += 1;
                        let octal = |c: char| c.is_digit(8);
                        if octal(d) && octal(e) && src.get(i).is_some_and(|c| octal(*c)) {
                            digits.push(src[i]);
                            i += 1;
                            let value = u32::from_str_radix(&digits, 8).unwrap_or(0);
                            if value > 0o377 {
                                return Err(template_error(
                                    &format!(
                                        "octal escape value \\{digits} outside of range 0-0o377"
                                    ),
                                    &src,
                                    start,
                                ));
                            }
                            lit.push(char::from_u32(value).unwrap_or('\0'));
                            continue;
                        }
                    }
                    let index = digits.parse::<usize>().unwrap_or(0);
                    add_group(&mut pieces, &mut lit, index, start + 1)?;
                }
                d => match escape_char(d) {
                    Some(ch) => lit.push(ch),
                    None if d.is_ascii_alphabetic() => {
                        return Err(template_error(&format!("bad escape \\{d}"), &src, start));
                    }
                    None => {
                        lit.push('\\');
                        lit.push(d);
                    }
                },
            }
        }
        if !lit.is_empty() {
            pieces.push(Piece::Lit(lit));
        }
        Ok(Template { pieces })
    }

    /// Parses `source` for the pattern `re`.
    pub fn for_regex(source: &str, re: &Regex) -> Result<Template, String> {
        let names: HashMap<String, usize> = re
            .capture_names()
            .enumerate()
            .filter_map(|(i, name)| name.map(|n| (n.to_string(), i)))
            .collect();
        Template::parse(source, re.captures_len() - 1, &names)
    }

    /// The replacement text for one match.
    pub fn expand(&self, caps: &Captures) -> String {
        let mut out = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Lit(s) => out.push_str(s),
                Piece::Group(i) => out.push_str(caps.get(*i).map_or("", |m| m.as_str())),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Python's `re.sub(pattern, template, text)` through this module.
    fn sub(pattern: &str, template: &str, text: &str) -> Result<String, String> {
        let re = Regex::new(pattern).unwrap();
        let t = Template::for_regex(template, &re)?;
        Ok(re
            .replace_all(text, |c: &Captures| t.expand(c))
            .into_owned())
    }

    #[test]
    fn groups_and_escapes() {
        assert_eq!(sub(r"(\w+)=(\d+)", r"\2=\1", "a=1").unwrap(), "1=a");
        assert_eq!(
            sub(r"(?P<k>\w+)=(\d+)", r"\g<k>:\g<2>", "a=1").unwrap(),
            "a:1"
        );
        assert_eq!(sub("x", r"\n\t\\", "x").unwrap(), "\n\t\\");
        assert_eq!(sub("x", r"\.", "x").unwrap(), "\\.");
        assert_eq!(sub("x", r"$1", "x").unwrap(), "$1");
        assert_eq!(sub("(a)|(b)", r"[\2]", "a").unwrap(), "[]");
        assert_eq!(sub("x", r"\0", "x").unwrap(), "\0");
        assert_eq!(sub("x", r"\101", "x").unwrap(), "A");
    }

    #[test]
    fn errors_match_python() {
        assert_eq!(
            sub("(x)", r"\2", "x").unwrap_err(),
            "invalid group reference 2 at position 1"
        );
        assert_eq!(
            sub("x", r"a\q", "x").unwrap_err(),
            "bad escape \\q at position 1"
        );
        assert_eq!(
            sub("x", "a\\", "x").unwrap_err(),
            "bad escape (end of pattern) at position 1"
        );
        assert_eq!(
            sub("x", r"\g<nope>", "x").unwrap_err(),
            "unknown group name 'nope'"
        );
        assert_eq!(
            sub("x", r"\g1", "x").unwrap_err(),
            "missing < at position 2"
        );
        assert_eq!(
            sub("x", r"\g<1", "x").unwrap_err(),
            "missing >, unterminated name at position 3"
        );
        assert_eq!(
            sub("x", r"\g<-1>", "x").unwrap_err(),
            "bad character in group name '-1' at position 3"
        );
        assert_eq!(
            sub("(x)", r"\g<3>", "x").unwrap_err(),
            "invalid group reference 3 at position 3"
        );
        assert_eq!(
            sub("x", "a\n\\q", "x").unwrap_err(),
            "bad escape \\q at position 2 (line 2, column 1)"
        );
    }
}
