// graphile-worker baseline for `leasekeeper-tools bench`: enqueue JOBS no-op jobs
// in one go, then time one graphile-worker runner (CONCURRENCY jobs at a
// time, a pool big enough for them) from its start until every job is done
// and the runner has stopped (so batched completions are committed too),
// then check that no job is left.
//
// FAST=1 turns on graphile-worker's documented fast path (0.17, "Performance"
// in its docs), set through `preset.worker`: a local queue of 500 jobs
// fetched in one query, and completions and failures written in batches
// (a delay of 0 ms: whatever completed in the same tick goes in one query).
//
// MODE=add_jobs instead times graphile-worker's bulk insert on the emptied
// queue: one `addJobs` call (WorkerUtils, over the `add_jobs` SQL function)
// of JOBS no-op jobs, and checks they are all there.
//
// Prints one JSON line: {"jobs": N, "seconds": S, "jobs_per_s": R, ...}.
// Written to target/bench-graphile/ and run there by the benchmark.
import { run, makeWorkerUtils, Logger } from "graphile-worker";

const connectionString = process.env.DATABASE_URL;
const jobs = Number(process.env.JOBS);
const concurrency = Number(process.env.CONCURRENCY);
const fast = process.env.FAST === "1";
const mode = process.env.MODE ?? "run";
// Errors only: graphile-worker logs every completed job at info level, and
// printing that would slow it down.
const logger = new Logger(() => (level, message) => {
  if (level === "error") console.error(message);
});

const utils = await makeWorkerUtils({ connectionString, logger });
await utils.migrate();
await utils.withPgClient((client) =>
  client.query("DELETE FROM graphile_worker._private_jobs"),
);
if (mode === "add_jobs") {
  const specs = Array.from({ length: jobs }, () => ({
    identifier: "noop",
    payload: {},
  }));
  const started = process.hrtime.bigint();
  await utils.addJobs(specs);
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  const queued = await utils.withPgClient((client) =>
    client.query("SELECT count(*)::int AS n FROM graphile_worker._private_jobs"),
  );
  await utils.release();
  if (queued.rows[0].n !== jobs) {
    console.error(`${queued.rows[0].n} jobs queued of ${jobs}`);
    process.exit(1);
  }
  console.log(JSON.stringify({ mode, jobs, seconds, jobs_per_s: jobs / seconds }));
  process.exit(0);
}
await utils.withPgClient((client) =>
  client.query(
    `SELECT graphile_worker.add_jobs(array(
       SELECT json_populate_record(null::graphile_worker.job_spec,
                json_build_object('identifier', 'noop', 'payload', '{}'::json))
         FROM generate_series(1, $1::int)))`,
    [jobs],
  ),
);

const preset = fast
  ? {
      worker: {
        localQueue: { size: 500 },
        completeJobBatchDelay: 0,
        failJobBatchDelay: 0,
      },
    }
  : {};

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
  preset,
  taskList: {
    noop: async () => {
      done += 1;
      if (done === jobs) finished();
    },
  },
});
await allDone;
const handled = Number(process.hrtime.bigint() - started) / 1e9;
await runner.stop();
const seconds = Number(process.hrtime.bigint() - started) / 1e9;
const left = await utils.withPgClient((client) =>
  client.query("SELECT count(*)::int AS n FROM graphile_worker._private_jobs"),
);
await utils.release();
if (left.rows[0].n !== 0) {
  console.error(`${left.rows[0].n} jobs left after the run`);
  process.exit(1);
}
console.log(
  JSON.stringify({
    jobs,
    fast,
    seconds,
    seconds_to_last_handler: handled,
    jobs_per_s: jobs / seconds,
  }),
);
