//! A primary and a streaming standby of the installed Postgres, on loopback
//! ports of their own, for tests of a failover: `initdb` the primary,
//! `pg_basebackup` the standby from it, and stream the primary's WAL to the
//! standby through a [`Proxy`] (the `link`) the test controls. Holding the
//! link stalls replication while the primary goes on committing (with
//! asynchronous replication); cutting it drops what it held, so those
//! commits never reach the standby. Synchronous replication makes every
//! commit wait until the standby has flushed it.
//!
//! Its waits poll the servers with `psql` while the link's proxy forwards on
//! the async runtime: use it from a multi-threaded runtime.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::postgres_server::{
    Server, as_server_user, hand_to_server_user, initdb, run, scratch_dir,
};
use crate::proxy::Proxy;

/// How the standby is fed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// The primary commits without waiting for the standby.
    Asynchronous,
    /// A commit returns (and becomes visible) only once the standby has
    /// flushed it (`synchronous_commit = on`, the standby named in
    /// `synchronous_standby_names`).
    Synchronous,
}

/// The standby's name in `synchronous_standby_names`.
const STANDBY_NAME: &str = "standby";

#[derive(Debug)]
pub struct ReplicatedPostgres {
    pub primary: Server,
    pub standby: Server,
    /// The standby's WAL stream from the primary passes through it.
    pub link: Proxy,
    pub mode: Replication,
    dir: PathBuf,
}

impl ReplicatedPostgres {
    /// Starts the primary and the standby, and returns once the standby
    /// streams (synchronously, with [`Replication::Synchronous`]).
    ///
    /// # Panics
    /// A server cannot be set up or does not stream within a minute.
    pub async fn start(mode: Replication) -> Self {
        let dir = scratch_dir("flotilla-replicated");
        hand_to_server_user(&dir);
        let (primary_data, standby_data) = (dir.join("primary"), dir.join("standby"));
        let mut settings = vec![
            // The machine does not crash in these tests, only the server's
            // processes: what they wrote stays in the page cache.
            "fsync=off".to_owned(),
            "max_wal_senders=4".to_owned(),
            "wal_keep_size=512MB".to_owned(),
            // A restarted WAL receiver connects again quickly.
            "wal_retrieve_retry_interval=200ms".to_owned(),
            "max_connections=200".to_owned(),
        ];
        // The standby, once promoted, has no standby of its own to wait for.
        let standby_settings = settings.clone();
        if mode == Replication::Synchronous {
            settings.push(format!("synchronous_standby_names={STANDBY_NAME}"));
        }
        let (primary, socket_dir) = {
            let (data, dir, settings) = (primary_data.clone(), dir.clone(), settings.clone());
            tokio::task::spawn_blocking(move || {
                initdb(&data);
                std::fs::write(
                    data.join("pg_hba.conf"),
                    "local all all trust\nhost all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n",
                )
                .unwrap();
                hand_to_server_user(&data);
                (Server::start(&data, &dir, &settings), dir)
            })
            .await
            .unwrap()
        };
        let link = Proxy::start(primary.address()).await;
        let standby = {
            let (port, link_port) = (primary.port, link.address().port());
            let data = standby_data.clone();
            tokio::task::spawn_blocking(move || {
                let mut backup = as_server_user("pg_basebackup");
                backup
                    .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres"])
                    .args(["-X", "stream", "--no-sync", "-D"])
                    .arg(&data);
                run(backup, "pg_basebackup");
                std::fs::write(data.join("standby.signal"), "").unwrap();
                let conninfo = format!(
                    "\nprimary_conninfo = 'host=127.0.0.1 port={link_port} user=postgres application_name={STANDBY_NAME}'\n"
                );
                let auto_conf = data.join("postgresql.auto.conf");
                let mut conf = std::fs::read_to_string(&auto_conf).unwrap_or_default();
                conf.push_str(&conninfo);
                std::fs::write(&auto_conf, conf).unwrap();
                hand_to_server_user(&data);
                Server::start(&data, &socket_dir, &standby_settings)
            })
            .await
            .unwrap()
        };
        let pair = Self {
            primary,
            standby,
            link,
            mode,
            dir,
        };
        pair.wait_streaming().await;
        pair
    }

    async fn wait_streaming(&self) {
        let wanted = match self.mode {
            Replication::Asynchronous => "async",
            Replication::Synchronous => "sync",
        };
        let sql = format!(
            "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = '{wanted}'"
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.primary.try_query(&sql).as_deref() != Some("1") {
            assert!(
                Instant::now() < deadline,
                "the standby did not stream ({wanted}) within a minute"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A URL of `database` on `server`.
    #[must_use]
    pub fn url(address: std::net::SocketAddr, database: &str) -> String {
        format!("postgres://postgres@{address}/{database}")
    }
}

impl Drop for ReplicatedPostgres {
    fn drop(&mut self) {
        self.primary.stop();
        self.standby.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
