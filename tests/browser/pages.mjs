// Drives the web page in headless Chromium against a running server with a CPU-only worker.
// Run by tests/e2e/browser.rs, which starts both and prepares:
//   web-requeue   1 GPU job claimed by a "ghost" worker that sent GPU readings and vanished:
//                 the reaper requeued it (REQUEUED_JOB, GHOST_WORKER);
//   web-smoke     4 jobs that wait for GATE_FILE, then print a line, a `<script>` line and
//                 metrics (`loss`, `acc`, `lr`, `test_acc` once), write a result file; the one
//                 with lr=0.0001 then fails; a parameter holds an <img>, another 17 digits;
//   web-blocked   3 jobs that need a GPU, so the CPU-only worker never starts them;
//   web-analysis  24 random-search runs whose loss follows lr;
//   web-gpu       1 GPU job finished by a worker that reported its GPU use: six readings of a
//                 mostly idle GPU (MEASURED_JOB).
// It submits web-from-page (the submit page) and, last, web-blind (its metric never arrives)
// and web-typo (a misspelt program that pauses itself after three failed runs).
//
//   node pages.mjs SERVER_URL OUTPUT_DIR  (env: GATE_FILE, WORKER_NAME, GHOST_WORKER, REQUEUED_JOB, MEASURED_JOB, CHROMIUM)
//
// Each view is checked at 1440x900 and again at 390x844, with a check for each defect the page
// once had (the check names say which). Fails (exit 1) on any console error or page error other
// than the failed requests a step causes on purpose. Screenshots of every view, at both sizes,
// light and dark, go to OUTPUT_DIR as `<view>-<desktop|phone>-<light|dark>.png`.

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
const ghostName = process.env.GHOST_WORKER || 'ghost-gpu-box';
const requeuedJob = Number(process.env.REQUEUED_JOB);
const measuredJob = Number(process.env.MEASURED_JOB);
const SMOKE = 'web-smoke';
const BLOCKED = 'web-blocked';
const ANALYSIS = 'web-analysis';
const LONG = 90_000;
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
  const text = await response.text();
  if (!response.ok) throw new Error(`${pathAndQuery}: ${response.status} ${text}`);
  return pathAndQuery.includes('format=csv') ? text : JSON.parse(text);
}

function check(condition, what) {
  if (!condition) throw new Error(`check failed: ${what}`);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox'],
  headless: true,
});

/** A page in its own context (`size`: desktop or phone), reporting console errors. */
async function open(size) {
  const options = size === 'phone'
    ? { viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true, deviceScaleFactor: 1 }
    : { viewport: { width: 1440, height: 900 } };
  const context = await browser.newContext({ ...options, colorScheme: 'light' });
  const opened = await context.newPage();
  opened.setDefaultTimeout(20_000);
  opened.on('console', (message) => {
    if (message.type() !== 'error') return;
    const where = message.location()?.url || '';
    if (message.text().startsWith('Failed to load resource') && expectedFailures.some((pattern) => pattern.test(where))) return;
    problems.push(`console error: ${message.text()} (${where})`);
  });
  opened.on('pageerror', (error) => problems.push(`page error: ${error.stack || error.message}`));
  return opened;
}

let page = await open('desktop');
let size = 'desktop';

async function step(name, run) {
  const started = Date.now();
  try {
    await run();
  } catch (error) {
    await page.screenshot({ path: path.join(outDir, 'failure.png'), fullPage: true }).catch(() => {});
    const text = await page.locator('main').innerText().catch(() => '(no page text)');
    console.error(`FAILED at step "${name}" (${size}): ${error.stack || error.message}`);
    console.error(`--- page text ---\n${text.slice(0, 3000)}\n---`);
    if (problems.length) console.error(`console/page errors so far:\n  ${problems.join('\n  ')}`);
    await browser.close();
    process.exit(1);
  }
  if (problems.length) {
    console.error(`FAILED at step "${name}" (${size}): console or page errors:\n  ${problems.join('\n  ')}`);
    await browser.close();
    process.exit(1);
  }
  console.log(`ok ${name} [${size}] (${Date.now() - started} ms)`);
}

async function go(hash) {
  await page.evaluate((target) => { location.hash = target; }, hash);
}

async function shot(name) {
  await page.waitForTimeout(400); // let charts finish drawing
  await page.screenshot({ path: path.join(outDir, `${name}.png`), fullPage: true });
}

