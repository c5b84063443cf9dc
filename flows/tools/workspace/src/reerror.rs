//! Why a pattern is not a regular expression, in one line and in the words
//! of Python's `re` (`missing ), unterminated subpattern at position 0`),
//! for the `Invalid regex pattern '<p>': <reason>` errors of `search_files`
//! and `edit_file`.
//!
//! [`python_refusal`] is Python 3.11's parser (`re._parser`) and the
//! look-behind check of its compiler, ported for what they refuse: every
//! pattern Python refuses is refused with its message and position (in
//! characters; `(line L, column C)` added when the pattern has several
//! lines), including those the `regex` crate would accept (`a**`). What
//! Python accepts and the crate does not (look-around, backreferences)
//! gets the crate's one-line reason ([`crate_reason`]), in the same form.

use std::collections::HashMap;

use regex_syntax::ast;

/// Python's `_sre.MAXREPEAT` (and `MAXCODE`): repeat counts must stay
/// below it.
const MAXREPEAT: u64 = 4_294_967_295;
/// Python's `_sre.MAXGROUPS`.
const MAXGROUPS: usize = 1_073_741_823;
/// Python's `MAXWIDTH`: the widest a subpattern is counted.
const MAXWIDTH: u128 = 1 << 64;

/// Flag bits, as `re._constants` numbers them.
const FLAG_TEMPLATE: u32 = 1;
const FLAG_LOCALE: u32 = 4;
const FLAG_UNICODE: u32 = 32;
const FLAG_VERBOSE: u32 = 64;
const FLAG_DEBUG: u32 = 128;
const FLAG_ASCII: u32 = 256;
const TYPE_FLAGS: u32 = FLAG_ASCII | FLAG_LOCALE | FLAG_UNICODE;
const GLOBAL_FLAGS: u32 = FLAG_DEBUG | FLAG_TEMPLATE;

/// The inline flag letters.
fn flag(c: char) -> Option<u32> {
    Some(match c {
        'i' => 2,
        'L' => FLAG_LOCALE,
        'm' => 8,
        's' => 16,
        'x' => FLAG_VERBOSE,
        'a' => FLAG_ASCII,
        't' => FLAG_TEMPLATE,
        'u' => FLAG_UNICODE,
        _ => return None,
    })
}

/// Why Python refuses a pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// `re.error`: the message and, usually, the position.
    Re { msg: String, pos: Option<usize> },
    /// Another exception (`OverflowError: the repetition number is too
    /// large`, `ValueError: ASCII and UNICODE flags are incompatible`):
    /// not an `re.error`, the tools report it as an unexpected failure.
    Other(&'static str),
}

impl Refusal {
    /// `str(e)` of the error for `pattern`.
    pub fn text(&self, pattern: &str) -> String {
        match self {
            Refusal::Other(text) => text.to_string(),
            Refusal::Re { msg, pos: None } => msg.clone(),
            Refusal::Re {
                msg,
                pos: Some(pos),
            } => at_position(msg, &pattern.chars().collect::<Vec<_>>(), *pos),
        }
    }
}

/// `msg at position P`, with `(line L, column C)` when the pattern (its
/// characters `chars`) has several lines (Python's `re.error`).
pub fn at_position(msg: &str, chars: &[char], pos: usize) -> String {
    let mut out = format!("{msg} at position {pos}");
    if chars.contains(&'\n') {
        let before = &chars[..pos.min(chars.len())];
        let line = before.iter().filter(|c| **c == '\n').count() + 1;
        let column = match before.iter().rposition(|c| *c == '\n') {
            Some(nl) => pos - nl,
            None => pos + 1,
        };
        out.push_str(&format!(" (line {line}, column {column})"));
    }
    out
}

type R<T> = Result<T, Refusal>;

/// One token: a character, or a backslash and the character after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok {
    Char(char),
    Esc(char),
}

impl Tok {
    /// Its length in characters.
    fn len(self) -> usize {
        match self {
            Tok::Char(_) => 1,
            Tok::Esc(_) => 2,
        }
    }

    /// Its text.
    fn text(self) -> String {
        match self {
            Tok::Char(c) => c.to_string(),
            Tok::Esc(c) => format!("\\{c}"),
        }
    }
}

/// Python's `Tokenizer`.
struct Source {
    s: Vec<char>,
    index: usize,
    next: Option<Tok>,
}

impl Source {
    fn new(pattern: &str) -> R<Source> {
        let mut source = Source {
            s: pattern.chars().collect(),
            index: 0,
            next: None,
        };
        source.advance()?;
        Ok(source)
    }

    fn advance(&mut self) -> R<()> {
        let mut index = self.index;
        let Some(&c) = self.s.get(index) else {
            self.next = None;
            return Ok(());
        };
        let tok = if c == '\\' {
            index += 1;
            match self.s.get(index) {
                Some(&d) => Tok::Esc(d),
                None => {
                    return Err(Refusal::Re {
                        msg: "bad escape (end of pattern)".into(),
                        pos: Some(self.s.len() - 1),
                    })
                }
            }
        } else {
            Tok::Char(c)
        };
        self.index = index + 1;
        self.next = Some(tok);
        Ok(())
    }

