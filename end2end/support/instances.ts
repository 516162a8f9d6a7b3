import { spawn, type ChildProcess } from "node:child_process";
import path from "node:path";

// Extra leasekeeper instances on the e2e server's database: the same binary
// `cargo leptos end-to-end` built, started from the repository root with the
// e2e environment (LEASEKEEPER_DATA_DIR points them at the running cluster;
// an instance that finds the cluster running shares it).

const root = path.resolve(__dirname, "..", "..");

export type Instance = {
  url: string;
  id: string;
  proc: ChildProcess;
  exited: Promise<number | null>;
  stop: () => Promise<void>;
};

/** The e2e server (instance A). */
export const mainUrl = `http://${process.env.LEPTOS_SITE_ADDR ?? "127.0.0.1:3000"}`;

/** Starts an instance on `port` and waits until it answers. */
export async function startInstance(port: number, env: Record<string, string> = {}): Promise<Instance> {
  const addr = `127.0.0.1:${port}`;
  const proc = spawn(path.join(root, "target", "debug", "leasekeeper"), ["serve"], {
    cwd: root,
    env: { ...process.env, LEPTOS_SITE_ADDR: addr, ...env },
    stdio: ["ignore", "inherit", "inherit"],
  });
  const exited = new Promise<number | null>((resolve) => proc.on("exit", (code) => resolve(code)));
  const url = `http://${addr}`;
  const deadline = Date.now() + 60_000;
  for (;;) {
    if (proc.exitCode !== null) throw new Error(`instance on ${addr} exited with ${proc.exitCode}`);
    try {
      const res = await fetch(`${url}/api/generator/status`);
      if (res.ok) {
        const id = (await res.json()).answered_by as string;
        return {
          url,
          id,
          proc,
          exited,
          stop: async () => {
            if (proc.exitCode === null) {
              proc.kill("SIGTERM");
              await exited;
            }
          },
        };
      }
    } catch {
      // not up yet
    }
    if (Date.now() > deadline) throw new Error(`instance on ${addr} did not come up within 60 s`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

/** The id of the instance serving `url`. */
export async function instanceId(url: string): Promise<string> {
  return (await (await fetch(`${url}/api/generator/status`)).json()).answered_by;
}
