import { test, expect } from "../support/test";

// The e2e server runs its scheduler on a 3 s lease (see .ci/test): it holds
// singleton:scheduler and fires every schedule's ticks.

test("a schedule's ticks show on the page, and pause, resume, run now and delete work", async ({ page, request }) => {
  const name = `e2e-every-second-${Date.now()}`;
  const put = await request.put(`/api/schedules/${name}`, {
    data: { cron: "* * * * * *", kind: "e2e-tick", catch_up: "all", data: { from: "playwright" } },
  });
  expect(put.status()).toBe(201);

  await page.goto("/schedules");
  const row = page.locator(`[data-testid="schedule-row"][data-schedule="${name}"]`);
  await expect(row).toBeVisible();
  await expect(row.getByTestId("schedule-cron-text")).toHaveText("Every second (UTC)");
  await expect(row.getByTestId("schedule-state")).toHaveText("running");
  await expect(row.getByTestId("schedule-next")).toContainText("in ");

  // Ticks appear live, each naming the holder and its token.
  const ticks = row.getByTestId("schedule-tick");
  await expect.poll(() => ticks.count(), { timeout: 10_000 }).toBeGreaterThanOrEqual(2);
  const leader = (await (await request.get(`/api/schedules/${name}`)).json()).leader;
  expect(leader).not.toBeNull();
  await expect(ticks.first().getByTestId("schedule-tick-holder")).toHaveText(` ${leader.holder} #${leader.fencing_token}`);
  await expect(ticks.first().getByTestId("schedule-tick-late")).toContainText("ms late");
  // The timeline of the scheduler's lease is on the page.
  await expect(page.getByTestId("timeline")).toBeVisible();

  // Pause: the state says so, and no tick fires while paused.
  await row.getByTestId("schedule-pause").click();
  await expect(row.getByTestId("schedule-state")).toHaveText("paused");
  await expect(page.getByTestId("schedule-action-result")).toHaveText(`paused ${name}`);
  const pausedAt = (await (await request.get(`/api/schedules/${name}/ticks`)).json()).length;
  await page.waitForTimeout(2_500);
  const whilePaused = (await (await request.get(`/api/schedules/${name}/ticks`)).json()).length;
  expect(whilePaused).toBeLessThanOrEqual(pausedAt + 1); // a tick in flight at the click may commit
  await row.getByTestId("schedule-resume").click();
  await expect(row.getByTestId("schedule-state")).toHaveText("running");
  await expect
    .poll(async () => (await (await request.get(`/api/schedules/${name}/ticks`)).json()).length, { timeout: 10_000 })
    .toBeGreaterThan(whilePaused);

  // Run now: one extra task of the schedule, no tick.
  await row.getByTestId("schedule-trigger").click();
  await expect(page.getByTestId("schedule-action-result")).toContainText(`triggered ${name}: task `);
  const text = await page.getByTestId("schedule-action-result").textContent();
  const taskId = text!.match(/task (\d+)/)![1];
  const task = await (await request.get(`/api/tasks/${taskId}`)).json();
  expect(task.schedule).toBe(name);
  expect(task.tick_at).toBeNull();
  // The task's page links back to its schedule.
  await page.goto(`/tasks?id=${taskId}`);
  await expect(page.getByTestId("detail-schedule")).toContainText(name);
  await page.getByTestId("detail-schedule").getByRole("link").click();
  await expect(page).toHaveURL(new RegExp(`/schedules#schedule-${name}$`));

  // Delete: gone from the page and the API.
  const again = page.locator(`[data-testid="schedule-row"][data-schedule="${name}"]`);
  await again.getByTestId("schedule-delete").click();
  await expect(again).toHaveCount(0);
  expect((await request.get(`/api/schedules/${name}`)).status()).toBe(404);
});

test.describe("before hydration (JavaScript off)", () => {
  test.use({ javaScriptEnabled: false });

  test("pause and resume work as plain forms", async ({ page, request }) => {
    const name = `e2e-nightly-${Date.now()}`;
    expect((await request.put(`/api/schedules/${name}`, { data: { cron: "0 2 * * *" } })).status()).toBe(201);
    await page.goto("/schedules");
    const row = page.locator(`[data-testid="schedule-row"][data-schedule="${name}"]`);
    await expect(row.getByTestId("schedule-cron-text")).toHaveText("At 02:00 (UTC)");
    await row.getByTestId("schedule-pause").click();
    await page.waitForURL(/\/schedules/);
    expect((await (await request.get(`/api/schedules/${name}`)).json()).paused).toBe(true);
    await page.locator(`[data-testid="schedule-row"][data-schedule="${name}"]`).getByTestId("schedule-resume").click();
    await page.waitForURL(/\/schedules/);
    expect((await (await request.get(`/api/schedules/${name}`)).json()).paused).toBe(false);
    expect((await request.delete(`/api/schedules/${name}`)).status()).toBe(204);
  });
});
