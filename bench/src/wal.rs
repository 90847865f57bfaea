//! Where a run's WAL went: `pg_waldump` over the run's LSN range, summed by
//! relation and record kind, so a change to the schema or the write path
//! shows which index or row it saved (or cost).
//!
//! Only where the benchmark runs beside the server, as root or the server's
//! user: `pg_waldump` reads the server's `pg_wal` directory. Elsewhere the
//! breakdown is skipped with a line saying why; the total is measured
//! either way (`pg_current_wal_lsn`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use sqlx::PgPool;

/// Bytes and records of one relation and record kind.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Share {
    pub(crate) records: u64,
    pub(crate) bytes: u64,
    /// Of `bytes`, the full-page images (the first change to a page after a
    /// checkpoint writes the whole page).
    pub(crate) page_images: u64,
}

/// The breakdown of one LSN range: (relation, record kind) → share.
pub(crate) type Breakdown = BTreeMap<(String, String), Share>;

/// The server's `pg_waldump` and WAL directory, when this process can use them.
async fn tools(pool: &PgPool) -> anyhow::Result<Result<(PathBuf, PathBuf), String>> {
    let data: String = sqlx::query_scalar("SELECT current_setting('data_directory')")
        .fetch_one(pool)
        .await?;
    let version: i32 = sqlx::query_scalar("SELECT current_setting('server_version_num')::int")
        .fetch_one(pool)
        .await?;
    let wal_dir = Path::new(&data).join("pg_wal");
    if std::fs::read_dir(&wal_dir).is_err() {
        return Ok(Err(format!("{} is not readable here", wal_dir.display())));
    }
    let packaged = PathBuf::from(format!(
        "/usr/lib/postgresql/{}/bin/pg_waldump",
        version / 10000
    ));
    let binary = if packaged.exists() {
        packaged
    } else {
        PathBuf::from("pg_waldump")
    };
    Ok(Ok((binary, wal_dir)))
}

/// The WAL between `from` and `to` (LSNs as text) by relation of `pool`'s
/// database and record kind; records of other databases are summed as one
/// line, records with no relation (commits, snapshots) by their kind.
/// `None` when `pg_waldump` cannot run here.
pub(crate) async fn breakdown(
    pool: &PgPool,
    from: &str,
    to: &str,
) -> anyhow::Result<Option<Breakdown>> {
    let (binary, wal_dir) = match tools(pool).await? {
        Ok(found) => found,
        Err(why) => {
            println!("bench: no WAL breakdown: {why}");
            return Ok(None);
        }
    };
    let output = std::process::Command::new(&binary)
        .arg("--path")
        .arg(&wal_dir)
        .args(["--start", from, "--end", to])
        .output();
    let output = match output {
        Ok(output) if output.status.success() || !output.stdout.is_empty() => output,
        Ok(output) => {
            println!(
                "bench: no WAL breakdown: {} said {}",
                binary.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            );
            return Ok(None);
        }
        Err(e) => {
            println!("bench: no WAL breakdown: {} ({e})", binary.display());
            return Ok(None);
        }
    };
    let database: i64 = sqlx::query_scalar(
        "SELECT oid::bigint FROM pg_database WHERE datname = current_database()",
    )
    .fetch_one(pool)
    .await?;
    let names: HashMap<i64, String> = sqlx::query_as::<_, (i64, String)>(
        "SELECT pg_relation_filenode(oid)::bigint, relname::text FROM pg_class
         WHERE pg_relation_filenode(oid) IS NOT NULL",
    )
    .fetch_all(pool)
    .await?
    .into_iter()
    .collect();
    let mut shares = Breakdown::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Some(record) = parse(line) else { continue };
        let relation = match record.relation {
            Some((db, node)) if db == database => names
                .get(&node)
                .cloned()
                .unwrap_or_else(|| format!("relfilenode {node}")),
            Some(_) => "(other databases)".to_owned(),
            None => "(no relation)".to_owned(),
        };
        let share = shares
            .entry((relation, format!("{} {}", record.manager, record.kind)))
            .or_default();
        share.records += 1;
        share.bytes += record.total;
        share.page_images += record.total - record.main;
    }
    Ok(Some(shares))
}

