// poolgate's web page in a real browser: Debian's Chromium, headless, driven
// by playwright-core. host/tests/all/ui.rs starts the gateway and the mock
// upstream and runs this script; what the page cannot do itself (a request
// through the Anthropic SDK, an account answering 429, an edit of the
// config file) the script asks the test for on stdout (`NEED <what>`) and
// waits for its `OK` on stdin. Each step says what it checks; the first that
// fails ends the script with its reason (exit 1). Screenshots go to
// $UI_ARTIFACTS.
//
//   GATEWAY_URL  ADMIN_TOKEN  UI_ARTIFACTS  [CHROMIUM=/usr/bin/chromium]
//
// With DEMO_LINK (the link `poolgate demo --traffic` prints) instead, it
// opens that link — signed in by its one-time ticket, which leaves the
// address — and checks the page moves as the demo's traffic flows.
import { chromium } from "playwright-core";
import { createInterface } from "node:readline";

const url = process.env.GATEWAY_URL;
const token = process.env.ADMIN_TOKEN;
const artifacts = process.env.UI_ARTIFACTS;
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

async function need(what) {
  console.log(`NEED ${what}`);
  const { value, done } = await lines.next();
  if (done || value.trim() !== "OK") throw new Error(`the test did not do ${what}: ${value}`);
}

function step(name) { console.log(`STEP ${name}`); }

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync"],
});
async function demo(page) {
  step("the demo's link signs in, and leaves nothing in the address");
  await page.goto(process.env.DEMO_LINK);
  await page.locator("[data-account]").first().waitFor({ timeout: 10000 });
  if (await page.evaluate(() => location.hash !== "")) throw new Error("the ticket stayed in the address");
  step("the demo's pool moves live");
  const rows = () => page.locator("#decisions tbody tr").count();
  const before = await rows();
  await page.waitForFunction((n) => document.querySelectorAll("#decisions tbody tr").length > n, before, { timeout: 10000 });
  await page.waitForTimeout(1500);
  await page.screenshot({ path: `${artifacts}/ui-demo.png`, fullPage: false });
  console.log("DONE");
}

try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  page.on("pageerror", (e) => { console.log(`PAGE ERROR ${e.message}`); process.exitCode = 1; });
  if (process.env.DEMO_LINK) await demo(page);
  else await full(page);
} finally {
  await browser.close();
}

async function full(page) {
  page.on("dialog", (d) => d.accept());
  await page.goto(`${url}/ui`);

  step("a wrong token is refused");
  await page.fill("#token", "not-the-token");
  await page.click("#sign-in-form button[type=submit]");
  await page.locator("#sign-in-error", { hasText: "refused" }).waitFor({ timeout: 5000 });

  step("the page signs in and shows every account");
  await page.fill("#token", token);
  await page.click("#sign-in-form button[type=submit]");
  const ids = JSON.parse(process.env.ACCOUNTS);
  for (const id of ids) await page.locator(`[data-account="${id}"]`).waitFor({ timeout: 5000 });
  if (await page.evaluate(() => location.href.includes("token"))) throw new Error("the token went into the URL");

  step("a request made with the SDK appears in the decisions within a second, with its stages' reasons");
  await need("sdk-request");
  const asked = Date.now();
  const row = page.locator("#decisions tbody tr").first();
  await row.waitFor({ timeout: 1000 });
  console.log(`FIGURE decision_shown_ms ${Date.now() - asked}`);
  await row.locator("summary").click();
  const stages = await row.locator(".stages li").allTextContents();
  if (!stages.length || !stages.every((s) => s.includes(":"))) throw new Error(`no stage reasons: ${stages}`);

  step("a key's usage moves after its request");
  const usageCell = page.locator('#usage tr[data-key="dev"] td.day');
  await usageCell.waitFor({ timeout: 5000 });
  const before = await usageCell.textContent();
  await need("sdk-request");
  await page.waitForFunction((b) => document.querySelector('#usage tr[data-key="dev"] td.day').textContent !== b, before, { timeout: 5000 });

  step("a cooldown appears when the mock answers 429, and goes when cleared from the page");
  await need("cooldown a");
  const card = page.locator('[data-account="a"]');
  await card.locator(".cooldown").waitFor({ timeout: 3000 });
  await page.screenshot({ path: `${artifacts}/ui-laptop.png`, fullPage: true });
  await card.locator(".cooldown button").click();
  await card.locator(".cooldown").waitFor({ state: "detached", timeout: 3000 });
  await page.locator("#actions li", { hasText: "clear a" }).waitFor({ timeout: 3000 });

  step("a reload from the page takes effect");
  await need("edit-config");
  await page.click("#reload");
  await page.locator("#notice", { hasText: "Reload the configuration: applied, generation" }).waitFor({ timeout: 5000 });
  await page.locator('[data-account="a"] h3', { hasText: "renamed" }).waitFor({ timeout: 5000 });
  await page.locator("#reloads li", { hasText: "applied by admin" }).waitFor({ timeout: 3000 });

  step("readable at phone width");
  await page.setViewportSize({ width: 390, height: 844 });
  await page.screenshot({ path: `${artifacts}/ui-phone.png`, fullPage: true });
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  if (overflow > 2) throw new Error(`the page is ${overflow}px wider than a phone`);

  console.log("DONE");
}
