//! `execute_command`: the one tool that is not WebAssembly. Processes cannot
//! run inside WASI, so this tool runs `sh -c <command>` on the host, with
//! the host's rights, in the run's workspace root. It is off unless the
//! operator enables it (`--enable-exec`, `STEPWELL_ENABLE_EXEC=1`,
//! `RuntimeBuilder::enable_exec`), always waits for a person's approval
//! (whatever the run policy says), and is refused in a read-only
//! workspace. What the command can reach is everything the host's user can:
//! the workspace scope only picks its starting directory (docs/tools.md,
//! "execute_command").

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::{ToolClass, ToolSpec};

/// The longest a command may run, whatever it asks (the reference's
/// `EXECUTE_COMMAND_MAX_TIMEOUT_S`).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(600);

/// How much of each stream is kept (the rest is counted, not stored).
const KEEP_BYTES: usize = 256 << 10;

/// The environment variable that enables the tool.
pub const ENABLE_EXEC_ENV: &str = "STEPWELL_ENABLE_EXEC";

/// The environment variables the binary passes from its own environment
/// to a command ([`ExecEnv`]; nothing else: keys such as `OPENAI_API_KEY`
/// never reach it).
pub const PASSED_ENV: [&str; 5] = ["PATH", "HOME", "LANG", "LC_ALL", "TMPDIR"];

/// The whole environment a command of `execute_command` gets: the library
/// reads none of its own process's, the application gives it (the binary
/// gives its [`PASSED_ENV`]). Empty by default.
///
/// ```
/// use stepwell_tools::exec::ExecEnv;
/// let env = ExecEnv::default().var("PATH", "/usr/bin:/bin").var("LANG", "C.UTF-8");
/// assert_eq!(env.vars().len(), 2);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecEnv(Vec<(String, std::ffi::OsString)>);

impl ExecEnv {
    /// This environment with `name` set to `value` (replacing it).
    pub fn var(mut self, name: impl Into<String>, value: impl Into<std::ffi::OsString>) -> Self {
        let name = name.into();
        self.0.retain(|(k, _)| *k != name);
        self.0.push((name, value.into()));
        self
    }

    /// Its variables, in the order they were set.
    pub fn vars(&self) -> &[(String, std::ffi::OsString)] {
        &self.0
    }
}

/// The tool's spec.
pub fn spec() -> ToolSpec {
    ToolSpec {
        name: "execute_command".into(),
        description: "Run a shell command in the workspace and return its exit code and output. \
                      Runs on the host with the host's rights; every call waits for a person's approval."
            .into(),
        parameters: json!({"type": "object", "properties": {
            "command": {"type": "string", "description": "The shell command (run with sh -c)."},
            "working_directory": {"type": "string", "description": "Where it runs (default: the workspace root)."},
            "timeout": {"type": "number", "description": "Seconds before it is killed (default 300, at most 600)."},
            "capture_output": {"type": "boolean", "description": "Keep stdout and stderr (default true)."},
            "allow_dangerous": {"type": "boolean", "description": "Allow commands the safety check blocks (default false)."}
        }, "required": ["command"]}),
        class: ToolClass::Exec,
    }
}

/// The reference's destructive-command check: why `command` is blocked,
/// if it is.
fn blocked(command: &str) -> Option<String> {
    const CRITICAL: [&str; 17] = [
        r"\brm\s+(-rf?|--recursive|--force)",
        r"\bdd\s+if=.*of=",
        r"\bmkfs\.",
        r"\bfdisk\b",
        r"\bparted\b",
        r"\bshred\b",
        r"\bwipe\b",
        r">\s*/dev/(sd[a-z]|nvme)",
        r"\bchmod\s+777",
        r"\bsudo\s+(rm|dd|mkfs|fdisk)",
        r"curl.*\|\s*(bash|sh|python)",
        r"wget.*\|\s*(bash|sh|python)",
        r"\bkill\s+-9\s+1\b",
        r"\binit\s+0",
        r"\bshutdown\b",
        r"\breboot\b",
        r"\bhalt\b",
    ];
    let lower = command.trim().to_lowercase();
    for p in CRITICAL {
        if regex::Regex::new(p).is_ok_and(|re| re.is_match(&lower)) {
            return Some(format!(
                "CRITICAL DESTRUCTIVE PATTERN: {p} - Could cause IRREVERSIBLE system damage"
            ));
        }
    }
    let paths = [
        "/etc/", "/usr/", "/var/", "/opt/", "/boot/", "/sys/", "/proc/",
    ];
    if paths.iter().any(|p| command.contains(p)) {
        let alt = paths.map(regex::escape).join("|");
        let destructive = format!(r"\b(rm|del|format)\s+.*({alt})");
        let redirect = format!(r".*(>|>>)\s*({alt})");
        if [destructive, redirect]
            .iter()
            .any(|p| regex::Regex::new(p).is_ok_and(|re| re.is_match(&lower)))
        {
            return Some(
                "CRITICAL SYSTEM PATH MODIFICATION - Could corrupt operating system".into(),
            );
        }
    }
    for k in [
        "format c:",
        "format d:",
        "del /f",
        "deltree",
        "destroy",
        "wipe",
        "kill -9",
        ":(){:|:&};:",
        "forkbomb",
    ] {
        if lower.contains(k) {
            return Some(format!(
                "HIGH-RISK KEYWORD: {k} - Requires EXPRESS user consent"
            ));
        }
    }
    None
}

