import { test, expect, type Page } from "../support/test";
import { mainUrl, startInstance, type Instance } from "../support/instances";

// The README demo's situation: several instances on one database, simulated
// workers on each, chaos on, the generator running. Found walking it: a
// browser panic on some page loads, workers of a dead instance shown as
// working (with controls that fail), and a page whose own instance was
// killed from it showing a raw error per refetch.

test.describe.configure({ mode: "serial" });

const busy = {
  LEASEKEEPER_WORKERS: "3",
  LEASEKEEPER_CHAOS: "1",
  LEASEKEEPER_CRASH_PROBABILITY: "0.05",
  LEASEKEEPER_STALL_PROBABILITY: "0.05",
  LEASEKEEPER_GENERATOR_INTERVAL_SECS: "1",
  LEASEKEEPER_GENERATOR_MAX_SLEEP_SECS: "3",
};

let b: Instance;
let c: Instance;
test.beforeAll(async ({ request }) => {
  [b, c] = await Promise.all([startInstance(3103, busy), startInstance(3104, busy)]);
  expect((await request.post(`${b.url}/api/generator/start`)).ok()).toBeTruthy();
});
test.afterAll(async ({ request }) => {
  await request.delete(`${mainUrl}/api/generator/stop`);
  await Promise.all([b?.stop(), c?.stop()]);
});

/** Collects every console error and uncaught exception of `page`. */
function watchErrors(page: Page): string[] {
  const errors: string[] = [];
  page.on("console", (m) => {
    if (m.type() === "error") errors.push(`${page.url()}: ${m.text()}`);
  });
  page.on("pageerror", (e) => errors.push(`${page.url()}: ${e.message}`));
  return errors;
}

test("every page, on two instances of a busy cluster, runs without a browser error", async ({ page, request }) => {
  test.setTimeout(240_000);
  const errors = watchErrors(page);
  // Busy: tasks being worked on by the chaos instances' workers.
  await expect
    .poll(async () => (await (await request.get(`${mainUrl}/api/tasks/started`)).json()).length, { timeout: 20_000 })
    .toBeGreaterThan(0);
  const started = (await (await request.get(`${mainUrl}/api/tasks/started`)).json())[0];
  const leases = await (await request.get(`${mainUrl}/api/leases`)).json();
  const pages = [
    "/",
    "/leases",
    `/leases?id=${leases[leases.length - 1].id}`,
    "/tasks",
    `/tasks?id=${started.id}`,
    "/workers",
    "/workers?show=all",
    "/instances",
  ];
  for (const base of [mainUrl, b.url]) {
    for (const path of pages) {
      await page.goto(`${base}${path}`);
      await expect(page.getByTestId("live-status")).toHaveAttribute("data-state", "live");
      // Long enough for several pushed refetches and clock ticks.
      await page.waitForTimeout(2_500);
    }
  }
  expect(errors).toEqual([]);
  // The generator's countdown still moves (it froze after the panic).
  await page.goto(`${mainUrl}/instances`);
  const expiry = page.getByTestId("generator-expiry");
  await expect(expiry).toContainText("expires in");
  const first = await expiry.textContent();
  await expect.poll(async () => expiry.textContent(), { timeout: 3_000 }).not.toBe(first);
  expect(errors).toEqual([]);
});

