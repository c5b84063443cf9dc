//! The HTTP client every model call shares: asynchronous (hyper, on one I/O
//! thread of its own), so that thousands of calls can wait for their
//! answers at once at the cost of a connection and a small task each, and
//! so that a call whose run is cancelled is dropped (its connection
//! closed) rather than waited out.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::http::{HeaderValue, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tower_service::Service;

/// How an exchange failed.
#[derive(Debug)]
pub(crate) enum HttpError {
    /// No whole answer within the deadline.
    Timeout,
    /// The request could not be built, sent or read.
    Transport(String),
}

type HttpsClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;
type ProxiedClient = Client<HttpsConnector<Via>, Full<Bytes>>;

/// Where a request goes: straight to its host, or through an HTTP proxy
/// (`CONNECT` for an `https` URL, the absolute URL for an `http` one).
#[derive(Clone, Debug)]
pub(crate) enum Route {
    /// To the host itself.
    Direct,
    /// Through the proxy at `uri` (`http://host:port/`), with its
    /// `Proxy-Authorization` if the proxy's URL had credentials.
    Proxy { uri: Uri, auth: Option<HeaderValue> },
}

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

/// A TCP connector (no TLS) with `connect_timeout`.
fn tcp(connect_timeout: Duration) -> HttpConnector {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    http
}

/// A pooled client over `connector`, TLS (webpki roots) for `https` URLs.
fn pooled<C>(connector: C) -> Client<HttpsConnector<C>, Full<Bytes>>
where
    C: Service<Uri> + Clone + Send + Sync + 'static,
    C::Response: hyper::rt::Read + hyper::rt::Write + Connection + Send + Unpin + 'static,
    C::Future: Send + Unpin + 'static,
    C::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(64)
        .build(https)
}

/// The shared client (its connection pool). No redirects: a key is only
/// ever sent to the URL its profile names.
fn client(connect_timeout: Duration) -> &'static HttpsClient {
    static CLIENT: OnceLock<HttpsClient> = OnceLock::new();
    CLIENT.get_or_init(|| pooled(tcp(connect_timeout)))
}

/// The client (and pool) of the proxy at `uri` with `auth`: one per
/// proxy, made on first use. A host names a handful of proxies at most.
fn proxied(uri: &Uri, auth: Option<&HeaderValue>, connect_timeout: Duration) -> ProxiedClient {
    /// A proxy's URL and credentials.
    type Key = (String, Option<Vec<u8>>);
    static CLIENTS: OnceLock<Mutex<HashMap<Key, ProxiedClient>>> = OnceLock::new();
    let key = (uri.to_string(), auth.map(|a| a.as_bytes().to_vec()));
    let mut clients = CLIENTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    clients
        .entry(key)
        .or_insert_with(|| {
            pooled(Via {
                proxy: uri.clone(),
                auth: auth.cloned(),
                tcp: tcp(connect_timeout),
            })
        })
        .clone()
}

/// Connects through an HTTP proxy: a `CONNECT` tunnel to an `https`
/// destination (TLS then runs inside it, to the destination), or a plain
/// connection to the proxy for an `http` one (the request then names its
/// absolute URL).
#[derive(Clone)]
struct Via {
    proxy: Uri,
    auth: Option<HeaderValue>,
    tcp: HttpConnector,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Service<Uri> for Via {
    type Response = ViaStream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<ViaStream, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let via = self.clone();
        Box::pin(async move {
            if dst.scheme_str() == Some("https") {
                let mut tunnel = Tunnel::new(via.proxy.clone(), via.tcp.clone());
                if let Some(auth) = via.auth {
                    tunnel = tunnel.with_auth(auth);
                }
                std::future::poll_fn(|cx| tunnel.poll_ready(cx)).await?;
                let io = tunnel.call(dst).await?;
                Ok(ViaStream { io, proxied: false })
            } else {
                let io = via.tcp.clone().call(via.proxy.clone()).await?;
                Ok(ViaStream { io, proxied: true })
            }
        })
    }
}

/// A connection made by [`Via`]: to the proxy itself (`proxied`: requests
/// name absolute URLs), or a tunnel through it.
struct ViaStream {
    io: TokioIo<tokio::net::TcpStream>,
    proxied: bool,
}

impl Connection for ViaStream {
    fn connected(&self) -> Connected {
        self.io.connected().proxy(self.proxied)
    }
}

impl hyper::rt::Read for ViaStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for ViaStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
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

/// One POST: where, how, and its bounds.
pub(crate) struct Post<'a> {
    pub url: &'a str,
    pub route: &'a Route,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub timeout: Duration,
    pub connect_timeout: Duration,
    pub max_body: u64,
}

/// POSTs `post.body` to `post.url` (by `post.route`) with its headers, and
/// returns the answer's status and body (at most `max_body` bytes), all
/// within `timeout`.
pub(crate) async fn post(post: Post<'_>) -> Result<(u16, Vec<u8>), HttpError> {
    let Post {
        url,
        route,
        headers,
        body,
        timeout,
        connect_timeout,
        max_body,
    } = post;
    let mut request = hyper::Request::post(without_userinfo(url));
    for (k, v) in headers {
        request = request.header(k, v);
    }
    // A plain-HTTP request goes to the proxy itself: it carries the
    // proxy's credentials (a tunnel carries them in its CONNECT).
    if let Route::Proxy {
        auth: Some(auth), ..
    } = route
    {
        if url.starts_with("http://") {
            request = request.header(hyper::header::PROXY_AUTHORIZATION, auth.clone());
        }
    }
    let request = request
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| HttpError::Transport(e.to_string()))?;
    let exchange = async {
        let sent = match route {
            Route::Direct => client(connect_timeout).request(request).await,
            Route::Proxy { uri, auth } => {
                proxied(uri, auth.as_ref(), connect_timeout)
                    .request(request)
                    .await
            }
        };
        let response = sent.map_err(|e| HttpError::Transport(transport_text(&e)))?;
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

/// `url` without the `user:password@` of its authority: a request line in
/// absolute form (to a proxy) would carry it, and nothing is sent for it
/// to the provider either way.
fn without_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => url.to_string(),
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
