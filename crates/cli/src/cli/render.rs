//! The one renderer of the binary: a command returns a [`Report`] (its
//! text, its JSON, the notes it has for standard error, how it ends), and
//! the [`Sink`] prints it as text or as JSON (the global `--json`) and maps
//! how it ended to the exit status. Commands that print as they go (the
//! driver's passes, a followed ledger, the server's banner) hand their
//! reports to the sink one at a time. No other module prints.

use std::io::Write;
use std::process::ExitCode;

use serde::Serialize;
use serde_json::Value;
use stepwell::{Error, RunState, StepRecord, WaitReason};

/// What a command returns: what it prints, as text and as JSON, and how
/// it ends. Empty, it prints nothing and succeeds.
#[derive(Default)]
#[must_use]
pub(crate) struct Report {
    /// Lines for standard error, printed first, as text and as JSON.
    notes: Vec<String>,
    /// What is printed without `--json`, a line each.
    text: Vec<Line>,
    /// What is printed with `--json` (one line, or an indented document).
    json: Option<String>,
    /// How the command ends once printed.
    end: End,
}

/// A line of a report's text: on standard output, or on standard error.
enum Line {
    Out(String),
    Err(String),
}

/// How a command ends, once its report is printed.
#[derive(Default)]
enum End {
    /// Exit 0.
    #[default]
    Done,
    /// Exit 1 without an error: something the command moved failed (a run
    /// ended `failed`, a command was rejected, a run could not move).
    Failed,
    /// Exit 1 with this error, printed after the report as any error is.
    Error(Error),
}

impl Report {
    /// A report whose JSON is `value` indented (`to_string_pretty`).
    pub(crate) fn pretty(value: &(impl Serialize + ?Sized)) -> Report {
        Report {
            json: Some(serde_json::to_string_pretty(value).unwrap_or_default()),
            ..Report::default()
        }
    }

    /// A report whose JSON is `value` on one line.
    pub(crate) fn compact(value: &(impl Serialize + ?Sized)) -> Report {
        Report {
            json: Some(serde_json::to_string(value).unwrap_or_default()),
            ..Report::default()
        }
    }

    /// A JSON value as the answer: on one line with `--json`, indented as
    /// text.
    pub(crate) fn value(value: &Value) -> Report {
        Report::compact(value).line(serde_json::to_string_pretty(value).unwrap_or_default())
    }

    /// A run: its state as lines, or as indented JSON. The commands it
    /// suggests repeat the store flags the user gave ([`set_store`]).
    pub(crate) fn run(run: &RunState) -> Report {
        let sw = format!("stepwell{}", store_flags());
        let version = run
            .workflow_version
            .map(|v| format!("  version {v}"))
            .unwrap_or_default();
        let mut report = Report::pretty(run).line(format!(
            "run {}  workflow {}{version}  status {}",
            run.run_id,
            run.workflow_id,
            run.status.as_str()
        ));
        if let Some(w) = &run.waiting {
            report.push(format!(
                "waiting: {}  key {}",
                w.reason.as_str(),
                w.wait_key
            ));
            if let Some(p) = &w.prompt {
                report.push(format!("prompt: {p}"));
            }
            if let Some(u) = &w.until {
                report.push(format!("until: {u}"));
            }
            let approval = w
                .details
                .as_ref()
                .is_some_and(|d| d["mode"] == "approval_required");
            report.push(match w.reason {
                WaitReason::User if approval => format!(
                    "approve with: {sw} resume {id} --payload '{{\"approved\": true}}'  (or {{\"approved\": false, \"reason\": \"...\"}})",
                    id = run.run_id
                ),
                WaitReason::User => format!(
                    "resume with: {sw} resume {} --payload '{{\"text\": \"...\"}}'",
                    run.run_id
                ),
                WaitReason::Until => format!("the driver resumes it when due: {sw} drive"),
                WaitReason::Subworkflow => {
                    format!("the driver resumes it when the child ends: {sw} drive")
                }
                _ => format!("resume with: {sw} resume {} --payload JSON", run.run_id),
            });
        }
        if let Some(out) = &run.output {
            report.push(format!("output: {out}"));
        }
        if let Some(err) = &run.error {
            report.push(format!("error: {err}"));
        }
        report
    }

