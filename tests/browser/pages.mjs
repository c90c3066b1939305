// Drives the web page in headless Chromium against a running server with a CPU-only worker.
// Run by tests/browser.rs, which starts both and submits two sweeps first:
//   SMOKE_SWEEP   3 jobs that wait for GATE_FILE, then print a line, a `<script>` line and
//                 metrics (`loss`, `acc`), and write a result file; a parameter holds an <img>;
//   BLOCKED_SWEEP 3 jobs that need a GPU, so the CPU-only worker never starts them.
//
//   node pages.mjs SERVER_URL OUTPUT_DIR      (env: GATE_FILE, WORKER_NAME, CHROMIUM)
//
// Fails (exit 1) on any console error or page error other than the failed requests a step
// causes on purpose (an unknown job or sweep, a YAML error). Screenshots of every page, light
// and dark, go to OUTPUT_DIR.

import { chromium } from 'playwright-core';
import fs from 'node:fs';
import path from 'node:path';

const [base, outDir] = process.argv.slice(2);
if (!base || !outDir) {
  console.error('usage: node pages.mjs SERVER_URL OUTPUT_DIR');
  process.exit(2);
}
const gateFile = process.env.GATE_FILE;
const workerName = process.env.WORKER_NAME || 'web-worker';
const SMOKE = process.env.SMOKE_SWEEP || 'web-smoke';
const BLOCKED = process.env.BLOCKED_SWEEP || 'web-blocked';
const LONG = 60_000;
fs.mkdirSync(outDir, { recursive: true });

/** Requests that fail on purpose in some step; their console errors are expected. */
const expectedFailures = [
  /\/api\/jobs\/999999(\/|$|\?)/,
  /\/api\/sweeps\/no-such-sweep(\/|$|\?)/,
  /\/api\/sweeps\?dry_run=true/,
];
const problems = [];

async function api(pathAndQuery, options = {}) {
  const response = await fetch(base + pathAndQuery, options);
  const body = await response.json();
  if (!response.ok) throw new Error(`${pathAndQuery}: ${response.status} ${JSON.stringify(body)}`);
  return body;
}

function check(condition, what) {
  if (!condition) throw new Error(`check failed: ${what}`);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox'],
  headless: true,
});
const context = await browser.newContext({ viewport: { width: 1440, height: 900 }, colorScheme: 'light' });
const page = await context.newPage();
page.setDefaultTimeout(15_000);
page.on('console', (message) => {
  if (message.type() !== 'error') return;
  const where = message.location()?.url || '';
  if (message.text().startsWith('Failed to load resource') && expectedFailures.some((pattern) => pattern.test(where))) return;
  problems.push(`console error: ${message.text()} (${where})`);
});
page.on('pageerror', (error) => problems.push(`page error: ${error.stack || error.message}`));

let currentStep = '';
async function step(name, run) {
  currentStep = name;
  const started = Date.now();
  try {
    await run();
  } catch (error) {
    await page.screenshot({ path: path.join(outDir, 'failure.png'), fullPage: true }).catch(() => {});
    const text = await page.locator('main').innerText().catch(() => '(no page text)');
    console.error(`FAILED at step "${name}": ${error.stack || error.message}`);
    console.error(`--- page text ---\n${text.slice(0, 3000)}\n---`);
    if (problems.length) console.error(`console/page errors so far:\n  ${problems.join('\n  ')}`);
    await browser.close();
    process.exit(1);
  }
  if (problems.length) {
    console.error(`FAILED at step "${name}": console or page errors:\n  ${problems.join('\n  ')}`);
    await browser.close();
    process.exit(1);
  }
  console.log(`ok ${name} (${Date.now() - started} ms)`);
}

async function go(hash) {
  await page.evaluate((target) => { location.hash = target; }, hash);
}

async function shot(name) {
  await page.waitForTimeout(300); // let charts finish drawing
  await page.screenshot({ path: path.join(outDir, `${name}.png`), fullPage: true });
}

