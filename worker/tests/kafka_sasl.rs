//! What a Kafka client made from the settings (`BrokerConfig`, its
//! `KafkaSecurity`) says to a broker when it authenticates, read off the
//! wire for each mechanism: the mechanism it asks for in SaslHandshake and
//! its first SaslAuthenticate message (the user, or the token).
//!
//! The broker is a listener made here that speaks just enough of the Kafka
//! protocol: it answers ApiVersions (advertising SaslHandshake v1 and
//! SaslAuthenticate), answers the handshake with the mechanism asked for,
//! and stops at the first SaslAuthenticate. OAUTHBEARER takes its token from
//! an OpenID Connect token endpoint made here too, as configured in
//! production (`sasl.oauthbearer.method=oidc`). No broker runs.

use std::time::Duration;

use axum::http::HeaderMap;
use axum::routing::post;
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use flotilla_runtime::BrokerConfig;
use flotilla_runtime::kafka::security::{SaslMechanism, SecurityProtocol};
use rdkafka::consumer::BaseConsumer;
use secrecy::SecretString;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

const SASL_HANDSHAKE: i16 = 17;
const API_VERSIONS: i16 = 18;
const SASL_AUTHENTICATE: i16 = 36;
const USER: &str = "flotilla";
const PASSWORD: &str = "s3cret-sasl";
const OIDC_CLIENT: &str = "flotilla-client";
const OIDC_SECRET: &str = "s3cret-oidc";

/// One request as the listener reads it: its header, and its body unread.
struct Request {
    api_key: i16,
    api_version: i16,
    correlation_id: i32,
    body: Vec<u8>,
}

/// Reads big-endian fields off a request frame.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        assert!(self.0.len() >= n, "a request shorter than its fields");
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }

    fn i16(&mut self) -> i16 {
        i16::from_be_bytes(self.take(2).try_into().unwrap())
    }

    fn i32(&mut self) -> i32 {
        i32::from_be_bytes(self.take(4).try_into().unwrap())
    }

    /// A STRING (i16 length); `None` for a null one.
    fn string(&mut self) -> Option<String> {
        let length = usize::try_from(self.i16()).ok()?;
        Some(String::from_utf8(self.take(length).to_vec()).unwrap())
    }

    /// BYTES (i32 length).
    fn bytes(&mut self) -> Vec<u8> {
        let length = usize::try_from(self.i32()).unwrap();
        self.take(length).to_vec()
    }
}

/// The next request: a 4-byte size, then api key, version, correlation id
/// and the client id; `None` when the client closed the connection.
async fn read_request(stream: &mut TcpStream) -> Option<Request> {
    let size = stream.read_i32().await.ok()?;
    let mut frame = vec![0; usize::try_from(size).unwrap()];
    stream.read_exact(&mut frame).await.ok()?;
    let mut reader = Reader(&frame);
    let (api_key, api_version, correlation_id) = (reader.i16(), reader.i16(), reader.i32());
    let _client_id = reader.string();
    // The requests read for their body (SaslHandshake v0-1, SaslAuthenticate
    // v0-1) have no tagged fields in their header.
    let body = reader.0.to_vec();
    Some(Request {
        api_key,
        api_version,
        correlation_id,
        body,
    })
}

async fn respond(stream: &mut TcpStream, correlation_id: i32, body: &[u8]) {
    let size = i32::try_from(4 + body.len()).unwrap();
    let mut frame = Vec::with_capacity(8 + body.len());
    frame.extend(size.to_be_bytes());
    frame.extend(correlation_id.to_be_bytes());
    frame.extend(body);
    stream.write_all(&frame).await.unwrap();
}

/// The ApiVersions answer in the version asked for (v3 and later are
/// "flexible": compact arrays and tagged fields).
fn api_versions(version: i16) -> Vec<u8> {
    let apis = [
        (SASL_HANDSHAKE, 0, 1),
        (API_VERSIONS, 0, 3),
        (SASL_AUTHENTICATE, 0, 1),
    ];
    let flexible = version >= 3;
    let mut body = 0i16.to_be_bytes().to_vec();
    if flexible {
        body.push(u8::try_from(apis.len() + 1).unwrap());
    } else {
        body.extend(i32::try_from(apis.len()).unwrap().to_be_bytes());
    }
    for (key, min, max) in apis {
        for field in [key, min, max] {
            body.extend(i16::to_be_bytes(field));
        }
        if flexible {
            body.push(0);
        }
    }
    if version >= 1 {
        body.extend(0i32.to_be_bytes());
    }
    if flexible {
        body.push(0);
    }
    body
}

/// What the client said when it authenticated.
#[derive(Debug)]
struct Seen {
    mechanism: String,
    first_message: Vec<u8>,
}

/// Serves connections on `listener` until one reaches SaslAuthenticate.
async fn fake_broker(listener: TcpListener) -> Seen {
    loop {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut mechanism = None;
        while let Some(request) = read_request(&mut stream).await {
            let mut body = Reader(&request.body);
            match request.api_key {
                API_VERSIONS => {
                    let answer = api_versions(request.api_version);
                    respond(&mut stream, request.correlation_id, &answer).await;
                }
                SASL_HANDSHAKE => {
                    let asked = body.string().expect("a mechanism");
                    // error_code 0, then the enabled mechanisms: this one.
                    let mut answer = 0i16.to_be_bytes().to_vec();
                    answer.extend(1i32.to_be_bytes());
                    answer.extend(i16::try_from(asked.len()).unwrap().to_be_bytes());
                    answer.extend(asked.as_bytes());
                    respond(&mut stream, request.correlation_id, &answer).await;
                    mechanism = Some(asked);
                }
                SASL_AUTHENTICATE => {
                    return Seen {
                        mechanism: mechanism.expect("SaslAuthenticate before SaslHandshake"),
                        first_message: body.bytes(),
                    };
                }
                other => panic!("an unexpected request before authenticating: api key {other}"),
            }
        }
    }
}