    /// One ledger record (`seq` its position, 1 for the first): a line, or
    /// its JSON on one line.
    pub(crate) fn record(seq: u64, r: &StepRecord) -> Report {
        let what = match (&r.effect, &r.result) {
            (Some(e), _) => e.kind.clone(),
            (None, Some(v)) if v.get("resumed").is_some() => "resume".into(),
            (None, Some(v)) if v.get("due").is_some() => "due".into(),
            _ => "node".into(),
        };
        let detail = r
            .error
            .clone()
            .or_else(|| r.result.as_ref().map(|v| v.to_string()))
            .unwrap_or_default();
        Report::compact(r).line(format!(
            "{seq:>5}  {}  {:10} {:16} {:18} {}",
            utc_micros(&r.started_at),
            r.status.as_str(),
            r.node_id.as_deref().unwrap_or("-"),
            what,
            detail
        ))
    }

    /// Its text lines cut to `width` characters, the cut marked with `…`
    /// (`None`: whole). The JSON is untouched.
    pub(crate) fn cut_to(mut self, width: Option<usize>) -> Report {
        let Some(width) = width else {
            return self;
        };
        for line in &mut self.text {
            let (Line::Out(l) | Line::Err(l)) = line;
            // Padding at the end is not worth a cut.
            l.truncate(l.trim_end().len());
            if display_width(l) > width {
                let mut kept = String::new();
                let mut used = 0;
                for c in l.chars() {
                    used += char_width(c);
                    if used > width.saturating_sub(1) {
                        break;
                    }
                    kept.push(c);
                }
                *l = format!("{kept}…");
            }
        }
        self
    }

    /// Adds a line of text.
    pub(crate) fn line(self, line: impl Into<String>) -> Report {
        self.lines([line.into()])
    }

    /// Adds lines of text.
    pub(crate) fn lines(mut self, lines: impl IntoIterator<Item = String>) -> Report {
        for line in lines {
            self.push(line);
        }
        self
    }

    /// Adds a line of text (in place).
    pub(crate) fn push(&mut self, line: impl Into<String>) {
        self.text.push(Line::Out(line.into()));
    }

    /// Adds a line of the text that goes to standard error, in its place
    /// among the text's lines (without `--json` only).
    pub(crate) fn push_err(&mut self, line: impl Into<String>) {
        self.text.push(Line::Err(line.into()));
    }

    /// Adds a note: a line for standard error, printed after the rest,
    /// with or without `--json`.
    pub(crate) fn note(&mut self, line: impl Into<String>) {
        self.notes.push(line.into());
    }

    /// Makes the command exit 1 when `failed`, having printed as usual.
    pub(crate) fn failed_if(mut self, failed: bool) -> Report {
        if failed {
            self.end = End::Failed;
        }
        self
    }

    /// Makes the command fail with `error`, printed after the report.
    pub(crate) fn failing(mut self, error: Error) -> Report {
        self.end = End::Error(error);
        self
    }
}

/// Where reports are printed: standard output and error, as text or as
/// JSON.
pub(crate) struct Sink {
    json: bool,
}

impl Sink {
    /// Prints as JSON when `json` (the global `--json`), else as text.
    pub(crate) fn new(json: bool) -> Sink {
        Sink { json }
    }

    /// Whether it prints JSON.
    pub(crate) fn json(&self) -> bool {
        self.json
    }

    /// Prints `report`: its text or its JSON, then its notes (what they
    /// say is about what was shown: the next page, a file left out).
    pub(crate) fn show(&self, report: &Report) {
        if self.json {
            if let Some(json) = &report.json {
                println!("{json}");
            }
        } else {
            for line in &report.text {
                match line {
                    Line::Out(l) => println!("{l}"),
                    Line::Err(l) => eprintln!("{l}"),
                }
            }
            if report.text.is_empty() && report.notes.is_empty() && lists_nothing(report) {
                // Silence would read as a command that did nothing.
                eprintln!("nothing to show");
            }
        }
        std::io::stdout().flush().ok();
        for note in &report.notes {
            eprintln!("{note}");
        }
    }