const jobRows = (sweep, status) =>
  page.locator(`tr[data-job-id][data-sweep="${sweep}"]${status ? `[data-status="${status}"]` : ''}`);

let smokeJob = null;

await step('the queue page lists the submitted jobs before they run', async () => {
  await page.goto(`${base}/#/`);
  await page.locator('#live[data-state="live"]').waitFor();
  await jobRows(SMOKE).nth(2).waitFor();
  check(await jobRows(SMOKE).count() === 3, 'three rows of the smoke sweep');
  check(await jobRows(SMOKE, 'succeeded').count() === 0, 'no smoke job has succeeded before the gate opens');
  await page.evaluate(() => { window.__sameDocument = true; });
});

await step('the jobs turn succeeded on the page without a reload', async () => {
  check(gateFile, 'GATE_FILE is set');
  fs.writeFileSync(gateFile, 'open\n');
  await page.waitForFunction((sweep) =>
    document.querySelectorAll(`tr[data-job-id][data-sweep="${sweep}"][data-status="succeeded"]`).length === 3,
  SMOKE, { timeout: LONG });
  check(await page.evaluate(() => window.__sameDocument === true), 'the page was not reloaded');
  const counts = await page.locator('.count-card[data-count="succeeded"] .n').innerText();
  check(Number(counts.replace(/\D/g, '')) >= 3, `the succeeded count shows at least 3 (${counts})`);
  smokeJob = Number(await jobRows(SMOKE).last().getAttribute('data-job-id'));
});

await step('cancel a queued job from its row; the API agrees', async () => {
  const row = jobRows(BLOCKED, 'queued').first();
  const id = Number(await row.getAttribute('data-job-id'));
  await row.locator('button[data-action="cancel"]').click();
  await page.locator(`tr[data-job-id="${id}"][data-status="cancelled"]`).waitFor();
  const job = await api(`/api/jobs/${id}`);
  check(job.status === 'cancelled', `job ${id} is cancelled in the API (it is ${job.status})`);
});

await step('cancel a selection of queued jobs; the API agrees', async () => {
  const row = jobRows(BLOCKED, 'queued').first();
  const id = Number(await row.getAttribute('data-job-id'));
  await row.locator('input[type="checkbox"]').check();
  await page.locator('button[data-action="cancel-selected"]').click();
  await page.locator(`tr[data-job-id="${id}"][data-status="cancelled"]`).waitFor();
  const job = await api(`/api/jobs/${id}`);
  check(job.status === 'cancelled', `job ${id} is cancelled in the API (it is ${job.status})`);
  check(await jobRows(BLOCKED, 'queued').count() === 1, 'one blocked job is still queued');
  await shot('queue');
});

await step('the job page shows its log, escaped text, a metric chart and its files', async () => {
  await page.locator(`tr[data-job-id="${smokeJob}"] a[href="#/jobs/${smokeJob}"]`).click();
  const log = page.locator('pre.log');
  await page.waitForFunction(() => document.querySelector('pre.log')?.textContent.includes('hello from web-smoke job'));
  const text = await log.textContent();
  check(text.includes('<script>window.__xss = 1</script>'), 'the log shows `<script>` as text');
  check(await page.locator('pre.log script').count() === 0, 'no script element in the log');
  await page.getByText('<img src=x onerror=window.__xss=2>', { exact: true }).first().waitFor();
  check(await page.locator('main img').count() === 0, 'no img element from a parameter value');
  await page.locator('.chart-box[data-metric="loss"] .uplot canvas').waitFor();
  await page.locator('table.files a', { hasText: 'result.txt' }).waitFor();
  const sha = await page.locator('table.files td.sha').first().innerText();
  check(/^[0-9a-f]{64}$/.test(sha.trim()), `a sha256 is shown (${sha})`);
  await page.locator('table.attempts tbody tr').first().waitFor();
  check(await page.evaluate(() => window.__xss === undefined), 'nothing injected ran');
  check(await page.evaluate(() => window.__sameDocument === true), 'still the same document');
  await shot('job');
});

