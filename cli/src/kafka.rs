//! Where the broker and the Schema Registry are, for `produce` and `tail`.

use clap::Args;

#[derive(Debug, Clone, Args)]
pub struct KafkaArgs {
    /// Kafka broker list.
    #[arg(
        long,
        env = "KAFKA_BOOTSTRAP_SERVERS",
        default_value = "localhost:9092"
    )]
    pub bootstrap_servers: String,
    /// Schema Registry: Avro on the wire when set (either encoding is read).
    #[arg(long, env = "SCHEMA_REGISTRY_URL")]
    pub schema_registry_url: Option<String>,
}
