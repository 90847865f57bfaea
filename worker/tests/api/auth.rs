//! Bearer tokens on every `/v1` route; health and readiness stay open.

use reqwest::{Method, StatusCode};
use sqlx::PgPool;
use uuid::Uuid;

use super::{Api, MIGRATOR};

#[sqlx::test(migrator = "MIGRATOR")]
async fn every_v1_route_requires_a_bearer_token(pool: PgPool) {
    let api = Api::start(&pool).await;
    let id = Uuid::new_v4();
    let routes = [
        (Method::POST, "/v1/jobs".to_owned()),
        (Method::GET, "/v1/jobs".to_owned()),
        (Method::GET, format!("/v1/jobs/{id}")),
        (Method::GET, format!("/v1/jobs/{id}/events")),
        (Method::POST, format!("/v1/jobs/{id}/steps/s/complete")),
        (Method::POST, format!("/v1/jobs/{id}/retry")),
        (Method::POST, format!("/v1/jobs/{id}/cancel")),
        (Method::GET, "/v1/workflows".to_owned()),
        (Method::GET, "/v1/workflows/w".to_owned()),
        (Method::GET, "/v1/workflows/w/versions".to_owned()),
        (Method::GET, "/v1/fleet".to_owned()),
        (Method::PUT, "/v1/workflows/w".to_owned()),
    ];
    for (method, path) in routes {
        let url = format!("{}{path}", api.base);
        let missing = api
            .client
            .request(method.clone(), &url)
            .send()
            .await
            .unwrap();
        assert_eq!(
            missing.status(),
            StatusCode::UNAUTHORIZED,
            "{method} {path}"
        );
        let wrong = api
            .client
            .request(method.clone(), &url)
            .bearer_auth("guess")
            .send()
            .await
            .unwrap();
        assert_eq!(wrong.status(), StatusCode::FORBIDDEN, "{method} {path}");
    }
    let health = api
        .client
        .get(format!("{}/healthz", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    let ready = api
        .client
        .get(format!("{}/readyz", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), StatusCode::OK);
}
