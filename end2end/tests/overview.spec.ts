import { test, expect, Page } from "../support/test";

// The e2e server runs with no simulated workers and chaos off (see
// .ci/test), so enqueued tasks stay pending unless another test claims them.
// Tests share one server: read values before and after, never assume zero.

async function count(page: Page, testid: string): Promise<number> {
  return Number(await page.getByTestId(testid).getAttribute("data-value"));
}

test("the overview shows counts, and enqueued tasks raise pending by exactly 3", async ({ page, request }) => {
  await page.goto("/");
  await expect(page.getByTestId("nav-overview")).toBeVisible();
  for (const id of [
    "count-pending", "count-started", "count-late", "count-processed", "count-failed",
    "count-leases-active", "count-workers-alive", "count-instances-alive",
  ]) {
    await expect(page.getByTestId(id)).toHaveText(/^\d+\+?$/);
  }
  await expect(page.getByTestId("count-instances-alive")).not.toHaveText("0");
  await expect(page.getByTestId("split-brain-ok")).toBeVisible();
  await expect(page.getByTestId("split-brain-banner")).toHaveCount(0);
  await expect(page.getByTestId("throughput-chart")).toBeVisible();
  await expect(page.getByTestId("throughput-bar")).toHaveCount(30);

  // The REST view agrees with the page.
  const api = await (await request.get("/api/overview")).json();
  const before = await count(page, "count-pending");
  expect(api.counts.tasks_pending).toBe(before);

  for (let i = 0; i < 3; i++) {
    const res = await request.post("/api/tasks", { data: { task_data: { sleep_duration_seconds: 1 } } });
    expect(res.status()).toBe(201);
  }
  // The page refreshes itself.
  await expect(page.getByTestId("count-pending")).toHaveAttribute("data-value", String(before + 3));
});

test("completions show up in the throughput chart", async ({ page, request }) => {
  await page.goto("/");
  const total = async () => Number(await page.getByTestId("throughput-completed").textContent());
  await expect(page.getByTestId("throughput-chart")).toBeVisible();
  const before = await total();
  const res = await request.post("/api/tasks", { data: { task_data: { sleep_duration_seconds: 1 } } });
  expect(res.status()).toBe(201);
  // Claim until we get a task and complete it (any pending task will do).
  const claimed = await (await request.post("/api/tasks/next", { data: { processor: "pw-overview" } })).json();
  expect(claimed.fencing_token).toBeGreaterThan(0);
  const done = await request.put(`/api/tasks/${claimed.id}/complete`, {
    data: { processor: "pw-overview", fencing_token: claimed.fencing_token, task_output: { ok: true } },
  });
  expect(done.status()).toBe(202);
  await expect.poll(total, { timeout: 6_000 }).toBeGreaterThan(before);
  const bars = page.locator('[data-testid="throughput-bar"]:not([data-completed="0"])');
  await expect(bars.first()).toBeVisible();
});

test("start and stop the generator from the overview", async ({ page }) => {
  await page.goto("/");
  const panel = page.getByTestId("generator-panel");
  await page.getByTestId("generator-start").click();
  await expect(panel.getByTestId("generator-desired")).toHaveText("running");
  await expect(panel.getByTestId("generator-holder")).not.toHaveText("nobody", { timeout: 5_000 });
  await expect(page.locator('[data-testid="overview-instance"]', { hasText: "holds the generator" })).toHaveCount(1);
  await page.getByTestId("generator-stop").click();
  await expect(panel.getByTestId("generator-desired")).toHaveText("stopped");
  await expect(panel.getByTestId("generator-holder")).toHaveText("nobody", { timeout: 3_000 });
});

test.describe("before hydration (JavaScript off)", () => {
  test.use({ javaScriptEnabled: false });

  test("the overview is server-rendered and its generator buttons are plain forms", async ({ page, request }) => {
    await page.goto("/");
    await expect(page.getByTestId("count-pending")).toHaveText(/^\d+$/);
    const pending = (await (await request.get("/api/overview")).json()).counts.tasks_pending;
    await expect(page.getByTestId("count-pending")).toHaveText(String(pending));
    await expect(page.getByTestId("split-brain-ok")).toBeVisible();
    await expect(page.getByTestId("throughput-bar")).toHaveCount(30);

    await page.getByTestId("generator-start").click();
    await page.waitForURL((url) => url.pathname === "/");
    await expect(page.getByTestId("generator-desired")).toHaveText("running");
    await page.getByTestId("generator-stop").click();
    await page.waitForURL((url) => url.pathname === "/");
    await expect(page.getByTestId("generator-desired")).toHaveText("stopped");
  });
});
