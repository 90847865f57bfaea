// graphile-worker draining N no-op jobs on the database DATABASE_URL points
// at, with CONCURRENCY jobs at once; prints the jobs/s as JSON on the last
// line. The jobs are queued before the clock starts (one add_jobs call), as
// flotilla-bench queues Flotilla's.
import { Logger, run, makeWorkerUtils } from "graphile-worker";

// Nothing per job on the console: printing would be most of the work.
const logger = new Logger(() => () => {});

const connectionString = process.env.DATABASE_URL;
const jobs = Number(process.argv[2] ?? 5000);
const concurrency = Number(process.env.CONCURRENCY ?? 16);

const utils = await makeWorkerUtils({ connectionString, logger });
await utils.migrate();
// WAL from the queueing to the last job's end: the database's work per job.
const walPosition = () =>
  utils.withPgClient((client) => client.query("SELECT pg_current_wal_lsn()::text AS lsn"));
const walStart = (await walPosition()).rows[0].lsn;
await utils.withPgClient((client) =>
  client.query(
    "SELECT graphile_worker.add_jobs(array_agg(ROW('noop', json_build_object('n', n), NULL, NULL, NULL, NULL, NULL, NULL)::graphile_worker.job_spec)) FROM generate_series(1, $1) n",
    [jobs],
  ),
);
let done = 0;
let finished;
const allDone = new Promise((resolve) => (finished = resolve));
const started = process.hrtime.bigint();
const runner = await run({
  connectionString,
  concurrency,
  noHandleSignals: true,
  maxPoolSize: concurrency + 2,
  pollInterval: 1000,
  logger,
  taskList: {
    noop: async () => {
      done += 1;
      if (done === jobs) finished();
    },
  },
});
await allDone;
const seconds = Number(process.hrtime.bigint() - started) / 1e9;
await runner.stop();
const wal = await utils.withPgClient((client) =>
  client.query("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8 AS bytes", [walStart]),
);
await utils.release();
console.log(
  JSON.stringify({
    jobs,
    concurrency,
    seconds,
    jobs_per_second: jobs / seconds,
    wal_bytes_per_job: wal.rows[0].bytes / jobs,
  }),
);
