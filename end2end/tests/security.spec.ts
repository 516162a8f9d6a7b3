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
