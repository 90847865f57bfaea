//! The HTTP API over real HTTP on port 0 against a real Postgres: a whole
//! worker (`TestApp`) without claim loops, so jobs stay where a test puts them.

mod auth;
mod bulk;
mod console;
mod document;
mod jobs;
mod listing;
mod metadata;
mod schedules;
mod security;
mod signals;
mod versions;
mod waits;

use flotilla_worker::engine::Engine;
use flotilla_worker::targets::Targets;
use flotilla_worker::test_support::{TestApp, echo_targets};
use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;

pub const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;
pub const TOKEN: &str = "s3cret";

#[derive(Debug)]
pub struct Api {
    pub base: String,
    pub client: Client,
    pub engine: Engine,
    /// The probes' own listener, with `--health-addr`.
    pub health: Option<String>,
    _app: TestApp,
}

impl Api {
    /// A worker that runs no claim loops, accepts two tokens and bodies up to 4 KiB.
    pub async fn start(pool: &PgPool) -> Self {
        Self::start_with(pool, &[], echo_targets()).await
    }

    /// As [`Api::start`], with more flags (a flag given again wins) and
    /// these targets.
    pub async fn start_with(pool: &PgPool, more: &[&str], targets: Targets) -> Self {
        let mut flags = vec![
            "--worker-count",
            "0",
            "--api-tokens",
            "other, s3cret",
            "--max-body-bytes",
            "4096",
        ];
        flags.extend_from_slice(more);
        let app = TestApp::spawn_with(pool.clone(), &flags, targets).await;
        Self {
            base: app.url.clone(),
            client: flotilla_runtime::tls::http_client().build().unwrap(),
            engine: app.engine.clone(),
            health: app.health_url.clone(),
            _app: app,
        }
    }

    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(TOKEN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        if !status.is_success() {
            let content_type = response.headers()["content-type"]
                .to_str()
                .unwrap()
                .to_owned();
            assert_eq!(
                content_type, "application/problem+json",
                "{status} on {path}"
            );
        }
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

pub fn approval() -> Value {
    json!({
        "name": "approval",
        "input_schema": {"type": "object", "required": ["amount"], "properties": {"amount": {"type": "integer"}}},
        "steps": [
            {"name": "check", "target": "echo", "method": "check", "rules": ["amount = input.amount"]},
            {"name": "approve", "target": "echo", "method": "approve", "completion": "external", "validate": ["response.ok == true"]}
        ]
    })
}