const jobRows = (sweep, status) =>
  page.locator(`tr[data-job-id][data-sweep="${sweep}"]${status ? `[data-status="${status}"]` : ''}`);

/**
 * How many pixels of a canvas are drawn in a series colour (uPlot draws on a canvas, so "the
 * chart shows the data" is a question about its pixels). Any of the eight series colours
 * counts: runs drawn at the same point cover one another.
 */
async function inked(selector) {
  return page.evaluate((target) => {
    const canvas = document.querySelector(target);
    if (!canvas) return -1;
    const style = getComputedStyle(document.documentElement);
    const colours = Array.from({ length: 8 }, (_, i) => style.getPropertyValue(`--series-${i + 1}`).trim())
      .map((hex) => [1, 3, 5].map((at) => parseInt(hex.slice(at, at + 2), 16)));
    const { data } = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height);
    let count = 0;
    for (let i = 0; i < data.length; i += 4) {
      if (data[i + 3] < 200) continue;
      if (colours.some(([r, g, b]) => Math.abs(data[i] - r) + Math.abs(data[i + 1] - g) + Math.abs(data[i + 2] - b) < 60)) count += 1;
    }
    return count;
  }, selector);
}

/**
 * The boxes of every element matching `selector`, measured in one go inside the page (a live
 * refresh between finding an element and measuring it would otherwise detach it).
 */
async function boxes(selector) {
  return page.evaluate((target) => [...document.querySelectorAll(target)].map((element) => {
    const { x, y, width, height } = element.getBoundingClientRect();
    return { x, y, width, height };
  }), selector);
}

/** The page does not scroll sideways: everything fits the viewport's width. */
async function fitsWidth(what) {
  const { scroll, width } = await page.evaluate(() => ({ scroll: document.documentElement.scrollWidth, width: window.innerWidth }));
  check(scroll <= width + 1, `${what}: the page is ${scroll}px wide in a ${width}px viewport`);
}

let smokeJob = null;
let failedJob = null;

// --- desktop, light --------------------------------------------------------------------------

await step('the queue page lists the submitted jobs before they run', async () => {
  await page.goto(`${base}/#/`);
  await page.locator('#live[data-state="live"]').waitFor();
  await jobRows(SMOKE).nth(3).waitFor();
  check(await jobRows(SMOKE).count() === 4, 'four rows of the smoke sweep');
  check(await jobRows(SMOKE, 'succeeded').count() === 0, 'no smoke job has succeeded before the gate opens');
  await page.evaluate(() => { window.__sameDocument = true; });
});

await step('issue 29 item 1: each sweep shows its owner, and the owner filter keeps one user\'s', async () => {
  check(await page.locator(`.sweeps tr[data-sweep="${SMOKE}"][data-owner="default"]`).count() === 1, 'the smoke sweep is default\'s');
  await go('#/?owner=nobody');
  await page.locator('.sweeps', { hasText: 'No sweeps of nobody.' }).waitFor();
  await page.locator('tr.empty-row', { hasText: 'No jobs match.' }).waitFor();
  check(await page.locator('select[name="owner"]').inputValue() === 'nobody', 'the filter shows the owner asked for');
  await go('#/?owner=default');
  await jobRows(SMOKE).nth(3).waitFor();
  await go('#/');
  await jobRows(SMOKE).nth(3).waitFor();
});

await step('item 7: a requeued job shows no worker and no running duration in the queue', async () => {
  const row = page.locator(`tr[data-job-id="${requeuedJob}"]`);
  await go(`#/?sweep=web-requeue`);
  await row.waitFor();
  check(await row.getAttribute('data-status') === 'queued', 'the requeued job is queued');
  const worker = await row.locator('td.col-worker').innerText();
  check(!worker.includes(ghostName) && worker.includes('requeued'), `the worker cell says requeued, not the lost worker (${worker})`);
  check(await row.locator('td.col-duration .live-duration').count() === 0, 'no duration counts for a queued job');
  check((await row.locator('td.col-gpu').innerText()).trim() === '—', 'no GPU for a queued job');
  await go('#/');
});

