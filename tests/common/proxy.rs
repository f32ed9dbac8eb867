//! A TCP proxy between the pool and a database server that a test can cut and restore:
//! the fault hook for "the database is unreachable".

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Forwards connections to `upstream` until cut. While cut, open connections are closed
/// and new ones are closed as soon as they are accepted.
pub struct Proxy {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    /// Bumped on every cut so that open connections close.
    generation: watch::Sender<u64>,
}

impl Proxy {
    /// Listens on a free loopback port; runs on the current tokio runtime.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let cut = Arc::new(AtomicBool::new(false));
        let (generation, _) = watch::channel(0u64);
        let accept_cut = Arc::clone(&cut);
        let accept_generation = generation.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if accept_cut.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let mut cuts = accept_generation.subscribe();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let mut client = client;
                    tokio::select! {
                        _ = copy_bidirectional(&mut client, &mut server) => {}
                        _ = cuts.changed() => {}
                    }
                });
            }
        });
        Proxy {
            addr,
            cut,
            generation,
        }
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every open connection and refuses new ones until [`restore`](Self::restore).
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Lets connections through again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
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
