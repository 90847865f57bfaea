//! The broker security settings read from the environment and the files
//! they name, refused with a reason when they cannot work.

use super::*;
use clap::Parser;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    security: KafkaSecurity,
}

fn parse(args: &[&str]) -> Result<KafkaSecurity, clap::Error> {
    Cli::try_parse_from(std::iter::once("test").chain(args.iter().copied())).map(|c| c.security)
}

fn base() -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", "localhost:9092");
    config
}

/// What a client is given, as librdkafka holds it (which masks
/// secrets when read back) and as set.
fn applied(security: &KafkaSecurity) -> BTreeMap<String, String> {
    let mut config = base();
    security.apply(&mut config);
    let set: BTreeMap<String, String> = security.properties().into_iter().collect();
    for key in set.keys() {
        assert!(config.get(key).is_some(), "{key} did not reach the client");
    }
    set
}

#[test]
fn named_settings_become_librdkafka_properties() {
    let dir = tempfile_dir();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, "not checked here").unwrap();
    let security = parse(&[
        "--kafka-security-protocol",
        "SASL_SSL",
        "--kafka-sasl-mechanism",
        "SCRAM-SHA-512",
        "--kafka-sasl-username",
        "flotilla",
        "--kafka-sasl-password",
        "s3cret",
        "--kafka-ssl-ca-location",
        ca.to_str().unwrap(),
        "--kafka-ssl-key-password",
        "key-s3cret",
        "--kafka-property",
        "sasl.oauthbearer.client.secret=property-s3cret",
    ])
    .unwrap();
    let properties = applied(&security);
    assert_eq!(properties["security.protocol"], "sasl_ssl");
    assert_eq!(properties["sasl.mechanisms"], "SCRAM-SHA-512");
    assert_eq!(properties["sasl.username"], "flotilla");
    assert_eq!(properties["sasl.password"], "s3cret");
    assert_eq!(properties["ssl.ca.location"], ca.display().to_string());
    assert_eq!(properties["ssl.key.password"], "key-s3cret");
    assert_eq!(
        properties["sasl.oauthbearer.client.secret"],
        "property-s3cret"
    );
    // Debug (what a log of the settings would print) names what is set
    // and shows no secret, a pass-through property's value included.
    let shown = format!("{security:?}");
    assert!(!shown.contains("s3cret"), "{shown}");
    assert!(shown.contains("sasl.oauthbearer.client.secret"), "{shown}");
    assert!(
        shown.contains(r#"kafka_sasl_username: Some("flotilla")"#),
        "{shown}"
    );
}

#[test]
fn the_properties_file_applies_first_and_a_kafka_property_last() {
    let dir = tempfile_dir();
    let file = dir.join("client.properties");
    std::fs::write(
        &file,
        "# a managed service's file\nsecurity.protocol=SASL_SSL\nsasl.mechanisms=PLAIN\nsasl.username=from-file\nsasl.password=file-secret\nclient.id = from-file\n",
    )
    .unwrap();
    let security = parse(&[
        "--kafka-properties-file",
        file.to_str().unwrap(),
        "--kafka-sasl-username",
        "named",
        "--kafka-property",
        "client.id=flag",
    ])
    .unwrap();
    let properties = applied(&security);
    assert_eq!(properties["security.protocol"], "SASL_SSL");
    assert_eq!(properties["sasl.username"], "named");
    assert_eq!(properties["sasl.password"], "file-secret");
    assert_eq!(properties["client.id"], "flag");
    assert!(
        !format!("{security:?}").contains("file-secret"),
        "{security:?}"
    );
    security.validate(&base()).unwrap();
}

#[test]
fn a_password_file_is_read_without_its_newline() {
    let dir = tempfile_dir();
    let file = dir.join("password");
    std::fs::write(&file, "from-a-secret\n").unwrap();
    let security = parse(&[
        "--kafka-security-protocol",
        "sasl_plaintext",
        "--kafka-sasl-mechanism",
        "PLAIN",
        "--kafka-sasl-username",
        "u",
        "--kafka-sasl-password-file",
        file.to_str().unwrap(),
    ])
    .unwrap();
    assert_eq!(applied(&security)["sasl.password"], "from-a-secret");
    security.validate(&base()).unwrap();
}

