import { test, expect, APIRequestContext } from "../support/test";

// Search on the tasks page: tasks enqueued with different data through the
// REST API, found by data (and kind) from the page's GET form; the URL
// carries the search, so a reload or a shared link shows the same list.
// Tasks get a kind of their own so no simulated worker claims them.

const unique = () => `${Date.now()}-${Math.floor(Math.random() * 1e6)}`;

async function enqueue(request: APIRequestContext, kind: string, task_data: object) {
  const res = await request.post("/api/tasks", { data: { task_data, kind } });
  expect(res.status(), await res.text()).toBe(201);
  return (await res.json()).id as number;
}

test("tasks are found by their data from the page's search form, and the URL carries the search", async ({ page, request }) => {
  const run = unique();
  const kind = `e2e-search-${run}`;
  const mine = [
    await enqueue(request, kind, { customer: `c-${run}`, n: 1 }),
    await enqueue(request, kind, { customer: `c-${run}`, n: 2, nested: { vip: true } }),
  ];
  const others = [
    await enqueue(request, kind, { customer: `other-${run}`, n: 3 }),
    await enqueue(request, `${kind}-b`, { customer: `c-${run}-not`, n: 4 }),
  ];

  await page.goto("/tasks");
  await page.getByTestId("task-search-data").fill(`{"customer": "c-${run}"}`);
  await page.getByTestId("task-search-submit").click();
  await expect(page).toHaveURL(/[?&]data=/);
  const url = new URL(page.url());
  expect(JSON.parse(url.searchParams.get("data") ?? "")).toEqual({ customer: `c-${run}` });

  const rows = page.getByTestId("task-row");
  await expect(rows).toHaveCount(2);
  const ids = await rows.evaluateAll((rs) => rs.map((r) => Number(r.getAttribute("data-task-id"))));
  expect(ids).toEqual([...mine].reverse());
  for (const id of others) {
    await expect(page.locator(`[data-testid="task-row"][data-task-id="${id}"]`)).toHaveCount(0);
  }
  // The form shows the search it made.
  await expect(page.getByTestId("task-search-data")).toHaveValue(`{"customer": "c-${run}"}`);

  // The URL alone (a reload, a shared link, no script) gives the same list,
  // narrowed further by a nested field.
  const nested = `/tasks?kind=${encodeURIComponent(kind)}&data=${encodeURIComponent(JSON.stringify({ nested: { vip: true } }))}`;
  await page.goto(nested);
  await expect(page.getByTestId("task-row")).toHaveCount(1);
  await expect(page.getByTestId("task-row")).toHaveAttribute("data-task-id", String(mine[1]));
  await expect(page.getByTestId("task-search-kind")).toHaveValue(kind);

  // What is not a JSON object is refused, saying what to write.
  await page.getByTestId("task-search-data").fill("[1, 2]");
  await page.getByTestId("task-search-submit").click();
  await expect(page.getByTestId("tasks-error")).toContainText("data must be a JSON object");
  await expect(page.getByTestId("task-row")).toHaveCount(0);
});

test("a bulk cancel from a search cancels only the tasks the search shows", async ({ page, request }) => {
  const run = unique();
  const kind = `e2e-search-bulk-${run}`;
  const shown = await enqueue(request, kind, { customer: `c-${run}` });
  const kept = await enqueue(request, kind, { customer: `d-${run}` });

  await page.goto(`/tasks?status=pending&kind=${encodeURIComponent(kind)}&data=${encodeURIComponent(`{"customer":"c-${run}"}`)}`);
  await expect(page.getByTestId("task-row")).toHaveCount(1);
  await page.getByTestId("tasks-cancel-all").click();
  const confirm = page.getByTestId("task-bulk-confirm");
  await expect(confirm).toContainText(`whose data contains {"customer":"c-${run}"}`);
  await page.getByTestId("task-bulk-confirmed").click();
  await expect(page.getByTestId("task-bulk-action-result")).toContainText("1 pending tasks cancelled");

  expect((await (await request.get(`/api/tasks/${shown}`)).json()).status).toBe("cancelled");
  expect((await (await request.get(`/api/tasks/${kept}`)).json()).status).toBe("pending");
});
