import { test, expect } from "../support/test";

// What an operator points a load balancer and Prometheus at, on the real
// server binary (its recorder is installed at start-up).

test("healthz, readyz and metrics answer on the running server", async ({ request }) => {
  const health = await request.get("/healthz");
  expect(health.status()).toBe(200);
  expect((await health.json()).status).toBe("ok");

  const ready = await request.get("/readyz");
  expect(ready.status()).toBe(200);
  const body = await ready.json();
  expect(body.ready).toBe(true);
  expect(body.migrations).toBeGreaterThan(0);

  // A claim through the REST API moves the claims counter.
  const count = (text: string, series: string) =>
    Number(text.split("\n").find((l) => l.startsWith(`${series} `))?.split(" ")[1] ?? "0");
  const before = await (await request.get("/metrics")).text();
  expect((await request.post("/api/tasks", { data: { task_data: { sleep_duration_seconds: 1 } } })).status()).toBe(201);
  const claim = await request.post("/api/tasks/next", { data: { processor: "pw-metrics" } });
  expect(claim.status()).toBe(202);
  const t = await claim.json();
  await request.put(`/api/tasks/${t.id}/complete`, {
    data: { processor: "pw-metrics", fencing_token: t.fencing_token, task_output: "ok" },
  });
  const metrics = await request.get("/metrics");
  expect(metrics.status()).toBe(200);
  expect(metrics.headers()["content-type"]).toContain("text/plain; version=0.0.4");
  const after = await metrics.text();
  expect(after).toContain("# TYPE leasekeeper_tasks gauge");
  expect(after).toMatch(/^leasekeeper_tasks\{status="processed"\} \d+/m);
  // Labelled by queue and kind, the fleet's pair there from the first
  // scrape (at 0); the claim may take another test's task of any pair, so
  // the family's sum is compared.
  expect(before).toMatch(/^leasekeeper_claims_total\{queue="default",kind="sleep"\} \d+/m);
  const total = (text: string, family: string) =>
    text
      .split("\n")
      .filter((l) => l.startsWith(`${family}{`) || l.startsWith(`${family} `))
      .reduce((sum, l) => sum + Number(l.split(" ").pop()), 0);
  for (const family of ["leasekeeper_claims_total", "leasekeeper_completions_total"]) {
    expect(total(after, family)).toBeGreaterThan(total(before, family));
  }
});

test.describe("a page that must not hydrate", () => {
  // Its goto must not wait for the hydration that never comes.
  test.use({ awaitHydration: false });

  test("a server serving another build's bundle says so on the page, and the page does not half-hydrate", async ({ page }) => {
    // A copy of the site whose bundle carries another build's stamp (same
    // length, so the wasm stays valid).
    const { mkdtempSync, cpSync, readFileSync, writeFileSync } = await import("node:fs");
    const { tmpdir } = await import("node:os");
    const path = await import("node:path");
    const { startInstance } = await import("../support/instances");
    const root = path.resolve(__dirname, "..", "..");
    const site = mkdtempSync(path.join(tmpdir(), "lk-site-"));
    cpSync(path.join(root, "target", "site"), site, { recursive: true });
    const wasm = path.join(site, "pkg", "leasekeeper.wasm");
    const bytes = readFileSync(wasm);
    const found = /leasekeeper-build:([0-9a-z]+)-([a-z]+);/.exec(bytes.toString("latin1"));
    expect(found, "the bundle carries its build stamp").toBeTruthy();
    const own = `${found![1]}-${found![2]}`;
    const other = `${"0".repeat(found![1].length)}-${found![2]}`;
    expect(other).not.toBe(own);
    Buffer.from(other, "latin1").copy(bytes, found!.index + "leasekeeper-build:".length);
    writeFileSync(wasm, bytes);

    const errors: string[] = [];
    page.on("pageerror", (e) => errors.push(e.message));
    const stale = await startInstance(3107, { LEPTOS_SITE_ROOT: site, LEASEKEEPER_WORKERS: "0" });
    try {
      await page.goto(`${stale.url}/workers`);
      const banner = page.getByTestId("bundle-mismatch");
      await expect(banner).toBeVisible();
      await expect(banner).toContainText(own);
      await expect(banner).toContainText(other);
      // Not hydrated (on purpose): the server-rendered page stays readable,
      // the live badge never turns live, and nothing panicked.
      await expect(page.getByTestId("workers-empty").or(page.getByTestId("workers-table"))).toBeVisible();
      await page.waitForTimeout(1_500);
      await expect(page.getByTestId("live-status")).toHaveAttribute("data-state", "connecting");
      await expect(page.locator("html[data-hydrated]")).toHaveCount(0);
      expect(errors).toEqual([]);
    } finally {
      await stale.stop();
    }
  });
});

test("a page of this build carries no mismatch banner", async ({ page }) => {
  await page.goto("/workers");
  await expect(page.getByTestId("live-status")).toHaveAttribute("data-state", "live");
  await expect(page.getByTestId("bundle-mismatch")).toHaveCount(0);
});
