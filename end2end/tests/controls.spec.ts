import { test, expect, APIRequestContext } from "../support/test";

// Task controls (cancel, retry, release, one and all matching the filter), the audit
// page, and paging, in a real browser. Tasks get a kind of their own so no
// simulated worker (which runs `sleep` tasks) claims them.

const kind = () => `e2e-ctl-${Date.now()}-${Math.floor(Math.random() * 1e6)}`;

async function enqueue(request: APIRequestContext, k: string, max_attempts = 5) {
  const res = await request.post("/api/tasks", { data: { task_data: { e2e: true }, kind: k, max_attempts } });
  expect(res.status()).toBe(201);
  return res.json();
}

async function claimAs(request: APIRequestContext, k: string, processor: string) {
  const res = await request.post("/api/tasks/next", { data: { processor, kinds: [k] } });
  expect(res.status(), await res.text()).toBe(202);
  return res.json();
}

test("a task is cancelled and retried from the page, and the history and audit log say so", async ({ page, request }) => {
  const k = kind();
  const task = await enqueue(request, k);

  await page.goto("/tasks?status=pending");
  const row = page.locator(`[data-testid="task-row"][data-task-id="${task.id}"]`);
  await expect(row.getByTestId("task-status")).toHaveText("pending");
  await row.getByTestId("task-cancel").click();
  await expect(page.getByTestId("task-action-result")).toHaveText(new RegExp(`task ${task.id} cancelled`));
  // Gone from the pending list, listed under cancelled.
  await expect(row).toHaveCount(0);
  await page.getByTestId("filter-cancelled").click();
  await expect(row.getByTestId("task-status")).toHaveText("cancelled");

  // Its detail: the history names the action; Retry puts it back.
  await page.goto(`/tasks?id=${task.id}`);
  const detail = page.getByTestId("task-detail");
  await expect(detail.getByTestId("detail-status")).toHaveText("cancelled");
  await expect(detail.getByTestId("lease-history")).toContainText("operator: cancel task");
  await expect(detail.getByTestId("lease-history")).toContainText("was pending");
  await detail.getByTestId("task-retry").click();
  await expect(detail.getByTestId("detail-status")).toHaveText("pending");
  await expect(detail.getByTestId("detail-attempts")).toHaveText(/attempt 0 of 5/);
  const now = await (await request.get(`/api/tasks/${task.id}`)).json();
  expect(now.status).toBe("pending");

  // The audit page lists both, newest first, linked to the task.
  await page.getByTestId("nav-audit").click();
  await expect(page).toHaveURL(/\/audit$/);
  const rows = page.getByTestId("audit-row");
  await expect(rows.nth(0)).toHaveAttribute("data-action", "retry_task");
  await expect(rows.nth(1)).toHaveAttribute("data-action", "cancel_task");
  await expect(rows.nth(0)).toContainText(`task:${task.id}`);
  await rows.nth(0).getByRole("link", { name: `task:${task.id}` }).click();
  await expect(page.getByTestId("task-detail").getByTestId("detail-status")).toHaveText("pending");
});

test("cancelling a started task from the page ends its claim: its holder's heartbeat is refused", async ({ page, request }) => {
  const k = kind();
  const task = await enqueue(request, k);
  const claimed = await claimAs(request, k, "pw-ctl-holder");
  expect(claimed.id).toBe(task.id);

  await page.goto(`/tasks?id=${task.id}`);
  const detail = page.getByTestId("task-detail");
  await expect(detail.getByTestId("detail-status")).toHaveText("started");
  await detail.getByTestId("task-cancel").click();
  await expect(detail.getByTestId("detail-status")).toHaveText("cancelled");
  await expect(detail.getByTestId("lease-history")).toContainText("was started");

  const beat = await request.put(`/api/tasks/${task.id}/heartbeat`, {
    data: { processor: "pw-ctl-holder", fencing_token: claimed.fencing_token },
  });
  expect(beat.status()).toBe(409);
  expect((await beat.json()).error).toContain("cancelled");
  // The refused write shows in the history (live).
  await expect(detail.locator('[data-testid="history-event"][data-kind="stale_write_refused"]')).toHaveCount(1);
});