/// One record of `pg_waldump`'s output.
struct Record<'a> {
    manager: &'a str,
    kind: &'a str,
    /// The record without its page images, and with them.
    main: u64,
    total: u64,
    /// The first block's (database oid, relfilenode).
    relation: Option<(i64, i64)>,
}

/// `rmgr: Heap len (rec/tot): 79/ 79, tx: 742, lsn: …, desc: INSERT off 5 …, blkref #0: rel 1663/5/16398 blk 0`
fn parse(line: &str) -> Option<Record<'_>> {
    let rest = line.strip_prefix("rmgr:")?.trim_start();
    let (manager, rest) = rest.split_once(char::is_whitespace)?;
    let (_, rest) = rest.split_once("len (rec/tot):")?;
    let (lengths, rest) = rest.split_once(',')?;
    let (main, total) = lengths.split_once('/')?;
    let (_, desc) = rest.split_once("desc:")?;
    let kind = desc.split_whitespace().next()?.trim_end_matches(',');
    let relation = desc.split_once("rel ").and_then(|(_, after)| {
        let path = after.split_whitespace().next()?;
        let mut parts = path.split('/').skip(1);
        Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
    });
    Some(Record {
        manager,
        kind,
        main: main.trim().parse().ok()?,
        total: total.trim().parse().ok()?,
        relation,
    })
}

/// The breakdown as lines of bytes per job, largest first.
pub(crate) fn print(title: &str, shares: &Breakdown, jobs: usize) {
    #[allow(clippy::cast_precision_loss)]
    let per_job = |bytes: u64| bytes as f64 / jobs as f64;
    let total: u64 = shares.values().map(|s| s.bytes).sum();
    println!(
        "bench: WAL {title}: {:.0} bytes per job, by relation and record:",
        per_job(total)
    );
    let mut lines: Vec<_> = shares.iter().collect();
    lines.sort_by_key(|(_, share)| std::cmp::Reverse(share.bytes));
    for ((relation, kind), share) in lines {
        #[allow(clippy::cast_precision_loss)]
        let records = share.records as f64 / jobs as f64;
        println!(
            "bench:   {relation:<40} {kind:<28} {:>8.1} bytes {:>6.2} records {:>8.1} of it page images",
            per_job(share.bytes),
            records,
            per_job(share.page_images)
        );
    }
}

/// Bytes per relation (summed over record kinds).
pub(crate) fn by_relation(shares: &Breakdown) -> BTreeMap<&str, u64> {
    let mut relations = BTreeMap::new();
    for ((relation, _), share) in shares {
        *relations.entry(relation.as_str()).or_default() += share.bytes;
    }
    relations
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_with_a_page_image_reads_its_relation_kind_and_lengths() {
        let line = "rmgr: Btree       len (rec/tot):     64/  8256, tx:        750, lsn: 0/01A3B2C8, prev 0/01A3B290, desc: INSERT_LEAF off 12, blkref #0: rel 1663/16384/16401 blk 3 FPW";
        let record = parse(line).expect("parsed");
        assert_eq!(record.manager, "Btree");
        assert_eq!(record.kind, "INSERT_LEAF");
        assert_eq!((record.main, record.total), (64, 8256));
        assert_eq!(record.relation, Some((16384, 16401)));
    }

    #[test]
    fn a_commit_has_no_relation_and_other_lines_are_not_records() {
        let line = "rmgr: Transaction len (rec/tot):     34/    34, tx:        750, lsn: 0/01A3B300, prev 0/01A3B2C8, desc: COMMIT 2026-12-02 12:00:00.000000 UTC";
        let record = parse(line).expect("parsed");
        assert_eq!(record.kind, "COMMIT");
        assert_eq!(record.relation, None);
        assert!(parse("pg_waldump: error: could not find file").is_none());
    }
}
