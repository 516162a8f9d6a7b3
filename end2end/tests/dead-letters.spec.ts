import { test, expect, type APIRequestContext, type Page } from "../support/test";

// The dead letters on the tasks page: failed tasks grouped by error, and
// "Retry these" on one group. Every test's tasks get a kind of their own
// (no simulated worker runs it, no other test claims it), claimed and
// failed over REST with one attempt each.

const unique = () => `e2e-dlq-${Date.now()}-${Math.floor(Math.random() * 1e6)}`;

/** Enqueues a task of `kind` with one attempt, claims it and fails it with `error`: its id. */
async function failWith(request: APIRequestContext, kind: string, error: string): Promise<number> {
  const made = await request.post("/api/tasks", { data: { task_data: { e2e: true }, kind, max_attempts: 1 } });
  expect(made.status(), await made.text()).toBe(201);
  const id = (await made.json()).id;
  const claimed = await request.post("/api/tasks/next", { data: { processor: "pw-dlq", kinds: [kind] } });
  expect(claimed.status(), await claimed.text()).toBe(202);
  const c = await claimed.json();
  expect(c.id).toBe(id);
  const failed = await request.put(`/api/tasks/${id}/fail`, {
    data: { processor: "pw-dlq", fencing_token: c.fencing_token, error },
  });
  expect(failed.status(), await failed.text()).toBe(200);
  expect((await failed.json()).status).toBe("failed");
  return id;
}

async function statusOf(request: APIRequestContext, id: number): Promise<string> {
  return (await (await request.get(`/api/tasks/${id}`)).json()).status;
}

const TIMEOUT = "timeout after <n> ms";
const group = (page: Page, error: string) =>
  page.locator(`[data-testid="dead-letter-row"][data-error-group="${error}"]`);

/** Three failed tasks of `kind`: two timeouts (one group) and a declined card. */
async function threeFailed(request: APIRequestContext, kind: string) {
  return {
    timeouts: [await failWith(request, kind, "timeout after 17 ms"), await failWith(request, kind, "timeout after 4242 ms")],
    declined: await failWith(request, kind, "card declined"),
  };
}

test("failed tasks are grouped by error, and Retry these retries exactly one group after a confirmation", async ({ page, request }) => {
  const kind = unique();
  const { timeouts, declined } = await threeFailed(request, kind);

  // Narrowed by the search's kind: our two groups, the largest first.
  await page.goto(`/tasks?status=failed&kind=${kind}`);
  const panel = page.getByTestId("dead-letters");
  await expect(panel.getByTestId("dead-letter-row")).toHaveCount(2);
  await expect(panel.getByTestId("dead-letter-row").first()).toHaveAttribute("data-error-group", TIMEOUT);
  const timeout = group(page, TIMEOUT);
  await expect(timeout.getByTestId("dead-letter-kind")).toHaveText(kind);
  await expect(timeout.getByTestId("dead-letter-queue")).toHaveText("default");
  await expect(timeout.getByTestId("dead-letter-error")).toHaveText(TIMEOUT);
  await expect(timeout.getByTestId("dead-letter-count")).toHaveText("2");
  await expect(timeout.getByTestId("dead-letter-example")).toHaveText(/^e\.g\. timeout after (17|4242) ms$/);
  const declinedRow = group(page, "card declined");
  await expect(declinedRow.getByTestId("dead-letter-count")).toHaveText("1");
  // Ages once hydrated, by the browser's clock.
  await expect(timeout.locator("td").nth(4)).toContainText(/\d+(\.\d)? s ago/);

  // Keeping them changes nothing.
  await timeout.getByTestId("dead-letter-retry").click();
  await expect(page).toHaveURL(/confirm=group-[0-9a-f]{16}/);
  const confirm = page.getByTestId("dead-letter-confirm");
  await expect(confirm).toContainText(`Retry the 2 failed tasks of kind "${kind}" in queue "default" whose error reads "${TIMEOUT}"`);
  await confirm.getByTestId("dead-letter-keep").click();
  await expect(page.getByTestId("dead-letter-confirm")).toHaveCount(0);
  expect(await Promise.all([...timeouts, declined].map((id) => statusOf(request, id)))).toEqual(["failed", "failed", "failed"]);

  // Confirmed: the timeouts only, and the panel follows without a reload.
  await timeout.getByTestId("dead-letter-retry").click();
  await page.getByTestId("dead-letter-confirmed").click();
  await expect(page.getByTestId("dead-letters-action-result")).toHaveText(/^2 tasks retried\b/);
  expect(await Promise.all(timeouts.map((id) => statusOf(request, id)))).toEqual(["pending", "pending"]);
  expect(await statusOf(request, declined)).toBe("failed");
  await expect(panel.getByTestId("dead-letter-row")).toHaveCount(1);
  await expect(group(page, TIMEOUT)).toHaveCount(0);
  await expect(declinedRow.getByTestId("dead-letter-count")).toHaveText("1");
  await expect(page.getByTestId("dead-letter-confirm")).toHaveCount(0);
  // The list of failed tasks below follows too.
  await expect(page.getByTestId("task-row")).toHaveCount(1);
  await expect(page.locator(`[data-testid="task-row"][data-task-id="${declined}"]`)).toHaveCount(1);

  // Not claimable by anyone here: cancel them again over REST, by kind.
  const done = await request.post("/api/tasks/cancel", { data: { status: "pending", kind } });
  expect((await done.json()).count).toBe(2);
});

test("the dead letters show under the failed filter only, and say when there are none", async ({ page, request }) => {
  const kind = unique();
  await page.goto(`/tasks?status=failed&kind=${kind}`);
  await expect(page.getByTestId("dead-letters-empty")).toHaveText("No failed tasks");
  await expect(page.getByTestId("dead-letter-row")).toHaveCount(0);

  // A failure of this kind shows up live, without a reload.
  await failWith(request, kind, "card declined");
  await expect(group(page, "card declined").getByTestId("dead-letter-count")).toHaveText("1");
  await expect(page.getByTestId("dead-letters-empty")).toHaveCount(0);

  await page.goto(`/tasks?status=pending&kind=${kind}`);
  await expect(page.getByTestId("tasks-empty")).toBeVisible();
  await expect(page.getByTestId("dead-letters")).toHaveCount(0);
});

test.describe("before hydration (JavaScript off)", () => {
  test.use({ javaScriptEnabled: false });

  test("the server lists the groups, and Retry these works as a link and a plain form", async ({ page, request }) => {
    const kind = unique();
    const { timeouts, declined } = await threeFailed(request, kind);
    await page.goto(`/tasks?status=failed&kind=${kind}`);
    await expect(page.getByTestId("dead-letter-row")).toHaveCount(2);
    await group(page, TIMEOUT).getByTestId("dead-letter-retry").click();
    await page.getByTestId("dead-letter-confirmed").click();
    await page.waitForURL(/\/tasks\?status=failed/);
    await expect(page.getByTestId("dead-letter-row")).toHaveCount(1);
    expect(await Promise.all(timeouts.map((id) => statusOf(request, id)))).toEqual(["pending", "pending"]);
    expect(await statusOf(request, declined)).toBe("failed");
    const done = await request.post("/api/tasks/cancel", { data: { status: "pending", kind } });
    expect((await done.json()).count).toBe(2);
  });
});
