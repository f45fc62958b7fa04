//! The connection layer of `coli serve`: what a slow or hostile client may hold, and for how
//! long (issue 42). Built on hyper's HTTP/1 server (its header-read timer) with axum's router as
//! the service; no timer of our own besides tokio's `timeout_at` on each body frame.
//!
//! - **Connection cap** (`--max-connections`): at most N connections are served at once. A
//!   connection beyond the cap evicts the open connection that has waited longest for a
//!   request head, once one has waited at least [`EVICTABLE_AFTER`] (a slowloris dribbling its
//!   headers, or an idle keep-alive connection: nginx also closes idle keep-alive connections
//!   first when it runs out), and takes its slot, so that slow clients cannot starve new ones;
//!   when no slot frees within [`OVERFLOW_WAIT`] (every connection is busy with a request),
//!   it gets `503` with `Retry-After: 1` and is closed. At most
//!   [`REFUSING`] refusals are written at once; beyond that the server stops accepting until
//!   one ends (new connections wait in the kernel's listen backlog, using no descriptor).
//!   So descriptors stay bounded (cap + [`REFUSING`] + [`LINGERING`] + the listener), and the soft
//!   `RLIMIT_NOFILE` is raised to the hard limit at start ([`raise_open_file_limit`]).
//! - **Header timeout** (`--header-timeout`): hyper's `header_read_timeout`. Its timer starts
//!   whenever hyper waits for a request head: on a new connection and after each response on a
//!   keep-alive connection, so it is also the idle keep-alive timeout. It never runs while a
//!   request is handled or a response streams (a long generation is not idle).
//! - **Body limits** ([`limit_body`]): a `Content-Length` over `--max-body-bytes` is answered
//!   413 before any of the body is read; a body must arrive at `--body-min-rate` bytes/s on
//!   average after `--body-timeout` seconds of slack (each frame is awaited until
//!   `start + body_timeout + received / min_rate`), else 408; a body that ends early (a
//!   truncated chunked body, a dropped connection) is 400. These answers close the connection.
//! - **Send timeout** (`--send-timeout`): a response whose client has taken no bytes for that
//!   long (hyper holds a frame it cannot write: the socket's send buffer is full) is closed;
//!   time the response waits for the model does not count (`Watched` records which).

use super::anthropic;
use super::api::{ApiError, RefusalReason};
use super::metrics::Metrics;
use anyhow::{bail, Context, Result};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use clap::Args;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, Semaphore};

/// A connection beyond the cap may evict one that has waited this long for a request head.
pub const EVICTABLE_AFTER: Duration = Duration::from_millis(100);
/// How long a connection beyond the cap waits for a slot (freed by an eviction or a closing
/// connection) before it is answered 503.
pub const OVERFLOW_WAIT: Duration = Duration::from_millis(500);
/// Closed connections whose input is drained at once before they close (`linger`).
pub const LINGERING: usize = 256;
/// Connections beyond the cap handled at once (waiting for a slot, or being answered 503).
pub const REFUSING: usize = 256;
/// Descriptors kept for everything but connections (store, mirrors, KV files, the listener):
/// `--max-connections` must leave this many below the open-file limit.
pub const OTHER_FILES: u64 = 256;

