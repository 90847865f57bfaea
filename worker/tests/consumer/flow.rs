//! Requests become rows, and a killed consumer loses and duplicates nothing.

use flotilla_runtime::kafka::GroupProtocol;

use super::*;

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_thousand_mixed_avro_and_json_requests_become_a_thousand_completed_jobs(pool: PgPool) {
    within_deadline(async {
        let topics = topics().await;
        let engine = support::engine(&pool);
        support::register_greet(&engine).await;
        let producer = producer();
        let mut ids = Vec::new();
        for n in 0..1000 {
            let job_id = Uuid::new_v4();
            produce_request(
                &producer,
                &topics.requests,
                job_id,
                json!({"name": format!("n{n}")}),
                n % 2 == 0,
            )
            .await;
            ids.push(job_id);
        }
        let (stop, handle) = spawn(support::consumer(&engine, &topics));
        wait_rows(&pool, 1000).await;
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        stop.cancel();
        handle.await.unwrap();
        assert_eq!(
            count(
                &pool,
                "SELECT count(*) FROM workflow_run WHERE status = 'QUEUED'"
            )
            .await,
            1000
        );
        let stored: HashSet<Uuid> = sqlx::query_scalar("SELECT job_id FROM workflow_run")
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
        assert_eq!(stored, ids.iter().copied().collect());

        let run = CancellationToken::new();
        let runner = tokio::spawn({
            let (engine, run) = (engine.clone(), run.clone());
            async move { engine.run(run, Duration::from_secs(10)).await }
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while count(
            &pool,
            "SELECT count(*) FROM workflow_run WHERE status = 'COMPLETED'",
        )
        .await
            < 1000
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "jobs did not complete"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        run.cancel();
        runner.await.unwrap();
    })
    .await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_consumer_killed_between_row_commit_and_offset_commit_loses_and_duplicates_nothing(
    pool: PgPool,
) {
    killed_between_row_and_offset_commits(pool, GroupProtocol::Classic).await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_consumer_killed_between_row_commit_and_offset_commit_loses_nothing_consumer_protocol(
    pool: PgPool,
) {
    killed_between_row_and_offset_commits(pool, GroupProtocol::Consumer).await;
}

async fn killed_between_row_and_offset_commits(pool: PgPool, protocol: GroupProtocol) {
    within_deadline(async {
        let topics = support::topics_for(protocol).await;
        let engine = support::engine(&pool);
        support::register_greet(&engine).await;
        let producer = producer();
        for n in 0..30 {
            produce_request(
                &producer,
                &topics.requests,
                Uuid::new_v4(),
                json!({"name": format!("n{n}")}),
                n % 3 == 0,
            )
            .await;
        }
        // First life: rows committed, then the process dies before the offset commit.
        let doomed = support::consumer(&engine, &topics);
        let never = CancellationToken::new();
        let mut seen = 0;
        while seen < 30 {
            let batch = doomed.next_batch(&never).await.unwrap();
            seen += batch.len();
            doomed.persist(&batch).await.unwrap();
        }
        doomed.close();
        assert_eq!(count(&pool, "SELECT count(*) FROM workflow_run").await, 30);

        // Second life: everything is redelivered and recognised.
        let reborn = support::consumer(&engine, &topics);
        let mut total = BatchReport::default();
        let mut redelivered = 0;
        while redelivered < 30 {
            let batch = reborn.next_batch(&never).await.unwrap();
            redelivered += batch.len();
            let report = reborn.persist(&batch).await.unwrap();
            total.existing += report.existing;
            total.created += report.created;
            reborn.commit(&batch);
        }
        assert_eq!(
            total,
            BatchReport {
                existing: 30,
                ..BatchReport::default()
            }
        );
        assert_eq!(count(&pool, "SELECT count(*) FROM workflow_run").await, 30);
        assert_eq!(
            count(
                &pool,
                "SELECT count(*) FROM workflow_run_outbox WHERE event_type = 'ACCEPTED'"
            )
            .await,
            30
        );
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        reborn.close();
    })
    .await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn with_no_batch_wait_a_batch_still_takes_everything_already_fetched(pool: PgPool) {
    within_deadline(async {
        let topics = topics().await;
        let engine = support::engine(&pool);
        let settings = flotilla_worker::ingest::ConsumerSettings::new(
            flotilla_tests::broker(),
            &topics.requests,
            &topics.group,
        );
        assert_eq!(
            settings.batch_wait,
            Duration::ZERO,
            "the default waits for nothing"
        );
        let producer = producer();
        // Twenty requests in the partition before the consumer's first fetch:
        // they come in one fetch, so one batch takes them all.
        for n in 0..20 {
            support::produce_to(
                &producer,
                &topics.requests,
                0,
                format!("r{n}").as_bytes(),
                None,
            )
            .await;
        }
        let consumer =
            flotilla_worker::ingest::RequestConsumer::subscribe(engine, support::codec(), settings)
                .unwrap();
        let never = CancellationToken::new();
        let first = consumer.next_batch(&never).await.unwrap();
        assert_eq!(first.len(), 20, "one batch took the whole fetch");
        // A request produced alone is a batch of its own.
        support::produce_to(&producer, &topics.requests, 1, b"alone", None).await;
        let second = consumer.next_batch(&never).await.unwrap();
        assert_eq!(second.len(), 1);
        assert_eq!(rdkafka::Message::payload(&*second[0]), Some(&b"alone"[..]));
        consumer.close();
    })
    .await;
}

/// Requests naming a stored version, in both encodings, become rows of that
/// version; one naming none takes the newest; one naming a version the
/// name never had is a FAILED row saying so (its own outcome, the
/// partition goes on).
#[sqlx::test(migrator = "MIGRATOR")]
async fn requests_naming_a_workflow_version_become_rows_of_that_version(pool: PgPool) {
    within_deadline(async {
        let topics = topics().await;
        let engine = support::engine(&pool);
        support::register_greet(&engine).await;
        let mut newer = engine
            .workflow("greet")
            .await
            .unwrap()
            .unwrap()
            .definition
            .0;
        newer["max_attempts"] = json!(7);
        engine.register_workflow(&newer).await.unwrap();
        let producer = producer();
        // (version, priority, Avro or JSON)
        let cases = [
            (Some(1), Some(5), true),
            (Some(1), Some(3), false),
            (None, None, true),
            (Some(9), None, false),
        ];
        let mut ids = Vec::new();
        for (version, priority, avro) in cases {
            let job_id = Uuid::new_v4();
            let request =
                flotilla_contracts::WorkflowRunRequest::new(job_id, "greet", json!({"name": "v"}))
                    .unwrap()
                    .with_workflow_version(version)
                    .unwrap()
                    .with_priority(priority)
                    .unwrap();
            let bytes = if avro {
                support::codec()
                    .encode(&topics.requests, &request)
                    .await
                    .unwrap()
            } else {
                flotilla_contracts::json::encode(&request).unwrap()
            };
            produce_raw(
                &producer,
                &topics.requests,
                &job_id.to_string(),
                &bytes,
                None,
            )
            .await;
            ids.push(job_id);
        }
        let (stop, handle) = spawn(support::consumer(&engine, &topics));
        wait_rows(&pool, 4).await;
        stop.cancel();
        handle.await.unwrap();
        let mut stored = Vec::new();
        for id in &ids {
            let row: (Option<i32>, String, Option<String>, i16) = sqlx::query_as(
                "SELECT workflow_version, status, error, priority FROM workflow_run WHERE job_id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
            stored.push(row);
        }
        assert_eq!(stored[0].0, Some(1));
        assert_eq!(stored[1].0, Some(1));
        assert_eq!(stored[2].0, Some(2));
        assert_eq!(
            stored.iter().map(|row| row.3).collect::<Vec<_>>(),
            [5, 3, 0, 0],
            "the priority asked for, in both encodings"
        );
        assert_eq!(stored[3].1, "FAILED");
        let error = stored[3].2.clone().unwrap_or_default();
        assert!(error.contains("has no version 9"), "{error}");
    })
    .await;
}
