//! The process's Prometheus recorder: one per process, installed at
//! start-up (so nothing recorded before the first scrape is lost), with
//! histogram buckets for every `*_seconds` metric.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Bucket bounds of the duration histograms, in seconds: from a fast
/// target call to a long human wait.
const SECONDS_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0,
    600.0,
];

/// The recorder, installed on the first call; `None` when another recorder
/// was installed first (a test harness, an embedding program).
pub fn prometheus() -> Option<&'static PrometheusHandle> {
    static HANDLE: std::sync::OnceLock<Option<PrometheusHandle>> = std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS_BUCKETS);
            match builder.and_then(PrometheusBuilder::install_recorder) {
                Ok(handle) => Some(handle),
                Err(e) => {
                    tracing::warn!(error = %e, "no Prometheus recorder: another one is installed");
                    None
                }
            }
        })
        .as_ref()
}
