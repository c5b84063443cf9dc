//! The HTTP client every model call shares: asynchronous (hyper, on one I/O
//! thread of its own), so that thousands of calls can wait for their
//! answers at once at the cost of a connection and a small task each, and
//! so that a call whose run is cancelled is dropped (its connection
//! closed) rather than waited out.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// How an exchange failed.
#[derive(Debug)]
pub(crate) enum HttpError {
    /// No whole answer within the deadline.
    Timeout,
    /// The request could not be built, sent or read.
    Transport(String),
}

type HttpsClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// The I/O thread's runtime: one worker, which only waits on sockets.
fn io() -> &'static tokio::runtime::Runtime {
    static IO: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    IO.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("stepwell-llm-io")
            .enable_all()
            .build()
            .expect("the LLM client's I/O thread starts")
    })
}

/// The shared client (its connection pool). No redirects: a key is only
/// ever sent to the URL its profile names.
fn client(connect_timeout: Duration) -> &'static HttpsClient {
    static CLIENT: OnceLock<HttpsClient> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(connect_timeout));
        http.set_nodelay(true);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(64)
            .build(https)
    })
}

/// Runs `task` on the I/O thread.
pub(crate) fn spawn<F>(task: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    io().spawn(task);
}

/// Runs `future` on the I/O thread and blocks this thread until it is done
/// (any thread, including one of another Tokio runtime's blocking pool).
pub(crate) fn block_on<F>(future: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    io().spawn(async move {
        let _ = tx.send(future.await);
    });
    rx.recv()
        .expect("the LLM client's I/O thread answers every call")
}

/// POSTs `body` to `url` with `headers`, and returns the answer's status
/// and body (at most `max_body` bytes), all within `timeout`.
pub(crate) async fn post(
    url: &str,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    timeout: Duration,
    connect_timeout: Duration,
    max_body: u64,
) -> Result<(u16, Vec<u8>), HttpError> {
    let mut request = hyper::Request::post(url);
    for (k, v) in headers {
        request = request.header(k, v);
    }
    let request = request
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| HttpError::Transport(e.to_string()))?;
    let exchange = async {
        let response = client(connect_timeout)
            .request(request)
            .await
            .map_err(|e| HttpError::Transport(transport_text(&e)))?;
        let status = response.status().as_u16();
        let limit = usize::try_from(max_body).unwrap_or(usize::MAX);
        let bytes = Limited::new(response.into_body(), limit)
            .collect()
            .await
            .map_err(|e| HttpError::Transport(format!("reading the answer: {e}")))?
            .to_bytes();
        Ok((status, bytes.to_vec()))
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(answer) => answer,
        Err(_) => Err(HttpError::Timeout),
    }
}

/// A client error with its causes (hyper's own text is only the outermost).
fn transport_text(e: &hyper_util::client::legacy::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
