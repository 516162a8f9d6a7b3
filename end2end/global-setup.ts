// Waits until the server answers: `cargo leptos end-to-end` starts Playwright
// without waiting for the server it spawned.
const addr = process.env.LEPTOS_SITE_ADDR ?? "127.0.0.1:3000";

export default async function globalSetup(): Promise<void> {
  const url = `http://${addr}/api/leases`;
  const deadline = Date.now() + 180_000;
  let last = "";
  while (Date.now() < deadline) {
    try {
      const res = await fetch(url);
      if (res.ok) return;
      last = `HTTP ${res.status}`;
    } catch (e) {
      last = String(e);
    }
    await new Promise((r) => setTimeout(r, 500));
  }
  throw new Error(`server at ${url} did not come up within 180 s: ${last}`);
}