#[test]
fn misconfigurations_are_refused_naming_the_setting() {
    let missing = parse(&["--kafka-ssl-ca-location", "/no/such/ca.pem"]).unwrap_err();
    assert!(missing.to_string().contains("/no/such/ca.pem"), "{missing}");
    assert!(
        missing.to_string().contains("--kafka-ssl-ca-location"),
        "{missing}"
    );

    let unsupported = parse(&["--kafka-sasl-mechanism", "GSSAPI"]).unwrap_err();
    assert!(unsupported.to_string().contains("GSSAPI"), "{unsupported}");

    let cases: [(&[&str], &str); 4] = [
        (&["--kafka-sasl-mechanism", "PLAIN"], "KAFKA_SASL_MECHANISM"),
        (
            &[
                "--kafka-security-protocol",
                "SASL_SSL",
                "--kafka-sasl-mechanism",
                "SCRAM-SHA-256",
                "--kafka-sasl-username",
                "u",
            ],
            "KAFKA_SASL_PASSWORD",
        ),
        (
            &["--kafka-security-protocol", "SASL_SSL"],
            "KAFKA_SASL_MECHANISM",
        ),
        (
            &["--kafka-property", "no.such.property=1"],
            "no.such.property",
        ),
    ];
    for (args, named) in cases {
        let security = parse(args).unwrap();
        let refused = security.validate(&base()).unwrap_err();
        assert!(refused.to_string().contains(named), "{args:?}: {refused}");
    }
}

#[test]
fn every_mechanism_is_built_into_librdkafka() {
    for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] {
        let mut security = parse(&[
            "--kafka-security-protocol",
            "SASL_SSL",
            "--kafka-sasl-mechanism",
            mechanism,
            "--kafka-sasl-username",
            "u",
            "--kafka-sasl-password",
            "p",
        ])
        .unwrap();
        if mechanism == "OAUTHBEARER" {
            // The production form: tokens from an OpenID Connect provider.
            security.kafka_property.extend([
                ("sasl.oauthbearer.method".into(), "oidc".into()),
                ("sasl.oauthbearer.client.id".into(), "c".into()),
                ("sasl.oauthbearer.client.secret".into(), "s".into()),
                (
                    "sasl.oauthbearer.token.endpoint.url".into(),
                    "https://idp.invalid/token".into(),
                ),
            ]);
        }
        security
            .validate(&base())
            .unwrap_or_else(|e| panic!("{mechanism}: {e}"));
        // Whether a mechanism is compiled in is only known when a client
        // is created (no broker is needed for that).
        let mut config = base();
        security.apply(&mut config);
        let producer: rdkafka::producer::BaseProducer = config
            .create()
            .unwrap_or_else(|e| panic!("{mechanism} is not built in: {e}"));
        std::thread::spawn(move || drop(producer));
    }
}

#[test]
fn refused_credentials_and_rights_are_told_apart_from_other_errors() {
    use rdkafka::types::RDKafkaErrorCode as Code;
    // However the client reports them: as a consumer's, a producer's
    // or a metadata request's error.
    let reported: [fn(Code) -> KafkaError; 3] = [
        KafkaError::MessageConsumption,
        KafkaError::MessageProduction,
        KafkaError::MetadataFetch,
    ];
    for report in reported {
        for refused in [
            Code::Authentication,
            Code::SaslAuthenticationFailed,
            Code::SSL,
            Code::TopicAuthorizationFailed,
            Code::GroupAuthorizationFailed,
            Code::ClusterAuthorizationFailed,
        ] {
            assert!(is_refused_access(&report(refused)), "{refused:?}");
        }
        for other in [
            Code::BrokerTransportFailure,
            Code::AllBrokersDown,
            Code::MessageTimedOut,
            Code::QueueFull,
            Code::UnknownTopicOrPartition,
            Code::MessageSizeTooLarge,
            Code::BadMessage,
            Code::NotEnoughReplicas,
            Code::NoError,
        ] {
            assert!(!is_refused_access(&report(other)), "{other:?}");
        }
    }
    // An error without a code (a client that could not be created).
    assert!(!is_refused_access(&KafkaError::ClientCreation(
        "bad".into()
    )));
}

fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "flotilla-kafka-security-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