    /// Takes the next token when it is the character `c`.
    fn matches(&mut self, c: char) -> R<bool> {
        if self.next == Some(Tok::Char(c)) {
            self.advance()?;
            return Ok(true);
        }
        Ok(false)
    }

    fn get(&mut self) -> R<Option<Tok>> {
        let this = self.next;
        self.advance()?;
        Ok(this)
    }

    fn next_is(&self, pred: impl Fn(char) -> bool) -> bool {
        matches!(self.next, Some(Tok::Char(c)) if pred(c))
    }

    fn getwhile(&mut self, n: usize, pred: impl Fn(char) -> bool) -> R<String> {
        let mut out = String::new();
        for _ in 0..n {
            match self.next {
                Some(Tok::Char(c)) if pred(c) => out.push(c),
                _ => break,
            }
            self.advance()?;
        }
        Ok(out)
    }

    fn getuntil(&mut self, terminator: char, name: &str) -> R<String> {
        let mut out = String::new();
        loop {
            let c = self.next;
            self.advance()?;
            match c {
                None if out.is_empty() => return Err(self.error(&format!("missing {name}"), 0)),
                None => {
                    return Err(self.error(
                        &format!("missing {terminator}, unterminated name"),
                        out.chars().count(),
                    ))
                }
                Some(Tok::Char(t)) if t == terminator => {
                    if out.is_empty() {
                        return Err(self.error(&format!("missing {name}"), 1));
                    }
                    return Ok(out);
                }
                Some(t) => out.push_str(&t.text()),
            }
        }
    }

    fn tell(&self) -> usize {
        self.index - self.next.map_or(0, Tok::len)
    }

    fn seek(&mut self, index: usize) -> R<()> {
        self.index = index;
        self.advance()
    }

    fn error(&self, msg: &str, offset: usize) -> Refusal {
        Refusal::Re {
            msg: msg.to_string(),
            pos: Some(self.tell().saturating_sub(offset)),
        }
    }

    fn checkgroupname(&self, name: &str, offset: usize) -> R<()> {
        if !crate::pyre::is_identifier(name) {
            return Err(self.error(
                &format!("bad character in group name {}", crate::text::py_repr(name)),
                name.chars().count() + offset,
            ));
        }
        Ok(())
    }
}

/// `int(text)` for a conditional group's number (`None`: a `ValueError`).
fn py_int(text: &str) -> Option<i128> {
    let t = crate::text::py_strip(text);
    let (neg, digits) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
    {
        return None;
    }
    let mut n: i128 = 0;
    for c in digits.chars().filter(|c| *c != '_') {
        let d = c.to_digit(10)?;
        n = n.saturating_mul(10).saturating_add(i128::from(d));
    }
    Some(if neg { -n } else { n })
}

/// A parsed element, as far as widths and checks need it.
#[derive(Debug, Clone)]
enum Node {
    /// One character (a literal, `.`, a class).
    Unit,
    /// An anchor (`^`, `$`, `\A`, `\b`, ...).
    At,
    /// Alternatives.
    Branch(Vec<Vec<Node>>),
    /// A group: its number (capturing), its flags and its body.
    Group {
        gid: Option<usize>,
        flags: bool,
        body: Vec<Node>,
    },
    /// `(?>...)`.
    Atomic(Vec<Node>),
    /// A repeat of `item` from `min` to `max` times.
    Repeat { min: u64, max: u64, item: Vec<Node> },
    /// `\1`, `(?P=name)`.
    GroupRef(usize),
    /// `(?(1)yes|no)`.
    GroupRefExists(Vec<Node>, Option<Vec<Node>>),
    /// A look-ahead (`behind: false`) or look-behind.
    Assert { behind: bool, body: Vec<Node> },
}

/// A class member's code: a literal, or a category (`\d`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Code {
    Literal(u32),
    Category,
}

/// Python's parser `State`.
struct State {
    flags: u32,
    groupdict: HashMap<String, usize>,
    groupwidths: Vec<Option<(u128, u128)>>,
    lookbehindgroups: Option<usize>,
    grouprefpos: Vec<(usize, usize)>,
}

impl State {
    fn groups(&self) -> usize {
        self.groupwidths.len()
    }

    fn opengroup(&mut self, name: Option<&str>) -> Result<usize, String> {
        let gid = self.groups();
        self.groupwidths.push(None);
        if self.groups() > MAXGROUPS {
            return Err("too many groups".into());
        }
        if let Some(name) = name {
            if let Some(ogid) = self.groupdict.get(name) {
                return Err(format!(
                    "redefinition of group name {} as group {gid}; was group {ogid}",
                    crate::text::py_repr(name)
                ));
            }
            self.groupdict.insert(name.to_string(), gid);
        }
        Ok(gid)
    }

    fn checkgroup(&self, gid: usize) -> bool {
        gid < self.groups() && self.groupwidths[gid].is_some()
    }

