//! Docs are tests: every shell session shown in README.md and docs/*.md is
//! run, command by command, against the built binary, and what each
//! command prints must match what the page shows.
//!
//! A session is a fenced block whose first line starts with `$ `. Each doc
//! runs in a scratch folder of its own (its store is that folder's
//! `.stepwell/`, shared by the page's sessions in order, as a reader
//! following the page would), with `stepwell` on the `PATH` and the
//! repository's folders linked in. What may differ between runs is
//! normalised (README.md, "Two commands"):
//! - a run id (any UUID), a connection id (`tc_` and 32 hex digits), a
//!   digest or key (12 or more hex digits) and a server's
//!   `127.0.0.1:PORT` shown in the page stand for the ones the commands
//!   got; later commands that name them are given the real ones;
//! - times match any time written the same way (`T` or a space, `Z`, an
//!   offset or no zone), durations any duration; runs of spaces match any run of spaces;
//! - `...` inside a line matches any text, and a line of `...` any number
//!   of lines.
//!
//! A command that exits with a failure must be shown failing: an `error`
//! in what the page shows it printing, or `# exit N` on the command.
//!
//! A session the suite cannot run (it needs a model, a browser, a second
//! machine) says why in `<!-- doc-test: skip: REASON -->` just above it;
//! the skipped ones are counted and printed. Two more marks:
//! `<!-- doc-test: background -->` starts each command of the session and
//! leaves it running (a server) once it has printed what the page shows,
//! until the page ends; `<!-- doc-test: prelude -->` above a plain block
//! (shell variables) runs its lines before every later command of the
//! page; `<!-- doc-test: stop -->` stops the servers before its session
//! runs; `<!-- doc-test: file: PATH -->` above a plain block says it
//! shows that file of the repository whole, and the suite checks that it
//! does. The path `/tmp/docs-scratch` in a page stands for the page's
//! scratch folder. `STEPWELL_DOCS_BLESS=1` writes what the commands
//! printed into the pages where they differ.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use regex::Regex;
use stepwell_tests::{repo, stepwell_binary};

/// The pages whose sessions are run; `every_page_is_listed` keeps it whole.
const PAGES: &[&str] = &[
    "README.md",
    "docs/ahp.md",
    "docs/architecture.md",
    "docs/automations.md",
    "docs/cli.md",
    "docs/concepts.md",
    "docs/dashboard.md",
    "docs/deploying.md",
    "docs/flows.md",
    "docs/history.md",
    "docs/http.md",
    "docs/llm.md",
    "docs/nodes.md",
    "docs/nodes-c.md",
    "docs/nodes-js.md",
    "docs/nodes-python.md",
    "docs/nodes-rust.md",
    "docs/observing.md",
    "docs/performance.md",
    "docs/storage.md",
    "docs/tools.md",
    "docs/triggers.md",
    "docs/wit.md",
];

/// How long one documented command may take.
const COMMAND_LIMIT: Duration = Duration::from_secs(120);

/// One `$ ` command of a page and what the page shows it printing.
#[derive(Debug)]
struct Step {
    /// The 1-based line of the `$ ` in the page.
    line: usize,
    /// The command, continuation lines joined.
    command: String,
    /// What the page shows, one entry a line (trailing blank lines cut).
    expected: Vec<String>,
    /// The 1-based lines of the page that `expected` came from.
    lines: std::ops::Range<usize>,
}

/// How the page asks a block to be run.
#[derive(Debug, Clone, PartialEq)]
enum Mark {
    /// Each command to its end.
    Run,
    /// Not at all, for this reason.
    Skip(String),
    /// Each command left running once it printed what the page shows.
    Background,
    /// A plain block's lines before every later command.
    Prelude,
    /// Each command to its end, once the servers started before are
    /// stopped.
    Stop,
    /// Not a session: the block is this file of the repository, whole.
    File(String),
}

/// A session: the commands of one fenced block.
#[derive(Debug)]
struct Session {
    /// The line of its opening fence.
    line: usize,
    mark: Mark,
    steps: Vec<Step>,
}

