// The browser half of `leasekeeper-tools bench dashboard`'s push-to-pixel
// phase: Chromium (Debian's, as the end-to-end tests use) driven through
// playwright-core. The bench (Rust) commits the changes and owns the clock
// on its side; this script only watches a page and says when the change
// reached the screen. One JSON object per line each way:
//
//   bench -> here                      here -> bench
//   (start)                            {"ready": true}
//   {"cmd":"open","path":"/tasks"}     {"opened": "/tasks"}  (hydrated, live)
//   {"cmd":"arm","probe":n,            {"armed": n}
//    "selector":"…","value":"…"|null}
//   {"cmd":"wait","probe":n,           {"probe": n, "shown_ms": <epoch ms>,
//    "committed_ms": <epoch ms>}         "stages": {…}}
//   {"cmd":"quit"}                     (exits)
//
// "Shown" is the first frame painted after the DOM held the change: a
// MutationObserver sees the element (`selector`, with `data-value` equal to
// `value` when given) appear, then requestAnimationFrame waits for the next
// frame and a message posted from its callback runs once that frame's paint
// has been handed over. Its wall-clock time (performance.timeOrigin +
// performance.now(), the same system clock the bench reads) is the pixel.
//
// The stages (the profile, not the measure): when the first `change` event
// after the commit reached the page, when the refetch that brought the
// change (the page's server function whose answer came last before the DOM
// showed it) started and ended, and when the DOM showed it; each in ms after
// the commit.
//
// Environment: BASE (the dashboard's address), PLAYWRIGHT_CORE (the
// playwright-core module's directory), CHROMIUM_PATH (default
// /usr/bin/chromium).

import { createRequire } from "node:module";
import readline from "node:readline";

const require = createRequire(import.meta.url);
const { chromium } = require(process.env.PLAYWRIGHT_CORE);
const base = process.env.BASE;

function say(obj) {
  process.stdout.write(JSON.stringify(obj) + "\n");
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM_PATH || "/usr/bin/chromium",
  // As end2end/playwright.config.ts: what Chromium needs on these machines.
  args: [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
  ],
});
const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
// Before the page's own scripts: note when each `change` event reaches the
// page's listener, for the stages (the constructor is left alone: the
// page's code checks what it builds).
await context.addInitScript(() => {
  window.__changes = [];
  const add = EventSource.prototype.addEventListener;
  EventSource.prototype.addEventListener = function (type, listener, ...rest) {
    if (type !== "change") return add.call(this, type, listener, ...rest);
    const noted = function (event) {
      window.__changes.push(performance.timeOrigin + performance.now());
      return typeof listener === "function" ? listener.call(this, event) : listener.handleEvent(event);
    };
    return add.call(this, type, noted, ...rest);
  };
});
let page = null;

// Installed in the page: one watcher per probe, resolving to the time of
// the first painted frame after the condition held.
function arm({ probe, selector, value }) {
  performance.clearResourceTimings();
  window.__changes = [];
  const holds = () => {
    const el = document.querySelector(selector);
    return el !== null && (value === null || el.getAttribute("data-value") === value);
  };
  if (holds()) {
    return false; // already on screen: the probe would measure nothing
  }
  window.__pixel = window.__pixel || {};
  window.__pixel[probe] = new Promise((resolve) => {
    const observer = new MutationObserver(() => {
      if (!holds()) return;
      observer.disconnect();
      window.__dom = window.__dom || {};
      window.__dom[probe] = performance.timeOrigin + performance.now();
      requestAnimationFrame(() => {
        const channel = new MessageChannel();
        channel.port1.onmessage = () => resolve(performance.timeOrigin + performance.now());
        channel.port2.postMessage(null);
      });
    });
    observer.observe(document.documentElement, {
      subtree: true,
      childList: true,
      attributes: true,
      characterData: true,
    });
  });
  return true;
}

const lines = readline.createInterface({ input: process.stdin });
say({ ready: true });
for await (const line of lines) {
  if (!line.trim()) continue;
  const msg = JSON.parse(line);
  try {
    if (msg.cmd === "open") {
      if (page) await page.close();
      page = await context.newPage();
      const said = [];
      page.on("console", (m) => m.type() === "error" && said.push(m.text()));
      page.on("pageerror", (e) => said.push(String(e)));
      await page.goto(base + msg.path);
      // Hydrated and on the event stream, or no measurement makes sense.
      try {
        await page
          .locator('[data-testid="live-status"][data-state="live"]')
          .waitFor({ timeout: 30_000 });
      } catch (e) {
        // The server refuses to go live with a bundle of another build
        // (commit or profile) and says so on the page.
        const mismatch = await page
          .locator('[data-testid="bundle-mismatch"]')
          .textContent({ timeout: 1_000 })
          .catch(() => null);
        throw new Error(
          `${msg.path} did not go live (hydrated, event stream open): ${mismatch || said.join(" | ") || e.message}`,
        );
      }
      say({ opened: msg.path });
    } else if (msg.cmd === "arm") {
      const ok = await page.evaluate(arm, {
        probe: msg.probe,
        selector: msg.selector,
        value: msg.value ?? null,
      });
      if (!ok) throw new Error(`probe ${msg.probe}: ${msg.selector} is on screen before its commit`);
      say({ armed: msg.probe });
    } else if (msg.cmd === "wait") {
      const [shown, stages] = await page.evaluate(
        async ({ probe, committed, fetch }) => {
          const shown = await Promise.race([
            window.__pixel[probe],
            new Promise((_, reject) => setTimeout(() => reject(new Error("not shown within 10 s")), 10_000)),
          ]);
          const dom = window.__dom[probe];
          const event = window.__changes.find((t) => t >= committed);
          const at = (t) => performance.timeOrigin + t;
          const brought = performance
            .getEntriesByType("resource")
            .filter((e) => e.name.includes(fetch) && at(e.responseEnd) <= dom)
            .sort((a, b) => a.responseEnd - b.responseEnd)
            .pop();
          const after = (t) => (t === undefined ? null : t - committed);
          return [
            shown,
            {
              event: after(event),
              fetch_start: after(brought && at(brought.startTime)),
              fetch_end: after(brought && at(brought.responseEnd)),
              dom: after(dom),
            },
          ];
        },
        { probe: msg.probe, committed: msg.committed_ms, fetch: msg.fetch },
      );
      say({ probe: msg.probe, shown_ms: shown, stages });
    } else if (msg.cmd === "quit") {
      break;
    }
  } catch (e) {
    say({ error: String(e && e.message ? e.message : e) });
  }
}
await browser.close();
