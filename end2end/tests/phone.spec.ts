import { test, expect, type Page } from "@playwright/test";

// A 390 px wide phone (an iPhone 12-15's CSS width): no page scrolls
// sideways, every control is on screen without scrolling a table, and the
// ownership timeline stays readable.

const WIDTH = 390;

/** The page itself does not overflow sideways. */
async function expectNoSidewaysScroll(page: Page) {
  const widths = await page.evaluate(() => ({
    doc: document.documentElement.scrollWidth,
    body: document.body.scrollWidth,
  }));
  expect(widths.doc, `${page.url()} is ${widths.doc} px wide`).toBeLessThanOrEqual(WIDTH);
  expect(widths.body, `${page.url()} body is ${widths.body} px wide`).toBeLessThanOrEqual(WIDTH);
}

/** Every visible control matching `selector` lies within the screen's width. */
async function expectControlsOnScreen(page: Page, selector: string) {
  const controls = page.locator(selector);
  const n = await controls.count();
  expect(n, `no ${selector} on ${page.url()}`).toBeGreaterThan(0);
  for (let i = 0; i < n; i++) {
    const box = await controls.nth(i).boundingBox();
    if (!box) continue; // hidden (e.g. a row scrolled out of a list)
    const id = await controls.nth(i).getAttribute("data-testid");
    expect(box.x, `${id} starts off screen on ${page.url()}`).toBeGreaterThanOrEqual(0);
    expect(box.x + box.width, `${id} ends off screen on ${page.url()}`).toBeLessThanOrEqual(WIDTH);
  }
}

test("every page fits a 390 px phone, with its controls in reach", async ({ page, request }) => {
  test.setTimeout(90_000);
  await page.setViewportSize({ width: WIDTH, height: 844 });
  // Something on every page: a worker to control (killed at the end), a
  // lease with a history, and a task whose data is one long unbroken run.
  const worker = await (await request.post("/api/workers")).json();
  const lease = await (
    await request.post("/api/leases", { data: { resource: `phone-${Date.now()}`, holder: "phone-holder-with-a-long-name", ttl_seconds: 60 } })
  ).json();
  const task = await (
    await request.post("/api/tasks", { data: { task_data: { sleep_duration_seconds: 0.1, note: "x".repeat(400) } } })
  ).json();
  try {
    for (const path of ["/", "/leases", `/leases?id=${lease.id}`, "/tasks", `/tasks?id=${task.id}`, "/workers", "/instances"]) {
      await page.goto(path);
      await expect(page.getByTestId("live-status")).toHaveAttribute("data-state", "live");
      await expectNoSidewaysScroll(page);
      await expectControlsOnScreen(page, 'header a, [data-testid^="filter-"], [data-testid$="-lookup-submit"]');
    }

    await page.goto(`/tasks?id=${task.id}`);
    await expect(page.getByTestId("detail-data")).toContainText("xxxx");
    await expectNoSidewaysScroll(page);

    await page.goto("/workers");
    const row = page.locator(`[data-testid="worker-row"][data-worker="${worker.id}"]`);
    await expect(row).toHaveCount(1);
    await expectControlsOnScreen(page, '[data-testid="worker-spawn"], [data-testid="worker-kill"], [data-testid="worker-pause"]');

    await page.goto("/instances");
    await expectControlsOnScreen(
      page,
      '[data-testid="generator-start"], [data-testid="generator-stop"], [data-testid="instance-kill"], [data-testid^="timeline-window-"]',
    );

    // The timeline scrolls inside its own box, at a readable size.
    await page.goto(`/leases?id=${lease.id}`);
    const label = page.getByTestId("timeline").getByTestId("timeline-label").first();
    await expect(label).toBeVisible();
    const box = (await label.boundingBox())!;
    expect(box.height, "timeline labels at least 9 px tall").toBeGreaterThanOrEqual(9);
    await expectNoSidewaysScroll(page);
  } finally {
    await request.post(`/api/workers/${worker.id}/kill`);
  }
});
