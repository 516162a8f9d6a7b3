import { test, expect, type Page } from "../support/test";
import { mainUrl, startInstance, instanceId, type Instance } from "../support/instances";

// Two (and, for the kill, three) instances on one database. Changes made
// through instance A must show on pages served by instance B within one
// second, without a reload: the fallback poll runs only every 5 s, so only
// the push (NOTIFY -> LISTEN -> server-sent events) can be that fast.

test.describe.configure({ mode: "serial" });

let b: Instance;
test.beforeAll(async () => {
  b = await startInstance(3101);
});
test.afterAll(async () => {
  await b?.stop();
});

/** Marks the page so a reload (which would lose the mark) is detected. */
async function markNoReload(page: Page) {
  await page.evaluate(() => ((window as unknown as { __noReload: boolean }).__noReload = true));
}
async function expectNoReload(page: Page) {
  expect(await page.evaluate(() => (window as unknown as { __noReload?: boolean }).__noReload)).toBe(true);
}

async function goLive(page: Page, url: string) {
  await page.goto(url);
  await expect(page.getByTestId("live-status")).toHaveAttribute("data-state", "live");
  await markNoReload(page);
}

test("a task enqueued through A shows on B's tasks page within a second", async ({ page, request }) => {
  await goLive(page, `${b.url}/tasks`);
  for (let i = 0; i < 3; i++) {
    const res = await request.post(`${mainUrl}/api/tasks`, {
      data: { task_data: { sleep_duration_seconds: 1, probe: i } },
    });
    expect(res.status()).toBe(201);
    const committed = Date.now();
    const task = await res.json();
    await expect(page.locator(`[data-testid="task-row"][data-task-id="${task.id}"]`)).toHaveCount(1, {
      timeout: 1_000,
    });
    expect(Date.now() - committed).toBeLessThan(1_000);
  }
  await expectNoReload(page);
});

test("a lease taken through B shows on A's leases page within a second", async ({ page, request }) => {
  await goLive(page, `${mainUrl}/leases`);
  const resource = `live-${Date.now()}`;
  const res = await request.post(`${b.url}/api/leases`, {
    data: { resource, holder: "pw-live", ttl_seconds: 30 },
  });
  expect(res.ok()).toBeTruthy();
  const committed = Date.now();
  await expect(page.locator(`[data-testid="lease-row"][data-resource="${resource}"]`)).toHaveCount(1, {
    timeout: 1_000,
  });
  expect(Date.now() - committed).toBeLessThan(1_000);
  await expectNoReload(page);
});

test("stop the generator from B while A holds it", async ({ page, request }) => {
  const a = await instanceId(mainUrl);
  // Start it through A (A nudges its own generator at once, so A takes the
  // lease first; if B won the race, try again).
  let holder = "";
  for (let attempt = 0; attempt < 3 && holder !== a; attempt++) {
    await request.delete(`${mainUrl}/api/generator/stop`);
    await expect
      .poll(async () => (await (await request.get(`${mainUrl}/api/generator/status`)).json()).holder, { timeout: 10_000 })
      .toBeNull();
    await request.post(`${mainUrl}/api/generator/start`);
    await expect
      .poll(async () => (await (await request.get(`${mainUrl}/api/generator/status`)).json()).holder, { timeout: 10_000 })
      .not.toBeNull();
    holder = (await (await request.get(`${mainUrl}/api/generator/status`)).json()).holder;
  }
  expect(holder).toBe(a);

  await goLive(page, `${b.url}/instances`);
  await expect(page.getByTestId("generator-holder")).toHaveText(a);
  await page.getByTestId("generator-stop").click();
  await expect(page.getByTestId("generator-desired")).toHaveText("stopped");
  // A sees the request and gives the lease up; B's page shows it live.
  await expect(page.getByTestId("generator-holder")).toHaveText("nobody", { timeout: 10_000 });
  const status = await (await request.get(`${mainUrl}/api/generator/status`)).json();
  expect(status.desired).toBe("stopped");
  expect(status.holder).toBeNull();
  await expectNoReload(page);
});

test("kill instance C from A's dashboard: it exits like a crash and shows dead", async ({ page }) => {
  const c = await startInstance(3102);
  try {
    await goLive(page, `${mainUrl}/instances`);
    const row = page.locator(`[data-testid="instance-row"][data-instance="${c.id}"]`);
    await expect(row).toHaveAttribute("data-alive", "true");
    await row.getByTestId("instance-kill").click();
    await expect(page.getByTestId("instance-action-result")).toContainText(`instance ${c.id} killed`);
    // It died without its graceful shutdown (exit code 137, like kill -9).
    expect(await c.exited).toBe(137);
    // Not marked stopped: it is found dead when its heartbeats stop.
    await expect(row).toHaveAttribute("data-alive", "false", { timeout: 10_000 });
    await expect(row.getByTestId("instance-alive")).toHaveText("dead");
  } finally {
    await c.stop();
  }
});

test("kill B's worker from A's workers page, through B", async ({ page, request }) => {
  const spawned = await request.post(`${b.url}/api/workers`);
  expect(spawned.status()).toBe(201);
  const worker = await spawned.json();
  await goLive(page, `${mainUrl}/workers`);
  const row = page.locator(`[data-testid="worker-row"][data-worker="${worker.id}"]`);
  await expect(row.getByTestId("worker-instance")).toContainText(b.id);
  await row.getByTestId("worker-kill").click();
  await expect(page.getByTestId("worker-action-result")).toContainText(`worker ${worker.id} killed`);
  await expect(row).toHaveAttribute("data-state", "crashed");
  await expectNoReload(page);
});