/// A token endpoint that answers the client-credentials grant of
/// `OIDC_CLIENT` with `token`; refuses anything else.
async fn token_endpoint(token: String) -> String {
    let expected = format!(
        "Basic {}",
        STANDARD.encode(format!("{OIDC_CLIENT}:{OIDC_SECRET}"))
    );
    let app = axum::Router::new().route(
        "/token",
        post(move |headers: HeaderMap, body: String| async move {
            let authorised = headers
                .get("authorization")
                .is_some_and(|v| v == expected.as_str());
            if !authorised || !body.contains("grant_type=client_credentials") {
                return Err(axum::http::StatusCode::UNAUTHORIZED);
            }
            Ok(axum::Json(serde_json::json!({
                "access_token": token,
                "token_type": "bearer",
                "expires_in": 3600,
            })))
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/token", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// An unsigned JWT with the claims librdkafka reads (`sub`, `exp`).
fn unsigned_jwt() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let part = |json: serde_json::Value| URL_SAFE_NO_PAD.encode(json.to_string());
    format!(
        "{}.{}.signature",
        part(serde_json::json!({"alg": "none", "typ": "JWT"})),
        part(serde_json::json!({"sub": USER, "iat": now, "exp": now + 3600})),
    )
}

/// Connects a client made from `broker`'s settings to the fake broker and
/// returns what it said.
async fn authenticate(mut broker: BrokerConfig, listener: TcpListener) -> Seen {
    broker.bootstrap_servers = listener.local_addr().unwrap().to_string();
    broker.validate().unwrap();
    let consumer: BaseConsumer = broker.client().create().unwrap();
    // A metadata request makes it connect; it never gets an answer. The
    // thread is left behind: the client may block in its destructor.
    let (done, mut finished) = mpsc::channel::<()>(1);
    std::thread::spawn(move || {
        let _ =
            rdkafka::consumer::Consumer::fetch_metadata(&consumer, None, Duration::from_secs(30));
        let _ = done.blocking_send(());
        drop(consumer);
    });
    tokio::select! {
        seen = fake_broker(listener) => seen,
        _ = finished.recv() => panic!("the client gave up before authenticating"),
    }
}

fn with_password(mechanism: SaslMechanism) -> BrokerConfig {
    let mut broker = BrokerConfig::new("unset");
    let security = &mut broker.security;
    security.kafka_security_protocol = Some(SecurityProtocol::SaslPlaintext);
    security.kafka_sasl_mechanism = Some(mechanism);
    security.kafka_sasl_username = Some(USER.into());
    security.kafka_sasl_password = Some(SecretString::from(PASSWORD));
    broker
}

#[tokio::test]
async fn each_sasl_mechanism_is_the_one_the_client_asks_the_broker_for() {
    tokio::time::timeout(Duration::from_secs(60), every_mechanism())
        .await
        .expect("a client never reached SaslAuthenticate");
}

async fn every_mechanism() {
    let listener = || async { TcpListener::bind("127.0.0.1:0").await.unwrap() };

    let plain = authenticate(with_password(SaslMechanism::Plain), listener().await).await;
    assert_eq!(plain.mechanism, "PLAIN");
    // authzid (empty), user, password, separated by NUL.
    assert_eq!(
        plain.first_message,
        format!("\0{USER}\0{PASSWORD}").into_bytes()
    );

    for (mechanism, name) in [
        (SaslMechanism::ScramSha256, "SCRAM-SHA-256"),
        (SaslMechanism::ScramSha512, "SCRAM-SHA-512"),
    ] {
        let scram = authenticate(with_password(mechanism), listener().await).await;
        assert_eq!(scram.mechanism, name);
        // The client-first message: no channel binding, the user, a nonce;
        // the password never travels.
        let first = String::from_utf8(scram.first_message).unwrap();
        assert!(
            first.starts_with(&format!("n,,n={USER},r=")),
            "{name}: {first}"
        );
        assert!(!first.contains(PASSWORD), "{name}: {first}");
    }

    // OAUTHBEARER as in production: the token comes from the provider.
    let token = unsigned_jwt();
    let mut broker = BrokerConfig::new("unset");
    let security = &mut broker.security;
    security.kafka_security_protocol = Some(SecurityProtocol::SaslPlaintext);
    security.kafka_sasl_mechanism = Some(SaslMechanism::OAuthBearer);
    security.kafka_property = vec![
        ("sasl.oauthbearer.method".into(), "oidc".into()),
        ("sasl.oauthbearer.client.id".into(), OIDC_CLIENT.into()),
        ("sasl.oauthbearer.client.secret".into(), OIDC_SECRET.into()),
        (
            "sasl.oauthbearer.token.endpoint.url".into(),
            token_endpoint(token.clone()).await,
        ),
    ];
    let bearer = authenticate(broker, listener().await).await;
    assert_eq!(bearer.mechanism, "OAUTHBEARER");
    let first = String::from_utf8(bearer.first_message).unwrap();
    assert!(first.starts_with("n,,\u{1}"), "{first:?}");
    assert!(
        first.contains(&format!("\u{1}auth=Bearer {token}\u{1}")),
        "{first:?}"
    );
    assert!(!first.contains(OIDC_SECRET), "{first:?}");
}