await step('the jobs end on the page without a reload (three succeed, one fails)', async () => {
  check(gateFile, 'GATE_FILE is set');
  fs.writeFileSync(gateFile, 'open\n');
  await page.waitForFunction((sweep) =>
    document.querySelectorAll(`tr[data-job-id][data-sweep="${sweep}"][data-status="succeeded"]`).length === 3 &&
    document.querySelectorAll(`tr[data-job-id][data-sweep="${sweep}"][data-status="failed"]`).length === 1,
  SMOKE, { timeout: LONG });
  check(await page.evaluate(() => window.__sameDocument === true), 'the page was not reloaded');
  const counts = await page.locator('.count-card[data-count="succeeded"] .n').innerText();
  check(Number(counts.replace(/\D/g, '')) >= 3, `the succeeded count shows at least 3 (${counts})`);
  smokeJob = Number(await jobRows(SMOKE, 'succeeded').first().getAttribute('data-job-id'));
  failedJob = Number(await jobRows(SMOKE, 'failed').first().getAttribute('data-job-id'));
});

await step('item 3: parameters show short in the queue, exact on hover', async () => {
  const cell = jobRows(SMOKE).first().locator('td.params');
  const text = await cell.innerText();
  check(text.includes('wd=0.0002606') && !text.includes('0.00026057902620338835'), `short wd in the queue: ${text}`);
  check((await cell.getAttribute('title')).includes('wd=0.00026057902620338835'), 'the exact value is in the title');
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
  const wd = page.locator('[data-param="wd"]');
  check(await wd.innerText() === '0.0002606' && await wd.getAttribute('title') === '0.00026057902620338835',
    'item 3: the job page shows wd short with the exact value on hover');
});

await step('item 2: a metric written once is drawn as a point and shown as a number', async () => {
  const box = page.locator('.chart-box[data-metric="test_acc"]');
  await box.locator('.uplot canvas').waitFor();
  check((await box.locator('.single-value').innerText()).includes('0.91'), 'the value is shown as a number');
  await page.waitForTimeout(300);
  const ink = await inked('.chart-box[data-metric="test_acc"] .uplot canvas');
  check(ink > 20, `the single value is drawn on the chart (${ink} pixels in the series colour)`);
  await shot('job-desktop-light');
});

await step('item 7: the requeued job shows no stale worker, GPUs or duration; reasons are sentences', async () => {
  await go(`#/jobs/${requeuedJob}`);
  await page.locator('h1', { hasText: `Job ${requeuedJob}` }).waitFor();
  const api_job = await api(`/api/jobs/${requeuedJob}`);
  check(api_job.status === 'queued' && api_job.attempt === 1, `the API has it queued after attempt 1 (${api_job.status})`);
  const details = page.locator('table.kv').first();
  const row = (label) => details.locator('tr', { has: page.locator('th', { hasText: new RegExp(`^${label}$`) }) }).locator('td');
  check(!(await row('Worker').innerText()).includes(ghostName), 'the details name no worker');
  check((await row('GPUs').innerText()).trim() === '—', 'the details list no GPU');
  check(await row('Duration').locator('.live-duration').count() === 0 && (await row('Duration').innerText()).trim() === '—',
    'the duration does not count');
  const main = await page.locator('main').innerText();
  check(!main.includes('lease_expired'), 'no raw reason identifier on the page');
  check(/stopped sending heartbeats/.test(await page.locator('.page-head .reason').innerText()), 'the reason is a sentence');
  // The attempts table keeps where attempt 1 ran, marked requeued.
  const attempt = page.locator('table.attempts tr[data-attempt="1"]');
  await attempt.waitFor();
  check((await attempt.innerText()).includes(ghostName) && (await attempt.innerText()).includes('requeued'), 'attempt 1 ran on the ghost and was requeued');
});

await step("item 9: the job's GPU chart has its own GPU's readings from its attempt", async () => {
  const panel = page.locator('section.job-gpu');
  await panel.locator('[data-gpu-chart="utilization"] .uplot canvas').waitFor();
  const samples = Number(await panel.locator('.charts').getAttribute('data-samples'));
  check(samples === 3, `the three readings of GPU 0 during the attempt (${samples})`);
  const legend = await panel.locator('[data-gpu-chart="utilization"] .u-legend').innerText();
  check(legend.includes('GPU 0') && !legend.includes('GPU 1'), `only the job's GPU: ${legend}`);
  await shot('requeued-desktop-light');
});

