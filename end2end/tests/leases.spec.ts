import { test, expect, type Page } from "@playwright/test";

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
