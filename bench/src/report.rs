//! The figures of one run: printed as a table, written as JSON.

use std::path::Path;

use serde::Serialize;

/// One measured figure.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Figure {
    /// What part of the system: `relay`, `end to end`, `ceiling`…
    pub(crate) group: String,
    /// What was measured, with its conditions.
    pub(crate) name: String,
    pub(crate) value: f64,
    pub(crate) unit: String,
}

/// Every figure of a run, and what it ran on.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Report {
    pub(crate) started_at: String,
    pub(crate) machine: String,
    pub(crate) smoke: bool,
    /// Whether jobs pointed at their stored version
    /// (`FLOTILLA_DEFINITION_BY_REFERENCE`) rather than copying it.
    pub(crate) definition_by_reference: bool,
    /// Whether runs kept their checkpoints as rows (`FLOTILLA_CHECKPOINT_ROWS`),
    /// apart from the figures that name their layout.
    pub(crate) checkpoint_rows: bool,
    pub(crate) figures: Vec<Figure>,
}

impl Report {
    pub(crate) fn add(&mut self, group: &str, name: impl Into<String>, value: f64, unit: &str) {
        let figure = Figure {
            group: group.to_owned(),
            name: name.into(),
            value,
            unit: unit.to_owned(),
        };
        println!(
            "bench: {:<11} {:<60} {:>12.1} {}",
            figure.group, figure.name, figure.value, figure.unit
        );
        self.figures.push(figure);
    }

    /// The best value among figures of `group` whose name passes `wanted`.
    pub(crate) fn best(&self, group: &str, wanted: impl Fn(&str) -> bool) -> Option<f64> {
        self.figures
            .iter()
            .filter(|f| f.group == group && wanted(&f.name))
            .map(|f| f.value)
            .reduce(f64::max)
    }

    /// The whole table, grouped as measured.
    #[must_use]
    pub(crate) fn table(&self) -> String {
        let mut out = format!(
            "{:<11} {:<60} {:>12} unit\n{}\n",
            "group",
            "figure",
            "value",
            "-".repeat(92)
        );
        for f in &self.figures {
            out.push_str(&format!(
                "{:<11} {:<60} {:>12.2} {}\n",
                f.group, f.name, f.value, f.unit
            ));
        }
        out
    }

    /// Writes `<dir>/<started_at>.json` and `<dir>/latest.json`.
    ///
    /// # Errors
    /// The directory cannot be written.
    pub(crate) fn write(&self, dir: &Path) -> anyhow::Result<std::path::PathBuf> {
        std::fs::create_dir_all(dir)?;
        let json = serde_json::to_string_pretty(self)?;
        let name = if self.smoke {
            "smoke.json".to_owned()
        } else {
            format!("{}.json", self.started_at.replace(':', "-"))
        };
        let path = dir.join(name);
        std::fs::write(&path, &json)?;
        if !self.smoke {
            std::fs::write(dir.join("latest.json"), &json)?;
        }
        Ok(path)
    }
}