/// What a page holds: its sessions and the preludes, in page order.
#[derive(Debug)]
enum Block {
    Session(Session),
    Prelude(String),
    /// A block that shows a repository file: its path, its text, and the
    /// page lines it spans.
    File(String, String, std::ops::Range<usize>),
}

/// The sessions (and preludes) of a page, in order.
fn sessions(text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(indent) = fence(lines[i]) else {
            i += 1;
            continue;
        };
        let open = i;
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() && fence(lines[i]).is_none() {
            body.push((i + 1, strip_indent(lines[i], indent)));
            i += 1;
        }
        i += 1;
        let mark = mark(&lines[..open]);
        if let Mark::File(path) = &mark {
            let text: Vec<&str> = body.iter().map(|(_, l)| *l).collect();
            let start = open + 2;
            out.push(Block::File(
                path.clone(),
                text.join("\n"),
                start..start + body.len(),
            ));
            continue;
        }
        if mark == Mark::Prelude {
            let text: Vec<&str> = body.iter().map(|(_, l)| *l).collect();
            out.push(Block::Prelude(text.join("\n")));
            continue;
        }
        if !body.first().is_some_and(|(_, l)| l.starts_with("$ ")) {
            continue;
        }
        out.push(Block::Session(Session {
            line: open + 1,
            mark,
            steps: steps(&body),
        }));
    }
    out
}

/// The indent of a fence line (```), if it is one.
fn fence(line: &str) -> Option<usize> {
    let t = line.trim_start();
    t.starts_with("```").then(|| line.len() - t.len())
}

/// `line` without up to `indent` leading spaces.
fn strip_indent(line: &str, indent: usize) -> &str {
    let n = line.len() - line.trim_start_matches(' ').len();
    &line[n.min(indent)..]
}

/// The `<!-- doc-test: ... -->` mark just above a block.
fn mark(before: &[&str]) -> Mark {
    let Some(last) = before.iter().rev().find(|l| !l.trim().is_empty()) else {
        return Mark::Run;
    };
    let Some(rest) = last.trim().strip_prefix("<!-- doc-test:") else {
        return Mark::Run;
    };
    let rest = rest.trim_end_matches("-->").trim();
    match rest {
        "background" => Mark::Background,
        "prelude" => Mark::Prelude,
        "stop" => Mark::Stop,
        _ => match rest.strip_prefix("skip:") {
            Some(why) if !why.trim().is_empty() => Mark::Skip(why.trim().to_string()),
            None if rest.starts_with("file:") => {
                Mark::File(rest["file:".len()..].trim().to_string())
            }
            _ => {
                panic!("unknown doc-test mark {last:?}: skip: REASON, file: PATH, background, prelude or stop")
            }
        },
    }
}

/// The commands of a session's body and the output shown under each.
fn steps(body: &[(usize, &str)]) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::new();
    let mut k = 0;
    while k < body.len() {
        let (line, text) = body[k];
        let Some(first) = text.strip_prefix("$ ") else {
            let step = out.last_mut().expect("a session starts with `$ `");
            step.expected.push(text.to_string());
            step.lines.end = line + 1;
            k += 1;
            continue;
        };
        let mut command = first.to_string();
        while command.ends_with('\\') && k + 1 < body.len() {
            k += 1;
            command.push('\n');
            command.push_str(body[k].1);
        }
        out.push(Step {
            line,
            command,
            expected: Vec::new(),
            lines: body[k].0 + 1..body[k].0 + 1,
        });
        k += 1;
    }
    for s in &mut out {
        while s.expected.last().is_some_and(|l| l.trim().is_empty()) {
            s.expected.pop();
            s.lines.end -= 1;
        }
    }
    out
}

/// The kinds of value that differ between runs, in the order they are
/// tried at a position of an expected line.
fn holes() -> &'static Regex {
    static R: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    R.get_or_init(|| {
        Regex::new(concat!(
            r"(?P<uuid>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b)",
            r"|(?P<conn>tc_[0-9a-f]{32}\b)",
            r"|(?P<time>\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)?)",
            r"|(?P<addr>127\.0\.0\.1:\d+)",
            r"|(?P<hex>[0-9a-f]{12,}\b)",
            r"|(?P<dur>\b\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m\d\ds|h\d\dm|d\d\dh)\b)",
            r"|(?P<any>\.\.\.)",
            r"|(?P<space>\s+)",
        ))
        .expect("holes")
    })
}

