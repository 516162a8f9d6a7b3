import { test, expect, type Page } from "../support/test";
import { spawn, type ChildProcess } from "node:child_process";
import { rmSync } from "node:fs";
import path from "node:path";

// The README's failover demo, as a newcomer does it: `leasekeeper-tools cluster
// -n 3 --lease-ttl-secs 6` with the README's defaults (4 simulated workers
// per instance, chaos on, generated tasks of 1-12 s), on a database of its
// own; start the generator from the page, kill a busy worker from the page,
// kill the generator's holder instance from the page, and read both
// takeovers on the stopwatch within their bound.

test.describe.configure({ mode: "serial" });

const root = path.resolve(__dirname, "..", "..");
const BASE = 3120;
const urls = [0, 1, 2].map((i) => `http://127.0.0.1:${BASE + i}`);
const dataDir = path.join(root, "target", "leasekeeper-demo-db");
let cluster: ChildProcess;
let exited: Promise<number | null>;

test.beforeAll(async () => {
  test.setTimeout(120_000);
  rmSync(dataDir, { recursive: true, force: true });
  // The README's demo settings: only what the e2e run overrides is reset.
  const env = { ...process.env };
  for (const k of ["LEASEKEEPER_LEASE_TTL_SECS", "LEASEKEEPER_WORKERS", "LEASEKEEPER_CHAOS", "LEPTOS_SITE_ADDR", "DATABASE_URL"]) delete env[k];
  env.LEASEKEEPER_DATA_DIR = dataDir;
  cluster = spawn(
    path.join(root, "target", "debug", "leasekeeper-tools"),
    ["cluster", "-n", "3", "--base-port", String(BASE), "--lease-ttl-secs", "6"],
    { cwd: root, env, stdio: ["ignore", "inherit", "inherit"] },
  );
  exited = new Promise((resolve) => cluster.on("exit", (code) => resolve(code)));
  const deadline = Date.now() + 100_000;
  for (const url of urls) {
    for (;;) {
      if (cluster.exitCode !== null) throw new Error(`leasekeeper-tools cluster exited with ${cluster.exitCode}`);
      try {
        if ((await fetch(`${url}/readyz`)).ok) break;
      } catch {
        // not up yet
      }
      if (Date.now() > deadline) throw new Error(`${url} did not come up`);
      await new Promise((r) => setTimeout(r, 250));
    }
  }
});

test.afterAll(async () => {
  if (cluster && cluster.exitCode === null) {
    cluster.kill("SIGTERM");
    await exited;
  }
});

async function json(url: string) {
  return (await fetch(url)).json();
}

/** The stopwatch row of `resource` after a kill of `subject`: taken over within the bound. */
async function takenOverWithinBound(page: Page, resource: string, subject: string) {
  const row = page.locator(`[data-testid="stopwatch-row"][data-resource="${resource}"][data-subject="${subject}"]`);
  await expect(row).toHaveAttribute("data-state", "taken_over", { timeout: 20_000 });
  const elapsed = Number(await row.getByTestId("stopwatch-elapsed").getAttribute("data-ms"));
  const bound = Number(await row.getByTestId("stopwatch-bound").getAttribute("data-ms"));
  expect(bound).toBeGreaterThan(0);
  expect(elapsed, `${resource}: ${elapsed} ms against a bound of ${bound} ms`).toBeLessThanOrEqual(bound);
  return elapsed;
}

test("the README demo: generator on, a busy worker killed and the generator's instance killed from the page, both taken over within the bound", async ({ page }) => {
  test.setTimeout(150_000);
  // Three instances, twelve workers, all alive.
  await page.goto(`${urls[0]}/instances`);
  await expect(page.locator('[data-testid="instance-row"][data-alive="true"]')).toHaveCount(3, { timeout: 15_000 });

  // Start the generator from the page; one instance holds it.
  await page.getByTestId("generator-start").click();
  await expect(page.getByTestId("generator-desired")).toHaveText("running");
  await expect(page.getByTestId("generator-holder")).toHaveText(/^i-/, { timeout: 15_000 });

  // Kill a busy worker from the workers page. Between reading its row and
  // the kill it may have finished that task (and gone idle: nothing to
  // take over); then another busy worker is killed, three tries at most.
  await page.goto(`${urls[0]}/workers`);
  const busy = page.locator('[data-testid="worker-row"][data-state="working"]');
  let victim: { worker: string; task: string } | undefined;
  for (let tries = 0; tries < 3 && !victim; tries++) {
    await expect(busy.first()).toBeVisible({ timeout: 30_000 });
    const row = busy.first();
    const worker = await row.getAttribute("data-worker");
    const task = await row.getAttribute("data-task");
    expect(worker, "a worker id").toBeTruthy();
    expect(task, "the task it works on").toBeTruthy();
    await row.getByTestId("worker-kill").click();
    await expect(page.getByTestId("worker-action-result")).toContainText(`worker ${worker} killed`);
    // Dead, it cannot finish the task: unless it had finished it already
    // (processed or failed by it), it held it at the kill. Its claim is
    // ended at once by its instance's liveness session, so the task may
    // already be another worker's.
    const after = await json(`${urls[0]}/api/tasks/${task}`);
    const finishedByIt = after.processor === worker && after.status !== "started";
    if (!finishedByIt) victim = { worker: worker!, task: task! };
  }
  expect(victim, "a worker killed while it held its task").toBeTruthy();
  const workerMs = await takenOverWithinBound(page, `task:${victim!.task}`, victim!.worker);
  // A killed worker is certainly dead: its claim was ended by its
  // instance's liveness session, not left to run out its 6 s TTL.
  const killedRow = page.locator(`[data-testid="stopwatch-row"][data-resource="task:${victim!.task}"][data-subject="${victim!.worker}"]`);
  await expect(killedRow.getByTestId("stopwatch-rule")).toHaveAttribute("data-rule", "session");
  expect(workerMs, "rescued before the TTL could have run out").toBeLessThan(6_000);

  // Kill the generator's holder from another instance's page.
  const status = await json(`${urls[0]}/api/generator/status`);
  const holder: string = status.holder;
  const instances: { id: string; address: string }[] = await json(`${urls[0]}/api/instances`);
  const from = urls.find((u) => !u.endsWith(instances.find((i) => i.id === holder)!.address))!;
  await page.goto(`${from}/instances`);
  const row = page.locator(`[data-testid="instance-row"][data-instance="${holder}"]`);
  await expect(row).toContainText("holds the generator");
  await row.getByTestId("instance-kill").click();
  await expect(row).toHaveAttribute("data-alive", "false", { timeout: 15_000 });
  const generatorMs = await takenOverWithinBound(page, "singleton:generator", holder);
  // Another instance holds it now and the generator keeps running.
  await expect(page.getByTestId("generator-holder")).not.toHaveText(holder, { timeout: 15_000 });
  await expect(page.getByTestId("generator-desired")).toHaveText("running");
  console.log(`demo: worker kill taken over in ${workerMs} ms, generator holder kill in ${generatorMs} ms`);
});
