import type { APIRequestContext } from "@playwright/test";

/**
 * Finishes every other test's task, so the caller's are the only work:
 * claims and completes (over the REST API, as `pw-drain`) all that is
 * claimable, and waits for tasks other tests left claimed to go late (one
 * TTL, 3 s on the e2e server) so it can take those over and finish them
 * too. Fails after 15 s with work still left.
 */
export async function drain(request: APIRequestContext) {
  const deadline = Date.now() + 15_000;
  while (Date.now() < deadline) {
    for (;;) {
      const res = await request.post("/api/tasks/next", { data: { processor: "pw-drain" } });
      if (res.status() !== 202) break;
      const t = await res.json();
      await request.put(`/api/tasks/${t.id}/complete`, {
        data: { processor: "pw-drain", fencing_token: t.fencing_token, task_output: "drained" },
      });
    }
    const started = await (await request.get("/api/tasks/started")).json();
    const pending = await (await request.get("/api/tasks/pending")).json();
    if (started.length === 0 && pending.length === 0) return;
    await new Promise((r) => setTimeout(r, 500));
  }
  throw new Error("other tests' tasks did not drain within 15 s");
}