/// `coli serve`'s connection and request limits (docs/SERVE.md, "Limits").
#[derive(Args, Debug, Clone)]
pub struct LimitArgs {
    /// Connections served at once. Beyond it, a new connection evicts the one that has waited
    /// longest (at least 0.1 s) for a request head and takes its slot; when none frees within
    /// 0.5 s it is answered 503 with Retry-After.
    #[arg(long, value_name = "N", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Seconds a connection may take to send a request head, counted from its opening or from
    /// its previous response (so also the idle keep-alive timeout); then it is closed.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub header_timeout: f64,
    /// Seconds of slack for a request body before --body-min-rate applies; a slower body is
    /// answered 408.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub body_timeout: f64,
    /// Bytes per second a request body must average after --body-timeout.
    #[arg(long, value_name = "BYTES", default_value_t = 1024)]
    pub body_min_rate: u64,
    /// Largest request body in bytes; a larger Content-Length is answered 413 before reading.
    #[arg(long, value_name = "BYTES", default_value_t = 2 << 20)]
    pub max_body_bytes: u64,
    /// Seconds a response may wait for its client to accept more bytes (the socket's send
    /// buffer full, the client not reading) before the connection is closed. A stream that
    /// waits for the model is not waiting for its client.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    pub send_timeout: f64,
    /// Send buffer of each connection's socket (SO_SNDBUF), bytes; 0 keeps the kernel's
    /// (auto-tuned) size.
    #[arg(long, value_name = "BYTES", default_value_t = 0)]
    pub send_buffer_bytes: u32,
}

/// The validated limits.
#[derive(Clone, Debug)]
pub struct Limits {
    /// `--max-connections`.
    pub max_connections: usize,
    /// `--header-timeout`.
    pub header_timeout: Duration,
    /// `--body-timeout`.
    pub body_timeout: Duration,
    /// `--body-min-rate`, bytes per second.
    pub body_min_rate: u64,
    /// `--max-body-bytes`.
    pub max_body_bytes: u64,
    /// `--send-timeout`.
    pub send_timeout: Duration,
    /// `--send-buffer-bytes` (0: the kernel's).
    pub send_buffer_bytes: u32,
}

fn seconds(flag: &str, v: f64) -> Result<Duration> {
    if !(v > 0.0 && v <= 86_400.0) {
        bail!("{flag} {v}: expected seconds in (0, 86400]");
    }
    Ok(Duration::from_secs_f64(v))
}

impl LimitArgs {
    /// Checks the flags.
    ///
    /// # Errors
    /// A timeout that is not a positive number of seconds, a zero rate or body size.
    pub fn limits(&self) -> Result<Limits> {
        if self.body_min_rate == 0 {
            bail!("--body-min-rate 0: expected bytes per second >= 1");
        }
        if self.max_body_bytes == 0 {
            bail!("--max-body-bytes 0: expected a size in bytes >= 1");
        }
        Ok(Limits {
            max_connections: self.max_connections as usize,
            header_timeout: seconds("--header-timeout", self.header_timeout)?,
            body_timeout: seconds("--body-timeout", self.body_timeout)?,
            body_min_rate: self.body_min_rate,
            max_body_bytes: self.max_body_bytes,
            send_timeout: seconds("--send-timeout", self.send_timeout)?,
            send_buffer_bytes: self.send_buffer_bytes,
        })
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and checks that `max_connections`
/// connections, the refusals and [`OTHER_FILES`] fit under it; returns the soft limit.
///
/// # Errors
/// When they do not fit (the message names `--max-connections` and `ulimit -n`).
pub fn raise_open_file_limit(max_connections: usize) -> Result<u64> {
    let soft = rlimit::increase_nofile_limit(u64::MAX)
        .or_else(|_| rlimit::getrlimit(rlimit::Resource::NOFILE).map(|(s, _)| s))
        .context("reading the open-file limit (RLIMIT_NOFILE)")?;
    let need = max_connections as u64 + (REFUSING + LINGERING) as u64 + OTHER_FILES;
    if need > soft {
        bail!(
            "--max-connections {max_connections} needs {need} file descriptors ({} more for refusals and closing connections, {OTHER_FILES} for the store and KV files) but the open-file limit is {soft}: lower --max-connections to at most {} or raise the hard limit (ulimit -Hn)",
            REFUSING + LINGERING,
            soft.saturating_sub((REFUSING + LINGERING) as u64 + OTHER_FILES)
        );
    }
    Ok(soft)
}

/// Pending connections the kernel may queue while the server is not accepting (a burst beyond
/// the cap, see [`REFUSING`]); the kernel caps it at `net.core.somaxconn`. A full queue drops
/// SYNs, and a dropped SYN costs its client a 1 s retransmission.
pub const LISTEN_BACKLOG: u32 = 4096;

/// Binds `host:port` (the first address it resolves to) with a listen backlog of
/// [`LISTEN_BACKLOG`] and `SO_REUSEADDR` (a restarted server rebinds at once).
///
/// # Errors
/// The name does not resolve, or binding or listening fails.
pub async fn bind(host: &str, port: u16) -> std::io::Result<TcpListener> {
    let mut last = None;
    for addr in tokio::net::lookup_host((host, port)).await? {
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        match socket
            .bind(addr)
            .and_then(|()| socket.listen(LISTEN_BACKLOG))
        {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "the host name resolves to no address",
        )
    }))
}

