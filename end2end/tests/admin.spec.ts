import { test, expect } from "../support/test";
import { startInstance, type Instance } from "../support/instances";

// An instance with LEASEKEEPER_ADMIN_TOKEN set: everything is readable,
// every control needs the token, and the sign-in form (a plain form that
// works without JavaScript) opens a server-side session whose id (never
// the token) an HttpOnly cookie keeps; signing out ends it.

const TOKEN = "e2e-admin-token-0123456789";
test.describe.configure({ mode: "serial" });

let d: Instance;
test.beforeAll(async () => {
  d = await startInstance(3103, { LEASEKEEPER_ADMIN_TOKEN: TOKEN });
});
test.afterAll(async ({ request }) => {
  await request.delete(`${d.url}/api/generator/stop`, { headers: { authorization: `Bearer ${TOKEN}` } });
  await d?.stop();
});

async function desired(request: import("@playwright/test").APIRequestContext) {
  return (await (await request.get(`${d.url}/api/generator/status`)).json()).desired;
}

test("without the token the dashboard is read-only and its controls are refused", async ({ page, request }) => {
  await request.delete(`${d.url}/api/generator/stop`, { headers: { authorization: `Bearer ${TOKEN}` } });
  await page.goto(`${d.url}/instances`);
  await expect(page.getByTestId("access-state")).toHaveAttribute("data-access", "read-only");
  await expect(page.getByTestId("generator-panel")).toBeVisible();
  await page.getByTestId("generator-start").click();
  await expect(page.getByTestId("generator-action-error")).toContainText("admin token");
  expect(await desired(request)).toBe("stopped");

  // The REST controls too; reads stay open.
  expect((await request.post(`${d.url}/api/generator/start`)).status()).toBe(401);
  expect((await request.post(`${d.url}/api/workers`)).status()).toBe(401);
  expect((await request.get(`${d.url}/api/workers`)).status()).toBe(200);
  expect(await desired(request)).toBe("stopped");
  const ok = await request.post(`${d.url}/api/generator/start`, { headers: { authorization: `Bearer ${TOKEN}` } });
  expect(ok.status()).toBe(200);
  expect(await desired(request)).toBe("running");
  await request.delete(`${d.url}/api/generator/stop`, { headers: { authorization: `Bearer ${TOKEN}` } });
});

test("a wrong token is refused; the right one unlocks the controls", async ({ page, request }) => {
  await page.goto(`${d.url}/instances`);
  await page.getByTestId("sign-in-link").click();
  await expect(page.getByTestId("sign-in")).toBeVisible();
  await page.getByTestId("sign-in-token").fill("not-the-token-at-all");
  await page.getByTestId("sign-in-submit").click();
  await expect(page.getByTestId("sign-in-error")).toContainText("not the admin token");

  await page.getByTestId("sign-in-token").fill(TOKEN);
  await page.getByTestId("sign-in-submit").click();
  // Signed in, the form goes to the overview; leaving before would abort
  // the sign-in's request (and its cookie) on a slow machine.
  await page.waitForURL((url) => url.pathname === "/");
  await page.goto(`${d.url}/instances`);
  await expect(page.getByTestId("access-state")).toHaveAttribute("data-access", "operator");
  await page.getByTestId("generator-start").click();
  await expect(page.getByTestId("generator-desired")).toHaveText("running");
  expect(await desired(request)).toBe("running");
  await page.getByTestId("generator-stop").click();
  await expect(page.getByTestId("generator-desired")).toHaveText("stopped");

  // The cookie holds a session id, not the token.
  const session = (await page.context().cookies()).find((c) => c.name === "leasekeeper_session");
  expect(session?.httpOnly).toBe(true);
  expect(session?.value).not.toContain(TOKEN);
  expect((await page.context().cookies()).some((c) => c.value.includes(TOKEN))).toBe(false);

  // Signing out ends the session: read-only again, the controls refused,
  // and the old cookie value opens nothing any more.
  await page.getByTestId("sign-out").click();
  await page.waitForURL((url) => url.pathname === "/");
  await page.goto(`${d.url}/instances`);
  await expect(page.getByTestId("access-state")).toHaveAttribute("data-access", "read-only");
  await page.getByTestId("generator-start").click();
  await expect(page.getByTestId("generator-action-error")).toContainText("admin token");
  expect(await desired(request)).toBe("stopped");
  const replayed = await request.post(`${d.url}/api/generator/start`, {
    headers: { cookie: `leasekeeper_session=${session?.value}` },
  });
  expect(replayed.status()).toBe(401);
});

test.describe("without JavaScript", () => {
  test.use({ javaScriptEnabled: false });
  test("the sign-in form works before hydration", async ({ page }) => {
    await page.goto(`${d.url}/signin`);
    await page.getByTestId("sign-in-token").fill(TOKEN);
    await page.getByTestId("sign-in-submit").click();
    await page.goto(`${d.url}/instances`);
    await expect(page.getByTestId("access-state")).toHaveAttribute("data-access", "operator");
  });
});
