// The job page's side of code shipping, in headless Chromium. Run by tests/e2e/code.rs against a
// server whose job JOB ran a snapshot with digest DIGEST from a dirty git tree.
//
//   node code.mjs SERVER_URL OUTPUT_DIR      (env: JOB, DIGEST, COMMIT, CHROMIUM)
//
// Checks: the job page names the snapshot its attempt ran (digest, commit, dirty, the
// directory it started in). Fails on any console error.

import path from 'node:path';
import { openPage, check } from './harness.mjs';

const [base, outDir] = process.argv.slice(2);
const { JOB: job, DIGEST: digest, COMMIT: commit } = process.env;
if (!base || !outDir || !job || !digest || !commit) {
  console.error('usage: JOB=... DIGEST=... COMMIT=... node code.mjs SERVER_URL OUTPUT_DIR');
  process.exit(2);
}
const { browser, page, problems } = await openPage(outDir);

try {
  await page.goto(`${base}/#/jobs/${job}`);
  const line = page.locator('.code-snapshot');
  await line.first().waitFor();
  check(await line.first().getAttribute('data-code-digest') === digest, 'the job page names the snapshot by its digest');
  check(await line.first().getAttribute('data-dirty') === 'true', 'and says the tree was dirty');
  const text = await line.first().innerText();
  check(text.includes(digest.slice(0, 12)) && text.includes(commit.slice(0, 10)), `with the digest and the commit: ${text}`);
  check(text.includes('started in experiments/'), `and where the job started: ${text}`);
  await page.screenshot({ path: path.join(outDir, 'job-code.png'), fullPage: true });
  console.log('ok: the job page shows the code snapshot');
  check(problems.length === 0, problems.join('\n'));
} finally {
  await browser.close();
}