/// One open connection, as the cap sees it.
struct Slot {
    /// Since when it waits for a request head (None while a request is handled).
    waiting_since: Option<Instant>,
    /// Requests being handled (their responses not yet finished).
    busy: usize,
    /// Closes the connection when notified (eviction).
    evict: Arc<Notify>,
}

/// The open connections.
struct Connections {
    slots: Arc<Semaphore>,
    refusing: Arc<Semaphore>,
    lingering: Arc<Semaphore>,
    table: Mutex<HashMap<u64, Slot>>,
    next_id: AtomicU64,
    metrics: Arc<Metrics>,
    /// The refusal and eviction log line, and the counts since it was last written.
    overflow_log: OncePerSecond,
    refused_since_log: AtomicU64,
    evicted_since_log: AtomicU64,
    /// The malformed-request log line, and the count since it was last written.
    malformed_log: OncePerSecond,
    malformed_since_log: AtomicU64,
    start: Instant,
    max: usize,
    /// `--send-timeout`.
    send_timeout: Duration,
    /// `--send-buffer-bytes` (0: the kernel's).
    send_buffer_bytes: u32,
    /// The send-timeout log line, and the count since it was last written.
    stalled_log: OncePerSecond,
    stalled_since_log: AtomicU64,
}

impl Connections {
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Slot>> {
        // A panic while holding this lock leaves plain data; keep serving.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Evicts the connection that has waited longest for a request head, if it has waited at
    /// least [`EVICTABLE_AFTER`]; returns whether one was.
    fn evict_oldest_waiting(&self) -> bool {
        let now = Instant::now();
        let mut table = self.table();
        let oldest = table
            .values_mut()
            .filter(|s| s.busy == 0)
            .filter(|s| {
                s.waiting_since
                    .is_some_and(|t| now.duration_since(t) >= EVICTABLE_AFTER)
            })
            .min_by_key(|s| s.waiting_since);
        match oldest {
            Some(s) => {
                // Not chosen twice: it closes as soon as its task sees the notice.
                s.waiting_since = None;
                s.evict.notify_one();
                true
            }
            None => false,
        }
    }

    fn mark(&self, id: u64, start_request: bool) {
        if let Some(s) = self.table().get_mut(&id) {
            if start_request {
                s.busy += 1;
                s.waiting_since = None;
            } else {
                s.busy = s.busy.saturating_sub(1);
                if s.busy == 0 {
                    s.waiting_since = Some(Instant::now());
                }
            }
        }
    }

    /// Logs a request head hyper refused (400 or 431), at most one line a second with the
    /// count since the last.
    fn log_malformed(&self, e: &hyper::Error) {
        self.malformed_since_log.fetch_add(1, Ordering::Relaxed);
        if self.malformed_log.due(self.start) {
            let n = self.malformed_since_log.swap(0, Ordering::Relaxed);
            let status = if e.is_parse_too_large() { 431 } else { 400 };
            eprintln!(
                "coli serve: {n} malformed request(s) refused by the HTTP layer -> {status}: {e}"
            );
        }
    }

    /// Logs connections closed by the send timeout, at most one line a second.
    fn log_stalled(&self) {
        self.stalled_since_log.fetch_add(1, Ordering::Relaxed);
        if self.stalled_log.due(self.start) {
            let n = self.stalled_since_log.swap(0, Ordering::Relaxed);
            eprintln!(
                "coli serve: {n} connection(s) closed: the client took no bytes of its response for {:.0} s (--send-timeout)",
                self.send_timeout.as_secs_f64()
            );
        }
    }

    /// Logs refusals and evictions, at most once a second.
    fn log_overflow(&self, refused: bool) {
        if refused {
            self.refused_since_log.fetch_add(1, Ordering::Relaxed);
        } else {
            self.evicted_since_log.fetch_add(1, Ordering::Relaxed);
        }
        if self.overflow_log.due(self.start) {
            let r = self.refused_since_log.swap(0, Ordering::Relaxed);
            let e = self.evicted_since_log.swap(0, Ordering::Relaxed);
            eprintln!(
                "coli serve: --max-connections {} reached: {e} connection(s) waiting for a request head closed to make room, {r} refused with 503",
                self.max
            );
        }
    }
}

/// A log line that is written at most once a second (what happens more often is counted and
/// summed into the next line).
#[derive(Default)]
struct OncePerSecond {
    /// The second (since the server started, plus one) of the last line.
    last: AtomicU64,
}

impl OncePerSecond {
    /// Whether a line may be written now; at most one caller a second gets `true`.
    fn due(&self, start: Instant) -> bool {
        let sec = start.elapsed().as_secs() + 1;
        let last = self.last.load(Ordering::Relaxed);
        sec > last
            && self
                .last
                .compare_exchange(last, sec, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

/// Whether a connection's response is waiting for its client: the time (ms since the server
/// started) at which the body last handed hyper a frame that hyper has not yet asked to follow,
/// or [`Progress::IDLE`] while hyper waits on the body (the model) or no response is written.
struct Progress(AtomicU64);

impl Progress {
    const IDLE: u64 = u64::MAX;

    /// Since when the client has not taken the response's next bytes, if it has not.
    fn stalled_since(&self) -> Option<u64> {
        Some(self.0.load(Ordering::Relaxed)).filter(|&t| t != Progress::IDLE)
    }
}

/// A response body that records in [`Progress`] whether hyper is waiting on it.
struct Watched {
    inner: Body,
    progress: Arc<Progress>,
    start: Instant,
    _busy: Busy,
}

impl hyper::body::Body for Watched {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        let now = self.start.elapsed().as_millis() as u64;
        let state = match &r {
            // hyper waits for the model, or the response is complete.
            std::task::Poll::Pending | std::task::Poll::Ready(None) => Progress::IDLE,
            // A frame for hyper to write: until hyper asks again, the socket is the limit.
            std::task::Poll::Ready(Some(_)) => now,
        };
        self.progress.0.store(state, Ordering::Relaxed);
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.progress.0.store(Progress::IDLE, Ordering::Relaxed);
    }
}

/// Ends a request's busy mark when its response is dropped (fully sent, or the connection gone).
struct Busy {
    conns: Arc<Connections>,
    id: u64,
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.conns.mark(self.id, false);
    }
}

/// Serves `router` on `listener` under `limits` until `signal` completes; then stops accepting,
/// lets every connection finish its current response (hyper's graceful shutdown; generations
/// end within the caller's grace period) and returns once all are closed or `drain` has passed.
///
/// # Errors
/// Never for a connection's failure (those close the connection); only for the listener.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    metrics: Arc<Metrics>,
    signal: impl Future<Output = ()>,
    drain: Duration,
) -> Result<()> {
    let conns = Arc::new(Connections {
        slots: Arc::new(Semaphore::new(limits.max_connections)),
        refusing: Arc::new(Semaphore::new(REFUSING)),
        lingering: Arc::new(Semaphore::new(LINGERING)),
        table: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(0),
        metrics,
        overflow_log: OncePerSecond::default(),
        refused_since_log: AtomicU64::new(0),
        evicted_since_log: AtomicU64::new(0),
        malformed_log: OncePerSecond::default(),
        malformed_since_log: AtomicU64::new(0),
        start: Instant::now(),
        max: limits.max_connections,
        send_timeout: limits.send_timeout,
        send_buffer_bytes: limits.send_buffer_bytes,
        stalled_log: OncePerSecond::default(),
        stalled_since_log: AtomicU64::new(0),
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    tokio::pin!(signal);
    let mut accept_errors_logged = Instant::now() - Duration::from_secs(2);
    loop {
        let (stream, _peer) = tokio::select! {
            () = &mut signal => break,
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    // Out of descriptors or buffers: back off instead of spinning; the
                    // connections already open keep being served and free theirs.
                    if accept_errors_logged.elapsed() >= Duration::from_secs(1) {
                        eprintln!("coli serve: accepting a connection failed: {e} (retrying)");
                        accept_errors_logged = Instant::now();
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        if let Ok(permit) = conns.slots.clone().try_acquire_owned() {
            spawn_connection(&conns, &http, &router, stream, permit, stop_rx.clone());
            continue;
        }
        // Beyond the cap: make room by evicting a connection that waits for its head, else
        // refuse. Both hold a refusal permit; while all are taken the loop stops accepting,
        // and new connections wait in the kernel's backlog (no descriptor used).
        let refusal = tokio::select! {
            () = &mut signal => break,
            p = conns.refusing.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let (conns2, http2, router2, stop2) =
            (conns.clone(), http.clone(), router.clone(), stop_rx.clone());
        tokio::spawn(async move {
            // For up to OVERFLOW_WAIT: close the longest-waiting request head (when one has
            // waited EVICTABLE_AFTER) and take the slot it frees, or a slot freed otherwise.
            let deadline = tokio::time::Instant::now() + OVERFLOW_WAIT;
            loop {
                if conns2.evict_oldest_waiting() {
                    conns2.metrics.connections_evicted.inc();
                    conns2.log_overflow(false);
                }
                let step = tokio::time::timeout(
                    Duration::from_millis(25),
                    conns2.slots.clone().acquire_owned(),
                )
                .await;
                if let Ok(Ok(permit)) = step {
                    drop(refusal);
                    spawn_connection(&conns2, &http2, &router2, stream, permit, stop2);
                    return;
                }
                if tokio::time::Instant::now() >= deadline {
                    break;
                }
            }
            conns2.metrics.connections_refused.inc();
            conns2.log_overflow(true);
            refuse(stream, conns2.max).await;
            drop(refusal);
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection holds a slot until it closes.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(drain, conns.slots.acquire_many(all))
        .await
        .is_err()
    {
        eprintln!(
            "coli serve: {} connection(s) still open after {:.1} s; closing them",
            conns.table().len(),
            drain.as_secs_f64()
        );
    }
    Ok(())
}

/// Serves one connection in its own task, holding `permit` until it closes.
fn spawn_connection(
    conns: &Arc<Connections>,
    http: &hyper::server::conn::http1::Builder,
    router: &Router,
    stream: TcpStream,
    permit: tokio::sync::OwnedSemaphorePermit,
    mut stop: watch::Receiver<bool>,
) {
    let id = conns.next_id.fetch_add(1, Ordering::Relaxed);
    let evict = Arc::new(Notify::new());
    conns.table().insert(
        id,
        Slot {
            waiting_since: Some(Instant::now()),
            busy: 0,
            evict: evict.clone(),
        },
    );
    conns.metrics.connections_open.inc();
    let _ = stream.set_nodelay(true);
    if conns.send_buffer_bytes > 0 {
        let _ =
            socket2::SockRef::from(&stream).set_send_buffer_size(conns.send_buffer_bytes as usize);
    }
    let send_timeout = conns.send_timeout;
    let conns = conns.clone();
    let router = router.clone();
    let http = http.clone();
    tokio::spawn(async move {
        let svc_conns = conns.clone();
        let progress = Arc::new(Progress(AtomicU64::new(Progress::IDLE)));
        let svc_progress = progress.clone();
        let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            svc_conns.mark(id, true);
            let busy = Busy {
                conns: svc_conns.clone(),
                id,
            };
            let router = router.clone();
            let progress = svc_progress.clone();
            let start = svc_conns.start;
            // Boxed: the connection is polled without being pinned (poll_without_shutdown).
            Box::pin(async move {
                let resp = tower::ServiceExt::oneshot(router, req).await;
                // The busy mark ends when the response body is dropped: fully streamed, or
                // the connection gone.
                Ok::<_, std::convert::Infallible>(match resp {
                    Ok(r) => r.map(|inner| Watched {
                        inner,
                        progress,
                        start,
                        _busy: busy,
                    }),
                    Err(never) => match never {},
                })
            })
        });
        let mut conn = http.serve_connection(TokioIo::new(stream), svc);
        let mut stopping = *stop.borrow();
        if stopping {
            std::pin::Pin::new(&mut conn).graceful_shutdown();
        }
        let mut done = false;
        loop {
            tokio::select! {
                r = std::future::poll_fn(|cx| conn.poll_without_shutdown(cx)) => {
                    match r {
                        Ok(()) => done = true,
                        Err(e) if e.is_timeout() => {
                            conns.metrics.header_timeouts.inc();
                        }
                        // hyper answered a request head it could not parse (400, or 431 for
                        // headers over its limit) before any route saw it: log it here.
                        Err(e) if e.is_parse() || e.is_parse_too_large() => {
                            conns.log_malformed(&e);
                        }
                        Err(_) => {}
                    }
                    break;
                }
                () = evict.notified() => break,
                // The send timeout: checked when it would expire, at the latest every
                // send_timeout while nothing is pending.
                () = tokio::time::sleep_until(send_deadline(&progress, conns.start, send_timeout)) => {
                    if let Some(since) = progress.stalled_since() {
                        let now = conns.start.elapsed().as_millis() as u64;
                        if now.saturating_sub(since) >= send_timeout.as_millis() as u64 {
                            conns.metrics.send_timeouts.inc();
                            conns.log_stalled();
                            break;
                        }
                    }
                }
                changed = stop.changed(), if !stopping => {
                    if changed.is_err() || *stop.borrow() {
                        stopping = true;
                        std::pin::Pin::new(&mut conn).graceful_shutdown();
                    }
                }
            }
        }
        // The connection is done being served: its slot is free (and it cannot be evicted)
        // before any lingering.
        conns.table().remove(&id);
        conns.metrics.connections_open.dec();
        drop(permit);
        if done && !*stop.borrow() {
            // The last response is written; the client may still be sending a body the
            // server refused (413 before reading): read and drop it for a while before
            // closing, so that closing does not reset the connection before the client has
            // read the answer (nginx's lingering close). At most LINGERING at once (each
            // holds a descriptor outside the cap); beyond that, close at once.
            if let Ok(_lingering) = conns.lingering.clone().try_acquire_owned() {
                let io = conn.into_parts().io.into_inner();
                linger(io).await;
            }
        }
    });
}

/// How long, and how many bytes, a closing connection's unread input is drained ([`linger`]).
const LINGER: Duration = Duration::from_secs(5);
const LINGER_BYTES: usize = 64 << 20;

/// Shuts the write side of `stream` and drains what the client still sends (at most [`LINGER`]
/// and [`LINGER_BYTES`]) before it is closed.
async fn linger(mut stream: TcpStream) {
    if stream.shutdown().await.is_err() {
        return;
    }
    let drain = async {
        let mut sink = vec![0u8; 16 << 10];
        let mut total = 0usize;
        while let Ok(n) = stream.read(&mut sink).await {
            total += n;
            if n == 0 || total > LINGER_BYTES {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// When the send timeout of a connection expires: `timeout` after its response stalled on the
/// client, or `timeout` from now when it has not (then it is checked again).
fn send_deadline(progress: &Progress, start: Instant, timeout: Duration) -> tokio::time::Instant {
    let at = match progress.stalled_since() {
        Some(ms) => start + Duration::from_millis(ms) + timeout,
        None => Instant::now() + timeout,
    };
    tokio::time::Instant::from_std(at)
}

/// Answers a connection beyond the cap with 503 and closes it: the response is written without
/// reading the request, the write side shut, and what the client sent drained briefly so that
/// closing does not reset the connection before it reads the answer.
async fn refuse(mut stream: TcpStream, max: usize) {
    let e = ApiError::too_many_connections(max);
    let body = e.body().to_string();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: {}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        e.retry_after.unwrap_or(1),
        body.len()
    );
    let write = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await
    };
    if let Ok(Ok(())) = tokio::time::timeout(Duration::from_secs(1), write).await {
        let mut sink = [0u8; 4096];
        let drain = async {
            let mut total = 0usize;
            while let Ok(n) = stream.read(&mut sink).await {
                total += n;
                if n == 0 || total > 64 << 10 {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_millis(100), drain).await;
    }
}

/// A refusal in the shape of the endpoint at `path` (Anthropic's for `/v1/messages`), closing
/// the connection (its request body is not read to the end).
fn refusal(path: &str, e: ApiError) -> Response {
    let mut r = if path == "/v1/messages" {
        let mut r = anthropic::error_response(&e);
        r.extensions_mut().insert(RefusalReason(e.message.clone()));
        r
    } else {
        e.into_response()
    };
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// The request-body limits (a middleware of every route; see the module doc): 413 for a
/// `Content-Length` or a body over `max_body_bytes`, 408 for a body slower than the minimum
/// rate, 400 for a body that ends early. The body reaches the handler whole.
pub async fn limit_body(State(l): State<Arc<Limits>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(n) = declared {
        if n > l.max_body_bytes {
            return refusal(
                &path,
                ApiError::body_rejected(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &format!(
                        "Content-Length {n} is over the limit of {} bytes (--max-body-bytes)",
                        l.max_body_bytes
                    ),
                ),
            );
        }
    }
    let (parts, mut body) = req.into_parts();
    if axum::body::HttpBody::is_end_stream(&body) || declared == Some(0) {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let start = tokio::time::Instant::now();
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let allowed =
            l.body_timeout + Duration::from_secs_f64(buf.len() as f64 / l.body_min_rate as f64);
        match tokio::time::timeout_at(start + allowed, body.frame()).await {
            Err(_) => {
                return refusal(
                    &path,
                    ApiError::request_timeout(&format!(
                        "the request body arrived too slowly: {} bytes in {:.1} s (at least {} bytes/s after {:.0} s are needed: --body-min-rate, --body-timeout)",
                        buf.len(),
                        start.elapsed().as_secs_f64(),
                        l.body_min_rate,
                        l.body_timeout.as_secs_f64()
                    )),
                )
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                return refusal(
                    &path,
                    ApiError::body_rejected(
                        StatusCode::BAD_REQUEST,
                        &format!("it ended early or was malformed after {} bytes: {e}", buf.len()),
                    ),
                )
            }
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    if (buf.len() + data.len()) as u64 > l.max_body_bytes {
                        return refusal(
                            &path,
                            ApiError::body_rejected(
                                StatusCode::PAYLOAD_TOO_LARGE,
                                &format!(
                                    "the body is over the limit of {} bytes (--max-body-bytes)",
                                    l.max_body_bytes
                                ),
                            ),
                        );
                    }
                    buf.extend_from_slice(&data);
                }
            }
        }
    }
    next.run(Request::from_parts(parts, Body::from(buf))).await
}
