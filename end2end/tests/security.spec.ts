import { test, expect } from "@playwright/test";

test("a cross-site POST to a control is refused and changes nothing", async ({ request }) => {
  const resource = `xsite-${Date.now()}`;
  const res = await request.post("/api/leases", {
    headers: { Origin: "http://evil.example" },
    data: { resource, holder: "attacker" },
  });
  expect(res.status()).toBe(403);
  expect((await res.json()).error).toContain("cross-site request refused");
  const stop = await request.delete("/api/generator/stop", { headers: { Origin: "http://evil.example" } });
  expect(stop.status()).toBe(403);
  const all = await (await request.get("/api/leases?limit=1000")).json();
  expect(all.map((l: any) => l.resource)).not.toContain(resource);
});