await step('items 1 and 4: each metric column follows its own direction, and lr is labelled apart', async () => {
  await go(`#/sweeps/${SMOKE}`);
  await page.locator('table.leaderboard tbody tr').nth(3).waitFor();
  check(await page.locator('table.leaderboard tbody tr').count() === 4, 'four runs on the leaderboard');
  const headers = await page.locator('table.leaderboard thead tr.names th').allInnerTexts();
  check(headers.some((text) => text.startsWith('loss best ↓')), `the sweep metric's best is its min: ${headers}`);
  check(headers.some((text) => text.startsWith('acc best ↑')), `accuracy's best is its max under "minimize loss": ${headers}`);
  check(headers.some((text) => text.startsWith('lr (param)')), `the parameter lr is labelled: ${headers}`);
  check(headers.some((text) => text.startsWith('lr (metric) min')) && headers.some((text) => text.startsWith('lr (metric) max')),
    `the metric lr, direction unknown, shows min and max: ${headers}`);
  check(!headers.some((text) => text.startsWith('lr (metric) best')), 'no best for a metric whose direction is unknown');
  check((await page.locator('table.leaderboard thead tr.groups').innerText()).includes('Parameters'), 'a group row names parameters');
  // acc went 0.1, 0.2, 0.3, 0.4, 0.3, 0.2: its best is 0.4, not the min 0.1 or the last 0.2.
  const accIndex = headers.findIndex((text) => text.startsWith('acc best'));
  const accCells = await page.locator(`table.leaderboard tbody tr td:nth-child(${accIndex + 1})`).allInnerTexts();
  check(accCells.every((text) => text.trim() === '0.4'), `every run's best acc is 0.4: ${accCells}`);
  const csv = await api(`/api/sweeps/${SMOKE}/summary?format=csv`);
  const [header, first] = csv.split('\n');
  const column = header.split(',').indexOf('acc.best');
  check(column > 0 && first.split(',')[column] === '0.4', `the CSV agrees: acc.best is 0.4 (${header} / ${first})`);
  check(csv.includes('0.00026057902620338835'), 'the CSV keeps the exact wd');
});

await step('issue 28 item 6: wd, the same in every run, is said once above the leaderboard, exactly', async () => {
  const headers = await page.locator('table.leaderboard thead tr.names th').allInnerTexts();
  check(!headers.some((text) => text.startsWith('wd')), `no wd column: ${headers.join(' | ')}`);
  const constants = page.locator('.leaderboard-panel p.constants');
  check((await constants.innerText()).includes('wd=0.00026057902620338835'), `said once: ${await constants.innerText()}`);
});

await step('item 8: leaderboard columns sort on click', async () => {
  const lr = page.locator('table.leaderboard thead th', { hasText: 'lr (param)' });
  const lrIndex = (await page.locator('table.leaderboard thead tr.names th').allInnerTexts()).findIndex((t) => t.startsWith('lr (param)'));
  const column = () => page.locator(`table.leaderboard tbody tr td:nth-child(${lrIndex + 1})`).allInnerTexts();
  await lr.click();
  check(JSON.stringify((await column()).map(Number)) === JSON.stringify([0.0001, 0.001, 0.01, 0.1]), `ascending lr: ${await column()}`);
  await lr.click();
  check(JSON.stringify((await column()).map(Number)) === JSON.stringify([0.1, 0.01, 0.001, 0.0001]), `descending lr: ${await column()}`);
  check(await lr.getAttribute('aria-sort') === 'descending', 'aria-sort says so');
});

await step('item 8: failed runs are marked in the scatter; the estimate says the sweep has ended', async () => {
  await page.locator('.scatter .uplot canvas').waitFor();
  check(Number(await page.locator('.scatter').getAttribute('data-failed-points')) === 1, 'one failed run marked in the scatter');
  check((await page.locator('.scatter .u-legend').innerText()).includes('failed'), 'the legend names failed runs');
  check((await page.locator('.progress-panel .eta').innerText()).includes('every job has ended'), 'the estimate of a finished sweep');
});

await step('item 2 and 8: the curves chart picks any metric, draws single values, smooths and goes log', async () => {
  await page.locator('.curves .uplot canvas').waitFor();
  check(await page.locator('.curves').getAttribute('data-metric') === 'loss', 'the ranking metric by default');
  await page.locator('select[name="curve-metric"]').selectOption('test_acc');
  await page.locator('.curves[data-metric="test_acc"]').waitFor();
  await page.locator('.curves', { hasText: 'wrote test_acc once' }).waitFor();
  await page.waitForTimeout(300);
  const ink = await inked('.curves .uplot canvas');
  check(ink > 20, `single values are drawn (${ink} pixels)`);
  await page.locator('select[name="curve-metric"]').selectOption('loss');
  await page.locator('.curves[data-metric="loss"]').waitFor();
  await page.locator('input[name="smoothing"]').fill('0.6');
  await page.locator('.curves .u-legend', { hasText: '(smoothed)' }).waitFor();
  await page.locator('input[name="log-y"]').check();
  await page.waitForTimeout(300);
  check(await inked('.curves .uplot canvas') > 20, 'the log-y chart draws');
  await page.locator('input[name="smoothing"]').fill('0');
  await page.locator('input[name="log-y"]').uncheck();
});

