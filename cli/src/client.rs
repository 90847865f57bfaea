//! The HTTP side of the CLI: `FLOTILLA_URL`, `FLOTILLA_TOKEN`, and turning
//! API answers into exit codes scripts can rely on.

use clap::Args;
use reqwest::{Method, StatusCode};
use secrecy::{ExposeSecret as _, SecretString};
use serde_json::Value;

use crate::Failure;

#[derive(Debug, Clone, Args)]
pub(crate) struct ApiArgs {
    /// Base URL of a worker's API.
    #[arg(
        long,
        env = "FLOTILLA_URL",
        default_value = "http://localhost:8080",
        global = true
    )]
    pub url: String,
    /// Bearer token for `/v1` (a secret: never printed).
    #[arg(long, env = "FLOTILLA_TOKEN", hide_env_values = true, global = true, value_parser = secret)]
    pub token: Option<SecretString>,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

pub(crate) fn secret(value: &str) -> Result<SecretString, std::convert::Infallible> {
    Ok(SecretString::from(value))
}

/// Exit codes: 0 ok, 1 unreachable or server error, 2 bad usage or input,
/// 3 not found, 4 conflict or wrong state, 5 not authorised.
fn exit_code(status: StatusCode) -> u8 {
    match status.as_u16() {
        401 | 403 => 5,
        404 => 3,
        409 => 4,
        400..=499 => 2,
        _ => 1,
    }
}

impl ApiArgs {
    /// Sends a request and returns the JSON body of a success.
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, Failure> {
        let url = format!("{}{path}", self.url.trim_end_matches('/'));
        let client = flotilla_runtime::tls::http_client()
            .build()
            .map_err(|e| Failure::usage(anyhow::anyhow!("building the HTTP client: {e}")))?;
        let mut request = client.request(method, &url);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token.expose_secret());
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .send()
            .await
            .map_err(|e| Failure::delivery(anyhow::anyhow!("{url}: {e}")))?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(body);
        }
        let detail = body["detail"]
            .as_str()
            .map_or_else(|| body.to_string(), str::to_owned);
        Err(Failure {
            error: anyhow::anyhow!("{status}: {detail}"),
            exit_code: exit_code(status),
        })
    }
}