fn boolish(v: Option<&Value>, default: bool) -> bool {
    match v {
        None | Some(Value::Null) => default,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|f| f != 0.0),
        Some(Value::String(s)) => match s.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "t" | "yes" | "y" | "on" => true,
            "0" | "false" | "f" | "no" | "n" | "off" | "" => false,
            _ => default,
        },
        _ => default,
    }
}

/// What a reader thread has read of a stream so far: the first
/// [`KEEP_BYTES`], the total, and whether the stream ended.
#[derive(Default)]
struct Drained {
    kept: Vec<u8>,
    total: usize,
    done: bool,
}

type Shared = std::sync::Arc<std::sync::Mutex<Drained>>;

/// Reads a stream to its end on its own thread, into a shared buffer the
/// caller can take at any time (a process that escaped the group kill may
/// hold the stream open for ever: the caller does not wait for it).
fn drain(mut r: impl Read + Send + 'static) -> Shared {
    let shared: Shared = Default::default();
    let into = shared.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        loop {
            let n = r.read(&mut buf).unwrap_or(0);
            let mut d = into.lock().unwrap_or_else(|e| e.into_inner());
            if n == 0 {
                d.done = true;
                break;
            }
            d.total += n;
            let room = KEEP_BYTES.saturating_sub(d.kept.len());
            d.kept.extend_from_slice(&buf[..n.min(room)]);
        }
    });
    shared
}

