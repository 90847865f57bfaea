//! A TCP proxy the test controls, in the manner of toxiproxy: put it between
//! a client and a server, then `cut` the link (open connections are dropped
//! and new ones refused) and `restore` it, without touching the server; or
//! `hold` the connections open now (what their clients send waits in the
//! proxy, as on a slow network, while new connections flow) and `release`
//! them; or `repoint` it at another server, as a failover moves a service
//! address to the standby.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug)]
pub struct Proxy {
    address: SocketAddr,
    /// Where new connections go.
    upstream: Arc<Mutex<SocketAddr>>,
    open: Arc<AtomicBool>,
    refused: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
    generation: watch::Sender<u64>,
    /// Connections numbered below this are held (0: none).
    held_below: watch::Sender<u64>,
    /// Bytes that waited in the proxy because their connection was held.
    held_bytes: Arc<AtomicU64>,
}

impl Proxy {
    /// Listens on 127.0.0.1 (port 0) and forwards to `upstream`.
    ///
    /// # Panics
    /// The listener cannot be bound.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the proxy");
        let address = listener.local_addr().expect("proxy address");
        let open = Arc::new(AtomicBool::new(true));
        let refused = Arc::new(AtomicU64::new(0));
        let (generation, _) = watch::channel(0u64);
        let (accept_open, accept_generation) = (open.clone(), generation.clone());
        let accept_refused = refused.clone();
        let accepted = Arc::new(AtomicU64::new(0));
        let accept_count = accepted.clone();
        let (held_below, _) = watch::channel(0u64);
        let accept_held = held_below.clone();
        let held_bytes = Arc::new(AtomicU64::new(0));
        let accept_held_bytes = held_bytes.clone();
        let upstream = Arc::new(Mutex::new(upstream));
        let accept_upstream = upstream.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let number = accept_count.fetch_add(1, Ordering::SeqCst) + 1;
                if !accept_open.load(Ordering::SeqCst) {
                    accept_refused.fetch_add(1, Ordering::SeqCst);
                    drop(client); // refused while cut
                    continue;
                }
                let mut cut = accept_generation.subscribe();
                let held = accept_held.subscribe();
                let waited = accept_held_bytes.clone();
                let upstream = *accept_upstream.lock().unwrap();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::select! {
                        () = forward(client_read, server_write, number, held.clone(), waited.clone()) => {}
                        () = forward(server_read, client_write, number, held, waited) => {}
                        _ = cut.changed() => {} // dropping both ends cuts the link
                    }
                });
            }
        });
        Self {
            address,
            upstream,
            open,
            refused,
            accepted,
            generation,
            held_below,
            held_bytes,
        }
    }

    /// Bytes so far that waited because their connection was held.
    #[must_use]
    pub fn held_bytes(&self) -> u64 {
        self.held_bytes.load(Ordering::SeqCst)
    }

    /// Holds every connection open now, both ways: bytes read from either
    /// end wait in the proxy until `release`. Connections opened later flow.
    pub fn hold(&self) {
        let open_now = self.accepted.load(Ordering::SeqCst) + 1;
        self.held_below.send_replace(open_now);
    }

    /// Lets held connections flow again, what they held first.
    pub fn release(&self) {
        self.held_below.send_replace(0);
    }

    #[must_use]
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Drops every open connection and refuses new ones until `restore`.
    pub fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Connections refused while the link was cut: someone is trying.
    #[must_use]
    pub fn refused_connections(&self) -> u64 {
        self.refused.load(Ordering::SeqCst)
    }

    /// Connections accepted so far (refused ones included).
    #[must_use]
    pub fn connections(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Sends connections opened from now on to `upstream`; open ones stay
    /// where they are (`cut` first to move every client).
    pub fn repoint(&self, upstream: SocketAddr) {
        *self.upstream.lock().unwrap() = upstream;
    }

    pub fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

/// Copies `from` to `to`, each chunk waiting while connection `number` is held.
async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    number: u64,
    mut held: watch::Receiver<u64>,
    waited: Arc<AtomicU64>,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let read = match from.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        if number < *held.borrow_and_update() {
            waited.fetch_add(read as u64, Ordering::SeqCst);
        }
        while number < *held.borrow_and_update() {
            if held.changed().await.is_err() {
                return;
            }
        }
        if to.write_all(&chunk[..read]).await.is_err() {
            return;
        }
    }
}
