//! A real HTTP proxy on loopback, for the tests of the LLM client's proxy
//! support: it forwards absolute-form requests (`POST http://host:port/...`)
//! and opens `CONNECT` tunnels (or refuses them, when told to), and keeps
//! the request line and `Proxy-Authorization` of everything it got.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// What the proxy got on one connection.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The request line (`CONNECT host:443 HTTP/1.1`, `POST http://...`).
    pub line: String,
    /// Its `Proxy-Authorization` header, if it had one.
    pub auth: Option<String>,
}

/// The proxy: listening until the test process ends.
pub struct Proxy {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Proxy {
    /// Starts a proxy; with `refuse_tunnels`, every `CONNECT` is answered
    /// `403 Forbidden`.
    pub fn start(refuse_tunnels: bool) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let log = log.clone();
                std::thread::spawn(move || serve(conn, &log, refuse_tunnels));
            }
        });
        Proxy { url, seen }
    }

    /// What it got so far, one entry per connection.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// One client connection: its head read, then forwarded or tunnelled.
fn serve(client: TcpStream, log: &Mutex<Vec<Seen>>, refuse_tunnels: bool) {
    let mut reader = BufReader::new(client.try_clone().expect("clone the socket"));
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let end = line == "\r\n";
        head.push(line);
        if end {
            break;
        }
    }
    let request_line = head[0].trim_end().to_string();
    let auth = head
        .iter()
        .find(|h| h.to_ascii_lowercase().starts_with("proxy-authorization:"))
        .map(|h| h.split_once(':').unwrap().1.trim().to_string());
    log.lock().unwrap().push(Seen {
        line: request_line.clone(),
        auth,
    });
    let mut parts = request_line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let mut client = client;
    if method == "CONNECT" {
        if refuse_tunnels {
            let _ = client.write_all(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n");
            return;
        }
        let Ok(upstream) = TcpStream::connect(target) else {
            let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n");
            return;
        };
        let _ = client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
        splice(reader, client, upstream, Vec::new());
        return;
    }
    // Absolute form: to the host it names, in origin form, without the
    // proxy's own header.
    let Some(rest) = target.strip_prefix("http://") else {
        let _ = client.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
        return;
    };
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let Ok(upstream) = TcpStream::connect(host) else {
        let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n");
        return;
    };
    let mut first = format!("{method} /{path} HTTP/1.1\r\n").into_bytes();
    for h in &head[1..] {
        if !h.to_ascii_lowercase().starts_with("proxy-authorization:") {
            first.extend_from_slice(h.as_bytes());
        }
    }
    splice(reader, client, upstream, first);
}

/// Copies both ways until either side closes: `first` goes upstream
/// before what the client sends next (`reader` may hold some of it).
fn splice(
    mut reader: BufReader<TcpStream>,
    mut client: TcpStream,
    upstream: TcpStream,
    first: Vec<u8>,
) {
    let mut up = upstream.try_clone().expect("clone the socket");
    let mut down = upstream;
    let to_upstream = std::thread::spawn(move || {
        let _ = up.write_all(&first);
        let mut buf = [0u8; 16384];
        loop {
            match reader.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if up.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = up.shutdown(std::net::Shutdown::Write);
    });
    let _ = std::io::copy(&mut down, &mut client);
    let _ = client.shutdown(std::net::Shutdown::Both);
    let _ = to_upstream.join();
}
