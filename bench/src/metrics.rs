//! The in-process parts' metrics, read back: a recorder installed for the
//! whole run keeps every histogram sample, and a read takes (and clears)
//! one histogram's samples.

use std::sync::OnceLock;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();

/// Installs the recorder; later calls do nothing.
pub(crate) fn install() {
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        if recorder.install().is_err() {
            eprintln!("bench: a metrics recorder was installed already; histograms read empty");
        }
        snapshotter
    });
}

/// The samples `name` recorded since the last read, in seconds, sorted.
pub(crate) fn histogram(name: &str) -> Vec<f64> {
    let Some(snapshotter) = SNAPSHOTTER.get() else {
        return Vec::new();
    };
    let mut samples: Vec<f64> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == name)
        .flat_map(|(.., value)| match value {
            DebugValue::Histogram(values) => values.into_iter().map(|v| v.into_inner()).collect(),
            _ => Vec::new(),
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples
}

/// The `q` quantile of sorted `samples` (0 when there are none).
pub(crate) fn quantile(samples: &[f64], q: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let index = ((samples.len() - 1) as f64 * q).round() as usize;
    samples[index.min(samples.len() - 1)]
}