await step('item 8: ticking two runs overlays their curves and diffs their parameters', async () => {
  const ticks = page.locator('table.leaderboard tbody td.tick input');
  await ticks.nth(0).check();
  await ticks.nth(1).check();
  const compare = page.locator('section.compare');
  await compare.locator('h2', { hasText: 'Comparing 2 runs' }).waitFor();
  check(await compare.locator('tr[data-param="lr"]').count() === 1, 'lr differs and is listed');
  check(await compare.locator('tr[data-param="wd"]').count() === 0, 'wd is the same and is not');
  check((await compare.locator('.same-params').innerText()).includes('wd=0.0002606'), 'the same ones are summarised');
  await page.locator('.curves h2', { hasText: 'Compared runs' }).waitFor();
  check(await page.locator('.curves').getAttribute('data-runs') === '2', 'two curves overlaid');
  await shot('sweep-desktop-light');
  await compare.locator('button', { hasText: 'clear' }).click();
  await page.locator('section.compare[hidden]').waitFor({ state: 'attached' });
});

await step('item 8: the analysis sweep: importance, best so far, parallel coordinates with brushing', async () => {
  await go(`#/sweeps/${ANALYSIS}`);
  await page.locator('.progress-panel h2', { hasText: 'Progress: 24 of 24 finished' }).waitFor({ timeout: LONG });
  await page.locator('.best-so-far .chart[data-points="24"]').waitFor();
  const first = page.locator('.importance .bar-row').first();
  await first.waitFor();
  check(await first.getAttribute('data-param') === 'lr', `lr matters most: ${await page.locator('.importance').innerText()}`);
  const low = await page.locator('.importance .bar-row[data-param="batch_size"]').getAttribute('data-importance');
  check(Number(low) < 0.3, `batch size hardly matters (${low})`);
  check((await page.locator('.importance .method').innerText()).includes('ANOVA'), 'the method is named');
  const lines = page.locator('svg.parcoords path.pc-line');
  await page.waitForFunction(() => document.querySelectorAll('svg.parcoords path.pc-line').length === 24);
  check(await lines.count() === 24, 'one line per run');
  check(await page.locator('table.leaderboard tbody tr').count() === 24, 'all runs listed before brushing');
  // Brush the upper half of the metric axis (the worst losses: higher is up).
  const hit = page.locator('svg.parcoords rect.pc-hit[data-brush="metric:val_loss"]');
  const box = await hit.boundingBox();
  await page.mouse.move(box.x + box.width / 2, box.y + 2);
  await page.mouse.down();
  await page.mouse.move(box.x + box.width / 2, box.y + box.height * 0.5, { steps: 5 });
  await page.mouse.up();
  await page.locator('.filter-note').waitFor();
  const inside = Number(await page.locator('svg.parcoords').getAttribute('data-inside'));
  const shown = await page.locator('table.leaderboard tbody tr').count();
  check(inside > 0 && inside < 24 && shown === inside, `the leaderboard shows the ${inside} brushed runs (${shown})`);
  await page.locator('.progress-panel .eta').waitFor();
  await shot('analysis-desktop-light');
  await page.locator('.filter-note button', { hasText: 'clear brushes' }).click();
  await page.waitForFunction(() => document.querySelectorAll('table.leaderboard tbody tr').length === 24);
});

await step('item 8: a sweep whose jobs wait for a worker says why there is no estimate', async () => {
  await go(`#/sweeps/${BLOCKED}`);
  await page.locator('.progress-panel .eta').waitFor();
  const text = await page.locator('.progress-panel .eta').innerText();
  check(text.includes('no estimate'), `no estimate for a sweep with nothing finished: ${text}`);
});

