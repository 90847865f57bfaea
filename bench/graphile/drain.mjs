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
await utils.release();
console.log(JSON.stringify({ jobs, concurrency, seconds, jobs_per_second: jobs / seconds }));