    /// A line on standard error now (what a command that prints as it goes
    /// has to say beside its reports).
    pub(crate) fn note(&self, line: impl std::fmt::Display) {
        eprintln!("{line}");
    }

    /// Hands what was printed to the reader now (before a command waits).
    pub(crate) fn flush(&self) {
        std::io::stdout().flush().ok();
    }

    /// With `--json`: one JSON array to print items into as they are read
    /// (a ledger of any length in the memory of a page); `None` as text.
    pub(crate) fn json_array(&self) -> Option<JsonArray> {
        self.json.then(|| JsonArray {
            out: std::io::BufWriter::new(std::io::stdout().lock()),
            first: true,
        })
    }

    /// Prints what a command returned and gives the exit status: 0 when
    /// it succeeded, 1 (having printed the error) when it failed.
    pub(crate) fn finish(&self, result: Result<Report, Error>) -> ExitCode {
        let report = match result {
            Ok(report) => report,
            Err(e) => Report::default().failing(e),
        };
        self.show(&report);
        match report.end {
            End::Done => ExitCode::SUCCESS,
            End::Failed => ExitCode::FAILURE,
            End::Error(e) => {
                self.error(&e);
                ExitCode::FAILURE
            }
        }
    }

    /// Prints an error on standard error: `error: ...`, or with `--json`
    /// `{"error": {"code": ..., "message": ...}}`. A run not found says
    /// which store was looked in.
    fn error(&self, e: &Error) {
        if self.json {
            eprintln!(
                "{}",
                serde_json::json!({ "error": stepwell::host::error_json(e) })
            );
        } else {
            eprintln!("error: {e}");
            if let (Error::RunNotFound { .. }, Some(store)) = (e, STORE.get()) {
                eprintln!("(looked in {store}; another store is named with --db or --store)");
            }
        }
    }
}

/// Whether a report's answer is an empty list (`[]`, or a page whose
/// `items` are `[]`).
fn lists_nothing(report: &Report) -> bool {
    let Some(json) = &report.json else {
        return false;
    };
    let compact: String = json.chars().filter(|c| !c.is_whitespace()).collect();
    compact == "[]" || (compact.starts_with('{') && compact.contains("\"items\":[]"))
}

/// The store the command works on, as shown (a password hidden), and the
/// flags that name it as the user gave them (empty for the default).
static STORE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
static STORE_FLAGS: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Remembers the store (`shown`) and the flags that name it (`--db PATH`,
/// `--store SPEC`, as given on the command line) for the hints and errors
/// printed later. A `--store` URL with a password is not repeated.
pub(crate) fn set_store(shown: String, db: Option<&std::path::Path>, store: Option<&str>) {
    let _ = STORE.set(shown);
    let flags = match (store, db) {
        // Another process never sees a memory store's runs.
        (Some("memory"), _) => String::new(),
        // A password is not printed: the URL is shown redacted.
        (Some(s), _) => flag("--store", &stepwell::store::redact_url(s)),
        (None, Some(db)) => flag("--db", &db.display().to_string()),
        (None, None) => String::new(),
    };
    let _ = STORE_FLAGS.set(flags);
}

/// ` --name word`, or ` --name=word` when the word starts with `-` (it
/// would read as an option).
fn flag(name: &str, value: &str) -> String {
    let word = shell_word(value);
    if word.starts_with('-') {
        format!(" {name}={word}")
    } else {
        format!(" {name} {word}")
    }
}

fn store_flags() -> &'static str {
    STORE_FLAGS.get().map_or("", String::as_str)
}

/// A command to paste: `stepwell`, the store flags given, `words`, then
/// each option that has a value (`--name value`, quoted for the shell).
pub(crate) fn command_hint(words: &str, options: &[(&str, Option<&str>)]) -> String {
    let mut line = format!("stepwell{} {words}", store_flags());
    for (name, value) in options {
        if let Some(v) = value {
            line.push_str(&flag(name, v));
        }
    }
    line
}

