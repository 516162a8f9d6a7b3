// graphile-worker contestant of `leasekeeper-tools bench` (see race.rs for the
// protocol every contestant is measured by). Written to
// target/bench-graphile/ and run there by the benchmark, in one of three
// modes (MODE):
//
// - prepare: install graphile-worker's schema if needed, delete every job,
//   then queue JOBS no-op jobs in one statement (graphile_worker.add_jobs).
//   Untimed: the bench then vacuums, analyzes and checkpoints.
// - serve: one runner of CONCURRENCY jobs at a time (a pool of
//   CONCURRENCY + 2 connections, so no worker waits for one) on the jobs
//   queued; prints "ready" once it runs, and stops gracefully on SIGTERM.
//   The bench counts completions from the database, not here. LOCAL_QUEUE
//   (a size) turns on the local queue (jobs fetched in batches) and
//   BATCH_DELAY (ms) batched completions and failures, graphile-worker's
//   documented fast path (0.17, "Performance" in its docs), set through
//   `preset.worker`. NO_LOG_SUCCESS=1, read by graphile-worker itself, skips
//   its log line per completed job, as its own performance test does.
// - add_jobs: graphile-worker's bulk insert, timed: one untimed `addJobs`
//   call of JOBS jobs (the warm-up), delete them, CHECKPOINT, then one timed
//   `addJobs` call of JOBS jobs (WorkerUtils, over the add_jobs SQL
//   function), checked to be all there.
//
// Prints JSON lines on stdout.
import { run, makeWorkerUtils, Logger } from "graphile-worker";

const connectionString = process.env.DATABASE_URL;
const jobs = Number(process.env.JOBS ?? 0);
const concurrency = Number(process.env.CONCURRENCY ?? 16);
const localQueue = Number(process.env.LOCAL_QUEUE ?? 0);
const batchDelay = process.env.BATCH_DELAY;
const mode = process.env.MODE ?? "serve";
// Errors only: nothing of graphile-worker's is printed but a failure.
const logger = new Logger(() => (level, message) => {
  if (level === "error") console.error(message);
});

const utils = await makeWorkerUtils({ connectionString, logger });
await utils.migrate();
const query = (sql, args) => utils.withPgClient((client) => client.query(sql, args));
const count = async () =>
  (await query("SELECT count(*)::int AS n FROM graphile_worker._private_jobs")).rows[0].n;

if (mode === "prepare") {
  await query("DELETE FROM graphile_worker._private_jobs");
  await query(
    `SELECT graphile_worker.add_jobs(array(
       SELECT json_populate_record(null::graphile_worker.job_spec,
                json_build_object('identifier', 'noop', 'payload', '{}'::json))
         FROM generate_series(1, $1::int)))`,
    [jobs],
  );
  const n = await count();
  await utils.release();
  if (n !== jobs) {
    console.error(`${n} jobs queued of ${jobs}`);
    process.exit(1);
  }
  console.log(JSON.stringify({ mode, jobs }));
  process.exit(0);
}

if (mode === "add_jobs") {
  const specs = () =>
    Array.from({ length: jobs }, () => ({ identifier: "noop", payload: {} }));
  await query("DELETE FROM graphile_worker._private_jobs");
  await utils.addJobs(specs());
  await query("DELETE FROM graphile_worker._private_jobs");
  await query("CHECKPOINT");
  const batch = specs();
  const started = process.hrtime.bigint();
  await utils.addJobs(batch);
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  const n = await count();
  await query("DELETE FROM graphile_worker._private_jobs");
  await utils.release();
  if (n !== jobs) {
    console.error(`${n} jobs queued of ${jobs}`);
    process.exit(1);
  }
  console.log(JSON.stringify({ mode, jobs, seconds, jobs_per_s: jobs / seconds }));
  process.exit(0);
}

await utils.release();
const worker = {};
if (localQueue > 0) worker.localQueue = { size: localQueue };
if (batchDelay !== undefined) {
  worker.completeJobBatchDelay = Number(batchDelay);
  worker.failJobBatchDelay = Number(batchDelay);
}
const runner = await run({
  connectionString,
  concurrency,
  maxPoolSize: concurrency + 2,
  noHandleSignals: true,
  logger,
  preset: { worker },
  taskList: { noop: async () => {} },
});
let stopping = false;
process.on("SIGTERM", async () => {
  if (stopping) return;
  stopping = true;
  await runner.stop();
  process.exit(0);
});
console.log("ready");
await runner.promise;
