// graphile-worker baseline for `leasekeeper bench`: enqueue JOBS no-op jobs
// in one go, then time one graphile-worker runner (CONCURRENCY jobs at a
// time, a pool big enough for them) from its start until every job is done.
// Prints one JSON line: {"jobs": N, "seconds": S, "jobs_per_s": R}.
// Written to target/bench-graphile/ and run there by the benchmark.
import { run, makeWorkerUtils, Logger } from "graphile-worker";

const connectionString = process.env.DATABASE_URL;
const jobs = Number(process.env.JOBS);
const concurrency = Number(process.env.CONCURRENCY);
// Errors only: graphile-worker logs every completed job at info level, and
// printing that would slow it down.
const logger = new Logger(() => (level, message) => {
  if (level === "error") console.error(message);
});

const utils = await makeWorkerUtils({ connectionString, logger });
await utils.migrate();
await utils.withPgClient((client) =>
  client.query("DELETE FROM graphile_worker._private_jobs").catch(() =>
    client.query("DELETE FROM graphile_worker.jobs"),
  ),
);
await utils.withPgClient((client) =>
  client.query(
    `SELECT graphile_worker.add_jobs(array(
       SELECT json_populate_record(null::graphile_worker.job_spec,
                json_build_object('identifier', 'noop', 'payload', '{}'::json))
         FROM generate_series(1, $1::int)))`,
    [jobs],
  ),
);
await utils.release();

let done = 0;
let finished;
const allDone = new Promise((resolve) => (finished = resolve));
const started = process.hrtime.bigint();
const runner = await run({
  connectionString,
  concurrency,
  maxPoolSize: concurrency + 2,
  noHandleSignals: true,
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
console.log(JSON.stringify({ jobs, seconds, jobs_per_s: jobs / seconds }));
