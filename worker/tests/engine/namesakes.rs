//! Two live workers never share an id: a worker refuses to start while
//! another one keeps announcing itself under its id, and starts after a
//! predecessor of that id that stopped announcing (it died a moment ago).

use std::time::Duration;

use flotilla_worker::engine::{Engine, Namesake};
use sqlx::PgPool;

use crate::support::{self, Calls, echo_targets, manual_clock};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

fn engine(pool: &PgPool) -> Engine {
    let mut settings = support::settings("twin");
    settings.sweep_interval = Duration::from_millis(200);
    Engine::new(
        pool.clone(),
        echo_targets(&Calls::default()),
        manual_clock(),
        settings,
    )
}

async fn announce(pool: &PgPool) {
    sqlx::query(
        "INSERT INTO worker_member (worker_id, claim_loops, started_at, last_seen, reader_level)
         VALUES ('twin', 16, now(), clock_timestamp(), 1)
         ON CONFLICT (worker_id) DO UPDATE SET last_seen = clock_timestamp()",
    )
    .execute(pool)
    .await
    .unwrap();
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_worker_refuses_to_start_beside_a_live_worker_of_its_id(pool: PgPool) {
    announce(&pool).await;
    let alive = tokio::spawn({
        let pool = pool.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                announce(&pool).await;
            }
        }
    });
    let refused = engine(&pool).refuse_a_live_namesake().await;
    alive.abort();
    match refused {
        Err(Namesake::Alive { worker_id, .. }) => assert_eq!(worker_id, "twin"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_worker_starts_after_a_predecessor_of_its_id_that_stopped_announcing(pool: PgPool) {
    announce(&pool).await;
    engine(&pool)
        .refuse_a_live_namesake()
        .await
        .expect("the row was fresh but nobody renewed it");
}
