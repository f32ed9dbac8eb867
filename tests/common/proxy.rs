//! A TCP proxy between the pool and a database server that a test can break on purpose:
//! the fault hook for "the database is slow, silent or unreachable".
//!
//! Faults, each reversible:
//! - [`cut`](Proxy::cut): every open connection is closed and new ones are closed as
//!   soon as they are accepted, until [`restore`](Proxy::restore) (a network outage the
//!   client notices at once);
//! - [`set_delay`](Proxy::set_delay): every chunk is forwarded that much later, in both
//!   directions (latency, order kept);
//! - [`set_drop`](Proxy::set_drop): every byte is read and thrown away, connections stay
//!   open (a black hole: the client only notices by timing out);
//! - [`hold`](Proxy::hold): bytes in one direction are kept in the proxy until released
//!   or cut, so a test can cut a connection while a statement, or its answer, is in flight.
//!
//! [`retarget`](Proxy::retarget) points it at another server, as a virtual IP or a DNS
//! name moves to a new primary on failover.
//!
//! Not every test binary uses every fault.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep_until};

/// Which way bytes travel through the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client to server: statements.
    Up,
    /// Server to client: answers.
    Down,
}

/// The faults in force; every forwarding task watches them.
#[derive(Debug, Clone, Copy, Default)]
struct Faults {
    delay: Duration,
    drop: bool,
    hold_up: bool,
    hold_down: bool,
}

impl Faults {
    fn holds(&self, direction: Direction) -> bool {
        match direction {
            Direction::Up => self.hold_up,
            Direction::Down => self.hold_down,
        }
    }
}

/// Forwards connections to `upstream` until told otherwise.
pub struct Proxy {
    addr: SocketAddr,
    /// Where new connections go.
    upstream: Arc<Mutex<SocketAddr>>,
    cut: Arc<AtomicBool>,
    /// Bumped on every cut so that open connections close.
    generation: watch::Sender<u64>,
    faults: watch::Sender<Faults>,
    /// Chunks read but not yet written (held, delayed or waiting for the peer).
    in_flight: Arc<AtomicUsize>,
}

impl Proxy {
    /// Listens on a free loopback port; runs on the current tokio runtime.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let cut = Arc::new(AtomicBool::new(false));
        let (generation, _) = watch::channel(0u64);
        let (faults, _) = watch::channel(Faults::default());
        let in_flight = Arc::new(AtomicUsize::new(0));
        let upstream = Arc::new(Mutex::new(upstream));
        let accept_upstream = Arc::clone(&upstream);
        let accept_cut = Arc::clone(&cut);
        let accept_generation = generation.clone();
        let accept_faults = faults.clone();
        let accept_in_flight = Arc::clone(&in_flight);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if accept_cut.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let mut cuts = accept_generation.subscribe();
                let faults = accept_faults.clone();
                let in_flight = Arc::clone(&accept_in_flight);
                let upstream = *accept_upstream.lock().unwrap_or_else(|e| e.into_inner());
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    let up = pump(
                        client_read,
                        server_write,
                        Direction::Up,
                        &faults,
                        &in_flight,
                    );
                    let down = pump(
                        server_read,
                        client_write,
                        Direction::Down,
                        &faults,
                        &in_flight,
                    );
                    // Dropping the halves closes both sockets: that is the cut.
                    tokio::select! {
                        _ = async { tokio::join!(up, down) } => {}
                        _ = cuts.changed() => {}
                    }
                });
            }
        });
        Proxy {
            addr,
            upstream,
            cut,
            generation,
            faults,
            in_flight,
        }
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every open connection and refuses new ones until [`restore`](Self::restore).
    /// Bytes held or delayed in the proxy are lost with their connection.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Sends new connections to `upstream` from now on and closes the open ones (a moved
    /// virtual IP breaks the flows to the old address). A cut stays in force.
    pub fn retarget(&self, upstream: SocketAddr) {
        *self.upstream.lock().unwrap_or_else(|e| e.into_inner()) = upstream;
        self.generation.send_modify(|g| *g += 1);
    }

    /// Lets connections through again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    /// Forwards every chunk `delay` after it arrived (zero: no delay).
    pub fn set_delay(&self, delay: Duration) {
        self.faults.send_modify(|f| f.delay = delay);
    }

    /// Throws every byte away (`true`) or forwards again (`false`). Bytes dropped are
    /// gone: a connection that lost some is useless afterwards, so cut it to clean up.
    pub fn set_drop(&self, on: bool) {
        self.faults.send_modify(|f| f.drop = on);
    }

    /// Keeps bytes going `direction` in the proxy (`true`) or lets them go on (`false`).
    pub fn hold(&self, direction: Direction, on: bool) {
        self.faults.send_modify(|f| match direction {
            Direction::Up => f.hold_up = on,
            Direction::Down => f.hold_down = on,
        });
    }

    /// Chunks read from one side and not yet written to the other.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Ends every fault: no cut, no delay, no drop, nothing held.
    pub fn heal(&self) {
        self.faults.send_replace(Faults::default());
        self.restore();
    }
}

/// Bytes on their way through the proxy; counted in [`Proxy::in_flight`] until written or
/// dropped with their connection.
struct Chunk {
    due: Instant,
    bytes: Vec<u8>,
    in_flight: Arc<AtomicUsize>,
}

impl Drop for Chunk {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Copies one direction of a connection, applying the faults in force.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    direction: Direction,
    faults: &watch::Sender<Faults>,
    in_flight: &Arc<AtomicUsize>,
) {
    // The reader never waits for the writer, so a held or delayed direction keeps
    // accepting bytes (as the kernel would) and order is kept by the queue.
    let (queue, mut queued) = mpsc::unbounded_channel::<Chunk>();
    let read = async {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            let now = *faults.borrow();
            if now.drop {
                continue;
            }
            in_flight.fetch_add(1, Ordering::SeqCst);
            let chunk = Chunk {
                due: Instant::now() + now.delay,
                bytes: buf[..n].to_vec(),
                in_flight: Arc::clone(in_flight),
            };
            if queue.send(chunk).is_err() {
                break;
            }
        }
        drop(queue);
    };
    let write = async {
        let mut watcher = faults.subscribe();
        while let Some(chunk) = queued.recv().await {
            sleep_until(chunk.due).await;
            if watcher.wait_for(|f| !f.holds(direction)).await.is_err() {
                break;
            }
            // Bytes that were held when the black hole opened are thrown away too.
            let dropped = faults.borrow().drop;
            if !dropped && to.write_all(&chunk.bytes).await.is_err() {
                break;
            }
        }
        to.shutdown().await.ok();
    };
    tokio::join!(read, write);
}

/// `scheme://user@host:port/db` with host and port replaced by the proxy's.
pub fn via_proxy(url: &str, proxy: SocketAddr) -> String {
    let mut parsed = url::Url::parse(url).expect("database URL");
    parsed.set_ip_host(proxy.ip()).expect("ip host");
    parsed.set_port(Some(proxy.port())).expect("port");
    parsed.to_string()
}

/// The server address of a database URL.
pub fn upstream_of(url: &str) -> SocketAddr {
    let parsed = url::Url::parse(url).expect("database URL");
    let host = parsed.host_str().expect("host");
    let port = parsed
        .port_or_known_default()
        .unwrap_or(match parsed.scheme() {
            "postgres" | "postgresql" => 5432,
            _ => 3306,
        });
    std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .expect("resolve")
        .next()
        .expect("an address")
}