    fn checklookbehindgroup(&self, gid: usize, source: &Source) -> R<()> {
        if let Some(lb) = self.lookbehindgroups {
            if !self.checkgroup(gid) {
                return Err(source.error("cannot refer to an open group", 0));
            }
            if gid >= lb {
                return Err(source.error(
                    "cannot refer to group defined in the same lookbehind subpattern",
                    0,
                ));
            }
        }
        Ok(())
    }

    /// `SubPattern.getwidth()`.
    fn width(&self, nodes: &[Node]) -> (u128, u128) {
        let (mut lo, mut hi): (u128, u128) = (0, 0);
        for node in nodes {
            match node {
                Node::Branch(items) => {
                    let (mut i, mut j) = (MAXWIDTH, 0);
                    for item in items {
                        let (l, h) = self.width(item);
                        i = i.min(l);
                        j = j.max(h);
                    }
                    lo += i;
                    hi += j;
                }
                Node::Atomic(body) | Node::Group { body, .. } => {
                    let (i, j) = self.width(body);
                    lo += i;
                    hi += j;
                }
                Node::Repeat { min, max, item } => {
                    let (i, j) = self.width(item);
                    lo += i * u128::from(*min);
                    if *max == MAXREPEAT && j > 0 {
                        hi = MAXWIDTH;
                    } else {
                        hi += j * u128::from(*max);
                    }
                }
                Node::Unit => {
                    lo += 1;
                    hi += 1;
                }
                Node::GroupRef(gid) => {
                    let (i, j) = self.groupwidths[*gid].unwrap_or((0, 0));
                    lo += i;
                    hi += j;
                }
                Node::GroupRefExists(yes, no) => {
                    let (mut i, mut j) = self.width(yes);
                    match no {
                        Some(no) => {
                            let (l, h) = self.width(no);
                            i = i.min(l);
                            j = j.max(h);
                        }
                        None => i = 0,
                    }
                    lo += i;
                    hi += j;
                }
                Node::At | Node::Assert { .. } => {}
            }
        }
        (lo.min(MAXWIDTH), hi.min(MAXWIDTH))
    }
}

fn is_hex(c: char) -> bool {
    c.is_ascii_hexdigit()
}

fn is_oct(c: char) -> bool {
    ('0'..='7').contains(&c)
}

/// The code of a `\x`, `\u`, `\U` or `\N` escape, shared by classes and
/// patterns; `None` when `c` is none of them.
fn unicode_escape(source: &mut Source, c: char) -> R<Option<u32>> {
    let escape = format!("\\{c}");
    let (digits, want) = match c {
        'x' => (2, 4),
        'u' => (4, 6),
        'U' => (8, 10),
        'N' => {
            if !source.matches('{')? {
                return Err(source.error("missing {", 0));
            }
            let name = source.getuntil('}', "character name")?;
            // Character names are not looked up: the name is taken as
            // defined (the `regex` crate has no `\N`, and refuses it).
            let _ = name;
            return Ok(Some(0));
        }
        _ => return Ok(None),
    };
    let more = source.getwhile(digits, is_hex)?;
    let escape = format!("{escape}{more}");
    let n = escape.chars().count();
    if n != want {
        return Err(source.error(&format!("incomplete escape {escape}"), n));
    }
    let value = u32::from_str_radix(&escape[2..], 16).unwrap_or(u32::MAX);
    if c == 'U' && value > 0x10FFFF {
        return Err(source.error(&format!("bad escape {escape}"), n));
    }
    Ok(Some(value))
}

/// `_class_escape`: an escape inside `[...]`.
fn class_escape(source: &mut Source, c: char) -> R<Code> {
    match c {
        'a' | 'b' | 'f' | 'n' | 'r' | 't' | 'v' | '\\' => return Ok(Code::Literal(c as u32)),
        'd' | 'D' | 's' | 'S' | 'w' | 'W' => return Ok(Code::Category),
        _ => {}
    }
    if let Some(v) = unicode_escape(source, c)? {
        return Ok(Code::Literal(v));
    }
    let escape = format!("\\{c}");
    if is_oct(c) {
        let more = source.getwhile(2, is_oct)?;
        let escape = format!("{escape}{more}");
        let value = u32::from_str_radix(&escape[1..], 8).unwrap_or(0);
        if value > 0o377 {
            return Err(source.error(
                &format!("octal escape value {escape} outside of range 0-0o377"),
                escape.chars().count(),
            ));
        }
        return Ok(Code::Literal(value));
    }
    if c.is_ascii_digit() || c.is_ascii_alphabetic() {
        return Err(source.error(&format!("bad escape {escape}"), 2));
    }
    Ok(Code::Literal(c as u32))
}

