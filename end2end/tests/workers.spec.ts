import { test, expect, type APIRequestContext, type Page } from "../support/test";
import { drain } from "../support/drain";
import { spawnFromPage } from "../support/workers";

// The e2e server starts with no simulated workers, no chaos and a 3 s TTL
// (see .ci/test); this test spawns the workers it needs.

/**
 * Enqueues a task of `seconds`, spawns one worker from the page and waits
 * until it is working on that task; returns the task and the worker's row.
 */
async function spawnBusyWorker(page: Page, request: APIRequestContext, seconds: number, extra: Record<string, unknown> = {}) {
  const created = await request.post("/api/tasks", { data: { task_data: { sleep_duration_seconds: seconds }, ...extra } });
  expect(created.status()).toBe(201);
  const task = await created.json();
  await page.goto("/workers");
  await spawnFromPage(page);
  const busy = page.locator(`[data-testid="worker-row"][data-task="${task.id}"][data-state="working"]`);
  await expect(busy).toHaveCount(1, { timeout: 5_000 });
  return { task, busy, busyId: (await busy.getAttribute("data-worker"))! };
}

test("kill a busy worker and see its task taken over by another worker", async ({ page, request }) => {
  await request.delete("/api/generator/stop");
  await drain(request);
  // The new worker claims our task.
  const { task, busy, busyId } = await spawnBusyWorker(page, request, 30);
  const claimed = await (await request.get(`/api/tasks/${task.id}`)).json();
  expect(claimed.processor).toBe(busyId);

  // A second worker waits idle; then the busy one is killed.
  await spawnFromPage(page);
  await busy.getByTestId("worker-kill").click();
  const killed = page.locator(`[data-testid="worker-row"][data-worker="${busyId}"]`);
  await expect(killed).toHaveAttribute("data-state", "crashed");

  // The instance's liveness session ends the dead worker's claim at once
  // (no waiting out the 3 s TTL) and the other worker takes the task over.
  await expect
    .poll(async () => (await (await request.get(`/api/tasks/${task.id}`)).json()).processor, { timeout: 10_000 })
    .not.toBe(busyId);
  const taken = await (await request.get(`/api/tasks/${task.id}`)).json();
  expect(taken.status).toBe("started");
  expect(taken.fencing_token).toBe(claimed.fencing_token + 1);
  expect(taken.attempts).toBe(2);
  const rescuer = page.locator(`[data-testid="worker-row"][data-worker="${taken.processor}"]`);
  await expect(rescuer).toHaveAttribute("data-state", "working");
  await expect(rescuer).toHaveAttribute("data-task", String(task.id));

  // The stopwatch timed it: from the kill to the takeover, within the
  // bound TTL + renew interval.
  const watch = page.locator(`[data-testid="stopwatch-row"][data-resource="task:${task.id}"]`);
  await expect(watch).toHaveAttribute("data-state", "taken_over");
  const elapsed = Number(await watch.getByTestId("stopwatch-elapsed").getAttribute("data-ms"));
  const bound = Number(await watch.getByTestId("stopwatch-bound").getAttribute("data-ms"));
  expect(elapsed).toBeGreaterThan(0);
  expect(elapsed).toBeLessThanOrEqual(bound);
  // Ended by its session, not by the TTL: sooner than the lease (3 s)
  // could have run out.
  await expect(watch.getByTestId("stopwatch-rule")).toHaveAttribute("data-rule", "session");
  await expect(watch.getByTestId("stopwatch-rule")).toHaveText("by its session");
  expect(elapsed).toBeLessThan(3_000);

  // The task page shows the takeover in the lease history, and the timeline
  // draws two terms: the killed worker's, ended by the takeover, and the
  // rescuer's, still held, with the next token.
  await page.goto(`/tasks?id=${task.id}`);
  await expect(page.getByTestId("task-detail").locator('[data-kind="taken_over"]')).toHaveCount(1);
  const timeline = page.locator(`[data-testid="timeline"][data-resource="task:${task.id}"]`);
  const terms = timeline.getByTestId("timeline-term");
  await expect(terms).toHaveCount(2);
  await expect(terms.nth(0)).toHaveAttribute("data-holder", busyId);
  await expect(terms.nth(0)).toHaveAttribute("data-end", "taken_over");
  await expect(terms.nth(1)).toHaveAttribute("data-holder", taken.processor);
  await expect(terms.nth(1)).toHaveAttribute("data-token", String(claimed.fencing_token + 1));
  await expect(timeline.getByTestId("timeline-takeover")).toHaveCount(1);
  // Nobody held the task from the first term's expiry (its ×) to the
  // takeover (its ▼): the drawing shades that gap, and only it. The history
  // keeps milliseconds, and a takeover can land in the very millisecond
  // the lease ran out (once in CI, 3.000 s after the claim): then there is
  // no gap to shade. Read from one rendering (a live refetch redraws it).
  const drawn = await timeline.locator('svg[role="img"]').evaluate((svg) => ({
    expiry: Number(svg.querySelector('[data-testid="timeline-expiry"]')!.getAttribute("x")),
    takeover: Number(/^M([\d.]+)/.exec(svg.querySelector('[data-testid="timeline-takeover"]')!.getAttribute("d")!)![1]),
    gaps: [...svg.querySelectorAll('[data-testid="timeline-gap"]')].map((g) => ({
      x: Number(g.getAttribute("x")),
      width: Number(g.getAttribute("width")),
    })),
  }));
  if (drawn.takeover > drawn.expiry) {
    expect(drawn.gaps).toHaveLength(1);
    expect(drawn.gaps[0].x).toBeCloseTo(drawn.expiry, 3);
    // At least half a pixel wide, however short.
    expect(drawn.gaps[0].width).toBeCloseTo(Math.max(drawn.takeover - drawn.expiry, 0.5), 3);
  } else {
    expect(drawn.takeover).toBe(drawn.expiry);
    expect(drawn.gaps).toEqual([]);
  }

  // Leave nothing running for other tests.
  await page.goto("/workers");
  for (const id of [taken.processor]) {
    await page.locator(`[data-testid="worker-row"][data-worker="${id}"]`).getByTestId("worker-kill").click();
    await expect(page.locator(`[data-testid="worker-row"][data-worker="${id}"]`)).toHaveAttribute("data-state", "crashed");
  }
});

