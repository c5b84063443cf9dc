//! A deliberately hostile node, for the sandbox tests and the `runaway` example.
//! It uses the raw bindings (not the SDK) so it can return malformed output.
//!
//! `config.mode` picks the misbehaviour: `loop` (never returns), `alloc`
//! (allocates without bound), `stack` (unbounded recursion), `trap`
//! (`unreachable`), `panic`, `bad_json` (output that does not parse),
//! `bad_vars` (a vars patch that is not an object), `unknown_next` (routes to a
//! node that does not exist), `sleep` (sleeps an hour), `poll` (waits on a
//! WASI pollable an hour away), `big_output` (returns `config.bytes`, default
//! 64 MiB, of output), `probe` (reports what the sandbox lets it see; with
//! `config.port`, first tries to connect to that port on 127.0.0.1), `ok`
//! (behaves).
//!
//! `leak` keeps `config.bytes` (default 8 MiB) more of memory on every call
//! and follows the node's route: an instance reused for many calls reaches
//! the memory limit, a fresh one never does.
//!
//! Five well-behaved modes serve tests of the host: `count` sets the var
//! `config.key` (default `calls`) to the number of `count` calls the
//! instance served, this one included (which instance served a step), and
//! follows the node's route; `echo_vars` completes
//! with the vars it was given; `random` sets the var `config.key` (default
//! `random`) to 16 bytes from WASI random, in hex, and follows the node's
//! route; `spin` counts to
//! `config.iterations` (a slow but finite step) and follows the node's route;
//! `effect` sets `config.patch` in the vars and asks for `config.effect`
//! (`{kind, payload, result_key}`), following the node's route.
use std::cell::RefCell;
use std::hint::black_box;

use stepwell_guest::bindings::stepwell::flow::types::{NodeError, NodeInput, StepPlan};

struct Hostile;

