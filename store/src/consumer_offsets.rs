//! `consumer_offset`: the next offset to read per (group, topic,
//! partition), written after the rows of each batch ([`record`]) and read
//! when a partition is assigned ([`next_offsets`]), so a database that lost
//! its last commits sends its consumers back to read them again. An
//! operator moves them, with Kafka's, by `flotilla-worker offsets set`
//! ([`set`]).

use sqlx::PgPool;

/// Where a partition's consumer stands: the next offset to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionOffset {
    pub topic: String,
    pub partition: i32,
    pub next_offset: i64,
}

/// Keeps `offsets` for `group`, each only ever moving forward (a member
/// that still finishes a batch after its partition moved cannot move the
/// offset back).
///
/// # Errors
/// Database errors.
pub async fn record(
    pool: &PgPool,
    group: &str,
    offsets: &[PartitionOffset],
) -> Result<(), sqlx::Error> {
    write(pool, group, offsets, Move::ForwardOnly).await
}

/// Sets `offsets` for `group` as given, forward or back: an operator's
/// move of an idle group (`flotilla-worker offsets set`), never a
/// consumer's.
///
/// # Errors
/// Database errors.
pub async fn set(
    pool: &PgPool,
    group: &str,
    offsets: &[PartitionOffset],
) -> Result<(), sqlx::Error> {
    write(pool, group, offsets, Move::AsGiven).await
}

/// How a written offset may move one already kept.
#[derive(Debug, Clone, Copy)]
enum Move {
    ForwardOnly,
    AsGiven,
}

async fn write(
    pool: &PgPool,
    group: &str,
    offsets: &[PartitionOffset],
    moving: Move,
) -> Result<(), sqlx::Error> {
    if offsets.is_empty() {
        return Ok(());
    }
    let topics: Vec<&str> = offsets.iter().map(|o| o.topic.as_str()).collect();
    let partitions: Vec<i32> = offsets.iter().map(|o| o.partition).collect();
    let next: Vec<i64> = offsets.iter().map(|o| o.next_offset).collect();
    let sql = match moving {
        Move::ForwardOnly => {
            "INSERT INTO consumer_offset (group_id, topic, partition, next_offset)
             SELECT $1, t, p, n FROM unnest($2::text[], $3::int[], $4::bigint[]) AS o(t, p, n)
             ON CONFLICT (group_id, topic, partition) DO UPDATE
                 SET next_offset = greatest(consumer_offset.next_offset, excluded.next_offset),
                     updated_at = now()"
        }
        Move::AsGiven => {
            "INSERT INTO consumer_offset (group_id, topic, partition, next_offset)
             SELECT $1, t, p, n FROM unnest($2::text[], $3::int[], $4::bigint[]) AS o(t, p, n)
             ON CONFLICT (group_id, topic, partition) DO UPDATE
                 SET next_offset = excluded.next_offset, updated_at = now()"
        }
    };
    crate::sql::session(pool, async |conn| {
        crate::sql::query(sql)
            .bind(group)
            .bind(&topics)
            .bind(&partitions)
            .bind(&next)
            .execute(conn)
            .await
    })
    .await?;
    Ok(())
}

/// The offsets kept for `group` on these partitions; a partition with
/// none kept is left out.
///
/// # Errors
/// Database errors.
pub async fn next_offsets(
    pool: &PgPool,
    group: &str,
    partitions: &[(String, i32)],
) -> Result<Vec<PartitionOffset>, sqlx::Error> {
    crate::sql::session(pool, async |conn| {
        let topics: Vec<&str> = partitions.iter().map(|(t, _)| t.as_str()).collect();
        let numbers: Vec<i32> = partitions.iter().map(|(_, p)| *p).collect();
        let rows: Vec<(String, i32, i64)> = crate::sql::query_as(
            "SELECT c.topic, c.partition, c.next_offset
             FROM consumer_offset c
             JOIN unnest($2::text[], $3::int[]) AS w(t, p) ON c.topic = w.t AND c.partition = w.p
             WHERE c.group_id = $1",
        )
        .bind(group)
        .bind(&topics)
        .bind(&numbers)
        .fetch_all(conn)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(topic, partition, next_offset)| PartitionOffset {
                topic,
                partition,
                next_offset,
            })
            .collect())
    })
    .await
}

/// The topics `group` keeps any offset of.
///
/// # Errors
/// Database errors.
pub async fn topics_kept(pool: &PgPool, group: &str) -> Result<Vec<String>, sqlx::Error> {
    crate::sql::session(pool, async |conn| {
        crate::sql::query_scalar("SELECT DISTINCT topic FROM consumer_offset WHERE group_id = $1")
            .bind(group)
            .fetch_all(conn)
            .await
    })
    .await
}
