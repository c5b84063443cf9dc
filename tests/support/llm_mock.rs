//! A small OpenAI-compatible chat-completions server on loopback, scripted
//! per test: it answers `POST /v1/chat/completions` from a queue of
//! [`Reply`]s and keeps every request it got, so a test can count them
//! ("never twice" is the server's own count) and read what was sent.

use std::collections::VecDeque;
use std::io::{BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

/// What the server answers to the next request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// 200 with this JSON body.
    Json(Value),
    /// This status, with this JSON body.
    Status(u16, Value),
    /// Waits, then answers the inner reply.
    Delay(Duration, Box<Reply>),
    /// Closes the connection without an answer.
    Close,
    /// 307 to this URL.
    Redirect(String),
    /// Never answers: holds the connection until the client drops it,
    /// which [`LlmMock::dropped`] counts.
    Hang,
}

impl Reply {
    /// A chat completion whose message has `content`, finishing `stop`.
    pub fn text(content: &str) -> Reply {
        Reply::Json(completion(
            json!({"role": "assistant", "content": content}),
            "stop",
        ))
    }

    /// A chat completion asking for one tool call (`id`, `name`, `args`),
    /// finishing `tool_calls`.
    pub fn tool_call(id: &str, name: &str, args: Value) -> Reply {
        Reply::Json(completion(
            json!({"role": "assistant", "content": null, "tool_calls": [{
                "id": id, "type": "function",
                "function": {"name": name, "arguments": args.to_string()}}]}),
            "tool_calls",
        ))
    }
}

/// A chat-completion body with one choice.
pub fn completion(message: Value, finish_reason: &str) -> Value {
    json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1764489600, "model": "mock-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29}
    })
}

/// One request the server got.
#[derive(Debug, Clone)]
pub struct Request {
    /// `POST /v1/chat/completions`.
    pub line: String,
    /// Header names (lower case) and values.
    pub headers: Vec<(String, String)>,
    /// The body, as JSON (`Null` when it was not JSON).
    pub body: Value,
}

impl Request {
    /// The value of header `name` (lower case), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The server. It stops with the test process.
#[derive(Clone)]
pub struct LlmMock {
    /// `http://127.0.0.1:<port>/v1`.
    pub base_url: String,
    script: Arc<Mutex<VecDeque<Reply>>>,
    seen: Arc<Mutex<Vec<Request>>>,
    always: Option<Reply>,
    dropped: Arc<std::sync::atomic::AtomicUsize>,
}

impl LlmMock {
    /// Starts a server that answers with `script`, in order (a request past
    /// its end gets a 500).
    pub fn start(script: Vec<Reply>) -> LlmMock {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mock = LlmMock {
            base_url: format!("http://127.0.0.1:{port}/v1"),
            script: Arc::new(Mutex::new(script.into())),
            seen: Arc::new(Mutex::new(Vec::new())),
            always: None,
            dropped: Arc::default(),
        };
        mock.listen(listener)
    }

    /// Starts a server that answers every request with `reply`.
    pub fn always(reply: Reply) -> LlmMock {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mock = LlmMock {
            base_url: format!("http://127.0.0.1:{port}/v1"),
            script: Arc::new(Mutex::new(VecDeque::new())),
            seen: Arc::new(Mutex::new(Vec::new())),
            always: Some(reply),
            dropped: Arc::default(),
        };
        mock.listen(listener)
    }

    fn listen(self, listener: TcpListener) -> LlmMock {
        let mock = self;
        let server = mock.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let server = server.clone();
                std::thread::spawn(move || server.serve(stream));
            }
        });
        mock
    }

    /// Adds replies to the end of the script.
    pub fn push(&self, reply: Reply) {
        self.script.lock().unwrap().push_back(reply);
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Request> {
        self.seen.lock().unwrap().clone()
    }

    /// How many requests it got.
    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// How many requests answered [`Reply::Hang`] the client dropped (it
    /// closed the connection).
    pub fn dropped(&self) -> usize {
        self.dropped.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn serve(&self, stream: TcpStream) {
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let Some((line, headers, body)) = crate::read_http_request(&mut reader) else {
            return;
        };
        self.seen.lock().unwrap().push(Request {
            line,
            headers,
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        });
        let scripted = self.script.lock().unwrap().pop_front();
        let reply = scripted
            .or_else(|| self.always.clone())
            .unwrap_or(Reply::Status(
                500,
                json!({"error": {"message": "the mock has no reply scripted for this request"}}),
            ));
        if let Reply::Hang = reply {
            // Until the client closes: a read of 0 bytes (or an error).
            let mut buf = [0u8; 64];
            while matches!(reader.read(&mut buf), Ok(n) if n > 0) {}
            self.dropped
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            return;
        }
        answer(stream, reply);
    }
}

fn answer(mut stream: TcpStream, reply: Reply) {
    let (status, body) = match reply {
        Reply::Json(v) => (200, v),
        Reply::Status(s, v) => (s, v),
        Reply::Delay(d, then) => {
            std::thread::sleep(d);
            return answer(stream, *then);
        }
        Reply::Close | Reply::Hang => return,
        Reply::Redirect(to) => {
            let head = format!(
                "HTTP/1.1 307 X\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            let _ = stream.write_all(head.as_bytes());
            return;
        }
    };
    let body = serde_json::to_vec(&body).unwrap();
    let head = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(&body);
    let _ = stream.flush();
}
