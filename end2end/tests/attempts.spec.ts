import { test, expect } from "../support/test";
import { drain } from "../support/drain";
import { spawnFromPage } from "../support/workers";

// The e2e server starts with no simulated workers, no chaos and a 3 s TTL
// (see .ci/test); this test spawns the workers it needs.

test("the task page lists each attempt: the killed worker's taken over, the rescuer's with the next token", async ({ page, request }) => {
  await request.delete("/api/generator/stop");
  await drain(request);
  const created = await request.post("/api/tasks", { data: { task_data: { sleep_duration_seconds: 10 } } });
  expect(created.status()).toBe(201);
  const task = await created.json();

  // A worker claims it; a second waits idle; the first is killed.
  await page.goto("/workers");
  const killedId = await spawnFromPage(page);
  const killed = page.locator(`[data-testid="worker-row"][data-worker="${killedId}"]`);
  await expect(killed).toHaveAttribute("data-task", String(task.id), { timeout: 5_000 });
  const first = await (await request.get(`/api/tasks/${task.id}`)).json();
  expect(first.processor).toBe(killedId);
  const rescuerId = await spawnFromPage(page);
  await killed.getByTestId("worker-kill").click();
  await expect(killed).toHaveAttribute("data-state", "crashed");

  // Its claim is ended at once by the instance's liveness session, and the
  // other worker takes the task over.
  await expect
    .poll(async () => (await (await request.get(`/api/tasks/${task.id}`)).json()).processor, { timeout: 10_000 })
    .toBe(rescuerId);

  // The task page's attempts table: two rows, oldest first, different tokens.
  await page.goto(`/tasks?id=${task.id}`);
  const rows = page.getByTestId("attempts-table").getByTestId("attempt-row");
  await expect(rows).toHaveCount(2);
  await expect(rows.nth(0).getByTestId("attempt-number")).toHaveText("1");
  await expect(rows.nth(0).getByTestId("attempt-processor")).toHaveText(killedId);
  await expect(rows.nth(0).getByTestId("attempt-token")).toHaveText(String(first.fencing_token));
  await expect(rows.nth(0).getByTestId("attempt-outcome")).toHaveText("taken_over");
  await expect(rows.nth(1).getByTestId("attempt-number")).toHaveText("2");
  await expect(rows.nth(1).getByTestId("attempt-processor")).toHaveText(rescuerId);
  await expect(rows.nth(1).getByTestId("attempt-token")).toHaveText(String(first.fencing_token + 1));
  await expect(rows.nth(1).getByTestId("attempt-outcome")).toHaveText(/^(running|completed)$/);

  // The rescuer finishes it; the page, live, says so.
  await expect(rows.nth(1)).toHaveAttribute("data-outcome", "completed", { timeout: 30_000 });
  const attempts = await (await request.get(`/api/tasks/${task.id}/attempts`)).json();
  expect(attempts.map((a: { outcome: string }) => a.outcome)).toEqual(["taken_over", "completed"]);

  // Leave nothing running for other tests.
  await page.goto("/workers");
  await page.locator(`[data-testid="worker-row"][data-worker="${rescuerId}"]`).getByTestId("worker-kill").click();
  await expect(page.locator(`[data-testid="worker-row"][data-worker="${rescuerId}"]`)).toHaveAttribute("data-state", "crashed");
});
