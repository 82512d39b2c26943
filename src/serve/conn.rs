//! The server's connections, bounded before any token is checked (issue 27, class 6).
//!
//! - **A connection limit**: each accepted connection holds one permit of a semaphore of
//!   [`ConnLimits::max_connections`]. At the limit, the accept loop closes one connection that
//!   has not yet made an authenticated call (a stranger), then waits for its permit; when every
//!   connection is authenticated, it waits (new connections queue in the kernel's backlog). File
//!   descriptors stay bounded, and idle strangers cannot keep analysts out.
//! - **Strangers counted by their source** (round 52, review "isolation" F1): each connection's
//!   peer address is recorded at accept, as a [`Source`] at three levels (an IPv4 /24, address
//!   and address; an IPv6 /32, /48 and /64: review "fixes2a" F3, "fixes3" F4). At the limit,
//!   the stranger closed is the oldest of the host holding the most strangers, in the block
//!   holding the most, in the net holding the most (where they hold as many, the oldest
//!   stranger among them), never simply the oldest one. A client that churned connections from one address
//!   (thousands a second) cycled through every stranger, so that any client needing longer than
//!   that cycle to send its first authenticated call (one network round trip, a TLS handshake)
//!   was closed before it could; now such a flood closes only its own strangers, and a client
//!   from another source is closed only once it holds as many strangers as the flood. No source
//!   is capped below the limit: clients of one address (every local one, or every one behind a
//!   NAT) opening many connections at once keep the whole limit (a cap of an eighth, then of
//!   half, churned them: the load test of 24 clients connecting at once beside idle strangers,
//!   all on loopback, lost its good clients). Behind a reverse proxy every client comes from the
//!   proxy's address, one source, and one client's flood closes the others' new connections as
//!   before: the proxy must limit each client itself. A flood from many addresses, holding more
//!   strangers each than a client does, is not bounded here (SECURITY.md, "What is not
//!   protected").
//! - **A handshake timeout**: a connection that has made no authenticated call within
//!   [`ConnLimits::handshake_timeout`] of being accepted is closed (TLS and HTTP/2 handshakes
//!   included: they read through this connection).
//! - **An idle timeout**: a connection with no authenticated call for
//!   [`ConnLimits::idle_timeout`] is closed (clients reconnect at their next call).
//! - **A share per analyst**: an analyst's authenticated connections are at most
//!   [`ConnLimits::per_analyst`] (the limit divided by the catalog's analysts); an analyst's call
//!   on one more is refused and that connection stays a stranger's, closed at its handshake
//!   timeout or first when room is needed (never one of theirs already in use: a statement
//!   running on it would fail after its charge). So the analysts together hold at most the
//!   limit, each their share, and one analyst cannot keep another out (review r45).
//! - **No spinning**: an accept error (`EMFILE`, `ENFILE`, `ENOBUFS`, …) is retried after a
//!   back-off that doubles from 5 ms to 1 s, never at once.
//!
//! Calls find their connection's [`Conn`] in the request's extensions ([`conn_in`]) and mark it
//! authenticated ([`Conn::authenticated`]): the router does, from a call's headers, before any
//! byte of its body is read (`serve::ByMethod`, round 46), so a connection is authenticated, and
//! an analyst's, from their first call's headers.
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tonic::transport::server::Connected;

/// The bounds of connections.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub max_connections: usize,
    /// An analyst's connections at most (at least 1).
    pub per_analyst: usize,
    pub handshake_timeout: Duration,
    pub idle_timeout: Duration,
}

/// Where a connection comes from, as its strangers are counted (round 52), at three levels,
/// each within the one before: its `net` (an IPv4 /24, an IPv6 /32), its `block` (an IPv4
/// address, an IPv6 /48) and its `host` (an IPv4 address, an IPv6 /64). A host commonly holds a
/// whole /64, one client can hold a /56 or a /48 (a common home or tunnel allocation) and take a
/// new /64 of it for each connection (review "fixes2a" F3), and a hosting customer a /32 of
/// /48s (review "fixes3" F4). An IPv4-mapped IPv6 address (a server listening on `[::]`) is its
/// IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Source {
    net: IpAddr,
    block: IpAddr,
    host: IpAddr,
}

