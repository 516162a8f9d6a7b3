import { test, expect } from "../support/test";

// The e2e server runs with a 3 s lease TTL (see .ci/test).

test("a claimed task shows its processor and countdown, turns late, and its history", async ({ page, request }) => {
  const created = await request.post("/api/tasks", { data: { task_data: { sleep_duration_seconds: 1, e2e: Date.now() } } });
  expect(created.status()).toBe(201);
  const task = await created.json();

  await page.goto("/tasks?status=pending");
  const row = page.locator(`[data-testid="task-row"][data-task-id="${task.id}"]`);
  await expect(row).toBeVisible();
  await expect(row.getByTestId("task-status")).toHaveText("pending");

  // Claim it as a processor that will never heartbeat. Other pending tasks
  // (from other tests) may be older: claim until we get ours.
  let claimed: any;
  for (let i = 0; i < 50; i++) {
    const res = await request.post("/api/tasks/next", { data: { processor: "pw-stalled" } });
    expect([200, 202]).toContain(res.status());
    if (res.status() !== 202) break;
    const t = await res.json();
    if (t.id === task.id) { claimed = t; break; }
  }
  expect(claimed, "our task was claimed").toBeTruthy();

  await page.getByTestId("filter-started").click();
  await expect(page).toHaveURL(/status=started/);
  await expect(row.getByTestId("task-processor")).toHaveText("pw-stalled");
  await expect(row.getByTestId("task-token")).toHaveText(String(claimed.fencing_token));
  await expect(row.getByTestId("task-heartbeat")).toContainText("s left");
  await expect(row.getByTestId("task-heartbeat")).toHaveAttribute("data-late", "false");
  // Record every colour band the countdown passes through (the orange one
  // lasts a fifth of the 3 s TTL: too short to catch by polling).
  await page.evaluate((id) => {
    // Watch the whole page: a refetch may replace the row's element.
    const band = () =>
      document.querySelector(`[data-testid="task-row"][data-task-id="${id}"] [data-testid="task-heartbeat"]`)?.getAttribute("data-band");
    const seen: string[] = [band() ?? ""];
    (window as unknown as { __bands: string[] }).__bands = seen;
    new MutationObserver(() => {
      const now = band();
      if (now && seen[seen.length - 1] !== now) seen.push(now);
    }).observe(document.body, { subtree: true, childList: true, attributes: true, attributeFilter: ["data-band"] });
  }, task.id);

  // No heartbeat: after the 3 s TTL the page flags it late, by itself.
  await expect(row.getByTestId("task-heartbeat")).toHaveAttribute("data-late", "true", { timeout: 6_000 });
  await expect(row.getByTestId("task-heartbeat")).toContainText("late by");
  await expect(row.getByTestId("task-heartbeat")).toHaveClass(/bg-red-100/);
  // Green (more than half the TTL left), amber, orange (a fifth or less), red.
  const bands = await page.evaluate(() => (window as unknown as { __bands: string[] }).__bands);
  // (Green may already be over when the recording starts.)
  expect([["ok", "soon", "urgent", "late"], ["soon", "urgent", "late"]]).toContainEqual(bands);

  // The stalled processor's completion is refused; a rescuer takes it over.
  const stale = await request.put(`/api/tasks/${task.id}/complete`, {
    data: { processor: "pw-stalled", fencing_token: claimed.fencing_token, task_output: "late" },
  });
  expect(stale.status()).toBe(409);
  let rescued: any;
  for (let i = 0; i < 50; i++) {
    const res = await request.post("/api/tasks/next", { data: { processor: "pw-rescuer" } });
    if (res.status() !== 202) break;
    const t = await res.json();
    if (t.id === task.id) { rescued = t; break; }
  }
  expect(rescued.fencing_token).toBe(claimed.fencing_token + 1);
  const done = await request.put(`/api/tasks/${task.id}/complete`, {
    data: { processor: "pw-rescuer", fencing_token: rescued.fencing_token, task_output: { ok: true } },
  });
  expect(done.status()).toBe(202);

  await page.getByTestId("task-lookup-input").fill(String(task.id));
  await page.getByTestId("task-lookup-submit").click();
  const detail = page.getByTestId("task-detail");
  await expect(detail.getByTestId("detail-status")).toHaveText("processed");
  await expect(detail.getByTestId("detail-processor")).toHaveText("pw-rescuer");
  await expect(detail.getByTestId("detail-attempts")).toHaveText("attempt 2 of 5");
  const kinds = await detail.getByTestId("history-event").evaluateAll((els) => els.map((e) => e.getAttribute("data-kind")));
  expect(kinds).toEqual(["released", "taken_over", "stale_write_refused", "acquired"]);
});

test("a service's task shows its kind, queue and priority in the list and the detail", async ({ page, request }) => {
  // A task of a kind no simulated worker handles, in a queue of its own:
  // it stays pending (the dashboard's workers claim only `sleep`).
  const created = await request.post("/api/tasks", {
    data: { task_data: { order_id: Date.now() }, kind: "invoice", queue: "billing", priority: -2 },
  });
  expect(created.status()).toBe(201);
  const task = await created.json();

  await page.goto("/tasks?status=pending");
  const row = page.locator(`[data-testid="task-row"][data-task-id="${task.id}"]`);
  await expect(row.getByTestId("task-kind")).toHaveText("invoice · billing");
  await row.getByTestId("task-link").click();
  const detail = page.getByTestId("task-detail");
  await expect(detail.getByTestId("detail-kind")).toHaveText("invoice");
  await expect(detail.getByTestId("detail-queue")).toHaveText("billing (priority -2)");

  // Finish it as a worker of that queue would, so no other test finds it pending.
  const claim = await request.post("/api/tasks/next", {
    data: { processor: "pw-billing", queue: "billing", kinds: ["invoice"] },
  });
  expect(claim.status()).toBe(202);
  const claimed = await claim.json();
  expect(claimed.id).toBe(task.id);
  const done = await request.put(`/api/tasks/${task.id}/complete`, {
    data: { processor: "pw-billing", fencing_token: claimed.fencing_token, task_output: "invoiced" },
  });
  expect(done.status()).toBe(202);

  // A bad kind is refused with a clear error and stores nothing.
  const bad = await request.post("/api/tasks", { data: { task_data: {}, kind: "" } });
  expect(bad.status()).toBe(400);
  expect((await bad.json()).error).toContain("kind must be 1 to 128 characters");
});