/// What a hole of each kind matches in what a command printed.
const DUR: &str = r"\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m\d\ds|h\d\dm|d\d\dh)";
const UUID: &str = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}";
const CONN: &str = r"tc_[0-9a-f]{32}";
const HEX: &str = "[0-9a-f]{12,}";
const ADDR: &str = r"127\.0\.0\.1:\d+";

/// The path that stands for the page's scratch folder.
const SCRATCH: &str = "/tmp/docs-scratch";

/// What a time of the page matches: any time written the same way (`T`
/// or a space between date and time, `Z`, an offset or no zone), so a
/// page cannot show one style while the binary prints another.
fn time_like(shown: &str) -> String {
    let sep = if shown.as_bytes().get(10) == Some(&b'T') {
        "T"
    } else {
        " "
    };
    let tail = &shown[shown.len().saturating_sub(6)..];
    let zone = if shown.ends_with('Z') {
        "Z"
    } else if tail.starts_with(['+', '-']) && tail.as_bytes().get(3) == Some(&b':') {
        r"[+-]\d\d:\d\d"
    } else {
        ""
    };
    format!(r"\d{{4}}-\d\d-\d\d{sep}\d\d:\d\d:\d\d(?:\.\d+)?{zone}")
}

/// An expected line as a regex, with the page's ids already bound given
/// as their values, and the unbound ones as groups (their page ids
/// returned in order, once a group).
fn line_pattern(expected: &str, bound: &HashMap<String, String>) -> (Regex, Vec<String>) {
    let mut pat = String::from("^");
    let mut free = Vec::new();
    let mut at = 0;
    let text = expected.trim_end();
    for m in holes().captures_iter(text) {
        let whole = m.get(0).unwrap();
        pat.push_str(&regex::escape(&text[at..whole.start()]));
        at = whole.end();
        let s = whole.as_str();
        let id_kind = [("uuid", UUID), ("conn", CONN), ("addr", ADDR), ("hex", HEX)]
            .into_iter()
            .find(|(name, _)| m.name(name).is_some());
        if let Some((_, kind)) = id_kind {
            match bound.get(s) {
                Some(v) => pat.push_str(&regex::escape(v)),
                None => {
                    free.push(s.to_string());
                    pat.push_str(&format!("({kind})"));
                }
            }
        } else if m.name("time").is_some() {
            pat.push_str(&time_like(s));
        } else if m.name("dur").is_some() {
            pat.push_str(DUR);
        } else if m.name("any").is_some() {
            pat.push_str(".*?");
        } else {
            pat.push_str(r"\s+");
        }
    }
    pat.push_str(&regex::escape(&text[at..]));
    pat.push_str(r"\s*$");
    // A free id may come twice (the regex crate has no backreferences):
    // `matches` checks that both took the same value.
    (Regex::new(&pat).expect("expected line pattern"), free)
}

/// Matches what a command printed against what the page shows, binding
/// the page's unbound ids; `None` when they differ.
fn matches(
    expected: &[String],
    actual: &[&str],
    bound: &HashMap<String, String>,
) -> Option<HashMap<String, String>> {
    let Some((first, rest)) = expected.split_first() else {
        return actual.is_empty().then(|| bound.clone());
    };
    if first.trim() == "..." {
        return (0..=actual.len()).find_map(|skip| matches(rest, &actual[skip..], bound));
    }
    let (line, more) = actual.split_first()?;
    let (re, free) = line_pattern(first, bound);
    let caps = re.captures(line)?;
    let mut now = bound.clone();
    let mut groups = caps.iter().skip(1).flatten();
    for id in free {
        let value = groups.next()?.as_str().to_string();
        match now.get(&id) {
            Some(v) if v != &value => return None,
            Some(_) => {}
            None => {
                now.insert(id, value);
            }
        }
    }
    matches(rest, more, &now)
}