impl Source {
    pub fn of(ip: IpAddr) -> Self {
        let v6 = |v6: Ipv6Addr, bits: u32| {
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & (u128::MAX << (128 - bits))))
        };
        match ip.to_canonical() {
            IpAddr::V6(a) => Self {
                net: v6(a, 32),
                block: v6(a, 48),
                host: v6(a, 64),
            },
            IpAddr::V4(a) => Self {
                net: IpAddr::V4(Ipv4Addr::from(u32::from(a) & 0xffff_ff00)),
                block: IpAddr::V4(a),
                host: IpAddr::V4(a),
            },
        }
    }
}

/// One connection's state, shared by its I/O and the calls it carries.
#[derive(Debug)]
pub struct Conn {
    accepted: Instant,
    /// Milliseconds after `accepted` of the last authenticated call (0: none yet).
    last_call_ms: AtomicU64,
    authenticated: AtomicBool,
    closed: AtomicBool,
    waker: Mutex<Option<Waker>>,
    /// The analyst whose call came first on this connection (set once, under the peers' lock).
    analyst: std::sync::OnceLock<String>,
    /// Every open connection (the accept loop's list), and an analyst's share of them.
    peers: Weak<Mutex<VecDeque<Weak<Conn>>>>,
    per_analyst: usize,
    /// Where it comes from (round 52): a source's strangers are counted together.
    source: Source,
}

impl Conn {
    fn new(peers: Weak<Mutex<VecDeque<Weak<Conn>>>>, per_analyst: usize, source: Source) -> Self {
        Self {
            accepted: Instant::now(),
            last_call_ms: AtomicU64::new(0),
            authenticated: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            waker: Mutex::new(None),
            analyst: std::sync::OnceLock::new(),
            peers,
            per_analyst,
            source,
        }
    }

    /// Records an authenticated call of `analyst` on this connection; false when it is a
    /// connection of another analyst's, or when it would give the analyst more than their share
    /// of connections: the call is then refused, and the connection stays a stranger's.
    pub fn authenticated(&self, analyst: &str) -> bool {
        if self.analyst.get().is_none() {
            // One lock only, the peers' (a connection's analyst is set under it): two first
            // calls at once are counted one after the other.
            let peers = self.peers.upgrade();
            let open = peers.as_ref().map(|p| p.lock().expect("lock"));
            if self.analyst.get().is_none() {
                let theirs = open.as_ref().map_or(0, |open| {
                    open.iter()
                        .filter_map(Weak::upgrade)
                        .filter(|c| {
                            !std::ptr::eq(c.as_ref(), self)
                                && !c.closed.load(Ordering::Acquire)
                                && c.analyst.get().map(String::as_str) == Some(analyst)
                        })
                        .count()
                });
                if theirs >= self.per_analyst {
                    // Refused, and left a stranger's: closed at its handshake timeout, or first
                    // when the limit needs room (closing it now would cut the refusal's answer).
                    return false;
                }
                let _ = self.analyst.set(analyst.to_string());
            }
        }
        if self.analyst.get().map(String::as_str) != Some(analyst) {
            return false;
        }
        let ms = self.accepted.elapsed().as_millis() as u64;
        self.last_call_ms.fetch_max(ms, Ordering::Relaxed);
        self.authenticated.store(true, Ordering::Release);
        true
    }

    /// Whether the connection carries another analyst's calls than `analyst`'s (its first
    /// authenticated call was theirs): why [`Conn::authenticated`] refused `analyst`'s call,
    /// when it was not for one connection more than their share (round 49, review wire F4).
    pub fn carries_another(&self, analyst: &str) -> bool {
        self.analyst.get().is_some_and(|a| a != analyst)
    }

    fn is_authenticated(&self) -> bool {
        self.authenticated.load(Ordering::Acquire)
    }

    /// Open and not yet authenticated.
    fn is_stranger(&self) -> bool {
        !self.is_authenticated() && !self.closed.load(Ordering::Acquire)
    }

    /// Closes the connection: its next read fails, and the server drops it.
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        if let Some(w) = self.waker.lock().expect("lock").take() {
            w.wake();
        }
    }

    /// When the connection times out, as it stands.
    fn deadline(&self, limits: &ConnLimits) -> Instant {
        if self.is_authenticated() {
            let last = Duration::from_millis(self.last_call_ms.load(Ordering::Relaxed));
            self.accepted + last + limits.idle_timeout
        } else {
            self.accepted + limits.handshake_timeout
        }
    }
}

