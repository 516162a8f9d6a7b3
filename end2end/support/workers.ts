import { expect, type Page } from "./test";

/**
 * Presses "Spawn a worker" on the workers page and answers the new
 * worker's id once its row is in the table: the new row lands above the
 * others, and a press on another row's button while it lands could hit
 * the row that moved into its place.
 */
export async function spawnFromPage(page: Page): Promise<string> {
  const result = page.getByTestId("worker-action-result");
  const earlier = (await result.count()) > 0 ? await result.textContent() : null;
  await page.getByTestId("worker-spawn").click();
  await expect(result).toHaveText(/^spawned \S+$/);
  await expect(result).not.toHaveText(earlier ?? "");
  const id = (await result.textContent())!.replace("spawned ", "");
  await expect(page.locator(`[data-testid="worker-row"][data-worker="${id}"]`)).toHaveCount(1);
  return id;
}