/// The scratch folder a page runs in: the repository's folders linked in,
/// its own store, state and home.
fn scratch() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(repo()).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        let keep = !matches!(name.to_str(), Some("target" | ".stepwell" | ".git" | ".ci"));
        if keep {
            std::os::unix::fs::symlink(entry.path(), dir.path().join(&name)).unwrap();
        }
    }
    dir
}

/// A command started by `sh` in a page's scratch folder, standard error
/// merged into its output, which goes to a file (a server it leaves
/// running holds no pipe open).
struct Started {
    child: std::process::Child,
    out: PathBuf,
    began: Instant,
}

impl Started {
    /// Starts `command` (after the page's `prelude`) in `dir`.
    fn new(dir: &Path, prelude: &str, command: &str, n: usize) -> Started {
        let bin = stepwell_binary();
        let path = format!(
            "{}:{}",
            bin.parent().unwrap().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let out = dir.join(format!(".out/{n}"));
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        let file = std::fs::File::create(&out).unwrap();
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!("{prelude}\n{{\n{command}\n}} 2>&1"))
            .current_dir(dir)
            .env("PATH", path)
            .env("HOME", dir.join(".home"))
            .env("XDG_STATE_HOME", dir.join(".state"))
            .env("XDG_CACHE_HOME", repo().join("target/stepwell-doc-cache"))
            .env_remove("NO_COLOR")
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(Stdio::null());
        for (k, _) in std::env::vars() {
            if k.starts_with("STEPWELL_") || k.starts_with("OTEL_") {
                c.env_remove(k);
            }
        }
        std::os::unix::process::CommandExt::process_group(&mut c, 0);
        Started {
            child: c.spawn().expect("sh"),
            out,
            began: Instant::now(),
        }
    }

