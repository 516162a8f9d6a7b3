import { test as base, type APIRequestContext, type Page } from "@playwright/test";
import { instanceId, mainUrl } from "./instances";

export { expect } from "@playwright/test";
export type { APIRequestContext, Page } from "@playwright/test";

/**
 * Playwright's `test`, with two things every spec needs:
 *
 * - `page.goto` and `page.reload` return once the page is hydrated
 *   (`<html data-hydrated>`, set by the browser bundle), where JavaScript is
 *   on. Before that, pressing a control posts its plain form instead (a
 *   worker spawned, say, with no answer on the page): seen in CI, where the
 *   debug bundle took longer to load than the test took to press. A test of
 *   a page that must not hydrate says `test.use({ awaitHydration: false })`.
 *   With `E2E_SLOW_NETWORK=1` every page is loaded over a slow network,
 *   which makes such a test fail every time instead of once in a while.
 *   A page not hydrated 20 s after its load is loaded once more, said in
 *   the output with what the page had said (console errors, failed
 *   requests, uncaught errors); not hydrated again, the test fails with
 *   both. (Seen once in CI: a page after sign-out never hydrated, with no
 *   trace of why; never here, with or without the slow network.)
 * - After each test, every simulated worker the e2e server still runs is
 *   killed, so a test that failed half-way leaves no worker behind to take
 *   the next test's tasks (a failure then stays one failure).
 */
/** How long a loaded page may take to hydrate (the debug bundle is about 20 MB). */
const HYDRATION_MS = 20_000;

export const test = base.extend<{ awaitHydration: boolean; page: Page; workersLeftKilled: void }>({
  awaitHydration: [true, { option: true }],
  page: async ({ page, javaScriptEnabled, awaitHydration }, use, testInfo) => {
    if (process.env.E2E_SLOW_NETWORK) {
      // 8 MB/s and 20 ms a request: the debug bundle (about 20 MB) takes
      // seconds to arrive, as on a loaded CI machine, so a test that
      // presses before the page is hydrated fails every time.
      const cdp = await page.context().newCDPSession(page);
      await cdp.send("Network.enable");
      await cdp.send("Network.emulateNetworkConditions", {
        offline: false,
        latency: 20,
        downloadThroughput: 8_000_000,
        uploadThroughput: 8_000_000,
      });
    }
    if (javaScriptEnabled !== false && awaitHydration) {
      // What the page said, so a page that never hydrates fails with its
      // reason (a panic in the bundle, a failed load) and not only with a
      // timeout; and how long each hydration took when it was slow.
      const said: string[] = [];
      page.on("pageerror", (e) => said.push(`page error: ${e.message}`));
      page.on("console", (m) => {
        if (m.type() === "error") said.push(`console error: ${m.text()}`);
      });
      page.on("requestfailed", (r) => said.push(`request failed: ${r.url()} (${r.failure()?.errorText})`));
      const goto = page.goto.bind(page);
      const reload = page.reload.bind(page);
      const waitForHydration = () =>
        page.locator("html[data-hydrated]").waitFor({ state: "attached", timeout: HYDRATION_MS });
      const hydrated = async (what: string) => {
        const started = Date.now();
        try {
          await waitForHydration();
        } catch {
          // Once, said in the output: a bundle whose download stalled
          // (seen once in CI, never here) gets one more load; a page that
          // cannot hydrate fails again, with what it said both times.
          const first = said.join(" | ") || "nothing";
          console.log(`${what} was not hydrated ${HYDRATION_MS / 1000} s after it loaded (it said: ${first}); loading it again`);
          testInfo.setTimeout(testInfo.timeout + HYDRATION_MS + 10_000);
          said.length = 0;
          await reload();
          try {
            await waitForHydration();
          } catch (e) {
            throw new Error(
              `${what} was not hydrated after two loads; the first said: ${first}; the second: ${said.join(" | ") || "nothing"}`,
              { cause: e },
            );
          }
        }
        const took = Date.now() - started;
        if (took > 5_000) console.log(`slow hydration: ${what} took ${took} ms after its load`);
      };
      page.goto = async (url, options) => {
        said.length = 0;
        const response = await goto(url, options);
        await hydrated(url);
        return response;
      };
      page.reload = async (options) => {
        said.length = 0;
        const response = await reload(options);
        await hydrated(`${page.url()} (reloaded)`);
        return response;
      };
    }
    await use(page);
  },
  workersLeftKilled: [
    async ({ request }, use) => {
      await use();
      await killOwnWorkers(request);
    },
    { auto: true },
  ],
});

/** Kills every worker the e2e server runs that is not yet crashed or stopped. */
async function killOwnWorkers(request: APIRequestContext) {
  // Other instances' workers are listed too (one database); only their own
  // instance can kill them, and their tests stop those instances.
  const own = await instanceId(mainUrl);
  let next: string | null = `${mainUrl}/api/workers?limit=100`;
  const running: string[] = [];
  while (next) {
    const res = await request.get(next);
    if (!res.ok()) throw new Error(`listing workers: ${res.status()} ${await res.text()}`);
    const page: { id: string; instance_id: string | null; state: string }[] = await res.json();
    running.push(
      ...page.filter((w) => w.instance_id === own && w.state !== "crashed" && w.state !== "stopped").map((w) => w.id),
    );
    const link = /<([^>]+)>;\s*rel="next"/.exec(res.headers()["link"] ?? "");
    next = link ? new URL(link[1], mainUrl).toString() : null;
  }
  for (const id of running) {
    const res = await request.post(`${mainUrl}/api/workers/${id}/kill`);
    if (!res.ok()) throw new Error(`killing worker ${id} left running: ${res.status()} ${await res.text()}`);
  }
}
