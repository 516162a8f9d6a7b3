import { test, expect, type APIRequestContext, type Page } from "../support/test";

// The workflows pages and a workflow task's page, in a real browser. Every
// task gets a kind of its own, claimed by kind, so no simulated worker
// (which runs `sleep` tasks) and no other test takes it.

const unique = () => `e2e-wf-${Date.now()}-${Math.floor(Math.random() * 1e6)}`;

type FlowTask = { ref: string; id: number; status: string };
type Flow = { id: number; name: string; status: string; tasks: FlowTask[] };

/** A diamond: fetch, then resize and scan, then publish after both. */
async function diamond(request: APIRequestContext, kind: string): Promise<Flow> {
  const res = await request.post("/api/workflows", {
    data: {
      name: `photo ${kind}`,
      tasks: [
        { ref: "fetch", kind, task_data: { url: "https://example.com/a.jpg" } },
        { ref: "resize", kind, task_data: {}, depends_on: ["fetch"] },
        { ref: "scan", kind, task_data: {}, depends_on: ["fetch"] },
        { ref: "publish", kind, task_data: {}, depends_on: ["resize", "scan"] },
      ],
    },
  });
  expect(res.status(), await res.text()).toBe(201);
  return res.json();
}

const task = (flow: Flow, ref: string) => {
  const t = flow.tasks.find((t) => t.ref === ref);
  if (!t) throw new Error(`no task ${ref} in ${JSON.stringify(flow)}`);
  return t;
};

async function claim(request: APIRequestContext, kind: string, processor: string) {
  const res = await request.post("/api/tasks/next", { data: { processor, kinds: [kind] } });
  expect(res.status(), await res.text()).toBe(202);
  return res.json();
}

async function complete(request: APIRequestContext, claimed: { id: number; fencing_token: number }, processor: string, output: unknown) {
  const res = await request.put(`/api/tasks/${claimed.id}/complete`, {
    data: { processor, fencing_token: claimed.fencing_token, task_output: output },
  });
  expect(res.status(), await res.text()).toBe(202);
}

/** After a click that may load a new document: the new page is hydrated. */
async function hydrated(page: Page) {
  await page.locator("html[data-hydrated]").waitFor({ state: "attached", timeout: 20_000 });
}

const node = (page: Page, ref: string) => page.locator(`[data-testid="dag-node"][data-ref="${ref}"]`);

