import { test, expect } from "../support/test";

test("a cross-site POST to a control is refused and changes nothing", async ({ request }) => {
  const resource = `xsite-${Date.now()}`;
  const res = await request.post("/api/leases", {
    headers: { Origin: "http://evil.example" },
    data: { resource, holder: "attacker" },
  });
  expect(res.status()).toBe(403);
  expect((await res.json()).error).toContain("cross-site request refused");
  // No lease was taken: the attacker's holder has nothing to release (a
  // lookup by name, whatever the number of leases).
  const release = await request.delete("/api/leases/release", { data: { resource, holder: "attacker" } });
  expect(release.status()).toBe(404);
  expect((await release.json()).error).toContain("holds no live lease");

  // The generator running: a cross-site stop is refused and it keeps running.
  expect((await request.post("/api/generator/start")).ok()).toBeTruthy();
  const before = await (await request.get("/api/generator/status")).json();
  expect(before.desired).toBe("running");
  const stop = await request.delete("/api/generator/stop", { headers: { Origin: "http://evil.example" } });
  expect(stop.status()).toBe(403);
  const after = await (await request.get("/api/generator/status")).json();
  expect(after.desired).toBe("running");
  expect(after.updated_at).toBe(before.updated_at);
  expect((await request.delete("/api/generator/stop")).ok()).toBeTruthy();
});

test("the dashboard hydrates under its Content-Security-Policy, and no other site can frame it", async ({ page, baseURL }) => {
  const violations: string[] = [];
  page.on("console", (m) => {
    if (/Content[- ]Security[- ]Policy/i.test(m.text())) violations.push(m.text());
  });
  // `goto` returns once the page is hydrated (`html[data-hydrated]`): the
  // bundle's inline script ran with the policy's nonce, its WebAssembly
  // compiled under 'wasm-unsafe-eval'.
  const res = await page.goto("/");
  const headers = res!.headers();
  const policy = headers["content-security-policy"];
  expect(policy).toContain("frame-ancestors 'none'");
  expect(policy).toMatch(/script-src 'self' 'nonce-[A-Za-z0-9_-]{16,}' 'wasm-unsafe-eval'/);
  expect(headers["x-frame-options"]).toBe("DENY");
  expect(headers["x-content-type-options"]).toBe("nosniff");
  // The live stream connects (connect-src 'self') and client-side
  // navigation works: the hydrated app runs.
  await expect(page.getByTestId("live-status")).toHaveAttribute("data-state", "live");
  await page.getByTestId("nav-leases").click();
  await expect(page).toHaveURL(/\/leases$/);
  expect(violations).toEqual([]);

  // Another site's page frames the dashboard, and, as a control, a page
  // of its own: the own one loads, the dashboard does not.
  const framer = await page.context().newPage();
  await framer.route("http://framer.test/**", (route) => {
    const url = new URL(route.request().url());
    const body =
      url.pathname === "/own"
        ? `<p data-testid="brand">framer's own page</p>`
        : `<iframe id="own" src="/own"></iframe>
           <iframe id="dashboard" src="${baseURL}/" onload="window.dashboardFrameDone = true"></iframe>`;
    return route.fulfill({ contentType: "text/html", body });
  });
  await framer.goto("http://framer.test/");
  await expect(framer.frameLocator("#own").getByTestId("brand")).toHaveText("framer's own page");
  // The refused frame's load event fires on its error page; give it a
  // few seconds either way (the server-rendered page would show its brand
  // at once, hydrated or not).
  await Promise.race([
    framer.waitForFunction(() => (window as unknown as { dashboardFrameDone?: boolean }).dashboardFrameDone === true),
    framer.waitForTimeout(5_000),
  ]);
  await expect(framer.frameLocator("#dashboard").getByTestId("brand")).toHaveCount(0);
  await framer.close();
});