/// `text` as one shell word: as it is when it is plain, else in single
/// quotes.
fn shell_word(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_./:-=@+,%".contains(&b));
    if plain {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

/// A JSON array printed an item at a time, indented as
/// `serde_json::to_string_pretty` indents a list.
pub(crate) struct JsonArray {
    out: std::io::BufWriter<std::io::StdoutLock<'static>>,
    first: bool,
}

impl JsonArray {
    /// Prints one more item; `false` when the reader went away (a closed
    /// pipe): nothing more is worth printing.
    pub(crate) fn push(&mut self, item: &(impl Serialize + ?Sized)) -> bool {
        let text = serde_json::to_string_pretty(item).unwrap_or_default();
        let sep = if self.first { "[\n" } else { ",\n" };
        self.first = false;
        write!(self.out, "{sep}  {}", text.replace('\n', "\n  ")).is_ok()
    }

    /// Closes the array (`[]` when it is empty).
    pub(crate) fn finish(mut self) {
        let _ = writeln!(self.out, "{}", if self.first { "[]" } else { "\n]" });
        let _ = self.out.flush();
    }
}

/// The name among `names` nearest to `typed`: at most two edits away (an
/// insertion, a deletion, a change or a swap of neighbours each count one),
/// and fewer than half its letters.
pub(crate) fn nearest(typed: &str, names: impl Iterator<Item = String>) -> Option<String> {
    names
        .map(|n| (edits(typed, &n), n))
        .filter(|(d, n)| *d <= 2 && *d * 2 < n.chars().count().max(2))
        .min_by_key(|(d, _)| *d)
        .map(|(_, n)| n)
}

/// The optimal string alignment distance between `a` and `b`.
fn edits(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledger_times_are_shown_in_one_style() {
        for t in [
            "2026-01-01T00:00:00+00:00",
            "2026-01-01T00:00:00.000000Z",
            "2026-01-01T01:00:00+01:00",
        ] {
            assert_eq!(utc_micros(t), "2026-01-01T00:00:00.000000Z", "{t}");
        }
        assert_eq!(utc_micros("not a time"), "not a time");
    }

    #[test]
    fn a_mistyped_command_finds_the_nearest_and_nothing_far() {
        let names = || {
            ["run", "resume", "list", "status", "ledger"]
                .map(String::from)
                .into_iter()
        };
        assert_eq!(nearest("rnu", names()).as_deref(), Some("run"));
        assert_eq!(nearest("stauts", names()).as_deref(), Some("status"));
        assert_eq!(nearest("lst", names()).as_deref(), Some("list"));
        assert_eq!(nearest("xyz", names()), None);
        assert_eq!(nearest("deploy", names()), None);
        assert_eq!(shell_word("scratch dir/x.sqlite"), "'scratch dir/x.sqlite'");
        assert_eq!(shell_word("it's"), "'it'\\''s'");
        assert_eq!(flag("--db", "-x.sqlite"), " --db=-x.sqlite");
        assert_eq!(flag("--db", "a b"), " --db 'a b'");
    }
}

/// Shows the library's progress lines (the `stepwell::progress` log
/// target: a component compiling, a wait for a database that is starting)
/// on standard error when it is a terminal: a person waiting sees why; a
/// script, a pipe or `--json` gets none of them.
pub(crate) fn show_progress_on_terminal() {
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return;
    }
    // Another subscriber already set is left alone.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            "stepwell::progress=info",
        ))
        .without_time()
        .with_target(false)
        .with_level(false)
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .try_init();
}

/// A progress line of the command itself, shown as the library's are:
/// on standard error when it is a terminal, never with `--json`.
pub(crate) fn progress(sink: &Sink, line: std::fmt::Arguments) {
    if !sink.json() && std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        eprintln!("{line}");
    }
}

/// How many columns `text` takes on a terminal: two for the wide
/// characters of East Asian scripts and emoji, none for combining marks
/// and zero-width characters, one for the others (the common ranges of
/// Unicode's East Asian Width, not every code point).
pub(crate) fn display_width(text: &str) -> usize {
    text.chars().map(char_width).sum()
}

