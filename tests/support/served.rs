//! `stepwell serve` as the tests start it: a real server process on a
//! loopback port, called over HTTP with ureq.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{repo, scratch_home, stepwell_binary};

/// A `stepwell serve` process on a free loopback port, over a scratch
/// SQLite file, with its URL and token; killed when dropped.
pub struct Served {
    /// The server process.
    pub child: Child,
    /// Its base URL (`http://127.0.0.1:PORT`, no trailing slash).
    pub url: String,
    /// Its bearer token.
    pub token: String,
    /// The scratch folder holding its database and token file.
    pub dir: tempfile::TempDir,
    /// The client it calls itself with.
    pub agent: ureq::Agent,
}

/// The tests' HTTP client. Each request on a connection of its own: a
/// pooled connection the server has just closed (it may, after a response
/// it sent before reading the request's body) fails the next request sent
/// on it with "Peer disconnected" (seen once in CI, under load), which is
/// the client's race, not the server's answer.
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .max_idle_connections(0)
        .build()
        .into()
}

impl Served {
    /// Starts `stepwell serve` on a free port with `args` after `serve`.
    pub fn start(args: &[&str]) -> Served {
        Self::start_in(tempfile::tempdir().unwrap(), args)
    }

    /// Starts `stepwell serve` over a database in `dir`.
    pub fn start_in(dir: tempfile::TempDir, args: &[&str]) -> Served {
        Self::start_with(dir, args, &[])
    }

    /// Starts `stepwell serve` with `args` and these environment variables.
    pub fn start_with(dir: tempfile::TempDir, args: &[&str], env: &[(&str, &str)]) -> Served {
        let mut child = scratch_home(&mut Command::new(stepwell_binary()), dir.path())
            .arg("--db")
            .arg(dir.path().join("db.sqlite"))
            .args(["serve", "--listen", "127.0.0.1:0", "--interval-ms", "50"])
            .args(args)
            .current_dir(repo())
            .env_remove("STEPWELL_DB")
            .env_remove("STEPWELL_STORE")
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().expect("serve prints its URL").unwrap();
        let url = first
            .strip_prefix("stepwell serve: ")
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
            .trim_end_matches('/')
            .to_string();
        let second = lines.next().unwrap().unwrap();
        let token_file = PathBuf::from(second.strip_prefix("token file: ").unwrap());
        if !args.contains(&"--token-file") {
            assert_eq!(token_file, dir.path().join("serve-token"));
        }
        let token = std::fs::read_to_string(&token_file)
            .unwrap()
            .trim()
            .to_string();
        std::thread::spawn(move || for _ in lines {});
        Served {
            child,
            url,
            token,
            dir,
            agent: agent(),
        }
    }

    /// The server's SQLite file.
    pub fn db(&self) -> PathBuf {
        self.dir.path().join("db.sqlite")
    }

    /// Calls `method path` with `body` and `token`: the status and the
    /// answer as JSON (a string when it is not JSON).
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        token: Option<&str>,
    ) -> (u16, Value) {
        let url = format!("{}{path}", self.url);
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut response = match method {
            "GET" => {
                let mut r = self.agent.get(&url);
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.call()
            }
            "PUT" => {
                let mut r = self.agent.put(&url);
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.send(body.unwrap_or(""))
            }
            _ => {
                let mut r = self
                    .agent
                    .post(&url)
                    .header("Content-Type", "application/json");
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.send(body.unwrap_or(""))
            }
        }
        .unwrap();
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap_or_default();
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value)
    }

    /// `GET path` with the token.
    pub fn get(&self, path: &str) -> (u16, Value) {
        self.call("GET", path, None, Some(&self.token.clone()))
    }

    /// `POST path` with `body` and the token.
    pub fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call(
            "POST",
            path,
            Some(&body.to_string()),
            Some(&self.token.clone()),
        )
    }

    /// `GET path`, which must answer 200.
    pub fn ok(&self, path: &str) -> Value {
        let (status, v) = self.get(path);
        assert_eq!(status, 200, "GET {path}: {v}");
        v
    }

    /// SIGTERM, and the exit status.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) takes no pointers. The pid is the server's, our
        // child, not yet reaped (`try_wait` below reaps it), so it names
        // no other process.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the server did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs the `stepwell` CLI on the server's database.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        scratch_home(&mut Command::new(stepwell_binary()), self.dir.path())
            .arg("--db")
            .arg(self.db())
            .args(args)
            .current_dir(repo())
            .env_remove("STEPWELL_DB")
            .env_remove("STEPWELL_STORE")
            .output()
            .unwrap()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