test("a dead instance's workers show unreachable, without controls, and are not counted busy", async ({ page, request }) => {
  test.setTimeout(120_000);
  const d = await startInstance(3105, { ...busy, LEASEKEEPER_CHAOS: "0" });
  try {
    // d's workers get busy; then d dies like a crash. The generator's
    // trickle (about two tasks at a time) can leave d's workers idle for
    // long (a CI run saw none working in 20 s), so give every worker of
    // the three instances a long task: then d's three are working too.
    for (let i = 0; i < 12; i++) {
      const created = await request.post(`${mainUrl}/api/tasks`, {
        data: { task_data: { sleep_duration_seconds: 4 } },
      });
      expect(created.status()).toBe(201);
    }
    await expect
      .poll(
        async () =>
          (await (await request.get(`${mainUrl}/api/workers`)).json()).filter(
            (w: { instance_id: string; state: string }) => w.instance_id === d.id && w.state === "working",
          ).length,
        { timeout: 20_000 },
      )
      .toBeGreaterThan(0);
    const theirs: string[] = (await (await request.get(`${mainUrl}/api/workers`)).json())
      .filter((w: { instance_id: string }) => w.instance_id === d.id)
      .map((w: { id: string }) => w.id);
    const killed = await request.post(`${mainUrl}/api/instances/${d.id}/kill`);
    expect(killed.ok()).toBeTruthy();
    expect(await d.exited).toBe(137);

    await page.goto(`${mainUrl}/workers`);
    for (const id of theirs) {
      const row = page.locator(`[data-testid="worker-row"][data-worker="${id}"]`);
      // The instance is found dead within its alive window (a few seconds),
      // long before the workers' own rows would go stale.
      await expect(row).toHaveAttribute("data-alive", "false", { timeout: 10_000 });
      await expect(row.getByTestId("worker-state")).toHaveText("unreachable");
      await expect(row.getByTestId("worker-gone-why")).toContainText(`instance ${d.id} is dead`);
      await expect(row.getByTestId("worker-kill")).toHaveCount(0);
      await expect(row.getByTestId("worker-pause")).toHaveCount(0);
      await expect(row.getByTestId("worker-heartbeat-age")).toHaveText("");
    }
    // Listed under "gone", not under "alive".
    await page.getByTestId("filter-alive").click();
    await expect(page).toHaveURL(/show=alive/);
    await expect(page.locator(`[data-testid="worker-row"][data-worker="${theirs[0]}"]`)).toHaveCount(0);
    await page.getByTestId("filter-gone").click();
    await expect(page.locator(`[data-testid="worker-row"][data-worker="${theirs[0]}"]`)).toHaveCount(1);

    // A kill sent anyway (over REST) is refused in words, not a network error.
    const refused = await request.post(`${mainUrl}/api/workers/${theirs[0]}/kill`);
    expect(refused.status()).toBe(409);
    const body = await refused.json();
    expect(body.error).toContain("is not running");
    expect(body.error).not.toMatch(/reqwest|error sending request|tcp connect/i);

    // The overview counts none of them as busy, or alive.
    await page.goto(`${mainUrl}/`);
    for (const id of theirs) {
      await expect(page.locator(`[data-testid="overview-worker"][data-worker="${id}"]`)).toHaveCount(0, { timeout: 15_000 });
    }
  } finally {
    await d.stop();
  }
});

test("killing the instance that serves the page asks first, then says which instance to open", async ({ page }) => {
  const e = await startInstance(3106, { LEASEKEEPER_WORKERS: "0" });
  try {
    await page.goto(`${e.url}/instances`);
    await expect(page.getByTestId("live-status")).toHaveAttribute("data-state", "live");
    const own = page.locator(`[data-testid="instance-row"][data-instance="${e.id}"]`);
    await own.getByTestId("instance-kill").click();
    // Nothing killed yet: the page asks, naming live instances to go to.
    const confirm = page.getByTestId("instance-kill-confirm");
    await expect(confirm).toBeVisible();
    await expect(confirm).toContainText(e.id);
    await expect(confirm.getByTestId("confirm-other").first()).toBeVisible();
    const others = await confirm.getByTestId("confirm-other").allTextContents();
    expect(others).toContain(new URL(mainUrl).host);
    expect(e.proc.exitCode).toBeNull();
    // Cancel keeps it alive.
    await confirm.getByTestId("instance-kill-cancel").click();
    await expect(confirm).toHaveCount(0);
    expect(e.proc.exitCode).toBeNull();

    await own.getByTestId("instance-kill").click();
    await page.getByTestId("instance-kill-confirmed").click();
    await expect(page.getByTestId("instance-action-result")).toContainText(`instance ${e.id} killed`);
    expect(await e.exited).toBe(137);
    const gone = page.getByTestId("server-gone");
    await expect(gone).toBeVisible();
    await expect(gone.getByTestId("server-gone-link").filter({ hasText: new URL(mainUrl).host })).toHaveCount(1);
    await expect(page.getByTestId("live-status")).toHaveAttribute("data-state", "gone");
    // Past a fallback poll and a stream retry: still no error boxes.
    await page.waitForTimeout(7_000);
    await expect(page.locator('[data-testid$="-error"]:visible')).toHaveCount(0);
  } finally {
    await e.stop();
  }
});
