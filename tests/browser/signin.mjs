// The sign-in of a server that requires tokens, in headless Chromium. Run by tests/e2e/browser.rs
// against a server started with a user token and one sweep submitted with it.
//
//   node signin.mjs SERVER_URL OUTPUT_DIR      (env: USER_TOKEN, SWEEP, CHROMIUM)
//
// Checks: the first page load asks for a token; a wrong token is refused in the dialog; the
// right one opens the queue, live (the event stream works with the session cookie); the
// cookie is invisible to scripts; a reload does not ask again. Fails on any console error
// other than the 401s that trigger the sign-in.

import { chromium } from 'playwright-core';
import fs from 'node:fs';
import path from 'node:path';

const [base, outDir] = process.argv.slice(2);
const token = process.env.USER_TOKEN;
const sweep = process.env.SWEEP;
if (!base || !outDir || !token || !sweep) {
  console.error('usage: USER_TOKEN=... SWEEP=... node signin.mjs SERVER_URL OUTPUT_DIR');
  process.exit(2);
}
fs.mkdirSync(outDir, { recursive: true });

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox'],
  headless: true,
});
const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
const page = await context.newPage();
page.setDefaultTimeout(15_000);
const problems = [];
page.on('console', (message) => {
  if (message.type() !== 'error') return;
  // The requests refused before signing in are the point of this test.
  if (/401|Unauthorized/.test(message.text())) return;
  problems.push(`console error: ${message.text()}`);
});
page.on('pageerror', (error) => problems.push(`page error: ${error.stack || error.message}`));

function check(condition, what) {
  if (!condition) throw new Error(`check failed: ${what}`);
}

try {
  await page.goto(base + '/#/');
  const dialog = page.locator('dialog.sign-in');
  await dialog.waitFor();
  await page.screenshot({ path: path.join(outDir, 'signin.png') });
  console.log('ok: the page asks for a token');

  await dialog.locator('input[name=token]').fill('not-the-right-token-at-all');
  await dialog.locator('button[type=submit]').click();
  await dialog.locator('.error', { hasText: 'not valid' }).waitFor();
  console.log('ok: a wrong token is refused in the dialog');

  await dialog.locator('input[name=token]').fill(token);
  await dialog.locator('button[type=submit]').click();
  await dialog.waitFor({ state: 'detached' });
  await page.locator('main a', { hasText: sweep }).first().waitFor();
  await page.locator('#live[data-state="live"]').waitFor({ timeout: 30_000 });
  console.log('ok: signed in, the queue shows the sweep and the event stream is live');

  const visible = await page.evaluate(() => document.cookie);
  check(!visible.includes(token), 'the session cookie is HttpOnly (not readable by scripts)');
  const stored = await page.evaluate(() => JSON.stringify({ ...localStorage, ...sessionStorage }));
  check(!stored.includes(token), 'the token is not kept in web storage');

  await page.reload();
  await page.locator('main a', { hasText: sweep }).first().waitFor();
  check((await page.locator('dialog.sign-in').count()) === 0, 'a reload does not ask again');
  console.log('ok: a reload keeps the session');
  await page.screenshot({ path: path.join(outDir, 'signed-in.png') });
  check(problems.length === 0, `no console errors: ${problems.join('; ')}`);
} catch (error) {
  await page.screenshot({ path: path.join(outDir, 'signin-failure.png') }).catch(() => {});
  console.error(`FAILED: ${error.stack || error.message}`);
  if (problems.length) console.error(`console/page errors:\n  ${problems.join('\n  ')}`);
  await browser.close();
  process.exit(1);
}
await browser.close();
