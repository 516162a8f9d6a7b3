import { test, expect, type Page } from "../support/test";

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

/**
 * Every visible control matching `selector` lies within the screen's width.
 * Measured in one read inside the page: a live refetch may remove rows
 * between two reads (a claimed task leaves the pending list), and waiting
 * on the n-th of a list that shrank would wait forever.
 */
async function expectControlsOnScreen(page: Page, selector: string) {
  const boxes = await page.evaluate((sel) => {
    return Array.from(document.querySelectorAll(sel)).map((el) => {
      const r = el.getBoundingClientRect();
      return { id: el.getAttribute("data-testid"), x: r.x, width: r.width, shown: r.width > 0 || r.height > 0 };
    });
  }, selector);
  expect(boxes.length, `no ${selector} on ${page.url()}`).toBeGreaterThan(0);
  for (const box of boxes) {
    if (!box.shown) continue; // hidden (e.g. a collapsed menu)
    expect(box.x, `${box.id} starts off screen on ${page.url()}`).toBeGreaterThanOrEqual(0);
    expect(box.x + box.width, `${box.id} ends off screen on ${page.url()}`).toBeLessThanOrEqual(WIDTH);
  }
}

test("every page fits a 390 px phone, with its controls in reach", async ({ page, request }) => {
  test.setTimeout(90_000);
  await page.setViewportSize({ width: WIDTH, height: 844 });
  // Something on every page: a lease with a history, a task whose data is
  // one long unbroken run, and (from the workers check on) a worker to control.
  const lease = await (
    await request.post("/api/leases", { data: { resource: `phone-${Date.now()}`, holder: "phone-holder-with-a-long-name", ttl_seconds: 60 } })
  ).json();
  const task = await (
    await request.post("/api/tasks", { data: { task_data: { sleep_duration_seconds: 0.1, note: "x".repeat(400) } } })
  ).json();
  // A workflow whose graph is wider than the phone (three tasks side by
  // side): it scrolls in its own box. Its tasks have a kind no worker runs.
  const wfKind = `phone-wf-${Date.now()}`;
  const flow = await (
    await request.post("/api/workflows", {
      data: {
        name: "phone",
        tasks: [
          { ref: "root", kind: wfKind, task_data: {} },
          ...["left", "middle", "right"].map((ref) => ({ ref, kind: wfKind, task_data: {}, depends_on: ["root"] })),
        ],
      },
    })
  ).json();
  for (const path of ["/", "/leases", `/leases?id=${lease.id}`, "/tasks", `/tasks?id=${task.id}`, "/workers", "/queues", "/instances", "/audit", "/workflows", `/workflows/${flow.id}`]) {
    await page.goto(path);
    await expect(page.getByTestId("live-status")).toHaveAttribute("data-state", "live");
    await expectNoSidewaysScroll(page);
    await expectControlsOnScreen(page, 'header a, [data-testid^="filter-"], [data-testid$="-lookup-submit"]');
  }

  // The queues table's pause buttons stay in reach (the sticky column).
  await page.goto("/queues");
  await expect(page.getByTestId("live-status")).toHaveAttribute("data-state", "live");
  await expectControlsOnScreen(page, '[data-testid="queue-pause"], [data-testid="queue-resume"]');

  await page.goto(`/tasks?id=${task.id}`);
  await expect(page.getByTestId("detail-data")).toContainText("xxxx");
  await expectNoSidewaysScroll(page);

  // Task controls: the bulk link and each row's cancel button.
  await page.goto("/tasks?status=pending");
  await expect(page.getByTestId("tasks-cancel-all")).toBeVisible();
  await expectControlsOnScreen(page, '[data-testid="tasks-cancel-all"], [data-testid="task-cancel"]');
  await page.getByTestId("tasks-cancel-all").click();
  await expect(page.getByTestId("task-bulk-confirm")).toBeVisible();
  await expectNoSidewaysScroll(page);
  await expectControlsOnScreen(page, '[data-testid="task-bulk-confirmed"], [data-testid="task-bulk-keep"]');

  // The workflow's cancel and its confirmation are in reach; then it is
  // cancelled, so its tasks do not stay pending.
  await page.goto(`/workflows/${flow.id}`);
  await expectControlsOnScreen(page, '[data-testid="workflow-cancel"]');
  await page.getByTestId("workflow-cancel").click();
  await expect(page.getByTestId("workflow-cancel-confirm")).toBeVisible();
  await expectNoSidewaysScroll(page);
  await expectControlsOnScreen(page, '[data-testid="workflow-cancel-confirmed"], [data-testid="workflow-cancel-keep"]');
  expect((await request.post(`/api/workflows/${flow.id}/cancel`)).status()).toBe(200);

  // The dead letters: a group whose error is one long unbroken run, its
  // Retry these and its confirmation in reach. Its kind no worker runs.
  const dlKind = `phone-dlq-${Date.now()}`;
  expect((await request.post("/api/tasks", { data: { task_data: {}, kind: dlKind, max_attempts: 1 } })).status()).toBe(201);
  const claimed = await (await request.post("/api/tasks/next", { data: { processor: "phone", kinds: [dlKind] } })).json();
  const failed = await request.put(`/api/tasks/${claimed.id}/fail`, {
    data: { processor: "phone", fencing_token: claimed.fencing_token, error: "e".repeat(300) },
  });
  expect(failed.status()).toBe(200);
  await page.goto(`/tasks?status=failed&kind=${dlKind}`);
  await expect(page.getByTestId("dead-letter-row")).toHaveCount(1);
  await expectNoSidewaysScroll(page);
  await expectControlsOnScreen(page, '[data-testid="dead-letter-retry"]');
  await page.getByTestId("dead-letter-retry").click();
  await expect(page.getByTestId("dead-letter-confirm")).toBeVisible();
  await expectNoSidewaysScroll(page);
  await expectControlsOnScreen(page, '[data-testid="dead-letter-confirmed"], [data-testid="dead-letter-keep"]');

  // Spawned only now, so it claims no task the checks above look at.
  const worker: { id: string } = await (await request.post("/api/workers")).json();
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
  // A live refetch may redraw the timeline between two reads: measure
  // until a read finds the label in place.
  await expect
    .poll(async () => (await label.boundingBox())?.height ?? 0, { message: "timeline labels at least 9 px tall" })
    .toBeGreaterThanOrEqual(9);
  await expectNoSidewaysScroll(page);
});