test("a workflow is listed, drawn as a graph that follows its tasks live, and its tasks link to each other", async ({ page, request }) => {
  const kind = unique();
  const flow = await diamond(request, kind);

  // The list: newest first, so ours is on the first page.
  await page.goto("/workflows");
  const row = page.locator(`[data-testid="workflow-row"][data-workflow-id="${flow.id}"]`);
  await expect(row.getByTestId("workflow-status")).toHaveText("running");
  await expect(row.getByTestId("workflow-processed")).toHaveText("0/4");
  await expect(row.getByTestId("workflow-link")).toHaveText(`photo ${kind}`);
  await row.getByTestId("workflow-link").click();
  await expect(page).toHaveURL(new RegExp(`/workflows/${flow.id}$`));
  await hydrated(page);

  // The graph: four nodes in three layers, four edges from parent to child.
  const dag = page.getByTestId("workflow-dag");
  await expect(dag.getByTestId("dag-node")).toHaveCount(4);
  await expect(dag.getByTestId("dag-edge")).toHaveCount(4);
  const edges = await dag
    .getByTestId("dag-edge")
    .evaluateAll((els) => els.map((e) => `${e.getAttribute("data-from")}->${e.getAttribute("data-to")}`).sort());
  expect(edges).toEqual(["fetch->resize", "fetch->scan", "resize->publish", "scan->publish"]);
  const layers = await dag
    .getByTestId("dag-node")
    .evaluateAll((els) => Object.fromEntries(els.map((e) => [e.getAttribute("data-ref"), e.getAttribute("data-layer")])));
  expect(layers).toEqual({ fetch: "0", resize: "1", scan: "1", publish: "2" });
  // Drawn top to bottom: a parent's box ends above its child's.
  const fetchBox = (await node(page, "fetch").boundingBox())!;
  const publishBox = (await node(page, "publish").boundingBox())!;
  expect(fetchBox.y + fetchBox.height).toBeLessThan(publishBox.y);
  await expect(node(page, "fetch").getByTestId("dag-node-status")).toHaveText("pending");
  await expect(node(page, "publish")).toHaveAttribute("data-status", "waiting");
  await expect(node(page, "publish").locator("rect")).toHaveClass(/fill-violet-100/);
  for (const ref of ["fetch", "resize", "scan", "publish"]) {
    await expect(node(page, ref).getByTestId("dag-node-link")).toHaveAttribute("href", `/tasks?id=${task(flow, ref).id}`);
  }
  // The table says the same, for screen readers.
  const tableRow = page.locator(`[data-testid="workflow-task-row"][data-ref="publish"]`);
  await expect(tableRow.getByTestId("workflow-task-parents")).toHaveText("resize, scan");
  await expect(tableRow.getByTestId("workflow-task-status")).toHaveText("waiting");

  // Claimed over REST: the node turns started without a reload.
  const fetch = await claim(request, kind, "pw-wf");
  expect(fetch.id).toBe(task(flow, "fetch").id);
  await expect(node(page, "fetch").getByTestId("dag-node-status")).toHaveText("started");
  await expect(node(page, "fetch").locator("rect")).toHaveClass(/fill-sky-100/);

  // A child's page: its workflow, its parent (started) and child, and no
  // parent outputs yet.
  await node(page, "resize").getByTestId("dag-node-link").click();
  await expect(page).toHaveURL(new RegExp(`/tasks\\?id=${task(flow, "resize").id}$`));
  await hydrated(page);
  const detail = page.getByTestId("task-detail");
  await expect(detail.getByTestId("detail-status")).toHaveText("waiting");
  await expect(detail.getByTestId("detail-workflow")).toHaveAttribute("href", `/workflows/${flow.id}`);
  const parent = detail.getByTestId("detail-parent");
  await expect(parent).toHaveCount(1);
  await expect(parent).toHaveAttribute("data-ref", "fetch");
  await expect(parent).toHaveAttribute("data-status", "started");
  await expect(parent.getByRole("link")).toHaveAttribute("href", `/tasks?id=${task(flow, "fetch").id}`);
  const child = detail.getByTestId("detail-child");
  await expect(child).toHaveAttribute("data-ref", "publish");
  await expect(child).toHaveAttribute("data-status", "waiting");
  await expect(detail.getByTestId("detail-on-parent-failure")).toHaveText("cancel");
  await expect(detail.getByTestId("detail-parent-outputs")).toHaveText("");

  // The parent completes: the child's page shows its output, live.
  await complete(request, fetch, "pw-wf", { width: 640 });
  await expect(parent).toHaveAttribute("data-status", "processed");
  await expect(detail.getByTestId("detail-parent-outputs")).toHaveText('{"fetch":{"width":640}}');
  await expect(detail.getByTestId("detail-status")).toHaveText("pending");

  // Back on the workflow: fetch processed, its children pending, 1 of 4.
  await detail.getByTestId("detail-workflow").click();
  await expect(page).toHaveURL(new RegExp(`/workflows/${flow.id}$`));
  await expect(node(page, "fetch").getByTestId("dag-node-status")).toHaveText("processed");
  await expect(node(page, "resize").getByTestId("dag-node-status")).toHaveText("pending");
  await expect(node(page, "scan").getByTestId("dag-node-status")).toHaveText("pending");
  await expect(page.getByTestId("workflow-detail-processed")).toHaveText("1/4 processed");

  // Finish it, so no other test finds its tasks pending; it ends completed.
  for (let i = 0; i < 3; i++) await complete(request, await claim(request, kind, "pw-wf"), "pw-wf", i);
  await expect(page.getByTestId("workflow-detail-status")).toHaveText("completed");
  await expect(page.getByTestId("workflow-cancel")).toHaveCount(0);
  await page.goto("/workflows");
  await expect(row.getByTestId("workflow-processed")).toHaveText("4/4");
  await expect(row.getByTestId("workflow-status")).toHaveText("completed");
});

test("a task waiting for a signal shows the wait on its page, then the signal it got", async ({ page, request }) => {
  const kind = unique();
  const created = await request.post("/api/tasks", { data: { kind, task_data: {} } });
  expect(created.status()).toBe(201);
  const claimed = await claim(request, kind, "pw-waiter");
  const before = Date.now();
  const wait = await request.put(`/api/tasks/${claimed.id}/wait`, {
    data: { processor: "pw-waiter", fencing_token: claimed.fencing_token, signal: "approved", timeout_seconds: 600 },
  });
  expect(wait.status(), await wait.text()).toBe(200);

  await page.goto(`/tasks?id=${claimed.id}`);
  const detail = page.getByTestId("task-detail");
  await expect(detail.getByTestId("detail-status")).toHaveText("waiting");
  await expect(detail.getByTestId("detail-wait-signal")).toHaveText("approved");
  await expect(detail.getByTestId("detail-signals")).toHaveText("none yet");
  // Until about ten minutes from now.
  const until = Date.parse((await detail.getByTestId("detail-wait-until").locator("time").getAttribute("datetime"))!);
  expect(until).toBeGreaterThan(before + 590_000);
  expect(until).toBeLessThan(Date.now() + 610_000);
  // Not a workflow task: no workflow part.
  await expect(detail.getByTestId("detail-workflow-place")).toHaveCount(0);

  const signal = await request.post(`/api/tasks/${claimed.id}/signal`, { data: { name: "approved", payload: { by: "e2e" } } });
  expect(signal.status(), await signal.text()).toBe(200);
  await expect(detail.getByTestId("detail-signals")).toHaveText('{"approved":{"by":"e2e"}}');
  await expect(detail.getByTestId("detail-status")).toHaveText("pending");

  await complete(request, await claim(request, kind, "pw-waiter"), "pw-waiter", "approved");
  await expect(detail.getByTestId("detail-status")).toHaveText("processed");
});

