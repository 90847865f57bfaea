//! `event_topic`: the event topic's partition count the relays agreed on
//! (see `relay/src/partitions.rs`).

use sqlx::PgConnection;

/// The recorded partition count of `topic`, if any.
///
/// # Errors
/// Database errors.
pub async fn recorded_partitions(
    conn: &mut PgConnection,
    topic: &str,
) -> Result<Option<i32>, sqlx::Error> {
    crate::sql::query_scalar("SELECT partitions FROM event_topic WHERE topic = $1")
        .bind(topic)
        .fetch_optional(conn)
        .await
}

/// Records `partitions` as `topic`'s count.
///
/// # Errors
/// Database errors.
pub async fn record_partitions(
    conn: &mut PgConnection,
    topic: &str,
    partitions: i32,
) -> Result<(), sqlx::Error> {
    crate::sql::query(
        "INSERT INTO event_topic (topic, partitions) VALUES ($1, $2)
         ON CONFLICT (topic) DO UPDATE SET partitions = EXCLUDED.partitions, recorded_at = now()",
    )
    .bind(topic)
    .bind(partitions)
    .execute(conn)
    .await?;
    Ok(())
}