test("releasing a started task's claim from the page: its holder is refused and another worker takes it over with the next token", async ({ page, request }) => {
  const k = kind();
  const task = await enqueue(request, k);
  const claimed = await claimAs(request, k, "pw-rel-holder");
  expect(claimed.id).toBe(task.id);

  await page.goto(`/tasks?id=${task.id}`);
  const detail = page.getByTestId("task-detail");
  await expect(detail.getByTestId("detail-status")).toHaveText("started");
  await expect(detail.getByTestId("detail-token")).toHaveText(String(claimed.fencing_token));
  await detail.getByTestId("task-release").click();
  // Still started, its claim over: the history ends the term and names the action.
  await expect(detail.getByTestId("lease-history")).toContainText("operator: release claim");
  await expect(detail.locator('[data-testid="history-event"][data-kind="released"]')).toHaveCount(1);
  await expect(detail.getByTestId("detail-status")).toHaveText("started");

  const beat = await request.put(`/api/tasks/${task.id}/heartbeat`, {
    data: { processor: "pw-rel-holder", fencing_token: claimed.fencing_token },
  });
  expect(beat.status()).toBe(409);
  const next = await claimAs(request, k, "pw-rel-next");
  expect(next.id).toBe(task.id);
  expect(next.fencing_token).toBe(claimed.fencing_token + 1);
  // The page follows: the new holder and token, live.
  await expect(detail.getByTestId("detail-processor")).toHaveText("pw-rel-next");
  await expect(detail.getByTestId("detail-token")).toHaveText(String(claimed.fencing_token + 1));
  // A pending task offers no release.
  const pending = await enqueue(request, k);
  await page.goto(`/tasks?id=${pending.id}`);
  await expect(page.getByTestId("task-detail").getByTestId("task-cancel")).toBeVisible();
  await expect(page.getByTestId("task-detail").getByTestId("task-release")).toHaveCount(0);
});

test("every failed task is retried after a confirmation, and keeping them changes nothing", async ({ page, request }) => {
  const k = kind();
  const ids: number[] = [];
  for (let i = 0; i < 3; i++) {
    const t = await enqueue(request, k, 1);
    const c = await claimAs(request, k, "pw-ctl-failer");
    const failed = await request.put(`/api/tasks/${c.id}/fail`, {
      data: { processor: "pw-ctl-failer", fencing_token: c.fencing_token, error: "boom" },
    });
    expect(failed.status()).toBe(200);
    expect((await failed.json()).status).toBe("failed");
    ids.push(t.id);
  }
  const statuses = async () =>
    Promise.all(ids.map(async (id) => (await (await request.get(`/api/tasks/${id}`)).json()).status));

  await page.goto("/tasks?status=failed");
  await page.getByTestId("tasks-retry-all").click();
  await expect(page).toHaveURL(/confirm=retry/);
  const confirm = page.getByTestId("task-bulk-confirm");
  await expect(confirm).toContainText("Retry every failed task");
  await confirm.getByTestId("task-bulk-keep").click();
  await expect(page.getByTestId("task-bulk-confirm")).toHaveCount(0);
  expect(await statuses()).toEqual(["failed", "failed", "failed"]);

  await page.getByTestId("tasks-retry-all").click();
  await page.getByTestId("task-bulk-confirmed").click();
  await expect(page.getByTestId("task-bulk-action-result")).toHaveText(/^\d+ failed tasks retried$/);
  const said = Number((await page.getByTestId("task-bulk-action-result").textContent())!.split(" ")[0]);
  expect(said).toBeGreaterThanOrEqual(3);
  expect(await statuses()).toEqual(["pending", "pending", "pending"]);
  // Not claimable by anyone here: cancel them again over REST, by kind.
  const done = await request.post("/api/tasks/cancel", { data: { status: "pending", kind: k } });
  expect(done.status()).toBe(200);
  expect((await done.json()).count).toBe(3);
});

test("the tasks page pages older tasks with a cursor in the URL", async ({ page, request }) => {
  const k = kind();
  for (let i = 0; i < 101; i++) await enqueue(request, k);
  await page.goto("/tasks");
  const ids = async () =>
    (await page.getByTestId("task-row").evaluateAll((rows) => rows.map((r) => Number(r.getAttribute("data-task-id")))));
  const first = await ids();
  expect(first.length).toBe(100);
  await page.getByTestId("tasks-pager-older").click();
  await expect(page).toHaveURL(new RegExp(`before=${first[99]}`));
  await expect(page.getByTestId("tasks-pager-newest")).toBeVisible();
  const second = await ids();
  expect(second.length).toBeGreaterThan(0);
  expect(Math.max(...second)).toBeLessThan(Math.min(...first));
  // Reloading keeps the page (the cursor is in the URL).
  await page.reload();
  expect(await ids()).toEqual(second);
  await page.getByTestId("tasks-pager-newest").click();
  await expect(page).toHaveURL(/\/tasks$/);
  const cleaned = await request.post("/api/tasks/cancel", { data: { status: "pending", kind: k } });
  expect((await cleaned.json()).count).toBe(101);
});