test("Cancel workflow asks first, then cancels every unfinished task and ends the started one's claim", async ({ page, request }) => {
  const kind = unique();
  const flow = await diamond(request, kind);
  await complete(request, await claim(request, kind, "pw-wf-cancel"), "pw-wf-cancel", "fetched");
  const resize = await claim(request, kind, "pw-wf-cancel");

  await page.goto(`/workflows/${flow.id}`);
  await expect(node(page, "resize").getByTestId("dag-node-status")).toHaveText("started");
  await expect(node(page, "scan").getByTestId("dag-node-status")).toHaveText("pending");

  // Asked first; keeping it changes nothing.
  await page.getByTestId("workflow-cancel").click();
  const confirm = page.getByTestId("workflow-cancel-confirm");
  await expect(confirm).toContainText("Cancel the 3 unfinished tasks");
  await confirm.getByTestId("workflow-cancel-keep").click();
  await expect(confirm).toHaveCount(0);
  expect((await (await request.get(`/api/workflows/${flow.id}`)).json()).status).toBe("running");

  await page.getByTestId("workflow-cancel").click();
  await confirm.getByTestId("workflow-cancel-confirmed").click();
  await expect(page.getByTestId("workflow-action-result")).toHaveText(`workflow ${flow.id} is cancelled: 3 of its 4 tasks cancelled`);
  await expect(page.getByTestId("workflow-detail-status")).toHaveText("cancelled");
  await expect(node(page, "fetch").getByTestId("dag-node-status")).toHaveText("processed");
  for (const ref of ["resize", "scan", "publish"]) {
    await expect(node(page, ref).getByTestId("dag-node-status")).toHaveText("cancelled");
    await expect(node(page, ref).locator("rect")).toHaveClass(/fill-amber-100/);
  }
  await expect(page.getByTestId("workflow-cancel")).toHaveCount(0);

  // The started task's holder is refused its next write.
  const beat = await request.put(`/api/tasks/${resize.id}/heartbeat`, {
    data: { processor: "pw-wf-cancel", fencing_token: resize.fencing_token },
  });
  expect(beat.status()).toBe(409);
  const now: Flow = await (await request.get(`/api/workflows/${flow.id}`)).json();
  expect(now.status).toBe("cancelled");
  expect(now.tasks.map((t) => `${t.ref}:${t.status}`).sort()).toEqual([
    "fetch:processed",
    "publish:cancelled",
    "resize:cancelled",
    "scan:cancelled",
  ]);
});

test("a workflow that does not exist says so", async ({ page }) => {
  await page.goto("/workflows/987654321");
  await expect(page.getByTestId("workflow-missing")).toHaveText("No workflow with id 987654321.");
});

test.describe("before hydration (JavaScript off)", () => {
  test.use({ javaScriptEnabled: false });

  test("the server draws the graph, and Cancel workflow works as a link and a plain form", async ({ page, request }) => {
    const kind = unique();
    const flow = await diamond(request, kind);
    await page.goto("/workflows");
    await expect(page.locator(`[data-testid="workflow-row"][data-workflow-id="${flow.id}"]`)).toHaveCount(1);
    await page.goto(`/workflows/${flow.id}`);
    await expect(page.getByTestId("dag-node")).toHaveCount(4);
    await expect(page.getByTestId("dag-edge")).toHaveCount(4);
    await page.getByTestId("workflow-cancel").click();
    await page.getByTestId("workflow-cancel-confirmed").click();
    await page.waitForURL(new RegExp(`/workflows/${flow.id}`));
    await expect(page.getByTestId("workflow-detail-status")).toHaveText("cancelled");
    await expect(page.locator('[data-testid="dag-node"][data-status="cancelled"]')).toHaveCount(4);
    expect((await (await request.get(`/api/workflows/${flow.id}`)).json()).status).toBe("cancelled");
  });
});
