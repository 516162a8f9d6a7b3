import { test, expect, type APIRequestContext } from "../support/test";
import { drain } from "../support/drain";

// The e2e server starts with no simulated workers, no chaos and a 3 s TTL
// (see .ci/test); this test spawns the worker it needs. Simulated workers
// serve the queue `default`, so that is the queue paused here; the test
// resumes it whatever happens.

async function enqueue(request: APIRequestContext, seconds: number) {
  const created = await request.post("/api/tasks", { data: { task_data: { sleep_duration_seconds: seconds } } });
  expect(created.status()).toBe(201);
  return await created.json();
}

async function statusOf(request: APIRequestContext, id: number): Promise<string> {
  return (await (await request.get(`/api/tasks/${id}`)).json()).status;
}

test("pause a queue from the page: its started task finishes, nothing new is claimed until the resume", async ({ page, request }) => {
  await request.delete("/api/generator/stop");
  await request.post("/api/queues/default/resume");
  await drain(request);
  try {
    // Long enough to be still running once the page below has hydrated.
    const running = await enqueue(request, 6);
    const spawned = await request.post("/api/workers");
    expect(spawned.status()).toBe(201);
    await expect.poll(() => statusOf(request, running.id), { timeout: 5_000 }).toBe("started");

    await page.goto("/queues");
    await expect(page.getByTestId("nav-queues")).toBeVisible();
    const row = page.locator('[data-testid="queue-row"][data-queue="default"]');
    await expect(row).toHaveAttribute("data-paused", "false");
    await expect(row.getByTestId("queue-started")).toHaveText("1");
    await expect(row.getByTestId("queue-workers")).toHaveText("1");
    // Hydrated and live, so the page's answer shows in place.
    await expect(page.getByTestId("live-status")).toHaveAttribute("data-state", "live");
    await row.getByTestId("queue-pause").click();
    await expect(page.getByTestId("queue-action-result")).toHaveText("paused default");
    await expect(row).toHaveAttribute("data-paused", "true");
    await expect(row.getByTestId("queue-state")).toHaveText("paused");
    const paused = await (await request.get("/api/queues/default")).json();
    expect(paused.paused).toBe(true);

    // Enqueued while paused: pending, and the row says so live.
    const waiting = [await enqueue(request, 1), await enqueue(request, 1)];
    await expect(row.getByTestId("queue-pending")).toHaveText("2");
    // The oldest of them has waited: an age, in the past.
    await expect(row.getByTestId("queue-oldest")).toHaveText(/^\d+(\.\d)? (s|min|h) ago$/);
    // The task already started finishes normally.
    await expect.poll(() => statusOf(request, running.id), { timeout: 10_000 }).toBe("processed");
    // The worker is idle and looks for work every half second: for 3 s it
    // claims nothing of the paused queue.
    const until = Date.now() + 3_000;
    while (Date.now() < until) {
      for (const t of waiting) expect(await statusOf(request, t.id)).toBe("pending");
      await new Promise((r) => setTimeout(r, 250));
    }
    const stillPaused = await (await request.get("/api/queues/default")).json();
    expect(stillPaused.pending).toBe(2);
    expect(stillPaused.started).toBe(0);
    await expect(row.getByTestId("queue-chart")).toBeVisible();

    await row.getByTestId("queue-resume").click();
    await expect(page.getByTestId("queue-action-result")).toHaveText("resumed default");
    const resumedAt = Date.now();
    await expect.poll(() => statusOf(request, waiting[0].id), { timeout: 2_000, intervals: [50] }).not.toBe("pending");
    const claimedWithin = Date.now() - resumedAt;
    expect(claimedWithin).toBeLessThan(2_000);
    await expect(row).toHaveAttribute("data-paused", "false");

    // The audit has both actions.
    const audit = JSON.stringify(await (await request.get("/api/audit")).json());
    expect(audit).toContain("queue_pause");
    expect(audit).toContain("queue_resume");
  } finally {
    // The worker is killed by the shared after-test cleanup.
    await request.post("/api/queues/default/resume");
  }
});
