//! A TCP proxy the test controls, in the manner of toxiproxy: put it between
//! a client and a server, then `cut` the link (open connections are dropped
//! and new ones refused) and `restore` it, without touching the server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug)]
pub struct Proxy {
    address: SocketAddr,
    open: Arc<AtomicBool>,
    refused: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
    generation: watch::Sender<u64>,
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
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                accept_count.fetch_add(1, Ordering::SeqCst);
                if !accept_open.load(Ordering::SeqCst) {
                    accept_refused.fetch_add(1, Ordering::SeqCst);
                    drop(client); // refused while cut
                    continue;
                }
                let mut cut = accept_generation.subscribe();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let mut client = client;
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.changed() => {} // dropping both ends cuts the link
                    }
                });
            }
        });
        Self {
            address,
            open,
            refused,
            accepted,
            generation,
        }
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

    pub fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}