thread_local! {
    /// What the `leak` mode keeps from call to call.
    static LEAKED: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
    /// How many `count` calls this instance served.
    static CALLS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn plan() -> StepPlan {
    StepPlan {
        vars: None,
        effect: None,
        next_node: None,
        complete_output: None,
    }
}

#[allow(unconditional_recursion)]
fn recurse(buf: [u8; 256]) -> u64 {
    black_box(&buf);
    recurse(black_box(buf)) + 1
}

fn probe(port: Option<u64>) -> String {
    let net = port.map(
        |port| match std::net::TcpStream::connect(("127.0.0.1", port as u16)) {
            Ok(_) => "connected".to_string(),
            Err(e) => format!("error: {e}"),
        },
    );
    let env: Vec<String> = std::env::vars().map(|(k, _)| k).collect();
    let args: Vec<String> = std::env::args().collect();
    let fs = match std::fs::read_dir("/") {
        Ok(rd) => format!("listed {} entries", rd.count()),
        Err(e) => format!("error: {e}"),
    };
    let cwd_file = match std::fs::read("Cargo.toml") {
        Ok(b) => format!("read {} bytes", b.len()),
        Err(e) => format!("error: {e}"),
    };
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(u64::MAX);
    serde_json::json!({
        "env_count": env.len(),
        "args_count": args.len(),
        "fs_root": fs,
        "fs_relative": cwd_file,
        "clock_unix_secs": clock,
        "net": net,
    })
    .to_string()
}

impl stepwell_guest::bindings::Guest for Hostile {
    fn handle(input: NodeInput) -> Result<StepPlan, NodeError> {
        let config: serde_json::Value =
            serde_json::from_str(input.config.as_deref().unwrap_or("null"))
                .unwrap_or(serde_json::Value::Null);
        let mode = config.get("mode").and_then(|m| m.as_str()).unwrap_or("ok");
        match mode {
            "loop" => {
                let mut i: u64 = 0;
                loop {
                    i = black_box(i.wrapping_add(1));
                }
            }
            "alloc" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    black_box(&hoard);
                }
            }
            "stack" => {
                let n = recurse([0u8; 256]);
                Err(NodeError::Failed(format!("returned {n}")))
            }
            "trap" => core::arch::wasm32::unreachable(),
            "panic" => panic!("the hostile node panicked on purpose"),
            "bad_json" => Ok(StepPlan {
                complete_output: Some("{this is not json".into()),
                ..plan()
            }),
            "bad_vars" => Ok(StepPlan {
                vars: Some("[1, 2, 3]".into()),
                next_node: Some("end".into()),
                ..plan()
            }),
            "unknown_next" => Ok(StepPlan {
                next_node: Some("nowhere".into()),
                ..plan()
            }),
            "probe" => Ok(StepPlan {
                complete_output: Some(probe(config.get("port").and_then(|p| p.as_u64()))),
                ..plan()
            }),
            "sleep" => {
                std::thread::sleep(std::time::Duration::from_secs(3600));
                Ok(StepPlan {
                    complete_output: Some("\"slept\"".into()),
                    ..plan()
                })
            }
            "poll" => {
                let hour = wasip2::clocks::monotonic_clock::subscribe_duration(3_600_000_000_000);
                let ready = wasip2::io::poll::poll(&[&hour]);
                Ok(StepPlan {
                    complete_output: Some(format!("{{\"ready\":{}}}", ready.len())),
                    ..plan()
                })
            }
            "big_output" => {
                let bytes = config
                    .get("bytes")
                    .and_then(|b| b.as_u64())
                    .unwrap_or(64 << 20) as usize;
                let mut text = String::with_capacity(bytes + 2);
                text.push('"');
                text.extend(std::iter::repeat_n('x', bytes));
                text.push('"');
                Ok(StepPlan {
                    complete_output: Some(text),
                    ..plan()
                })
            }
            "spin" => {
                let n = config
                    .get("iterations")
                    .and_then(|i| i.as_u64())
                    .unwrap_or(1_000_000);
                let mut x: u64 = 0;
                for i in 0..n {
                    x = black_box(x.wrapping_add(i));
                }
                black_box(x);
                Ok(plan())
            }
            "effect" => {
                let effect = config.get("effect").cloned().unwrap_or_default();
                let text = |v: Option<&serde_json::Value>| v.map(|v| v.to_string());
                Ok(StepPlan {
                    vars: text(config.get("patch")),
                    effect: Some(stepwell_guest::bindings::stepwell::flow::types::Effect {
                        kind: effect["kind"].as_str().unwrap_or("").to_string(),
                        payload: effect
                            .get("payload")
                            .map(|p| p.to_string())
                            .unwrap_or_else(|| "{}".into()),
                        result_key: effect["result_key"].as_str().map(str::to_string),
                    }),
                    ..plan()
                })
            }
            "leak" => {
                let bytes = config
                    .get("bytes")
                    .and_then(|b| b.as_u64())
                    .unwrap_or(8 << 20) as usize;
                LEAKED.with(|l| l.borrow_mut().push(vec![1u8; bytes]));
                Ok(plan())
            }
            "count" => {
                // Which instance served the call: the number of `count`
                // calls it served, this one included, in var `config.key`.
                let n = CALLS.with(|c| {
                    c.set(c.get() + 1);
                    c.get()
                });
                let key = config
                    .get("key")
                    .and_then(|k| k.as_str())
                    .unwrap_or("calls");
                let mut patch = serde_json::Map::new();
                patch.insert(key.to_string(), n.into());
                Ok(StepPlan {
                    vars: Some(serde_json::Value::Object(patch).to_string()),
                    ..plan()
                })
            }
            "random" => {
                let bytes = wasip2::random::random::get_random_bytes(16);
                let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                let key = config
                    .get("key")
                    .and_then(|k| k.as_str())
                    .unwrap_or("random");
                let mut patch = serde_json::Map::new();
                patch.insert(key.to_string(), serde_json::Value::String(hex));
                Ok(StepPlan {
                    vars: Some(serde_json::Value::Object(patch).to_string()),
                    ..plan()
                })
            }
            // `config.patch` as the vars patch, and the node's `next`.
            "patch" => Ok(StepPlan {
                vars: config.get("patch").map(|p| p.to_string()),
                ..plan()
            }),
            "echo_vars" => Ok(StepPlan {
                complete_output: Some(input.vars.clone()),
                ..plan()
            }),
            "ok" => Ok(StepPlan {
                complete_output: Some("{\"ok\":true}".into()),
                ..plan()
            }),
            other => Err(NodeError::InvalidInput(format!("unknown mode {other}"))),
        }
    }
}

stepwell_guest::bindings::__export_node_world!(Hostile with_types_in stepwell_guest::bindings);