/// What was read of a stream, waiting at most until `deadline` for its end.
fn take(stream: Option<Shared>, deadline: Instant) -> (Vec<u8>, usize) {
    let Some(s) = stream else {
        return (Vec::new(), 0);
    };
    loop {
        {
            let d = s.lock().unwrap_or_else(|e| e.into_inner());
            if d.done || Instant::now() >= deadline {
                return (d.kept.clone(), d.total);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The first `limit` characters of `s`, and whether it was cut.
fn head(s: &str, limit: usize) -> (String, bool) {
    match s.char_indices().nth(limit) {
        Some((i, _)) => (s[..i].to_string(), true),
        None => (s.to_string(), false),
    }
}

/// Waits for the command `child` started at `started` until `timeout` (or
/// until `stop` says its run was cancelled), then kills its process group; kills what it left running in its group
/// either way. Returns its exit status and whether it timed out.
fn wait_bounded(
    child: &mut std::process::Child,
    started: Instant,
    timeout: Duration,
    stop: Option<&stepwell_runtime::wasm::Stop>,
) -> (Option<std::process::ExitStatus>, bool) {
    let pid = child.id() as i32;
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if started.elapsed() >= timeout || stop.is_some_and(|stop| stop()) => {
                // SAFETY: kill(2) takes no pointers. `-pid` names the
                // process group the command leads (`process_group(0)`),
                // whose leader is not reaped yet (`try_wait` said so), so
                // the id cannot have gone to another group.
                unsafe {
                    libc::kill(-pid, libc::SIGKILL);
                }
                timed_out = true;
                break child.wait().ok();
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => break None,
        }
    };
    // What the command left running in its group (a background job that
    // would hold its output open, a server) ends with it.
    // SAFETY: kill(2) takes no pointers, so it is memory-safe whatever the
    // id. `-pid` names the group the command led (`process_group(0)`): the
    // leader is reaped by now, but the id stays the group's while a member
    // lives (POSIX does not reuse it), and with none left the call finds no
    // group (ESRCH, ignored).
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
    }
    (status, timed_out)
}

/// Runs one `execute_command` call (arguments already rewritten by the
/// scope: `working_directory` absolute), bounded by `limit` (the run's
/// tool timeout) and the call's own `timeout`, with the environment `env`
/// and nothing else; its process group is killed when `stop` says its run
/// was cancelled. The answer is the reference's result object.
pub fn run(
    args: &Map<String, Value>,
    limit: Duration,
    env: &ExecEnv,
    stop: Option<&stepwell_runtime::wasm::Stop>,
) -> Value {
    let command = args
        .get("command")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let wd = args
        .get("working_directory")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let platform = std::env::consts::OS;
    if command.trim().is_empty() {
        return json!({"success": false, "error": "command is required", "command": command,
                      "platform": platform, "working_directory": wd,
                      "rendered": "❌ Error: command is required"});
    }
    if !boolish(args.get("allow_dangerous"), false) {
        if let Some(reason) = blocked(&command) {
            let rendered = format!(
                "🚫 CRITICAL SECURITY BLOCK: {reason}\nBLOCKED COMMAND: {command}\n⚠️  DANGER: This command could cause IRREVERSIBLE DAMAGE\nOnly use allow_dangerous=True with EXPRESS USER CONSENT\nThis safety mechanism protects your system and data"
            );
            return json!({"success": false, "error": reason, "command": command,
                          "platform": platform, "working_directory": wd, "rendered": rendered});
        }
    }
    let asked = args
        .get("timeout")
        .and_then(|v| v.as_f64().or_else(|| v.as_str()?.trim().parse().ok()))
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(300.0);
    let timeout = Duration::from_secs_f64(asked.min(MAX_TIMEOUT.as_secs_f64())).min(limit);
    let capture = boolish(args.get("capture_output"), true);
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(&command).env_clear();
    cmd.envs(env.vars().iter().map(|(k, v)| (k, v)));
    if !wd.is_empty() {
        cmd.current_dir(&wd);
    }
    cmd.stdin(Stdio::null());
    let pipe = || {
        if capture {
            Stdio::piped()
        } else {
            Stdio::null()
        }
    };
    cmd.stdout(pipe()).stderr(pipe());
    // Its own process group, so a timeout kills its children too.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let started = Instant::now();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let rendered = format!("❌ Error: cannot start the command: {e}");
            return json!({"success": false, "error": rendered.trim_start_matches('❌').trim(),
                          "command": command, "platform": platform, "working_directory": wd,
                          "rendered": rendered});
        }
    };
    let out = child.stdout.take().map(drain);
    let err = child.stderr.take().map(drain);
    let (status, timed_out) = wait_bounded(&mut child, started, timeout, stop);
    let duration = started.elapsed().as_secs_f64();
    // The streams end when every process holding them is gone; one that
    // left the group (setsid, a double fork) may keep them open: its
    // output is not waited for past a second.
    let deadline = Instant::now() + Duration::from_secs(1);
    let (stdout_bytes, stdout_total) = take(out, deadline);
    let (stderr_bytes, stderr_total) = take(err, deadline);
    let stdout = String::from_utf8_lossy(&stdout_bytes).into_owned();
    let stderr = String::from_utf8_lossy(&stderr_bytes).into_owned();
    let (mut stdout_preview, stdout_cut) = head(&stdout, 20_000);
    let (mut stderr_preview, stderr_cut) = head(&stderr, 5_000);
    if stdout_cut || stdout_total > stdout_bytes.len() {
        stdout_preview.push_str(&format!(
            "\n... (output truncated, {stdout_total} total bytes)"
        ));
    }
    if stderr_cut || stderr_total > stderr_bytes.len() {
        stderr_preview.push_str(&format!(
            "\n... (error output truncated, {stderr_total} total bytes)"
        ));
    }
    let mut parts = vec![
        format!("🖥️  Command executed on {platform}"),
        format!("💻 Command: {command}"),
        format!("📁 Working directory: {wd}"),
    ];
    if !stdout.is_empty() {
        parts.push(format!("\n📤 STDOUT:\n{stdout_preview}"));
    }
    if !stderr.is_empty() {
        parts.push(format!("\n❌ STDERR:\n{stderr_preview}"));
    }
    let shown = format!("{}", timeout.as_secs_f64());
    let (success, error, code) = if timed_out {
        // Stopped by its run's cancel, or by its timeout.
        let why = if stop.is_some_and(|stop| stop()) {
            "Command was stopped (its run was cancelled)".to_string()
        } else {
            format!("Command timed out after {shown}s")
        };
        parts.insert(
            0,
            format!("⏰ {why} and was killed (including all child processes)."),
        );
        (
            false,
            Some(format!(
                "{why} and was killed (including all child processes)"
            )),
            Value::Null,
        )
    } else {
        match status.and_then(|s| s.code()) {
            Some(0) => {
                parts.push("\n✅ Command completed successfully".into());
                (true, None, json!(0))
            }
            Some(c) => {
                parts.push(format!(
                    "\n⚠️  Command completed with non-zero exit code: {c}"
                ));
                (
                    false,
                    Some(format!("Command completed with non-zero exit code: {c}")),
                    json!(c),
                )
            }
            None => (
                false,
                Some("Command was killed by a signal".to_string()),
                Value::Null,
            ),
        }
    };
    json!({
        "success": success, "error": error, "command": command, "platform": platform,
        "working_directory": wd, "duration_s": duration, "return_code": code,
        "stdout": stdout, "stderr": stderr,
        "stdout_preview": stdout_preview, "stderr_preview": stderr_preview,
        "stdout_truncated": stdout_cut || stdout_total > stdout_bytes.len(),
        "stderr_truncated": stderr_cut || stderr_total > stderr_bytes.len(),
        "rendered": parts.join("\n"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn output_exit_code_and_environment() {
        std::env::set_var("STEPWELL_TEST_SECRET_FOR_EXEC", "s3cret");
        let tmp = tempfile::tempdir().unwrap();
        let r = run(
            &args(
                json!({"command": "echo hi; echo oops >&2; pwd; echo ${STEPWELL_TEST_SECRET_FOR_EXEC:-unset}; exit 3",
                         "working_directory": tmp.path().to_str().unwrap()}),
            ),
            Duration::from_secs(10),
            &ExecEnv::default(),
            None,
        );
        assert_eq!(r["success"], false);
        assert_eq!(r["return_code"], 3);
        assert_eq!(r["error"], "Command completed with non-zero exit code: 3");
        let out = r["stdout"].as_str().unwrap();
        assert!(out.starts_with("hi\n"), "{out}");
        assert!(out.contains(tmp.path().file_name().unwrap().to_str().unwrap()));
        assert!(
            out.contains("unset"),
            "the host's environment leaked: {out}"
        );
        assert_eq!(r["stderr"], "oops\n");
    }

    #[test]
    fn a_timeout_kills_the_process_group() {
        let started = Instant::now();
        let r = run(
            &args(json!({"command": "sleep 30 & sleep 30", "timeout": 0.3})),
            Duration::from_secs(10),
            &ExecEnv::default(),
            None,
        );
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(r["success"], false);
        assert!(r["error"]
            .as_str()
            .unwrap()
            .starts_with("Command timed out after 0.3s"));
    }

    #[test]
    fn a_background_job_does_not_outlive_the_command() {
        let started = Instant::now();
        let r = run(
            &args(json!({"command": "sleep 20 & echo started", "timeout": 10})),
            Duration::from_secs(30),
            &ExecEnv::default(),
            None,
        );
        assert!(started.elapsed() < Duration::from_secs(5), "{r}");
        assert_eq!(r["success"], true);
        assert_eq!(r["stdout"], "started\n");
    }

    #[test]
    fn a_process_that_leaves_the_group_does_not_hold_the_call() {
        let started = Instant::now();
        let r = run(
            &args(json!({"command": "setsid sleep 8 & echo started", "timeout": 20})),
            Duration::from_secs(30),
            &ExecEnv::default(),
            None,
        );
        assert!(started.elapsed() < Duration::from_secs(5), "{r}");
        assert_eq!(r["stdout"], "started\n");
    }

    #[test]
    fn destructive_commands_are_blocked_unless_allowed() {
        let r = run(
            &args(json!({"command": "rm -rf /tmp/x"})),
            Duration::from_secs(5),
            &ExecEnv::default(),
            None,
        );
        assert_eq!(r["success"], false);
        assert!(r["error"]
            .as_str()
            .unwrap()
            .starts_with("CRITICAL DESTRUCTIVE PATTERN"));
        assert!(blocked("echo > /etc/passwd").is_some());
        assert!(blocked("ls -la").is_none());
    }

    /// A command whose run is cancelled is killed with its process group,
    /// not waited out.
    #[test]
    fn a_stopped_command_is_killed() {
        let started = Instant::now();
        let stop: stepwell_runtime::wasm::Stop =
            std::sync::Arc::new(move || started.elapsed() > Duration::from_millis(200));
        let r = run(
            &args(json!({"command": "sleep 30; echo finished", "timeout": 60})),
            Duration::from_secs(60),
            &ExecEnv::default(),
            Some(&stop),
        );
        assert!(started.elapsed() < Duration::from_secs(20), "{r}");
        assert_eq!(
            r["error"],
            "Command was stopped (its run was cancelled) and was killed (including all child processes)"
        );
    }
}