/// `_escape`: an escape outside a class.
fn escape(source: &mut Source, c: char, state: &State) -> R<Node> {
    match c {
        'A' | 'b' | 'B' | 'Z' => return Ok(Node::At),
        'd' | 'D' | 's' | 'S' | 'w' | 'W' => return Ok(Node::Unit),
        'a' | 'f' | 'n' | 'r' | 't' | 'v' | '\\' => return Ok(Node::Unit),
        _ => {}
    }
    if unicode_escape(source, c)?.is_some() {
        return Ok(Node::Unit);
    }
    let mut escape = format!("\\{c}");
    if c == '0' {
        source.getwhile(2, is_oct)?;
        return Ok(Node::Unit);
    }
    if c.is_ascii_digit() {
        if source.next_is(|d| d.is_ascii_digit()) {
            if let Some(t) = source.get()? {
                escape.push_str(&t.text());
            }
            let e: Vec<char> = escape.chars().collect();
            if is_oct(e[1]) && is_oct(e[2]) && source.next_is(is_oct) {
                if let Some(t) = source.get()? {
                    escape.push_str(&t.text());
                }
                let value = u32::from_str_radix(&escape[1..], 8).unwrap_or(0);
                if value > 0o377 {
                    return Err(source.error(
                        &format!("octal escape value {escape} outside of range 0-0o377"),
                        escape.chars().count(),
                    ));
                }
                return Ok(Node::Unit);
            }
        }
        let n = escape.chars().count();
        let group: usize = escape[1..].parse().unwrap_or(usize::MAX);
        if group < state.groups() {
            if !state.checkgroup(group) {
                return Err(source.error("cannot refer to an open group", n));
            }
            state.checklookbehindgroup(group, source)?;
            return Ok(Node::GroupRef(group));
        }
        return Err(source.error(&format!("invalid group reference {group}"), n - 1));
    }
    if c.is_ascii_alphabetic() {
        return Err(source.error(&format!("bad escape {escape}"), 2));
    }
    Ok(Node::Unit)
}

/// `_parse_sub`: alternatives.
fn parse_sub(
    source: &mut Source,
    state: &mut State,
    mut verbose: bool,
    nested: usize,
) -> R<Vec<Node>> {
    let mut items: Vec<Vec<Node>> = Vec::new();
    loop {
        let first = nested == 0 && items.is_empty();
        items.push(parse(source, state, verbose, nested + 1, first)?);
        if !source.matches('|')? {
            break;
        }
        if nested == 0 {
            verbose = state.flags & FLAG_VERBOSE != 0;
        }
    }
    if items.len() == 1 {
        return Ok(items.pop().unwrap_or_default());
    }
    Ok(vec![Node::Branch(items)])
}

/// `_parse`: one alternative.
fn parse(
    source: &mut Source,
    state: &mut State,
    mut verbose: bool,
    nested: usize,
    first: bool,
) -> R<Vec<Node>> {
    let mut sub: Vec<Node> = Vec::new();
    while let Some(this) = source.next {
        if this == Tok::Char('|') || this == Tok::Char(')') {
            break;
        }
        source.get()?;
        if verbose {
            if let Tok::Char(' ' | '\t' | '\n' | '\r' | '\u{b}' | '\u{c}') = this {
                continue;
            }
            if this == Tok::Char('#') {
                loop {
                    match source.get()? {
                        None | Some(Tok::Char('\n')) => break,
                        _ => {}
                    }
                }
                continue;
            }
        }
        let ch = match this {
            Tok::Esc(c) => {
                sub.push(escape(source, c, state)?);
                continue;
            }
            Tok::Char(c) => c,
        };
        match ch {
            '[' => {
                class(source)?;
                sub.push(Node::Unit);
            }
            '*' | '+' | '?' | '{' => {
                let here = source.tell();
                let (min, max) = match ch {
                    '?' => (0, 1),
                    '*' => (0, MAXREPEAT),
                    '+' => (1, MAXREPEAT),
                    _ => {
                        if source.next == Some(Tok::Char('}')) {
                            sub.push(Node::Unit);
                            continue;
                        }
                        let mut lo = String::new();
                        let mut hi = String::new();
                        while source.next_is(|c| c.is_ascii_digit()) {
                            if let Some(t) = source.get()? {
                                lo.push_str(&t.text());
                            }
                        }
                        if source.matches(',')? {
                            while source.next_is(|c| c.is_ascii_digit()) {
                                if let Some(t) = source.get()? {
                                    hi.push_str(&t.text());
                                }
                            }
                        } else {
                            hi = lo.clone();
                        }
                        if !source.matches('}')? {
                            sub.push(Node::Unit);
                            source.seek(here)?;
                            continue;
                        }
                        let count = |t: &str| -> R<u64> {
                            let n: u64 = t.parse().unwrap_or(u64::MAX);
                            if n >= MAXREPEAT {
                                return Err(Refusal::Other("the repetition number is too large"));
                            }
                            Ok(n)
                        };
                        let min = if lo.is_empty() { 0 } else { count(&lo)? };
                        let mut max = MAXREPEAT;
                        if !hi.is_empty() {
                            max = count(&hi)?;
                            if max < min {
                                return Err(source.error(
                                    "min repeat greater than max repeat",
                                    source.tell() - here,
                                ));
                            }
                        }
                        (min, max)
                    }
                };
                let offset = source.tell() - here + 1;
                let item = match sub.last() {
                    None | Some(Node::At) => {
                        return Err(source.error("nothing to repeat", offset));
                    }
                    Some(Node::Repeat { .. }) => {
                        return Err(source.error("multiple repeat", offset));
                    }
                    Some(_) => sub.pop().map(|n| vec![n]).unwrap_or_default(),
                };
                if !source.matches('?')? {
                    source.matches('+')?;
                }
                sub.push(Node::Repeat { min, max, item });
            }
            '.' => sub.push(Node::Unit),
            '(' => {
                if let Some(node) = group(source, state, &mut verbose, nested, first, &sub)? {
                    sub.push(node);
                }
            }
            '^' | '$' => sub.push(Node::At),
            _ => sub.push(Node::Unit),
        }
    }
    // Unpack non-capturing groups without flags.
    let mut out = Vec::with_capacity(sub.len());
    for node in sub {
        match node {
            Node::Group {
                gid: None,
                flags: false,
                body,
            } => out.extend(body),
            other => out.push(other),
        }
    }
    Ok(out)
}

