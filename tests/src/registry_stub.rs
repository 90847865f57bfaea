//! A Schema Registry stand-in that answers from a script: the first requests
//! get the scripted answers (a 500, a 429, a 404 without a registry error
//! code…), every later one the last answer. Connections close after each
//! answer, so every request is seen.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

/// One scripted answer: status code and JSON body.
pub type Answer = (u16, String);

#[derive(Debug)]
pub struct RegistryStub {
    address: SocketAddr,
    requests: Arc<AtomicUsize>,
}

impl RegistryStub {
    /// Serves `script` in order, then its last answer forever.
    ///
    /// # Panics
    /// The script is empty or the listener cannot be bound.
    pub async fn start(script: Vec<Answer>) -> Self {
        assert!(!script.is_empty(), "a stub needs at least one answer");
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the stub");
        let address = listener.local_addr().expect("stub address");
        let requests = Arc::new(AtomicUsize::new(0));
        let seen = requests.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let n = seen.fetch_add(1, Ordering::SeqCst);
                let (status, body) = script[n.min(script.len() - 1)].clone();
                tokio::spawn(async move {
                    // Read the request head; the stub answers by position only.
                    let mut head = vec![0u8; 8192];
                    let _ = stream.read(&mut head).await;
                    let response = format!(
                        "HTTP/1.1 {status} Stub\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(response.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        Self { address, requests }
    }

    /// `http://127.0.0.1:<port>`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// How many requests it has answered.
    #[must_use]
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// The registry's answer carrying `schema` (the `.avsc` text).
#[must_use]
pub fn schema_answer(schema: &str) -> Answer {
    (200, serde_json::json!({ "schema": schema }).to_string())
}

/// A registry's definite "not found" for a schema id.
#[must_use]
pub fn not_found_answer() -> Answer {
    (
        404,
        r#"{"error_code": 40403, "message": "Schema not found"}"#.to_owned(),
    )
}
