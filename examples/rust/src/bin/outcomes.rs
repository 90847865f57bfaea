//! A downstream consumer that keeps a table of job outcomes in Postgres,
//! applying each event exactly once.
//!
//! Kafka delivers at least once and the fleet may publish an event twice,
//! so the rule lives in the table: each job's row holds the last sequence
//! applied, read with `FOR UPDATE` and written in the same transaction as
//! the event's effect. The offset is acknowledged only after that commit.
//! Killed between the commit and the acknowledgement, the consumer reads
//! the event again, [`classify`] calls it a repeat, and nothing changes.
//!
//! ```text
//! KAFKA_BOOTSTRAP_SERVERS=localhost:9092 SCHEMA_REGISTRY_URL=http://localhost:8081 \
//!   OUTCOMES_DATABASE_URL=postgres://localhost/outcomes \
//!   flotilla-example-outcomes --group billing
//! ```

use std::time::Duration;

use clap::Parser;
use flotilla_client::{
    BrokerConfig, Delivery, EventStream, EventStreamOptions, StreamError, Verdict,
    WorkflowRunEventType, classify,
};
use sqlx::PgPool;

#[derive(Debug, Parser)]
struct Args {
    /// The database that holds the `job_outcome` table (created when missing).
    #[arg(long, env = "OUTCOMES_DATABASE_URL")]
    database_url: String,
    /// The consumer group: one per downstream system.
    #[arg(long, default_value = "job-outcomes")]
    group: String,
    /// The event topic.
    #[arg(
        long,
        env = "FLOTILLA_EVENT_TOPIC",
        default_value = "workflow-run-events"
    )]
    topic: String,
    /// A static group member id (`group.instance.id`): restarted with it,
    /// the consumer gets its partitions back at once.
    #[arg(long)]
    instance_id: Option<String>,
    /// Keep only this workflow's jobs.
    #[arg(long)]
    workflow: Option<String>,
    /// Stop once the table holds this many finished jobs (for scripts).
    #[arg(long)]
    until_finished: Option<i64>,
    #[command(flatten)]
    broker: BrokerConfig,
}

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS job_outcome (
    job_id uuid PRIMARY KEY,
    workflow_name text NOT NULL,
    status text NOT NULL,
    last_sequence bigint NOT NULL,
    events_applied integer NOT NULL,
    gaps integer NOT NULL DEFAULT 0,
    result jsonb,
    error text,
    updated_at timestamptz NOT NULL DEFAULT now()
)";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let pool = PgPool::connect(&args.database_url).await?;
    sqlx::query(SCHEMA).execute(&pool).await?;
    let mut options = EventStreamOptions::new(&args.group).topic(&args.topic);
    if let Some(id) = &args.instance_id {
        options = options.static_member(id);
    }
    let mut events = EventStream::subscribe(&args.broker, &options)?;
    // For the repository's test of this example: die right after a
    // write commits and before its acknowledgement, as a crash would.
    let die_after: Option<u64> = std::env::var("OUTCOMES_DIE_AFTER_WRITES")
        .ok()
        .and_then(|n| n.parse().ok());
    let (mut writes, mut repeats) = (0_u64, 0_u64);
    loop {
        if let Some(target) = args.until_finished
            && finished(&pool).await? >= target
        {
            break;
        }
        let next = tokio::time::timeout(Duration::from_secs(1), events.next()).await;
        let (delivery, gap) = match next {
            Err(_elapsed) => continue,
            Ok(Ok(delivery)) => (delivery, false),
            Ok(Err(StreamError::Gap { delivery, .. })) => {
                eprintln!("outcomes: {}", gap_note(&delivery));
                (*delivery, true)
            }
            Ok(Err(e @ StreamError::Undecodable { .. })) => {
                // Not an event of this contract: nothing to apply. A real
                // service would keep the record's position for a person.
                eprintln!("outcomes: skipped: {e}");
                continue;
            }
            Ok(Err(e @ StreamError::Unavailable(_))) => {
                eprintln!("outcomes: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Ok(Err(e @ StreamError::Settings(_))) => return Err(e.into()),
        };
        if args
            .workflow
            .as_ref()
            .is_some_and(|name| name != delivery.event().workflow_name())
        {
            events.ack(&delivery); // another workflow's: nothing to keep
            continue;
        }
        if apply(&pool, &delivery, gap).await? {
            writes += 1;
        } else {
            repeats += 1;
        }
        if die_after == Some(writes) {
            eprintln!("outcomes: dying after {writes} writes, before acknowledging");
            std::process::abort();
        }
        events.ack(&delivery);
    }
    events.commit().await?;
    println!("outcomes: applied {writes}, repeats skipped {repeats}");
    Ok(())
}

fn gap_note(delivery: &Delivery) -> String {
    let event = delivery.event();
    format!(
        "job {} jumped to event {}: earlier events never arrived",
        event.job_id(),
        event.sequence()
    )
}

/// Applies one event in one transaction; false when the table had it.
async fn apply(pool: &PgPool, delivery: &Delivery, gap: bool) -> sqlx::Result<bool> {
    let event = delivery.event();
    let mut tx = pool.begin().await?;
    let last: Option<i64> =
        sqlx::query_scalar("SELECT last_sequence FROM job_outcome WHERE job_id = $1 FOR UPDATE")
            .bind(event.job_id())
            .fetch_optional(&mut *tx)
            .await?;
    // A gap the stream reported is applied: this table wants the latest
    // state, and it counts the gap for whoever reads it.
    if classify(last, event.sequence()) == Verdict::Repeat {
        return Ok(false);
    }
    // A checkpoint moves the job on without changing its state.
    let status = match event.event_type() {
        WorkflowRunEventType::StepCheckpoint => "RUNNING".to_owned(),
        other => other.to_string(),
    };
    sqlx::query(
        "INSERT INTO job_outcome (job_id, workflow_name, status, last_sequence, events_applied, gaps, result, error)
         VALUES ($1, $2, $3, $4, 1, $5, $6, $7)
         ON CONFLICT (job_id) DO UPDATE SET status = $3, last_sequence = $4,
             events_applied = job_outcome.events_applied + 1, gaps = job_outcome.gaps + $5,
             result = COALESCE($6, job_outcome.result), error = COALESCE($7, job_outcome.error),
             updated_at = now()",
    )
    .bind(event.job_id())
    .bind(event.workflow_name())
    .bind(status)
    .bind(event.sequence())
    .bind(i32::from(gap))
    .bind(event.result())
    .bind(event.error())
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(true)
}

async fn finished(pool: &PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar(
        "SELECT count(*) FROM job_outcome WHERE status IN ('COMPLETED', 'FAILED', 'DEAD', 'CANCELLED')",
    )
    .fetch_one(pool)
    .await
}