/// A character class after its `[`.
fn class(source: &mut Source) -> R<()> {
    let here = source.tell() - 1;
    source.matches('^')?;
    let mut count = 0;
    loop {
        let this = source.get()?;
        let Some(this) = this else {
            return Err(source.error("unterminated character set", source.tell() - here));
        };
        if this == Tok::Char(']') && count > 0 {
            return Ok(());
        }
        let code1 = match this {
            Tok::Esc(c) => class_escape(source, c)?,
            Tok::Char(c) => Code::Literal(c as u32),
        };
        if source.matches('-')? {
            let that = source.get()?;
            let Some(that) = that else {
                return Err(source.error("unterminated character set", source.tell() - here));
            };
            if that == Tok::Char(']') {
                return Ok(());
            }
            let code2 = match that {
                Tok::Esc(c) => class_escape(source, c)?,
                Tok::Char(c) => Code::Literal(c as u32),
            };
            let bad = || {
                source.error(
                    &format!("bad character range {}-{}", this.text(), that.text()),
                    this.len() + 1 + that.len(),
                )
            };
            match (code1, code2) {
                (Code::Literal(lo), Code::Literal(hi)) if hi >= lo => {}
                _ => return Err(bad()),
            }
        }
        count += 1;
    }
}

/// A group after its `(`: the node to add, or `None` (a comment, global
/// flags, which may turn `verbose` on).
fn group(
    source: &mut Source,
    state: &mut State,
    verbose_mode: &mut bool,
    nested: usize,
    first: bool,
    sub: &[Node],
) -> R<Option<Node>> {
    let verbose = *verbose_mode;
    let start = source.tell() - 1;
    let mut capture = true;
    let mut atomic = false;
    let mut name: Option<String> = None;
    let (mut add_flags, mut del_flags) = (0u32, 0u32);
    if source.matches('?')? {
        let Some(char) = source.get()? else {
            return Err(source.error("unexpected end of pattern", 0));
        };
        match char {
            Tok::Char('P') => {
                if source.matches('<')? {
                    let n = source.getuntil('>', "group name")?;
                    source.checkgroupname(&n, 1)?;
                    name = Some(n);
                } else if source.matches('=')? {
                    let n = source.getuntil(')', "group name")?;
                    source.checkgroupname(&n, 1)?;
                    let len = n.chars().count() + 1;
                    let Some(&gid) = state.groupdict.get(&n) else {
                        return Err(source.error(
                            &format!("unknown group name {}", crate::text::py_repr(&n)),
                            len,
                        ));
                    };
                    if !state.checkgroup(gid) {
                        return Err(source.error("cannot refer to an open group", len));
                    }
                    state.checklookbehindgroup(gid, source)?;
                    return Ok(Some(Node::GroupRef(gid)));
                } else {
                    let Some(c) = source.get()? else {
                        return Err(source.error("unexpected end of pattern", 0));
                    };
                    return Err(
                        source.error(&format!("unknown extension ?P{}", c.text()), c.len() + 2)
                    );
                }
            }
            Tok::Char(':') => capture = false,
            Tok::Char('#') => {
                loop {
                    if source.next.is_none() {
                        return Err(
                            source.error("missing ), unterminated comment", source.tell() - start)
                        );
                    }
                    if source.get()? == Some(Tok::Char(')')) {
                        break;
                    }
                }
                return Ok(None);
            }
            Tok::Char(c @ ('=' | '!' | '<')) => {
                let mut kind = c;
                let mut behind = false;
                let mut outer_lookbehind = None;
                if c == '<' {
                    let Some(k) = source.get()? else {
                        return Err(source.error("unexpected end of pattern", 0));
                    };
                    if k != Tok::Char('=') && k != Tok::Char('!') {
                        return Err(
                            source.error(&format!("unknown extension ?<{}", k.text()), k.len() + 2)
                        );
                    }
                    kind = if k == Tok::Char('=') { '=' } else { '!' };
                    behind = true;
                    outer_lookbehind = Some(state.lookbehindgroups);
                    if state.lookbehindgroups.is_none() {
                        state.lookbehindgroups = Some(state.groups());
                    }
                }
                let _ = kind;
                let body = parse_sub(source, state, verbose, nested + 1)?;
                if let Some(None) = outer_lookbehind {
                    state.lookbehindgroups = None;
                }
                if !source.matches(')')? {
                    return Err(
                        source.error("missing ), unterminated subpattern", source.tell() - start)
                    );
                }
                return Ok(Some(Node::Assert { behind, body }));
            }
            Tok::Char('(') => {
                let condname = source.getuntil(')', "group name")?;
                let len = condname.chars().count() + 1;
                let condgroup;
                if crate::pyre::is_identifier(&condname) {
                    source.checkgroupname(&condname, 1)?;
                    match state.groupdict.get(&condname) {
                        Some(&g) => condgroup = g,
                        None => {
                            return Err(source.error(
                                &format!("unknown group name {}", crate::text::py_repr(&condname)),
                                len,
                            ))
                        }
                    }
                } else {
                    let bad = || {
                        source.error(
                            &format!(
                                "bad character in group name {}",
                                crate::text::py_repr(&condname)
                            ),
                            len,
                        )
                    };
                    let n = match py_int(&condname) {
                        Some(n) if n >= 0 => n,
                        _ => return Err(bad()),
                    };
                    if n == 0 {
                        return Err(source.error("bad group number", len));
                    }
                    if n >= MAXGROUPS as i128 {
                        return Err(source.error(&format!("invalid group reference {n}"), len));
                    }
                    condgroup = n as usize;
                    if !state.grouprefpos.iter().any(|(g, _)| *g == condgroup) {
                        state.grouprefpos.push((condgroup, source.tell() - len));
                    }
                }
                state.checklookbehindgroup(condgroup, source)?;
                let yes = parse(source, state, verbose, nested + 1, false)?;
                let no = if source.matches('|')? {
                    let no = parse(source, state, verbose, nested + 1, false)?;
                    if source.next == Some(Tok::Char('|')) {
                        return Err(
                            source.error("conditional backref with more than two branches", 0)
                        );
                    }
                    Some(no)
                } else {
                    None
                };
                if !source.matches(')')? {
                    return Err(
                        source.error("missing ), unterminated subpattern", source.tell() - start)
                    );
                }
                return Ok(Some(Node::GroupRefExists(yes, no)));
            }
            Tok::Char('>') => {
                capture = false;
                atomic = true;
            }
            Tok::Char(c) if flag(c).is_some() || c == '-' => match parse_flags(source, state, c)? {
                None => {
                    if !first || !sub.is_empty() {
                        return Err(source.error(
                            "global flags not at the start of the expression",
                            source.tell() - start,
                        ));
                    }
                    *verbose_mode = state.flags & FLAG_VERBOSE != 0;
                    return Ok(None);
                }
                Some((add, del)) => {
                    add_flags = add;
                    del_flags = del;
                    capture = false;
                }
            },
            other => {
                return Err(source.error(
                    &format!("unknown extension ?{}", other.text()),
                    other.len() + 1,
                ))
            }
        }
    }
    let gid = if capture {
        match state.opengroup(name.as_deref()) {
            Ok(g) => Some(g),
            Err(msg) => {
                let len = name.as_deref().map_or(0, |n| n.chars().count()) + 1;
                return Err(source.error(&msg, len));
            }
        }
    } else {
        None
    };
    let sub_verbose = (verbose || add_flags & FLAG_VERBOSE != 0) && del_flags & FLAG_VERBOSE == 0;
    let body = parse_sub(source, state, sub_verbose, nested + 1)?;
    if !source.matches(')')? {
        return Err(source.error("missing ), unterminated subpattern", source.tell() - start));
    }
    if let Some(g) = gid {
        state.groupwidths[g] = Some(state.width(&body));
    }
    if atomic {
        return Ok(Some(Node::Atomic(body)));
    }
    Ok(Some(Node::Group {
        gid,
        flags: add_flags != 0 || del_flags != 0,
        body,
    }))
}