/// What a call knows of its connection (the request extension tonic fills from
/// [`Connected::connect_info`]).
#[derive(Debug, Clone)]
pub struct ConnInfo(pub Arc<Conn>);

/// The connection a request came on, if it came through [`incoming`].
pub fn conn_of<T>(request: &tonic::Request<T>) -> Option<&Arc<Conn>> {
    conn_in(request.extensions())
}

/// [`conn_of`], from a request's extensions (tonic fills them before the service sees the
/// request, so the router that reads only the headers finds it too: `serve::ByMethod`).
pub fn conn_in(ext: &tonic::codegen::http::Extensions) -> Option<&Arc<Conn>> {
    ext.get::<ConnInfo>()
        .or_else(|| {
            ext.get::<tonic::transport::server::TlsConnectInfo<ConnInfo>>()
                .map(|t| t.get_ref())
        })
        .map(|c| &c.0)
}

/// An accepted connection: the socket, its permit and its timeouts.
pub struct LimitedIo {
    tcp: TcpStream,
    conn: Arc<Conn>,
    limits: ConnLimits,
    timer: Pin<Box<Sleep>>,
    _permit: OwnedSemaphorePermit,
}

impl LimitedIo {
    /// `Err` when the connection is closed or has timed out; else arms the timer.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if self.conn.closed.load(Ordering::Acquire) {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed to make room for another connection",
            ));
        }
        *self.conn.waker.lock().expect("lock") = Some(cx.waker().clone());
        let deadline = self.conn.deadline(&self.limits);
        if Instant::now() >= deadline {
            self.conn.closed.store(true, Ordering::Release);
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "connection timed out",
            ));
        }
        let deadline = tokio::time::Instant::from_std(deadline);
        if self.timer.deadline() != deadline {
            self.timer.as_mut().reset(deadline);
        }
        // Registers the wake-up at the deadline (then the next poll re-checks).
        let _ = self.timer.as_mut().poll(cx);
        Ok(())
    }
}

impl Connected for LimitedIo {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        ConnInfo(Arc::clone(&self.conn))
    }
}

impl AsyncRead for LimitedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Err(e) = this.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for LimitedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }
}

/// The accept loop's state.
struct Acceptor {
    listener: TcpListener,
    limits: ConnLimits,
    permits: Arc<Semaphore>,
    open: Arc<Open>,
    backoff: Duration,
}

const MIN_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The open connections, oldest first (dead ones are pruned as they are met).
type Open = Mutex<VecDeque<Weak<Conn>>>;

/// At the limit: closes the oldest stranger of the source holding the most strangers (of two
/// that hold as many, the one whose oldest stranger is older), never simply the oldest
/// stranger (round 52, review "isolation" F1: a flood from one address closed everyone
/// else's new connections); whether there was one.
fn close_a_stranger(open: &Open) -> bool {
    let mut open = open.lock().expect("lock");
    open.retain(|w| w.strong_count() > 0);
    let strangers: Vec<Arc<Conn>> = open
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|c| c.is_stranger())
        .collect();
    // The strangers of the `level` holding the most of `among` (oldest first, as `among` is).
    let most = |among: Vec<Arc<Conn>>, level: fn(&Source) -> IpAddr| {
        let mut held: HashMap<IpAddr, usize> = HashMap::new();
        for c in &among {
            *held.entry(level(&c.source)).or_default() += 1;
        }
        let top = held.values().copied().max();
        among
            .into_iter()
            .filter(|c| Some(held[&level(&c.source)]) == top)
            .collect::<Vec<_>>()
    };
    // The net holding the most, then its block, then its host holding the most (a client of
    // many /64s of one /48 is one block), then that host's oldest stranger.
    let candidates = most(most(most(strangers, |s| s.net), |s| s.block), |s| s.host);
    match candidates.first() {
        Some(c) => {
            c.close();
            true
        }
        None => false,
    }
}

