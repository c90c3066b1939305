// What the small browser checks share: Chromium started headless, one page that records its
// console errors and uncaught exceptions, and `check`.

import { chromium } from 'playwright-core';
import fs from 'node:fs';

/** Starts Chromium (CHROMIUM, else Debian's) and opens one page of `viewport`; makes `outDir`. */
export async function openPage(outDir, viewport = { width: 1440, height: 900 }) {
  fs.mkdirSync(outDir, { recursive: true });
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: ['--no-sandbox'],
    headless: true,
  });
  const page = await (await browser.newContext({ viewport })).newPage();
  page.setDefaultTimeout(15_000);
  const problems = [];
  page.on('console', (message) => {
    if (message.type() === 'error') problems.push(`console error: ${message.text()}`);
  });
  page.on('pageerror', (error) => problems.push(`page error: ${error.stack || error.message}`));
  return { browser, page, problems };
}

export function check(condition, what) {
  if (!condition) throw new Error(`check failed: ${what}`);
}