/// `_parse_flags`: `None` for global flags (`(?i)`), else the flags added
/// and removed by a scoped group (`(?i-s:...)`).
fn parse_flags(source: &mut Source, state: &mut State, mut ch: char) -> R<Option<(u32, u32)>> {
    let (mut add, mut del) = (0u32, 0u32);
    // The last token read, as Python's `char` (None at the end).
    let mut cur: Option<Tok> = Some(Tok::Char(ch));
    if ch != '-' {
        loop {
            let f = flag(ch).unwrap_or(0);
            if ch == 'L' {
                return Err(source.error(
                    "bad inline flags: cannot use 'L' flag with a str pattern",
                    0,
                ));
            }
            add |= f;
            if f & TYPE_FLAGS != 0 && add & TYPE_FLAGS != f {
                return Err(source.error(
                    "bad inline flags: flags 'a', 'u' and 'L' are incompatible",
                    0,
                ));
            }
            cur = source.get()?;
            match cur {
                None => return Err(source.error("missing -, : or )", 0)),
                Some(Tok::Char(c @ (')' | '-' | ':'))) => {
                    ch = c;
                    break;
                }
                Some(Tok::Char(c)) if flag(c).is_some() => ch = c,
                Some(t) => {
                    let alpha = matches!(t, Tok::Char(c) if c.is_alphabetic());
                    let msg = if alpha {
                        "unknown flag"
                    } else {
                        "missing -, : or )"
                    };
                    return Err(source.error(msg, t.len()));
                }
            }
        }
    }
    let _ = cur;
    if ch == ')' {
        state.flags |= add;
        return Ok(None);
    }
    if add & GLOBAL_FLAGS != 0 {
        return Err(source.error("bad inline flags: cannot turn on global flag", 1));
    }
    if ch == '-' {
        let next = source.get()?;
        let mut c = match next {
            None => return Err(source.error("missing flag", 0)),
            Some(Tok::Char(c)) if flag(c).is_some() => c,
            Some(t) => {
                let alpha = matches!(t, Tok::Char(c) if c.is_alphabetic());
                let msg = if alpha {
                    "unknown flag"
                } else {
                    "missing flag"
                };
                return Err(source.error(msg, t.len()));
            }
        };
        loop {
            let f = flag(c).unwrap_or(0);
            if f & TYPE_FLAGS != 0 {
                return Err(source.error(
                    "bad inline flags: cannot turn off flags 'a', 'u' and 'L'",
                    0,
                ));
            }
            del |= f;
            match source.get()? {
                None => return Err(source.error("missing :", 0)),
                Some(Tok::Char(':')) => break,
                Some(Tok::Char(d)) if flag(d).is_some() => c = d,
                Some(t) => {
                    let alpha = matches!(t, Tok::Char(c) if c.is_alphabetic());
                    let msg = if alpha { "unknown flag" } else { "missing :" };
                    return Err(source.error(msg, t.len()));
                }
            }
        }
    }
    if del & GLOBAL_FLAGS != 0 {
        return Err(source.error("bad inline flags: cannot turn off global flag", 1));
    }
    if add & del != 0 {
        return Err(source.error("bad inline flags: flag turned on and off", 1));
    }
    Ok(Some((add, del)))
}