    /// What it printed so far.
    fn printed(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.out).unwrap_or_default()).into_owned()
    }

    /// Waits for its end (killing it after [`COMMAND_LIMIT`]) and returns
    /// what it printed and its exit status (`None`: killed).
    fn finish(mut self) -> (String, Option<i32>) {
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if self.began.elapsed() > COMMAND_LIMIT {
                self.stop(libc::SIGKILL);
                let printed = format!("{}(killed after {COMMAND_LIMIT:?})\n", self.printed());
                return (printed, None);
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        (self.printed(), status.code())
    }

    /// Signals its process group and reaps its shell; a group still there
    /// 5 s later (a server slow to stop) is killed.
    fn stop(&mut self, signal: i32) {
        let group = -(self.child.id() as i32);
        // SAFETY: kill(2) on the process group this test started.
        unsafe { libc::kill(group, signal) };
        let _ = self.child.wait();
        let deadline = Instant::now() + Duration::from_secs(5);
        // SAFETY: signal 0 only asks whether the group has a process.
        while unsafe { libc::kill(group, 0) } == 0 {
            if Instant::now() > deadline {
                // SAFETY: as above, the group this test started.
                unsafe { libc::kill(group, libc::SIGKILL) };
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Runs one command of a page to its end and returns what it printed.
fn run(dir: &Path, command: &str) -> String {
    match Started::new(dir, "", command, 0).finish() {
        (printed, Some(0)) => printed,
        (printed, code) => format!("{printed}{}", failed_line(code)),
    }
}

/// The line the runner adds to what a command printed when it exited
/// otherwise than its page shows.
fn failed_line(code: Option<i32>) -> String {
    match code {
        Some(n) => format!("(exit status {n})\n"),
        None => "(killed by a signal)\n".to_string(),
    }
}

/// The exit status a page shows for a step: `N` of a `# exit N` comment
/// on the command; else failure (`Err`) when what it prints starts a line
/// with `error` (the CLI's errors; an API's error answer is a `curl` that
/// worked); else 0.
fn shown_exit(step: &Step) -> Result<i32, ()> {
    if let Some(n) = step
        .command
        .split("# exit ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
    {
        return Ok(n);
    }
    let fails = step.expected.iter().any(|l| {
        let l = l.trim_start();
        l.starts_with("error")
    });
    if fails {
        Err(())
    } else {
        Ok(0)
    }
}

/// Whether `code` is the exit status the page shows (`Err`: any failure).
fn exits_as_shown(step: &Step, code: Option<i32>) -> bool {
    match shown_exit(step) {
        Ok(n) => code == Some(n),
        Err(()) => code != Some(0),
    }
}

/// A command whose output differed from the page.
struct Mismatch {
    line: usize,
    command: String,
    expected: Vec<String>,
    actual: String,
    lines: std::ops::Range<usize>,
}

/// What running a page gave.
#[derive(Default)]
struct PageRun {
    commands: usize,
    /// The blocks that show a repository file.
    files: usize,
    skipped: Vec<(usize, String)>,
    mismatches: Vec<Mismatch>,
    /// The commands that took long, and how long.
    slow: Vec<(usize, Duration)>,
    /// The page's ids and the real ones they stood for.
    bound: HashMap<String, String>,
}

/// A page being run: its scratch folder, preludes and servers.
struct PageShell {
    dir: tempfile::TempDir,
    prelude: String,
    servers: Vec<Started>,
    n: usize,
}

impl PageShell {
    /// A command of the page (or its prelude) as it is run: its ids
    /// bound, its scratch path real.
    fn real(&self, text: &str, bound: &HashMap<String, String>) -> String {
        let mut text = text.replace(SCRATCH, &self.scratch());
        for (page_id, real) in bound {
            text = text.replace(page_id.as_str(), real);
        }
        text
    }

    fn scratch(&self) -> String {
        self.dir.path().display().to_string()
    }

    /// What a command printed, its scratch path as the page writes it.
    fn shown(&self, printed: &str) -> String {
        printed.replace(&self.scratch(), SCRATCH)
    }

    /// Runs a step and matches it; returns the new bindings, or what it
    /// printed when it differs.
    fn step(
        &mut self,
        step: &Step,
        mark: &Mark,
        bound: &HashMap<String, String>,
    ) -> Result<HashMap<String, String>, String> {
        self.n += 1;
        let started = Started::new(
            self.dir.path(),
            &self.real(&self.prelude, bound),
            &self.real(&step.command, bound),
            self.n,
        );
        if *mark != Mark::Background {
            let (printed, code) = started.finish();
            let printed = self.shown(&printed);
            let lines: Vec<&str> = printed.lines().collect();
            let found = matches(&step.expected, &lines, bound);
            return match found {
                // A status other than the page's shows as a last line.
                Some(now) if exits_as_shown(step, code) => Ok(now),
                Some(_) => {
                    let sep = if printed.ends_with('\n') || printed.is_empty() {
                        ""
                    } else {
                        "\n"
                    };
                    Err(format!("{printed}{sep}{}", failed_line(code)))
                }
                None => Err(printed),
            };
        }
        // A server: wait until it printed what the page shows.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let printed = self.shown(&started.printed());
            let lines: Vec<&str> = printed.lines().collect();
            if let Some(now) = matches(&step.expected, &lines, bound) {
                // A server prints and stays: one that ended (an error, a
                // bad flag) is not what the page shows.
                std::thread::sleep(Duration::from_millis(300));
                let mut started = started;
                if started.child.try_wait().unwrap().is_some() {
                    let printed = self.shown(&started.printed());
                    return Err(format!("{printed}(ended; the page shows it running)"));
                }
                self.servers.push(started);
                return Ok(now);
            }
            if Instant::now() > deadline {
                let mut started = started;
                started.stop(libc::SIGKILL);
                return Err(printed);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl PageShell {
    /// Stops the servers the page started (SIGTERM: they shut down
    /// gracefully).
    fn stop_servers(&mut self) {
        for mut s in self.servers.drain(..) {
            s.stop(libc::SIGTERM);
        }
    }
}

impl Drop for PageShell {
    fn drop(&mut self) {
        self.stop_servers();
    }
}

/// Runs every session of a page in order, in one scratch folder.
fn run_page(page: &str) -> PageRun {
    let text = std::fs::read_to_string(repo().join(page)).unwrap();
    let mut shell = PageShell {
        dir: scratch(),
        prelude: String::new(),
        servers: Vec::new(),
        n: 0,
    };
    let mut done = PageRun::default();
    for block in sessions(&text) {
        let session = match block {
            Block::Prelude(p) => {
                shell.prelude.push_str(&p);
                shell.prelude.push('\n');
                continue;
            }
            Block::Session(s) => s,
            Block::File(path, shown, lines) => {
                done.files += 1;
                if let Some(real) = file_differs(&path, &shown) {
                    done.mismatches.push(Mismatch {
                        line: lines.start - 1,
                        command: format!("(the file {path}, shown whole)"),
                        expected: shown.lines().map(str::to_string).collect(),
                        actual: real,
                        lines,
                    });
                }
                continue;
            }
        };
        if let Mark::Skip(why) = session.mark {
            done.skipped.push((session.line, why));
            continue;
        }
        if session.mark == Mark::Stop {
            shell.stop_servers();
        }
        for step in session.steps {
            let began = Instant::now();
            let result = shell.step(&step, &session.mark, &done.bound);
            done.commands += 1;
            if began.elapsed() > SLOW {
                done.slow.push((step.line, began.elapsed()));
            }
            match result {
                Ok(now) => done.bound = now,
                Err(actual) => {
                    // Its ids still stand for what it printed, position
                    // by position: the commands after it (and a bless)
                    // use the real ones.
                    bind_loosely(&step.expected, &actual, &mut done.bound);
                    done.mismatches.push(Mismatch {
                        line: step.line,
                        command: step.command,
                        expected: step.expected,
                        actual,
                        lines: step.lines,
                    })
                }
            }
        }
    }
    done
}

/// The text of the repository file `path` when a page shows it otherwise
/// (trailing blank space aside).
fn file_differs(path: &str, shown: &str) -> Option<String> {
    let real = std::fs::read_to_string(repo().join(path))
        .unwrap_or_else(|e| format!("(cannot read {path}: {e})"));
    (real.trim_end() != shown.trim_end()).then(|| real.trim_end().to_string())
}

/// Binds the ids a page shows for a step that printed something else to
/// the ids of the same kind it printed, in order of appearance.
fn bind_loosely(expected: &[String], actual: &str, bound: &mut HashMap<String, String>) {
    for (name, kind) in [("uuid", UUID), ("conn", CONN), ("addr", ADDR)] {
        let page: Vec<String> = holes()
            .captures_iter(&expected.join("\n"))
            .filter_map(|c| c.name(name).map(|m| m.as_str().to_string()))
            .collect();
        let real: Vec<String> = Regex::new(kind)
            .unwrap()
            .find_iter(actual)
            .map(|m| m.as_str().to_string())
            .collect();
        for (p, r) in page.into_iter().zip(real) {
            bound.entry(p).or_insert(r);
        }
    }
}

/// A documented command slower than this is named in the page's summary.
const SLOW: Duration = Duration::from_secs(3);

/// Writes what the commands printed into the page where it differed,
/// with the real ids given back as the page's.
fn bless(page: &str, run: &PageRun) {
    let path = repo().join(page);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let back: BTreeMap<&str, &str> = run
        .bound
        .iter()
        .map(|(p, r)| (r.as_str(), p.as_str()))
        .collect();
    for m in run.mismatches.iter().rev() {
        let indent = " ".repeat(lines[m.line - 1].len() - lines[m.line - 1].trim_start().len());
        let new: Vec<String> = m
            .actual
            .lines()
            .map(|l| {
                let mut l = l.trim_end().to_string();
                for (real, page_id) in &back {
                    l = l.replace(real, page_id);
                }
                format!("{indent}{l}")
            })
            .collect();
        lines.splice(m.lines.start - 1..m.lines.end - 1, new);
    }
    let mut out = lines.join("\n");
    out.push('\n');
    std::fs::write(path, out).unwrap();
}

/// The programs the pages' sessions call besides `stepwell`.
const TOOLS: &[&str] = &["sh", "jq", "curl", "sqlite3", "python3", "sha256sum", "sed"];

/// Fails at once, naming them, when programs the pages call are missing
/// (rather than with a page of `not found` differences). Looked for once
/// per test binary.
fn tools_are_there() {
    static MISSING: std::sync::OnceLock<Vec<&str>> = std::sync::OnceLock::new();
    let missing = MISSING.get_or_init(|| {
        TOOLS
            .iter()
            .copied()
            .filter(|t| {
                !Command::new("sh")
                    .args(["-c", &format!("command -v {t}")])
                    .stdout(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            })
            .collect()
    });
    assert!(
        missing.is_empty(),
        "the documented sessions call {missing:?}, which this machine lacks (Debian: apt-get install jq curl sqlite3 python3)"
    );
}

/// Runs a page and fails with every command whose output differed.
fn check_page(page: &str) {
    tools_are_there();
    let done = run_page(page);
    eprintln!(
        "{page}: {} documented commands run, {} files shown, {} differ, {} sessions skipped",
        done.commands,
        done.files,
        done.mismatches.len(),
        done.skipped.len()
    );
    for (line, why) in &done.skipped {
        eprintln!("  {page}:{line}: skipped: {why}");
    }
    for (line, took) in &done.slow {
        eprintln!("  {page}:{line}: took {took:.1?}");
    }
    if done.mismatches.is_empty() {
        return;
    }
    if std::env::var("STEPWELL_DOCS_BLESS").as_deref() == Ok("1") {
        bless(page, &done);
    }
    let mut report = String::new();
    for m in &done.mismatches {
        report.push_str(&format!(
            "\n{page}:{}: $ {}\n--- the page shows\n{}\n--- the command printed\n{}\n",
            m.line,
            m.command,
            m.expected.join("\n"),
            m.actual.trim_end()
        ));
    }
    panic!(
        "{page}: {} of {} documented commands printed something else:{report}",
        done.mismatches.len(),
        done.commands
    );
}

macro_rules! pages {
    ($($name:ident => $page:literal,)*) => {
        $(
            #[test]
            fn $name() {
                check_page($page);
            }
        )*
    };
}

pages! {
    readme => "README.md",
    ahp => "docs/ahp.md",
    architecture => "docs/architecture.md",
    automations => "docs/automations.md",
    cli => "docs/cli.md",
    concepts => "docs/concepts.md",
    dashboard => "docs/dashboard.md",
    deploying => "docs/deploying.md",
    flows => "docs/flows.md",
    history => "docs/history.md",
    http => "docs/http.md",
    llm => "docs/llm.md",
    nodes => "docs/nodes.md",
    nodes_c => "docs/nodes-c.md",
    nodes_js => "docs/nodes-js.md",
    nodes_python => "docs/nodes-python.md",
    nodes_rust => "docs/nodes-rust.md",
    observing => "docs/observing.md",
    performance => "docs/performance.md",
    storage => "docs/storage.md",
    tools => "docs/tools.md",
    triggers => "docs/triggers.md",
    wit => "docs/wit.md",
}

/// Every page of docs/ is run: a new page cannot escape the suite.
#[test]
fn every_page_is_listed() {
    let mut found: Vec<String> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.ends_with(".md").then(|| format!("docs/{name}"))
        })
        .collect();
    found.push("README.md".into());
    found.sort();
    let mut listed: Vec<String> = PAGES.iter().map(|p| p.to_string()).collect();
    listed.sort();
    assert_eq!(found, listed, "tests/docs.rs PAGES and its pages! list");
}

/// The matcher itself: ids bind, kinds of value match their kind only,
/// and a changed word fails.
#[test]
fn the_matcher_binds_ids_and_refuses_other_text() {
    let page = |s: &[&str]| s.iter().map(|l| l.to_string()).collect::<Vec<_>>();
    let id = "1edb6e95-10de-42b5-975d-0e2b8c302a3b";
    let real = "0aa1e0c2-5cf2-4f0e-9a4e-8f3d1c2b3a4f";
    let shown = page(&[
        &format!("run {id}  status waiting"),
        "...",
        &format!("resume {id} at 2026-11-30T08:17:42.071004Z took 0.012s"),
    ]);
    let printed = [
        &format!("run {real}    status waiting") as &str,
        "a line",
        "another",
        &format!("resume {real} at 2026-12-06T03:00:01Z took 3m20s"),
    ];
    let bound = matches(&shown, &printed, &HashMap::new()).expect("matches");
    assert_eq!(bound.get(id).map(String::as_str), Some(real));
    // A time in another style is not the same output.
    let styled = format!("resume {real} at 2026-12-06T03:00:01+00:00 took 3m20s");
    let restyled = [printed[0], printed[1], printed[2], &styled as &str];
    assert!(matches(&shown, &restyled, &HashMap::new()).is_none());
    let other = format!("resume {} at 2026-12-06T03:00:01Z took 1s", UUID_B);
    let printed2 = [printed[0], &other as &str];
    assert!(matches(&shown, &printed2, &HashMap::new()).is_none());
    let worded = [&format!("run {real}  status completed") as &str];
    assert!(matches(&shown[..1], &worded, &HashMap::new()).is_none());
    assert!(matches(&shown[..1], &[], &HashMap::new()).is_none());
}

const UUID_B: &str = "11111111-2222-4333-8444-555555555555";

/// A page with a deliberately wrong output fails, and says where.
#[test]
fn a_wrong_output_in_a_page_fails() {
    let text =
        "intro\n\n```\n$ stepwell --store memory list --json\n[\"not what it prints\"]\n```\n";
    let found = sessions(text);
    assert_eq!(found.len(), 1);
    let Block::Session(session) = &found[0] else {
        panic!("a session")
    };
    let step = &session.steps[0];
    assert_eq!(step.line, 4);
    let dir = scratch();
    let actual = run(dir.path(), &step.command);
    let lines: Vec<&str> = actual.lines().collect();
    assert!(
        matches(&step.expected, &lines, &HashMap::new()).is_none(),
        "{actual}"
    );
    let fixed = vec!["[]".to_string()];
    assert!(
        matches(&fixed, &lines, &HashMap::new()).is_some(),
        "{actual}"
    );
}

/// A block marked as a repository file must show it whole: one line
/// changed in the page is a difference.
#[test]
fn a_file_shown_otherwise_fails() {
    let real = std::fs::read_to_string(repo().join("flows/examples/expenses/flow.json")).unwrap();
    let page = format!(
        "<!-- doc-test: file: flows/examples/expenses/flow.json -->\n```json\n{}```\n",
        real.replace("\"limit\": 100", "\"limit\": 500")
    );
    let found = sessions(&page);
    let [Block::File(path, shown, lines)] = found.as_slice() else {
        panic!("one file block: {found:?}")
    };
    assert_eq!(
        (path.as_str(), lines.clone()),
        (
            "flows/examples/expenses/flow.json",
            3..3 + real.lines().count()
        )
    );
    assert_eq!(file_differs(path, shown).as_deref(), Some(real.trim_end()));
    assert_eq!(file_differs(path, &real), None);
}

/// A command that fails where the page shows it working differs from the
/// page (its exit status is part of what it printed); a page that shows
/// it failing (an error line, or `# exit N` on the command) matches.
#[test]
fn a_command_that_fails_where_the_page_shows_it_working_differs() {
    let dir = scratch();
    let printed = run(dir.path(), "echo fine; exit 3");
    assert_eq!(printed, "fine\n(exit status 3)\n");
    let lines: Vec<&str> = printed.lines().collect();
    assert!(matches(&["fine".to_string()], &lines, &HashMap::new()).is_none());
    let page =
        "```\n$ echo fine; exit 3   # exit 3\nfine\n$ echo 'error: no'; exit 1\nerror: no\n```\n";
    let found = sessions(page);
    let [Block::Session(session)] = found.as_slice() else {
        panic!("one session: {found:?}")
    };
    assert_eq!(shown_exit(&session.steps[0]), Ok(3));
    assert_eq!(shown_exit(&session.steps[1]), Err(()));
    let mut shell = PageShell {
        dir: scratch(),
        prelude: String::new(),
        servers: Vec::new(),
        n: 0,
    };
    for step in &session.steps {
        assert!(
            shell.step(step, &Mark::Run, &HashMap::new()).is_ok(),
            "{step:?}"
        );
    }
}