impl Acceptor {
    async fn next(&mut self) -> LimitedIo {
        loop {
            let (tcp, peer) = match self.listener.accept().await {
                Ok(accepted) => {
                    self.backoff = MIN_BACKOFF;
                    accepted
                }
                Err(_) => {
                    // Out of descriptors or buffers, or a connection reset before it was
                    // accepted: wait, never spin.
                    tokio::time::sleep(self.backoff).await;
                    self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            };
            let source = Source::of(peer.ip());
            let permit = match Arc::clone(&self.permits).try_acquire_owned() {
                Ok(p) => p,
                Err(_) => {
                    // Its permit comes back as its connection is dropped.
                    close_a_stranger(&self.open);
                    match tokio::time::timeout(
                        self.limits.handshake_timeout,
                        Arc::clone(&self.permits).acquire_owned(),
                    )
                    .await
                    {
                        Ok(Ok(p)) => p,
                        // Nothing freed in time (every connection busy with authenticated
                        // calls): this one is closed.
                        _ => continue,
                    }
                }
            };
            let _ = tcp.set_nodelay(true);
            let conn = Arc::new(Conn::new(
                Arc::downgrade(&self.open),
                self.limits.per_analyst,
                source,
            ));
            {
                let mut open = self.open.lock().expect("lock");
                open.retain(|w| w.strong_count() > 0);
                open.push_back(Arc::downgrade(&conn));
            }
            let deadline = tokio::time::Instant::from_std(conn.deadline(&self.limits));
            return LimitedIo {
                tcp,
                conn,
                limits: self.limits,
                timer: Box::pin(tokio::time::sleep_until(deadline)),
                _permit: permit,
            };
        }
    }
}

/// The server's connections from `listener`, within `limits`.
pub fn incoming(
    listener: TcpListener,
    limits: ConnLimits,
) -> impl Stream<Item = Result<LimitedIo, io::Error>> + Send + 'static {
    let acceptor = Acceptor {
        listener,
        permits: Arc::new(Semaphore::new(limits.max_connections.max(1))),
        limits,
        open: Arc::new(Mutex::new(VecDeque::new())),
        backoff: MIN_BACKOFF,
    };
    futures::stream::unfold(acceptor, |mut a| async move {
        let io = a.next().await;
        Some((Ok::<_, io::Error>(io), a))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(ip: &str) -> Source {
        Source::of(ip.parse().unwrap())
    }

    fn local() -> Source {
        source("127.0.0.1")
    }

    /// Connections accepted in this order from these addresses, in one list.
    fn accepted(open: &Arc<Open>, from: &[&str]) -> Vec<Arc<Conn>> {
        from.iter()
            .map(|ip| {
                let c = Arc::new(Conn::new(Arc::downgrade(open), 64, source(ip)));
                open.lock().unwrap().push_back(Arc::downgrade(&c));
                c
            })
            .collect()
    }

    fn closed(conns: &[Arc<Conn>]) -> Vec<usize> {
        (0..conns.len())
            .filter(|&i| conns[i].closed.load(Ordering::Acquire))
            .collect()
    }

    /// Round 52 (review "isolation" F1): an IPv6 client is counted by its /64, an IPv4-mapped
    /// address as its IPv4 one, and two IPv4 addresses (two of loopback's too) apart.
    #[test]
    fn sources_are_ipv4_addresses_and_ipv6_slash_64s() {
        assert_eq!(
            source("2001:db8:1:2::1").block,
            source("2001:db8:1:ff00::1").block,
            "one /48"
        );
        assert_eq!(
            source("2001:db8:1::1").net,
            source("2001:db8:ff::1").net,
            "one /32"
        );
        assert_eq!(
            source("192.0.2.7").net,
            source("192.0.2.200").net,
            "one /24"
        );
        assert_ne!(source("192.0.2.7").block, source("192.0.2.200").block);
        assert_eq!(source("2001:db8:1:2::1"), source("2001:db8:1:2:ffff:1:2:3"));
        assert_ne!(source("2001:db8:1:2::1"), source("2001:db8:1:3::1"));
        assert_eq!(source("::ffff:192.0.2.7"), source("192.0.2.7"));
        assert_ne!(source("192.0.2.7"), source("192.0.2.8"));
        assert_ne!(source("127.0.0.1"), source("127.0.0.2"));
    }

    /// Round 52 (review "isolation" F1): at the limit the stranger closed is the oldest of the
    /// address holding the most strangers, never the globally oldest (another address's client
    /// still in its handshake), nor an authenticated connection.
    #[test]
    fn a_flood_from_one_address_closes_only_its_own_strangers() {
        let open: Arc<Open> = Arc::new(Mutex::new(VecDeque::new()));
        let conns = accepted(
            &open,
            &[
                "192.0.2.1",    // 0: a client mid-handshake, the oldest stranger
                "198.51.100.9", // 1: the flood's
                "2001:db8::5",  // 2: an authenticated analyst's
                "198.51.100.9", // 3
                "2001:db8::6",  // 4: another client of the same /64 as 2
                "198.51.100.9", // 5
            ],
        );
        assert!(conns[2].authenticated("alice"));
        // At the limit: the flood's oldest, not client 0 (older) nor 2.
        assert!(close_a_stranger(&open));
        assert_eq!(closed(&conns), [1]);
        // The flood now holds 2, the /64 one stranger (4; 2 is authenticated), 192.0.2.1 one.
        assert!(close_a_stranger(&open));
        assert_eq!(closed(&conns), [1, 3]);
        // One each: the oldest source's oldest stranger.
        assert!(close_a_stranger(&open));
        assert_eq!(closed(&conns), [0, 1, 3]);

        // Review "fixes2a" F3: a flood from many /64s of one /48, one stranger each, is one
        // block: its oldest is closed, not the client of another block mid-handshake.
        let open: Arc<Open> = Arc::new(Mutex::new(VecDeque::new()));
        let mut from = vec!["2001:db8:9::1".to_string()];
        from.extend((0..40).map(|i| format!("2001:db8:1:{i:x}::1")));
        let from: Vec<&str> = from.iter().map(String::as_str).collect();
        let conns = accepted(&open, &from);
        for k in 1..=10 {
            assert!(close_a_stranger(&open));
            assert_eq!(closed(&conns), (1..=k).collect::<Vec<_>>());
        }

        // Review "fixes3" F4: one stranger in each of many /48s of one /32 is one net.
        let open: Arc<Open> = Arc::new(Mutex::new(VecDeque::new()));
        let mut from = vec!["2001:db9::1".to_string()];
        from.extend((0..40).map(|i| format!("2001:db8:{i:x}::1")));
        let from: Vec<&str> = from.iter().map(String::as_str).collect();
        let conns = accepted(&open, &from);
        assert!(close_a_stranger(&open));
        assert_eq!(closed(&conns), [1]);

        // Only authenticated connections left: nothing to close.
        let open: Arc<Open> = Arc::new(Mutex::new(VecDeque::new()));
        let conns = accepted(&open, &["192.0.2.1"]);
        assert!(conns[0].authenticated("bob"));
        assert!(!close_a_stranger(&open));
    }

    /// Review r45: each analyst holds at most their share of the connections, counted under one
    /// lock (the first version locked each connection's analyst while holding the list's, and
    /// two first calls at once deadlocked the threads serving every call); a connection is one
    /// analyst's.
    #[test]
    fn first_calls_at_once_keep_each_analyst_within_their_share() {
        let open: Arc<Open> = Arc::new(Mutex::new(VecDeque::new()));
        let conns: Vec<Arc<Conn>> = (0..64)
            .map(|_| {
                let c = Arc::new(Conn::new(Arc::downgrade(&open), 5, local()));
                open.lock().unwrap().push_back(Arc::downgrade(&c));
                c
            })
            .collect();
        let threads: Vec<_> = conns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let c = Arc::clone(c);
                std::thread::spawn(move || {
                    c.authenticated(if i % 2 == 0 { "alice" } else { "bob" })
                })
            })
            .collect();
        let admitted: Vec<bool> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        for (who, parity) in [("alice", 0), ("bob", 1)] {
            let n = admitted
                .iter()
                .enumerate()
                .filter(|(i, a)| i % 2 == parity && **a)
                .count();
            assert_eq!(n, 5, "{who}");
        }
        // A connection of alice's carries no call of bob's.
        let alices = conns
            .iter()
            .zip(&admitted)
            .find(|(c, a)| **a && c.analyst.get().map(String::as_str) == Some("alice"))
            .unwrap()
            .0;
        assert!(alices.authenticated("alice"));
        assert!(!alices.authenticated("bob"));
        // Round 49 (review wire F4): why bob's call was refused.
        assert!(alices.carries_another("bob") && !alices.carries_another("alice"));
    }
}