/// The compiler's look-behind check, in the order it compiles.
fn check_lookbehinds(state: &State, nodes: &[Node]) -> R<()> {
    for node in nodes {
        match node {
            Node::Assert { behind, body } => {
                if *behind {
                    let (lo, hi) = state.width(body);
                    if lo > u128::from(MAXREPEAT) {
                        return Err(Refusal::Re {
                            msg: "looks too much behind".into(),
                            pos: None,
                        });
                    }
                    if lo != hi {
                        return Err(Refusal::Re {
                            msg: "look-behind requires fixed-width pattern".into(),
                            pos: None,
                        });
                    }
                }
                check_lookbehinds(state, body)?;
            }
            Node::Branch(items) => {
                for item in items {
                    check_lookbehinds(state, item)?;
                }
            }
            Node::Group { body, .. } | Node::Atomic(body) => check_lookbehinds(state, body)?,
            Node::Repeat { item, .. } => check_lookbehinds(state, item)?,
            Node::GroupRefExists(yes, no) => {
                check_lookbehinds(state, yes)?;
                if let Some(no) = no {
                    check_lookbehinds(state, no)?;
                }
            }
            Node::Unit | Node::At | Node::GroupRef(_) => {}
        }
    }
    Ok(())
}

/// Why Python's `re.compile(pattern)` refuses `pattern`, or `None` when it
/// compiles it (the tools' flags change nothing here: none is `VERBOSE`).
pub fn python_refusal(pattern: &str) -> Option<Refusal> {
    let run = || -> R<()> {
        let mut source = Source::new(pattern)?;
        let mut state = State {
            flags: 0,
            groupdict: HashMap::new(),
            groupwidths: vec![None],
            lookbehindgroups: None,
            grouprefpos: Vec::new(),
        };
        let p = parse_sub(&mut source, &mut state, false, 0)?;
        // `fix_flags`: a str pattern is Unicode unless ASCII.
        if state.flags & FLAG_ASCII != 0 && state.flags & FLAG_UNICODE != 0 {
            return Err(Refusal::Other("ASCII and UNICODE flags are incompatible"));
        }
        if source.next.is_some() {
            return Err(source.error("unbalanced parenthesis", 0));
        }
        for &(g, pos) in &state.grouprefpos {
            if g >= state.groups() {
                return Err(Refusal::Re {
                    msg: format!("invalid group reference {g}"),
                    pos: Some(pos),
                });
            }
        }
        check_lookbehinds(&state, &p)
    };
    run().err()
}