test("a paused worker's late completion is refused by its fencing token", async ({ page, request }) => {
  await drain(request);
  const { task, busy, busyId: pausedId } = await spawnBusyWorker(page, request, 6);
  await busy.getByTestId("worker-pause").click();
  const paused = page.locator(`[data-testid="worker-row"][data-worker="${pausedId}"]`);
  await expect(paused).toHaveAttribute("data-state", "paused");

  // While it is frozen past the TTL, a rescuer takes the task over and finishes it.
  await page.getByTestId("worker-spawn").click();
  await expect
    .poll(async () => (await (await request.get(`/api/tasks/${task.id}`)).json()).status, { timeout: 20_000 })
    .toBe("processed");
  const done = await (await request.get(`/api/tasks/${task.id}`)).json();
  expect(done.processor).not.toBe(pausedId);
  // A paused worker is alive, only frozen: its term ended by the TTL, not
  // by a session, and the stopwatch says so.
  const silent = page.locator(`[data-testid="stopwatch-row"][data-resource="task:${task.id}"]`);
  await expect(silent).toHaveAttribute("data-cause", "found_dead");
  await expect(silent.getByTestId("stopwatch-rule")).toHaveAttribute("data-rule", "ttl");
  await expect(silent.getByTestId("stopwatch-rule")).toHaveText("by the TTL");

  // The paused worker wakes, tries to complete, and is refused: recorded as a stale write.
  await page.goto(`/tasks?id=${task.id}`);
  const refused = page.getByTestId("task-detail").locator('[data-kind="stale_write_refused"]');
  await expect(refused).toHaveCount(1, { timeout: 10_000 });
  await expect(refused).toContainText(pausedId);
  const after = await (await request.get(`/api/tasks/${task.id}`)).json();
  expect(after.processor).toBe(done.processor);
  expect(after.task_output).toEqual(done.task_output);
});

