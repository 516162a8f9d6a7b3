import { test, expect } from "../support/test";

// One instance here (two-instance runs come with the live-push issue); the
// e2e server runs with a 3 s TTL, so renewals every 1 s (see .ci/test).

test("start and stop the generator from the page", async ({ page, request }) => {
  await page.goto("/instances");
  const panel = page.getByTestId("generator-panel");
  await expect(panel).toBeVisible();
  const me = page.locator('[data-testid="instance-row"][data-alive="true"]');
  await expect(me).toHaveCount(1);
  const instanceId = await me.getAttribute("data-instance");

  await page.getByTestId("generator-start").click();
  await expect(panel.getByTestId("generator-desired")).toHaveText("running");
  await expect(panel.getByTestId("generator-holder")).toHaveText(instanceId!, { timeout: 5_000 });
  await expect(panel.getByTestId("generator-token")).toHaveText(/^\d+$/);
  await expect(panel.getByTestId("generator-expiry")).toContainText("expires in");
  await expect(me).toContainText("holds the generator");

  // It generates: a task naming this instance's term appears within two intervals.
  await expect
    .poll(async () => {
      const tasks = await (await request.get("/api/tasks?limit=1000")).json();
      return tasks.filter((t: any) => t.task_data.generator === instanceId).length;
    }, { timeout: 6_000 })
    .toBeGreaterThan(0);

  await page.getByTestId("generator-stop").click();
  await expect(panel.getByTestId("generator-desired")).toHaveText("stopped");
  // The holder notices within one renew interval and releases.
  await expect(panel.getByTestId("generator-holder")).toHaveText("nobody", { timeout: 3_000 });
  const status = await (await request.get("/api/generator/status")).json();
  expect(status.holder).toBeNull();
});

test.describe("before hydration (JavaScript off)", () => {
  test.use({ javaScriptEnabled: false });

  test("the generator buttons work as plain forms", async ({ page, request }) => {
    await page.goto("/instances");
    await page.getByTestId("generator-start").click();
    await page.waitForURL(/\/instances/);
    await expect(page.getByTestId("generator-desired")).toHaveText("running");
    expect((await (await request.get("/api/generator/status")).json()).desired).toBe("running");
    await page.getByTestId("generator-stop").click();
    await page.waitForURL(/\/instances/);
    await expect(page.getByTestId("generator-desired")).toHaveText("stopped");
  });
});