/// The `regex` crate's reason for refusing `pattern` (which Python
/// accepts), in one line ending `at position N` (a character position, as
/// Python's), or its first line when the parser finds nothing (a size
/// limit).
pub fn crate_reason(pattern: &str, fallback: &regex::Error) -> String {
    let (what, offset) = match ast::parse::Parser::new().parse(pattern) {
        Err(e) => (e.kind().to_string(), e.span().start.offset),
        Ok(parsed) => {
            let mut translator = regex_syntax::hir::translate::Translator::new();
            match translator.translate(pattern, &parsed) {
                Err(e) => (e.kind().to_string(), e.span().start.offset),
                Ok(_) => return first_line(&fallback.to_string()),
            }
        }
    };
    let chars: Vec<char> = pattern.chars().collect();
    at_position(&what, &chars, char_pos(pattern, offset))
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
    use super::{crate_reason, python_refusal, Refusal};

    /// Python's text for `pattern`, which it must refuse.
    fn refused(pattern: &str) -> String {
        python_refusal(pattern)
            .unwrap_or_else(|| panic!("accepted {pattern:?}"))
            .text(pattern)
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
            ("a**", "multiple repeat at position 2"),
            ("a{2}{3}", "multiple repeat at position 4"),
            ("x+?+", "multiple repeat at position 3"),
            ("\\", "bad escape (end of pattern) at position 0"),
            ("\\q", "bad escape \\q at position 0"),
            ("\\xZZ", "incomplete escape \\x at position 0"),
            ("\\u12", "incomplete escape \\u12 at position 0"),
            ("[z-a]", "bad character range z-a at position 1"),
            ("[a-\\d]", "bad character range a-\\d at position 1"),
            ("a{3,2}", "min repeat greater than max repeat at position 2"),
            (
                "(?P<1a>x)",
                "bad character in group name '1a' at position 4",
            ),
            (
                "(?P<n>a)(?P<n>b)",
                "redefinition of group name 'n' as group 2; was group 1 at position 12",
            ),
            ("(?z)", "unknown extension ?z at position 1"),
            ("(?<n>x)", "unknown extension ?<n at position 1"),
            ("\\2", "invalid group reference 2 at position 1"),
            ("(?P<", "missing group name at position 4"),
            ("(?", "unexpected end of pattern at position 2"),
            ("(?#abc", "missing ), unterminated comment at position 0"),
            ("(?P=x)", "unknown group name 'x' at position 4"),
            ("\\p{L}", "bad escape \\p at position 0"),
            (
                "(?i)a(?s)b",
                "global flags not at the start of the expression at position 5",
            ),
            (
                "a\n(b",
                "missing ), unterminated subpattern at position 2 (line 2, column 1)",
            ),
            (
                "x\ny)",
                "unbalanced parenthesis at position 3 (line 2, column 2)",
            ),
            (
                "(?x) a # c\n (",
                "missing ), unterminated subpattern at position 12 (line 2, column 2)",
            ),
            ("(?<=a|bc)x", "look-behind requires fixed-width pattern"),
            (
                "(?<=(a)\\1)",
                "cannot refer to group defined in the same lookbehind subpattern at position 9",
            ),
            ("(?(1)a|b)", "invalid group reference 1 at position 3"),
            ("(?(0)a)", "bad group number at position 3"),
            (
                "(?(1)a|b|c)",
                "conditional backref with more than two branches at position 8",
            ),
            ("(?-i)", "missing : at position 4"),
            (
                "(?L)",
                "bad inline flags: cannot use 'L' flag with a str pattern at position 3",
            ),
            (
                "(?i-i:x)",
                "bad inline flags: flag turned on and off at position 5",
            ),
            ("\\U00110000", "bad escape \\U00110000 at position 0"),
            (
                "\\777",
                "octal escape value \\777 outside of range 0-0o377 at position 0",
            ),
            ("\\N", "missing { at position 2"),
            ("\\N{}", "missing character name at position 3"),
        ];
        for (pattern, want) in cases {
            assert_eq!(refused(pattern), *want, "{pattern:?}");
        }
        assert_eq!(
            python_refusal("a{99999999999}"),
            Some(Refusal::Other("the repetition number is too large"))
        );
        assert_eq!(
            python_refusal("(?a)(?u)"),
            Some(Refusal::Other("ASCII and UNICODE flags are incompatible"))
        );
    }

    /// What Python accepts, whether or not the `regex` crate does.
    #[test]
    fn python_accepts() {
        for pattern in [
            "a{5",
            "{",
            "a{,3}",
            "(?<=a)b",
            "(\\w)\\1",
            "(?i)abc",
            "[]a]",
            "x{}",
            "\\08",
            "(a)(?<=\\1)",
            "(?P<a1>a)(?P=a1)",
            "(?a-i:x)",
            "(?<=a{2})",
            "(?>a)*",
            "a*+",
        ] {
            assert_eq!(python_refusal(pattern), None, "{pattern:?}");
        }
    }

    /// What only the `regex` crate refuses is one line, with a position.
    #[test]
    fn crate_errors_are_one_line() {
        let pattern = "(?<=a)b";
        let err = regex::Regex::new(pattern).expect_err(pattern);
        let got = crate_reason(pattern, &err);
        assert_eq!(
            got,
            "look-around, including look-ahead and look-behind, is not supported at position 0"
        );
    }
}