await step('the sweep page shows the leaderboard, curves and a scatter', async () => {
  await go(`#/sweeps/${SMOKE}`);
  await page.locator('table.leaderboard tbody tr').nth(2).waitFor();
  check(await page.locator('table.leaderboard tbody tr').count() === 3, 'three runs on the leaderboard');
  await page.locator('.curves .uplot canvas').waitFor();
  await page.locator('.scatter .uplot canvas').waitFor();
  const csv = await page.locator('a[data-download="csv"]').getAttribute('href');
  const response = await fetch(base + csv);
  check(response.ok && (await response.text()).includes('loss'), 'the CSV download answers with the metric');
  await shot('sweep');
});

await step('the workers page shows the worker', async () => {
  await go('#/workers');
  await page.locator(`.worker-card[data-worker="${workerName}"]`).waitFor();
  await shot('workers');
});

await step('a YAML error in the submit box shows line and column and submits nothing', async () => {
  await go('#/submit');
  const before = (await api('/api/sweeps')).length;
  await page.locator('textarea[name="yaml"]').fill('name: broken\ncommand: echo {lr}\ngrid:\n  lr: [0.1, 0.2\n');
  await page.locator('button[data-action="dry-run"]').click();
  const error = page.locator('.dry-run-error .message.error');
  await error.waitFor();
  const text = await error.innerText();
  check(/line \d+/i.test(text) && /column \d+/i.test(text), `the error names a line and a column: ${text}`);
  check(await page.locator('button[data-action="submit"]').isDisabled(), 'submit is disabled after an error');
  await shot('submit-error');
  const after = (await api('/api/sweeps')).length;
  check(after === before, `no sweep was stored (${before} before, ${after} after)`);
});

await step('a dry run previews the jobs and submit stores the sweep', async () => {
  const before = (await api('/api/sweeps')).length;
  await page.locator('textarea[name="yaml"]').fill(
    'name: web-from-page\ncommand: echo {i}\nresources: {gpus: 1}\ngrid:\n  i: [1, 2, 3, 4]\n');
  await page.locator('button[data-action="dry-run"]').click();
  await page.locator('.preview .summary-line', { hasText: '4 jobs' }).waitFor();
  check(await page.locator('.preview-table tbody tr').count() === 4, 'four jobs previewed');
  check((await api('/api/sweeps')).length === before, 'a dry run stores nothing');
  await shot('submit');
  await page.locator('button[data-action="submit"]').click();
  await page.waitForFunction(() => location.hash === '#/sweeps/web-from-page');
  await page.locator('h1', { hasText: 'web-from-page' }).waitFor();
  check((await api('/api/sweeps')).length === before + 1, 'the sweep was stored');
});

await step('an unknown job or sweep shows "not found"', async () => {
  await go('#/jobs/999999');
  await page.locator('.not-found', { hasText: /not found/i }).waitFor();
  await go('#/sweeps/no-such-sweep');
  await page.locator('.not-found', { hasText: /not found/i }).waitFor();
  await go('#/no/such/page');
  await page.locator('.not-found', { hasText: /not found/i }).waitFor();
});

await step('every page in dark mode', async () => {
  await page.emulateMedia({ colorScheme: 'dark' });
  for (const [name, hash, ready] of [
    ['queue-dark', '#/', `tr[data-job-id][data-sweep="${SMOKE}"]`],
    ['sweep-dark', `#/sweeps/${SMOKE}`, '.curves .uplot canvas'],
    ['job-dark', `#/jobs/${smokeJob}`, '.chart-box[data-metric="loss"] .uplot canvas'],
    ['workers-dark', '#/workers', '.worker-card'],
    ['submit-dark', '#/submit', 'textarea[name="yaml"]'],
  ]) {
    await go(hash);
    await page.locator(ready).first().waitFor();
    await shot(name);
  }
  const background = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
  check(background !== 'rgb(255, 255, 255)' && background !== 'rgb(247, 248, 250)', `a dark background (${background})`);
});

await browser.close();
console.log(`all page checks passed; screenshots in ${outDir}`);