test("an operator's kill stays on the stopwatch however many failovers follow, and says when its task failed instead", async ({ page, request }) => {
  test.setTimeout(90_000);
  await request.delete("/api/generator/stop");
  await drain(request);
  // One attempt: once its worker is killed, nobody may run the task again.
  const { task, busy, busyId } = await spawnBusyWorker(page, request, 30, { max_attempts: 1 });
  await busy.getByTestId("worker-kill").click();
  await expect(page.locator(`[data-testid="worker-row"][data-worker="${busyId}"]`)).toHaveAttribute("data-state", "crashed");
  const watch = page.locator(`[data-testid="stopwatch-row"][data-resource="task:${task.id}"]`);
  // Its claim was ended at once by the instance's liveness session; out of
  // attempts, nobody may take it over, and the rescuer (every 5 s) may
  // already have failed it: waiting, or ended.
  await expect(watch).toHaveAttribute("data-state", /^(waiting|ended)$/);
  await expect(watch).toHaveAttribute("data-cause", "killed");
  await expect(watch).toHaveAttribute("data-subject", busyId);

  // Twelve silent deaths after the kill (more than the stopwatch's ten
  // newest rows): each lease runs out and another holder takes it.
  const names = Array.from({ length: 12 }, (_, i) => `stopwatch-${Date.now()}-${i}`);
  for (const resource of names) {
    expect((await request.post("/api/leases", { data: { resource, holder: "pw-silent", ttl_seconds: 1 } })).status()).toBe(201);
  }
  await page.waitForTimeout(1_300);
  for (const resource of names) {
    expect((await request.post("/api/leases", { data: { resource, holder: "pw-rescuer", ttl_seconds: 60 } })).status()).toBe(201);
  }
  await expect(page.locator('[data-testid="stopwatch-row"][data-cause="found_dead"]')).toHaveCount(10, { timeout: 5_000 });
  // The operator's kill is still listed.
  await expect(watch).toHaveAttribute("data-state", /^(waiting|ended)$/);

  // The next claim (or the rescuer) finds the task out of attempts and
  // fails it instead of running it again: the stopwatch says so.
  await expect
    .poll(
      async () => {
        const res = await request.post("/api/tasks/next", { data: { processor: "pw-claimer" } });
        if (res.status() === 202) {
          const t = await res.json();
          await request.put(`/api/tasks/${t.id}/complete`, {
            data: { processor: "pw-claimer", fencing_token: t.fencing_token, task_output: "other" },
          });
        }
        return (await (await request.get(`/api/tasks/${task.id}`)).json()).status;
      },
      { timeout: 15_000 },
    )
    .toBe("failed");
  await expect(watch).toHaveAttribute("data-state", "ended");
  await expect(watch.getByTestId("stopwatch-elapsed")).toHaveText("task failed");
  await expect(watch.getByTestId("stopwatch-ended")).toContainText("ran out of attempts");
});

test("the workers filter hides and shows crashed workers", async ({ page, request }) => {
  const spawned = await request.post("/api/workers");
  expect(spawned.status()).toBe(201);
  const worker = await spawned.json();
  await page.goto("/workers?show=alive");
  const row = page.locator(`[data-testid="worker-row"][data-worker="${worker.id}"]`);
  await expect(row).toHaveAttribute("data-alive", "true");
  await row.getByTestId("worker-kill").click();
  await expect(page.getByTestId("worker-action-result")).toContainText(`worker ${worker.id} killed`);
  // Crashed: gone from "alive", listed under "gone" and (recently) "current".
  await expect(row).toHaveCount(0);
  await page.getByTestId("filter-gone").click();
  await expect(page).toHaveURL(/show=gone/);
  await expect(row).toHaveAttribute("data-state", "crashed");
  await expect(row).toHaveAttribute("data-alive", "false");
  await page.getByTestId("filter-current").click();
  await expect(row).toHaveAttribute("data-state", "crashed");
  await page.getByTestId("filter-all").click();
  await expect(row).toHaveCount(1);
});

test("cancelling a busy worker's task from the tasks page frees the worker within seconds", async ({ page, request }) => {
  await request.delete("/api/generator/stop");
  await drain(request);
  // A worker sleeping on a long task.
  const { task, busyId } = await spawnBusyWorker(page, request, 600);

  // Cancel it from the tasks page, with the row's Cancel control.
  await page.goto("/tasks?status=started");
  const row = page.locator(`[data-testid="task-row"][data-task-id="${task.id}"]`);
  await expect(row.getByTestId("task-status")).toHaveText("started");
  const cancelledAt = Date.now();
  await row.getByTestId("task-cancel").click();
  await expect(page.getByTestId("task-action-result")).toHaveText(new RegExp(`task ${task.id} cancelled`));

  // The worker stopped its sleep: idle again, holding nothing, its task cancelled.
  await page.goto("/workers");
  const worker = page.locator(`[data-testid="worker-row"][data-worker="${busyId}"]`);
  await expect(worker).toHaveAttribute("data-state", "idle", { timeout: 5_000 });
  expect(Date.now() - cancelledAt).toBeLessThan(10_000);
  await expect(worker).not.toHaveAttribute("data-task", String(task.id));
  const after = await (await request.get(`/api/tasks/${task.id}`)).json();
  expect(after.status).toBe("cancelled");

  // Free: it takes the next task and finishes it.
  const next = await (await request.post("/api/tasks", { data: { task_data: { sleep_duration_seconds: 0 } } })).json();
  await expect
    .poll(async () => (await (await request.get(`/api/tasks/${next.id}`)).json()).status, { timeout: 10_000 })
    .toBe("processed");

  // Leave nothing running for other tests.
  await worker.getByTestId("worker-kill").click();
  await expect(worker).toHaveAttribute("data-state", "crashed");
});
