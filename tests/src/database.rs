//! The test's own database (a `#[sqlx::test]` one) as other parts see it: a
//! URL for a child process, or a pool through a proxy the test can cut.

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::proxy::Proxy;

/// The URL of `pool`'s database on the server `DATABASE_URL` points at.
///
/// # Panics
/// `DATABASE_URL` is unset or the database does not answer.
pub async fn url_of(pool: &PgPool) -> String {
    let (server, name) = server_and_name(pool).await;
    format!("{server}/{name}")
}

/// The URL of `pool`'s database reached through `proxy`.
///
/// # Panics
/// As [`url_of`].
pub async fn url_through(pool: &PgPool, proxy: &Proxy) -> String {
    let (server, name) = server_and_name(pool).await;
    let (scheme_and_user, _) = server.rsplit_once('@').expect("DATABASE_URL names a user");
    format!("{scheme_and_user}@{}/{name}", proxy.address())
}

/// The address of `pool`'s server.
///
/// # Panics
/// It cannot be resolved.
pub async fn server_address(pool: &PgPool) -> std::net::SocketAddr {
    let connect = pool.connect_options();
    tokio::net::lookup_host(format!("{}:{}", connect.get_host(), connect.get_port()))
        .await
        .expect("resolving the database server")
        .next()
        .expect("the database server has an address")
}

/// The name of `pool`'s database.
///
/// # Panics
/// The database does not answer.
pub async fn name_of(pool: &PgPool) -> String {
    sqlx::query_scalar("SELECT current_database()::text")
        .fetch_one(pool)
        .await
        .expect("the test database answers")
}

/// A proxy in front of `pool`'s server.
///
/// # Panics
/// The server's address cannot be resolved.
pub async fn proxy_for(pool: &PgPool) -> Proxy {
    Proxy::start(server_address(pool).await).await
}

/// A proxy in front of `pool`'s server, and a pool (built from `options`) to
/// the same database through it.
///
/// # Panics
/// The server's address cannot be resolved or the proxied pool not opened.
pub async fn behind_proxy(pool: &PgPool, options: PgPoolOptions) -> (Proxy, PgPool) {
    let proxy = proxy_for(pool).await;
    let connect: PgConnectOptions = pool.connect_options().as_ref().clone();
    let proxied = options
        .connect_with(connect.host("127.0.0.1").port(proxy.address().port()))
        .await
        .expect("opening the proxied pool");
    (proxy, proxied)
}

async fn server_and_name(pool: &PgPool) -> (String, String) {
    let name: String = sqlx::query_scalar("SELECT current_database()::text")
        .fetch_one(pool)
        .await
        .expect("the test database answers");
    let base = crate::service_env("DATABASE_URL");
    let (server, _) = base
        .rsplit_once('/')
        .expect("DATABASE_URL names a database");
    (server.to_owned(), name)
}
