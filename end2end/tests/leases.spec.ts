import { test, expect, type Page } from "../support/test";

// Each test uses its own resource names, so the tests do not depend on what
// else is in the database.
const unique = (name: string) => `${name}-${Date.now()}-${Math.floor(Math.random() * 1e6)}`;

const rowOf = (page: Page, resource: string) =>
  page.locator(`[data-testid="lease-row"][data-resource="${resource}"]`);

test("a lease acquired through the API appears live, filters, and shows its history", async ({ page, request }) => {
  const resource = unique("e2e");
  const errors: string[] = [];
  page.on("pageerror", (e) => errors.push(e.message));
  page.on("console", (m) => m.type() === "error" && errors.push(m.text()));
  await page.goto("/leases");
  await expect(page.getByTestId("lease-filters")).toBeVisible();
  await expect(rowOf(page, resource)).toHaveCount(0);

  const res = await request.post("/api/leases", { data: { resource, holder: "playwright", ttl_seconds: 120 } });
  expect(res.status()).toBe(201);
  const lease = await res.json();

  // No reload: the hydrated page refreshes itself.
  const row = rowOf(page, resource);
  await expect(row).toBeVisible({ timeout: 5_000 });
  await expect(row.getByTestId("lease-holder")).toHaveText("playwright");
  await expect(row.getByTestId("lease-token")).toHaveText(String(lease.fencing_token));
  await expect(row.getByTestId("lease-state")).toHaveText("active");
  await expect(row.getByTestId("lease-expiry")).toContainText("expires in");

  await page.getByTestId("filter-released").click();
  await expect(page).toHaveURL(/state=released/);
  await expect(page.getByTestId("filter-released")).toHaveAttribute("aria-current", "page");
  await expect(row).toHaveCount(0);

  await page.getByTestId("filter-active").click();
  await expect(page).toHaveURL(/state=active/);
  await expect(row).toBeVisible();

  const released = await request.delete("/api/leases/release", { data: { resource, holder: "playwright" } });
  expect(released.status()).toBe(200);
  await expect(row).toHaveCount(0, { timeout: 5_000 });

  await page.getByTestId("filter-released").click();
  await expect(row).toBeVisible();
  await expect(row.getByTestId("lease-state")).toHaveText("released");

  await page.getByTestId("lease-lookup-input").fill(String(lease.id));
  await page.getByTestId("lease-lookup-submit").click();
  await expect(page).toHaveURL(new RegExp(`id=${lease.id}`));
  const detail = page.getByTestId("lease-detail");
  await expect(detail).toBeVisible();
  await expect(detail.getByTestId("detail-holder")).toHaveText("playwright");
  const kinds = detail.getByTestId("history-event");
  await expect(kinds).toHaveCount(2);
  await expect(kinds.nth(0)).toHaveAttribute("data-kind", "released");
  await expect(kinds.nth(1)).toHaveAttribute("data-kind", "acquired");
  // Hydration and every refresh ran without a browser-side error.
  expect(errors).toEqual([]);
});

test("looking up a missing or malformed id says so", async ({ page }) => {
  await page.goto("/leases?id=987654321");
  await expect(page.getByTestId("lease-detail-missing")).toContainText("No lease with id 987654321");
  await page.goto("/leases?id=abc");
  await expect(page.getByTestId("lease-detail-error")).toContainText("positive integer");
});

test.describe("before hydration (JavaScript off)", () => {
  test.use({ javaScriptEnabled: false });

  test("the server-rendered page lists, filters and looks up leases", async ({ page, request }) => {
    const resource = unique("nojs");
    const res = await request.post("/api/leases", { data: { resource, holder: "static", ttl_seconds: 120 } });
    expect(res.status()).toBe(201);
    const lease = await res.json();

    await page.goto("/leases");
    await expect(rowOf(page, resource)).toBeVisible();
    await page.getByTestId("filter-expired").click();
    await expect(page).toHaveURL(/state=expired/);
    await expect(rowOf(page, resource)).toHaveCount(0);

    await page.getByTestId("lease-lookup-input").fill(String(lease.id));
    await page.getByTestId("lease-lookup-submit").click();
    await expect(page.getByTestId("lease-detail").getByTestId("detail-token")).toHaveText(String(lease.fencing_token));
  });
});

test("a timeline opens on a recent window, its buttons choose how much, and operator rows name the action", async ({ page, request }) => {
  test.setTimeout(60_000);
  const resource = unique("window");
  const first = await (await request.post("/api/leases", { data: { resource, holder: "old-holder", ttl_seconds: 60 } })).json();
  expect((await request.delete("/api/leases/release", { data: { resource, holder: "old-holder" } })).status()).toBe(200);
  await page.waitForTimeout(16_000); // past the 15 s window
  const second = await (await request.post("/api/leases", { data: { resource, holder: "new-holder", ttl_seconds: 60 } })).json();
  expect(second.id).toBe(first.id);

  await page.goto(`/leases?id=${first.id}`);
  await expect(page.getByTestId("live-status")).toHaveAttribute("data-state", "live");
  const timeline = page.locator(`[data-testid="timeline"][data-resource="${resource}"]`);
  const terms = timeline.getByTestId("timeline-term");
  await expect(timeline).toHaveAttribute("data-window", "60");
  await expect(timeline.getByTestId("timeline-window-60")).toHaveAttribute("aria-pressed", "true");
  await expect(terms).toHaveCount(2);

  await timeline.getByTestId("timeline-window-15").click();
  await expect(timeline).toHaveAttribute("data-window", "15");
  await expect(terms).toHaveCount(1);
  await expect(terms).toHaveAttribute("data-holder", "new-holder");
  await expect(timeline.getByTestId("timeline-older")).toContainText("1 older term");
  await expect(timeline.getByTestId("timeline-span")).toHaveText("-15 s");

  await timeline.getByTestId("timeline-window-all").click();
  await expect(terms).toHaveCount(2);
  await expect(timeline.getByTestId("timeline-older")).toHaveCount(0);

  // A force-release from the page: the history names the action, not just
  // "operator".
  await page.getByTestId("lease-force-release").click();
  const op = page.getByTestId("lease-detail").locator('[data-testid="history-event"][data-kind="operator"]');
  await expect(op).toHaveCount(1);
  await expect(op).toContainText("operator: force release");
  await expect(op).toContainText(`token #${second.fencing_token}`);
  await expect(op).toContainText("held by new-holder");
  // Tokens are explained where they first appear.
  await expect(page.getByTestId("fencing-token-note")).toContainText("fencing token");
});