fn char_width(c: char) -> usize {
    if c.is_control() {
        return 0;
    }
    match c as u32 {
        0x0300..=0x036F
        | 0x0591..=0x05BD
        | 0x0610..=0x061A
        | 0x064B..=0x065F
        | 0x0900..=0x0903
        | 0x093A..=0x094F
        | 0x0E31
        | 0x0E34..=0x0E3A
        | 0x0E47..=0x0E4E
        | 0x1160..=0x11FF
        | 0x1DC0..=0x1DFF
        | 0x200B..=0x200F
        | 0x2060..=0x2064
        | 0x20D0..=0x20FF
        | 0xFE00..=0xFE0F
        | 0xFE20..=0xFE2F
        | 0xFEFF => 0,
        0x1100..=0x115F
        | 0x2E80..=0x303E
        | 0x3041..=0x33FF
        | 0x3400..=0x4DBF
        | 0x4E00..=0x9FFF
        | 0xA000..=0xA4CF
        | 0xAC00..=0xD7A3
        | 0xF900..=0xFAFF
        | 0xFE30..=0xFE4F
        | 0xFF00..=0xFF60
        | 0xFFE0..=0xFFE6
        | 0x231A..=0x231B
        | 0x23E9..=0x23EC
        | 0x23F0
        | 0x23F3
        | 0x25FD..=0x25FE
        | 0x2614..=0x2615
        | 0x26A1
        | 0x26AA..=0x26AB
        | 0x26BD..=0x26BE
        | 0x26D4
        | 0x26EA
        | 0x26F5
        | 0x26FD
        | 0x2705
        | 0x270A..=0x270B
        | 0x2728
        | 0x274C
        | 0x2753..=0x2755
        | 0x2757
        | 0x2795..=0x2797
        | 0x27B0
        | 0x27BF
        | 0x2B1B..=0x2B1C
        | 0x2B50
        | 0x2B55
        | 0x1F000..=0x1F02F
        | 0x1F0A0..=0x1F0FF
        | 0x1F18E
        | 0x1F191..=0x1F19A
        | 0x1F200..=0x1F2FF
        | 0x1F300..=0x1F64F
        | 0x1F680..=0x1F6FF
        | 0x1F7E0..=0x1F7EB
        | 0x1F90C..=0x1F9FF
        | 0x1FA70..=0x1FAFF
        | 0x20000..=0x3FFFD => 2,
        _ => 1,
    }
}

/// Rows as lines whose columns line up: each column as wide as its widest
/// cell (in terminal columns), two spaces between columns, the last
/// column not padded.
pub(crate) fn table(rows: &[Vec<String>]) -> Vec<String> {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| display_width(cell))
                .max()
                .unwrap_or(0)
        })
        .collect();
    rows.iter()
        .map(|row| {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                if c > 0 {
                    line.push_str("  ");
                }
                line.push_str(cell);
                if c + 1 < row.len() {
                    let pad = widths[c].saturating_sub(display_width(cell));
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            line.trim_end().to_string()
        })
        .collect()
}

#[cfg(test)]
mod table_tests {
    use super::{display_width, table};

    #[test]
    fn wide_characters_take_two_columns() {
        assert_eq!(display_width("abc"), 3);
        assert_eq!(display_width("日本語"), 6);
        assert_eq!(display_width("e\u{301}"), 1);
        assert_eq!(display_width("\u{1F680}\u{2705}"), 4);
        assert_eq!(display_width("a\u{5B4}\u{FEFF}\u{1b}"), 1);
        let lines = table(&[
            vec!["日本".to_string(), "x".to_string()],
            vec!["abcd".to_string(), "y".to_string()],
        ]);
        assert_eq!(lines, ["日本  x", "abcd  y"]);
    }

    #[test]
    fn a_table_lines_up_its_columns_on_the_widest_cell() {
        let rows = vec![
            vec!["schedule@1".to_string(), "available".into(), "x".into()],
            vec!["webhook.received@1".to_string(), "no".into(), "y".into()],
        ];
        assert_eq!(
            table(&rows),
            [
                "schedule@1          available  x",
                "webhook.received@1  no         y"
            ]
        );
        assert!(table(&[]).is_empty());
    }
}

/// An RFC 3339 time as the text output shows every ledger time: UTC with
/// microseconds and `Z`, so the records a host wrote with an offset
/// (`+00:00`) line up with the others. Text that is not a time is kept.
pub(crate) fn utc_micros(t: &str) -> String {
    chrono::DateTime::parse_from_rfc3339(t).map_or_else(
        |_| t.to_string(),
        |d| {
            d.with_timezone(&chrono::Utc)
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
        },
    )
}
