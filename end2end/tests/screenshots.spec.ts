import { test } from "../support/test";
import path from "node:path";

// Not a test: refreshes the screenshots of the README and docs/dashboard.md from a running dashboard.
//   SCREENSHOTS=1 SHOT_TASK=<id> SHOT_LEASE=<id> SHOT_WORKFLOW=<id> LEPTOS_SITE_ADDR=127.0.0.1:3010 npx playwright test tests/screenshots.spec.ts
// (run against `leasekeeper-tools cluster` with the generator started, so the
// pages have something to show). Skipped unless SCREENSHOTS is set.

const docs = path.resolve(__dirname, "..", "..", "docs");
const pages: [string, string][] = [
  ["overview", "/"],
  ["leases", `/leases?id=${process.env.SHOT_LEASE ?? "1"}`],
  ["tasks", `/tasks?id=${process.env.SHOT_TASK ?? "1"}`],
  ["workers", "/workers"],
  ["schedules", "/schedules"],
  ["queues", "/queues"],
  ["workflow", `/workflows/${process.env.SHOT_WORKFLOW ?? "1"}`],
  ["instances", "/instances"],
  ["audit", "/audit"],
];

test.skip(!process.env.SCREENSHOTS, "set SCREENSHOTS=1 to refresh docs/*.png");

for (const [name, url] of pages) {
  test(`screenshot ${name}`, async ({ page }) => {
    // The queues page draws its charts from what it has seen since it
    // opened: give it half a minute of them.
    const watch = name === "queues" ? 30_000 : 1_500;
    test.setTimeout(watch + 30_000);
    await page.setViewportSize({ width: 1280, height: 900 });
    await page.goto(url);
    await page.waitForTimeout(watch); // hydrated, live, a few updates in
    // The whole page, but no taller than 1,600 px (a long task list).
    const height = Math.min(1_600, await page.evaluate(() => document.documentElement.scrollHeight));
    await page.screenshot({
      path: path.join(docs, `dashboard-${name}.png`),
      fullPage: true,
      clip: { x: 0, y: 0, width: 1280, height },
    });
  });
}

test("screenshot on a phone", async ({ page }) => {
  await page.setViewportSize({ width: 390, height: 844 });
  await page.goto("/tasks");
  await page.waitForTimeout(1_500);
  await page.screenshot({ path: path.join(docs, "dashboard-phone.png") });
});
