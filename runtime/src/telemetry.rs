//! Logs and traces, set up once per binary.
//!
//! Logs: text or JSON lines (`FLOTILLA_LOG_FORMAT`), filtered by `RUST_LOG`.
//! Traces: exported over OTLP only when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, honouring the standard
//! `OTEL_*` variables (service name, resource attributes, sampler, batch
//! delays, protocol); without it no OpenTelemetry layer is installed at all,
//! so tracing costs what plain logging costs. W3C trace context is the
//! propagator either way (see [`crate::trace`]).

use clap::{Args, ValueEnum};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The log filter used when none is configured.
pub const DEFAULT_LOG_FILTER: &str = "info";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// For people.
    Text,
    /// One JSON object a line, for collectors.
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct TelemetryConfig {
    /// Log filter in `RUST_LOG` syntax.
    #[arg(long, env = "RUST_LOG", default_value = DEFAULT_LOG_FILTER)]
    pub log_filter: String,

    /// Log line format.
    #[arg(long, env = "FLOTILLA_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Same as `--log-format json` (kept for existing deployments).
    #[arg(long, env = "FLOTILLA_LOG_JSON", default_value_t = false)]
    pub log_json: bool,
}

/// Logging or tracing could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("log filter: {0}")]
    Filter(#[from] tracing_subscriber::filter::ParseError),
    #[error("installing the log subscriber: {0}")]
    Install(String),
    #[error("OTLP trace exporter: {0}")]
    Exporter(String),
}

/// Flushes exported spans when dropped (at the end of `main`).
#[must_use = "dropping the guard flushes and stops trace export"]
#[derive(Debug, Default)]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("flushing traces at exit: {e}");
        }
    }
}

/// Set once an OTLP exporter and its layer are installed.
static EXPORTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether spans are being exported: without it, the per-span trace
/// context work ([`crate::trace::continue_trace`], [`crate::trace::headers_of`])
/// is skipped on the hot paths (every step call, every published event).
#[must_use]
pub fn exporting() -> bool {
    EXPORTING.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether the environment asks for trace export.
fn export_requested() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let disabled = std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.trim() == "none")
        || std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim() == "true");
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// The OTLP span exporter the `OTEL_EXPORTER_OTLP_*PROTOCOL` variables ask
/// for: `http/protobuf` (the default) or `grpc`.
fn exporter() -> Result<opentelemetry_otlp::SpanExporter, TelemetryError> {
    use opentelemetry_otlp::WithExportConfig as _;
    let protocol = std::env::var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_else(|_| "http/protobuf".into());
    let built = match protocol.trim() {
        "grpc" => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_protocol(opentelemetry_otlp::Protocol::Grpc)
            .build(),
        "http/protobuf" => {
            // The HTTP client is built now: its TLS needs the provider.
            crate::tls::install_crypto_provider();
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .build()
        }
        other => {
            return Err(TelemetryError::Exporter(format!(
                "OTEL_EXPORTER_OTLP_PROTOCOL={other} is not supported (grpc or http/protobuf)"
            )));
        }
    };
    built.map_err(|e| TelemetryError::Exporter(e.to_string()))
}

/// Installs the global subscriber (and, when asked for, the OTLP exporter
/// and its layer). `service` names the binary when `OTEL_SERVICE_NAME` does not.
///
/// # Errors
/// The filter does not parse, the exporter cannot be built, or a subscriber
/// is already installed.
pub fn init(config: &TelemetryConfig, service: &str) -> Result<TelemetryGuard, TelemetryError> {
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let filter = EnvFilter::try_new(&config.log_filter)?;
    let json = config.log_json || config.log_format == LogFormat::Json;
    let (provider, otel_layer) = if export_requested() {
        let mut resource = opentelemetry_sdk::Resource::builder();
        if std::env::var("OTEL_SERVICE_NAME").is_err() {
            resource = resource.with_service_name(service.to_owned());
        }
        let provider = SdkTracerProvider::builder()
            .with_resource(resource.build())
            .with_batch_exporter(exporter()?)
            .build();
        let tracer = provider.tracer("flotilla");
        opentelemetry::global::set_tracer_provider(provider.clone());
        (
            Some(provider),
            Some(tracing_opentelemetry::layer().with_tracer(tracer)),
        )
    } else {
        (None, None)
    };
    let registry = tracing_subscriber::registry().with(filter).with(otel_layer);
    let installed = if json {
        registry
            .with(tracing_subscriber::fmt::layer().json())
            .try_init()
    } else {
        registry.with(tracing_subscriber::fmt::layer()).try_init()
    };
    installed.map_err(|e| TelemetryError::Install(e.to_string()))?;
    EXPORTING.store(provider.is_some(), std::sync::atomic::Ordering::Relaxed);
    Ok(TelemetryGuard { provider })
}
