//! Plans as a connection runs them: prepared, then executed.

use sqlx::PgConnection;

/// The plans Postgres makes for `statement` prepared and executed with
/// `arguments` (SQL literals, comma-separated): first the one planned for
/// those values, then the generic one a connection settles on after five
/// runs. An `EXPLAIN` given bound values would only ever show the first.
/// Run inside the caller's transaction, after its own settings.
pub(crate) async fn prepared_plans(
    tx: &mut PgConnection,
    statement: &str,
    arguments: &str,
) -> [(&'static str, String); 2] {
    let mut plan = async |mode: &'static str| {
        for setting in [
            format!("SET LOCAL plan_cache_mode = {mode}"),
            format!("PREPARE planned AS {statement}"),
        ] {
            sqlx::raw_sql(&setting).execute(&mut *tx).await.unwrap();
        }
        let lines: Vec<String> =
            sqlx::query_scalar(&format!("EXPLAIN EXECUTE planned({arguments})"))
                .fetch_all(&mut *tx)
                .await
                .unwrap();
        sqlx::raw_sql("DEALLOCATE planned")
            .execute(&mut *tx)
            .await
            .unwrap();
        (mode, lines.join("\n"))
    };
    [
        plan("force_custom_plan").await,
        plan("force_generic_plan").await,
    ]
}
