// The page's side of adaptive search and early stopping, in headless Chromium. Run by
// tests/e2e/search.rs against a server whose sweep SWEEP stopped some runs early (STOPPED_JOB is
// one of them).
//
//   node search.mjs SERVER_URL OUTPUT_DIR      (env: SWEEP, STOPPED_JOB, CHROMIUM)
//
// Checks: the sweep page says how many runs were stopped early; its leaderboard shows them as
// "stopped early", after the ranked runs, without a rank; the job page of a stopped run says
// so with the decision as its reason; the submit view's dry run of a bayes sweep says how many
// runs it will make and shows its first runs. Fails on any console error.

import path from 'node:path';
import { openPage, check } from './harness.mjs';

const [base, outDir] = process.argv.slice(2);
const sweep = process.env.SWEEP;
const stoppedJob = process.env.STOPPED_JOB;
if (!base || !outDir || !sweep || !stoppedJob) {
  console.error('usage: SWEEP=... STOPPED_JOB=... node search.mjs SERVER_URL OUTPUT_DIR');
  process.exit(2);
}
const { browser, page, problems } = await openPage(outDir);

const BAYES = `name: page-bayes
method: bayes
run_cap: 5
metric: {name: loss, goal: minimize}
early_terminate: {type: hyperband, min_iter: 3}
parameters:
  lr: {distribution: log_uniform_values, min: 0.0001, max: 0.1}
command: echo $APP_PARAM_LR
`;

try {
  await page.goto(`${base}/#/sweeps/${encodeURIComponent(sweep)}`);
  const state = page.locator('.search-state');
  await state.waitFor();
  const stopped = Number(await state.getAttribute('data-stopped-early'));
  check(stopped > 0, `the sweep page counts the runs stopped early (${stopped})`);
  check((await state.innerText()).includes(`${stopped} runs stopped early`), 'and says so');
  const rows = page.locator('.leaderboard-panel tbody tr');
  await rows.first().waitFor();
  const badges = await rows.evaluateAll((trs) => trs.map((tr) => ({
    stopped: Boolean(tr.querySelector('.badge.stopped-early')),
    text: tr.querySelector('.badge')?.textContent,
  })));
  check(badges.filter((row) => row.stopped).length === stopped, `${stopped} leaderboard rows say stopped early`);
  check(badges.filter((row) => row.stopped).every((row) => row.text === 'stopped early'), 'their badge reads "stopped early"');
  const firstStopped = badges.findIndex((row) => row.stopped);
  check(badges.slice(firstStopped).every((row) => row.stopped), 'stopped runs come after the ranked runs');
  await page.screenshot({ path: path.join(outDir, 'sweep-stopped-early.png'), fullPage: true });
  console.log('ok: the sweep page shows runs stopped early apart');

  await page.goto(`${base}/#/jobs/${stoppedJob}`);
  const head = page.locator('.page-head');
  await head.locator('.badge.stopped-early').waitFor();
  const reason = await page.locator('[data-reason]').first().innerText();
  check(/Stopped early: at step \d+ .*cutoff/.test(reason), `the job's reason is the decision: ${reason}`);
  console.log('ok: a stopped job says why');

  await page.goto(`${base}/#/submit`);
  await page.locator('textarea[name=yaml]').fill(BAYES);
  await page.locator('button[data-action="dry-run"]').click();
  const summary = page.locator('.preview .summary-line strong[data-adaptive="true"]');
  await summary.waitFor();
  check((await summary.innerText()) === 'adaptive (bayes, GP): up to 5 runs', `the dry run says: ${await summary.innerText()}`);
  check((await page.locator('.preview .early-stop').innerText()).startsWith('early stopping (hyperband): at steps 3, 9'), 'and how runs stop');
  check((await page.locator('.preview-table tbody tr').count()) === 5, 'it shows the first 5 runs');
  await page.screenshot({ path: path.join(outDir, 'submit-adaptive.png'), fullPage: true });
  console.log('ok: the dry run of an adaptive sweep says what it will do');
  check(problems.length === 0, problems.join('\n'));
} catch (error) {
  console.error(error.stack || String(error));
  for (const problem of problems) console.error(problem);
  await browser.close();
  process.exit(1);
}
await browser.close();