await step('issue 12 item 4: a sweep and a job no connected worker can run say why', async () => {
  // Only the CPU worker is connected by now (the GPU ones went silent).
  const reason = 'it asks for 1 GPU; no connected worker has a GPU';
  const unplaceable = page.locator('.progress-panel [data-unplaceable]');
  await unplaceable.waitFor();
  check((await unplaceable.innerText()).includes(reason), `the sweep says why: ${await unplaceable.innerText()}`);
  const queued = (await api(`/api/jobs?sweep=${BLOCKED}&status=queued`)).jobs[0];
  check(queued.waiting?.reason === reason, `the API says why: ${JSON.stringify(queued.waiting)}`);
  await go(`#/jobs/${queued.id}`);
  const waiting = page.locator('[data-waiting="never"]');
  await waiting.waitFor();
  check((await waiting.innerText()).includes(reason), `the job page says why: ${await waiting.innerText()}`);
});

await step("issue 14 item 8 and issue 16 item 9: a job's own GPU use, charted and flagged mostly idle", async () => {
  await go(`#/jobs/${measuredJob}`);
  const charts = page.locator('section.job-gpu .charts[data-source="accounting"]');
  await charts.waitFor();
  await page.locator('section.job-gpu [data-gpu-chart="memory"] .uplot canvas').waitFor();
  check(await charts.getAttribute('data-samples') === '6', `the six readings of its run (${await charts.getAttribute('data-samples')})`);
  check((await page.locator('section.job-gpu h3').first().innerText()).includes("this job's share"), 'the chart says whose use it is');
  const use = await page.locator('[data-gpu-use]').innerText();
  check(use.includes('mean 10.3%') && use.includes('7.0 GiB') && use.includes('GPU mostly idle: input-bound?'), `the GPU use line: ${use}`);
  const details = await page.locator('table.kv').first().innerText();
  check(details.includes('GPU mostly idle: input-bound? GPU 0 averaged 10% busy'), 'the note is on the page');
  await shot('measured-desktop-light');
  await go('#/sweeps/web-gpu');
  const cell = page.locator('table.leaderboard tbody td[data-gpu="gpu:util"]');
  await cell.waitFor();
  check((await cell.innerText()).trim() === '⚠ 10', `the leaderboard flags the run: ${await cell.innerText()}`);
  check(await page.locator('table.leaderboard thead th[data-column="gpu:hours"]').count() === 1, 'a GPU-hours column');
});

await step('the workers page shows the worker, the lost ghost last, and which job holds a GPU', async () => {
  await go('#/workers');
  await page.locator(`.worker-card[data-worker="${workerName}"]`).waitFor();
  const ghost = page.locator(`.worker-card[data-worker="${ghostName}"]`);
  await ghost.waitFor();
  check(await ghost.getAttribute('data-state') === 'lost', 'the ghost is lost');
  // The ghost and the worker that reported a measured job are both lost by now.
  const order = await page.locator('.worker-card').evaluateAll((cards) => cards.map((card) => `${card.dataset.worker}:${card.dataset.state}`));
  const firstLost = order.findIndex((entry) => entry.endsWith(':lost'));
  check(firstLost > 0 && order.slice(firstLost).every((entry) => entry.endsWith(':lost')), `lost workers come last: ${order}`);
  check(order.includes(`${ghostName}:lost`), `the ghost is among them: ${order}`);
  const trainer = process.env.WORKER_TRAINER || 'no';
  check(await page.locator(`.worker-card[data-worker="${workerName}"] [data-trainer="${trainer}"]`).count() === 1,
    `the worker's card says whether it has the trainer (${trainer})`);
  check(await ghost.locator('.gpu-row').count() === 2, 'the ghost has two GPU rows');
  // The measured job held a GPU for a minute: its owner's GPU-hours say so.
  const week = page.locator('section.usage tr[data-user="default"] td[data-window="7d"]');
  await week.waitFor();
  check((await week.innerText()).trim() === '0.01667', `default's GPU-hours over 7 days: ${await week.innerText()}`);
  await shot('workers-desktop-light');
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
  const after = (await api('/api/sweeps')).length;
  check(after === before, `no sweep was stored (${before} before, ${after} after)`);
});

const PREVIEW_SWEEP = 'name: web-from-page\ncommand: |\n  python train.py --i {i} --lr {lr}\n  echo finished run {i} with a long command line that would wrap on a phone\n' +
  'resources: {gpus: 1}\ngrid:\n  i: [1, 2, 3, 4]\n  lr: [0.00026057902620338835]\n';

