import { test, expect, type APIRequestContext } from "../support/test";
import { drain } from "../support/drain";

// Queue limits from the Queues page (issue 39): set on `default` (the queue
// simulated workers serve) through the page's form, shown in the row with
// the busiest keys live while workers run keyed tasks, enforced (a key's
// second task waits while its first runs), a bad value refused naming its
// field; the limits are cleared whatever happens.

async function enqueue(request: APIRequestContext, key: string, seconds: number) {
  const created = await request.post("/api/tasks", {
    data: { task_data: { sleep_duration_seconds: seconds }, concurrency_key: key },
  });
  expect(created.status()).toBe(201);
  return await created.json();
}

test("set a queue's limits from the page: shown live with the busiest keys, enforced, a bad value named", async ({ page, request }) => {
  await request.delete("/api/generator/stop");
  await request.post("/api/queues/default/resume");
  await request.put("/api/queues/default/limits", { data: {} });
  await drain(request);
  try {
    await page.goto("/queues");
    await expect(page.getByTestId("live-status")).toHaveAttribute("data-state", "live");
    const form = page.getByTestId("limits-form");
    await form.getByTestId("limits-name").fill("default");
    await form.getByTestId("limits-max_started").fill("2");
    await form.getByTestId("limits-max_started_per_key").fill("1");
    await form.getByTestId("limits-save").click();
    await expect(page.getByTestId("limits-action-result")).toHaveText("limits of default: at most 2 started, 1 per key");
    const limits = (await (await request.get("/api/queues/default")).json()).limits;
    expect(limits).toEqual({ max_started: 2, max_started_per_key: 1, rate_per_second: null, rate_burst: null });

    // Three workers, two keys: acme's second task waits while its first runs.
    const acme = [await enqueue(request, "acme", 4), await enqueue(request, "acme", 4)];
    const globex = await enqueue(request, "globex", 4);
    for (let i = 0; i < 3; i++) expect((await request.post("/api/workers")).status()).toBe(201);
    const row = page.locator('[data-testid="queue-row"][data-queue="default"]');
    await expect(row.getByTestId("queue-limits-text")).toHaveText("at most 2 started, 1 per key");
    await expect(row.getByTestId("queue-limits")).toHaveAttribute("data-limited", "true");
    await expect(row.getByTestId("queue-busiest-keys")).toHaveText("acme 1, globex 1", { timeout: 10_000 });
    await expect(row.getByTestId("queue-started")).toHaveText("2");
    await expect(row.getByTestId("queue-pending")).toHaveText("1");
    const statuses = async () =>
      Promise.all([...acme, globex].map(async (t) => (await (await request.get(`/api/tasks/${t.id}`)).json()).status));
    const now = await statuses();
    expect(now.filter((s) => s === "started").length).toBe(2);
    expect(now[2]).toBe("started");

    // A bad value: refused naming the field, the limits unchanged.
    await form.getByTestId("limits-max_started").fill("0");
    await form.getByTestId("limits-save").click();
    await expect(page.getByTestId("limits-action-error")).toContainText("max_started must be a whole number between 1 and 100000");
    expect((await (await request.get("/api/queues/default")).json()).limits.max_started).toBe(2);

    // Cleared from the page: every field empty.
    for (const f of ["max_started", "max_started_per_key"]) await form.getByTestId(`limits-${f}`).fill("");
    await form.getByTestId("limits-save").click();
    await expect(page.getByTestId("limits-action-result")).toHaveText("limits of default: none");
    await expect(row.getByTestId("queue-limits-text")).toHaveText("none");
    // With no limit, acme's second task starts at once.
    await expect.poll(async () => (await statuses()).filter((s) => s !== "pending").length, { timeout: 5_000 }).toBe(3);

    const audit = JSON.stringify(await (await request.get("/api/audit")).json());
    expect(audit).toContain("queue_limits");
  } finally {
    await request.put("/api/queues/default/limits", { data: {} });
  }
});