await step('a dry run previews the jobs and submit stores the sweep', async () => {
  const before = (await api('/api/sweeps')).length;
  await page.locator('textarea[name="yaml"]').fill(PREVIEW_SWEEP);
  await page.locator('button[data-action="dry-run"]').click();
  await page.locator('.preview .summary-line', { hasText: '4 jobs' }).waitFor();
  check(await page.locator('.preview-table tbody tr').count() === 4, 'four jobs previewed');
  check((await api('/api/sweeps')).length === before, 'a dry run stores nothing');
  await shot('submit-desktop-light');
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

await step('the queue, at last', async () => {
  await go('#/');
  await jobRows(SMOKE).first().waitFor();
  await shot('queue-desktop-light');
});

/** Every view, ready when its selector shows; the submit view shows a dry run. */
const VIEWS = [
  ['queue', '#/', `tr[data-job-id][data-sweep="${SMOKE}"]`],
  ['sweep', `#/sweeps/${SMOKE}`, '.curves .uplot canvas'],
  ['analysis', `#/sweeps/${ANALYSIS}`, 'svg.parcoords path.pc-line'],
  ['job', () => `#/jobs/${smokeJob}`, '.chart-box[data-metric="loss"] .uplot canvas'],
  ['requeued', () => `#/jobs/${requeuedJob}`, '[data-gpu-chart="utilization"] .uplot canvas'],
  ['workers', '#/workers', '.worker-card .gpu-row'],
  ['submit', '#/submit', '.preview-table tbody tr'],
];

async function showView(hash, ready, name) {
  await go(typeof hash === 'function' ? hash() : hash);
  if (name === 'submit') {
    await page.locator('textarea[name="yaml"]').fill(PREVIEW_SWEEP.replace('web-from-page', 'web-preview'));
    await page.locator('button[data-action="dry-run"]').click();
  }
  await page.locator(ready).first().waitFor();
}

await step('every view in dark mode', async () => {
  await page.emulateMedia({ colorScheme: 'dark' });
  for (const [name, hash, ready] of VIEWS) {
    await showView(hash, ready, name);
    await shot(`${name}-desktop-dark`);
  }
  const background = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
  check(background !== 'rgb(255, 255, 255)' && background !== 'rgb(247, 248, 250)', `a dark background (${background})`);
});

// --- phone, 390 px wide --------------------------------------------------------------------

await page.context().close();
page = await open('phone');
size = 'phone';

await step('item 6: the queue at 390 px shows the Status column', async () => {
  await page.goto(`${base}/#/?sweep=${SMOKE}`);
  await jobRows(SMOKE).first().waitFor();
  const cells = await boxes('tr[data-job-id] td.col-status');
  check(cells.length === 4, `four status cells (${cells.length})`);
  for (const box of cells) check(box.x >= 0 && box.x + box.width <= 390, `a status cell is on screen (${JSON.stringify(box)})`);
  await fitsWidth('the queue');
  await shot('queue-phone-light');
});

await step('item 6: the job page charts fit the 390 px viewport', async () => {
  await go(`#/jobs/${smokeJob}`);
  await page.locator('.chart-box[data-metric="loss"] .uplot canvas').waitFor();
  await page.locator('.chart-box[data-metric="test_acc"] .uplot canvas').waitFor();
  await page.waitForTimeout(300);
  for (const box of await boxes('.uplot')) {
    check(box.x >= 0 && box.x + box.width <= 390, `a chart lies within the viewport (${JSON.stringify(box)})`);
  }
  await fitsWidth('the job page');
  await shot('job-phone-light');
  await go(`#/jobs/${requeuedJob}`);
  await page.locator('[data-gpu-chart="utilization"] .uplot canvas').waitFor();
  await fitsWidth('the requeued job page');
  await shot('requeued-phone-light');
});

/** Whether two boxes overlap by more than a pixel. */
function overlap(a, b) {
  return a.x < b.x + b.width - 1 && b.x < a.x + a.width - 1 && a.y < b.y + b.height - 1 && b.y < a.y + a.height - 1;
}

await step("item 6: the workers' chart captions do not overlap at 390 px", async () => {
  await go('#/workers');
  await page.locator(`.worker-card[data-worker="${ghostName}"] .gpu-row .uplot`).first().waitFor();
  await page.waitForTimeout(300);
  const rows = await page.evaluate((ghost) => [...document.querySelectorAll(`.worker-card[data-worker="${ghost}"] .gpu-row`)].map((row) =>
    ['.gpu-head', '.spark h4', '.spark .uplot', '.readings'].flatMap((selector) =>
      [...row.querySelectorAll(selector)].map((part) => {
        const { x, y, width, height } = part.getBoundingClientRect();
        return { selector, box: { x, y, width, height } };
      }))), ghostName);
  check(rows.length === 2, `the ghost's two GPU rows (${rows.length})`);
  for (const parts of rows) {
    check(parts.length === 6, `a GPU row has its head, two captions, two charts and readings (${parts.length})`);
    for (let i = 0; i < parts.length; i += 1) {
      for (let j = i + 1; j < parts.length; j += 1) {
        check(!overlap(parts[i].box, parts[j].box), `${parts[i].selector} and ${parts[j].selector} overlap in a GPU row`);
      }
    }
  }
  await fitsWidth('the workers page');
  await shot('workers-phone-light');
});

await step('item 6: dry-run preview rows stay one line at 390 px', async () => {
  await showView('#/submit', '.preview-table tbody tr', 'submit');
  const rows = await boxes('.preview-table tbody tr');
  check(rows.length === 4, `four previewed jobs (${rows.length})`);
  for (const box of rows) check(box.height <= 48, `a preview row is ${box.height}px tall`);
  await fitsWidth('the submit page');
  await shot('submit-phone-light');
});

await step('the sweep views fit 390 px', async () => {
  await go(`#/sweeps/${SMOKE}`);
  await page.locator('.curves .uplot canvas').waitFor();
  await fitsWidth('the sweep page');
  await shot('sweep-phone-light');
  await go(`#/sweeps/${ANALYSIS}`);
  await page.locator('svg.parcoords path.pc-line').first().waitFor();
  await page.locator('.best-so-far .uplot canvas').waitFor();
  await fitsWidth('the analysis page');
  await shot('analysis-phone-light');
});

await step('every view at 390 px in dark mode', async () => {
  await page.emulateMedia({ colorScheme: 'dark' });
  for (const [name, hash, ready] of VIEWS) {
    await showView(hash, ready, name);
    await fitsWidth(`the ${name} view`);
    await shot(`${name}-phone-dark`);
  }
});

await step('issue 28 item 4: a metric no finished run reported is said on the sweep page, with what did arrive', async () => {
  await page.emulateMedia({ colorScheme: 'light' });
  const yaml = 'name: web-blind\nmetric: {name: val_loss, goal: minimize}\ncommand: |\n  echo \'{"val/loss": 0.5}\' >> "$APP_METRICS_FILE"\ngrid: {i: [1]}\n';
  await api('/api/sweeps', { method: 'POST', headers: { 'content-type': 'application/yaml' }, body: yaml });
  await go('#/sweeps/web-blind');
  const missing = page.locator('[data-metric-missing="val_loss"]');
  await missing.waitFor({ timeout: LONG });
  const text = await missing.textContent();
  check(text.includes('they reported val/loss') && text.includes('Did you mean val/loss?'), `the page names what arrived: ${text}`);
});

await step('issue 28 item 5: a sweep whose runs keep failing pauses; its page says why and resumes it', async () => {
  await page.emulateMedia({ colorScheme: 'light' });
  const yaml = 'name: web-typo\ncommand: python3 trian.py --lr {lr}\ngrid:\n  lr: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]\n';
  await api('/api/sweeps', { method: 'POST', headers: { 'content-type': 'application/yaml' }, body: yaml });
  await go('#/sweeps/web-typo');
  const paused = page.locator('[data-paused]');
  await paused.waitFor({ timeout: LONG });
  const reason = await paused.textContent();
  check(reason.includes('none has succeeded') && reason.includes('trian.py'), `the page says why, quoting the log: ${reason}`);
  await go(`#/?sweep=web-typo`);
  await page.locator('tr[data-sweep="web-typo"] [data-paused]').waitFor();
  await go('#/sweeps/web-typo');
  const failed = (await api('/api/sweeps/web-typo')).counts.failed;
  await page.locator('button[data-action="resume"]').click();
  // Resumed, its jobs run again (and, failing, pause it once more).
  for (let tries = 0; (await api('/api/sweeps/web-typo')).counts.failed <= failed; tries++) {
    check(tries < 300, 'the resumed sweep ran again within 30 s');
    await page.waitForTimeout(100);
  }
});

await browser.close();
console.log(`all page checks passed; screenshots in ${outDir}`);
