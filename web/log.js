// The job page's log: follows the latest attempt with a long poll on /api/jobs/ID/log until
// the attempt has ended and the job is finished; an earlier attempt can be picked and is read
// to its end. Text is appended to one text node, so a job printing `<script>` shows the text.

import { get } from './api.js';
import { h, fill } from './dom.js';

/** The log kept on the page; older text is dropped (the whole log is in the API). */
const LOG_KEEP = 2 * 1024 * 1024;
const LOG_WAIT_MS = 20000;

/**
 * The log panel: follows the latest attempt's log with a long poll until the attempt has
 * ended and the job is finished; an earlier attempt can be picked and is read to its end.
 */
export function logPanel(id, currentJob) {
  const text = document.createTextNode('');
  const pre = h('pre.log', { 'aria-label': 'job log', tabindex: '0' }, text);
  const picker = h('select', { name: 'attempt', 'aria-label': 'attempt' });
  const follow = h('input', { type: 'checkbox', checked: true });
  const state = h('span.muted.log-state', {}, 'loading…');
  const element = h('section.panel.log-panel', {},
    h('div.log-head', {}, h('h2', { style: { margin: 0 } }, 'Log'), h('label', {}, 'attempt ', picker),
      h('label', {}, follow, ' follow'), state),
    pre);
  let pinned = null; // an attempt picked by hand, or null for the latest
  let attempt = 0; // the attempt being shown
  let offset = 0;
  let controller = null;
  let running = false;
  let stopped = false;
  let ended = false; // the shown attempt has ended and all its log is shown
  let shownAttempts = -1;

  picker.addEventListener('change', () => {
    const latest = currentJob()?.attempt ?? 0;
    const chosen = Number(picker.value);
    pinned = chosen === latest ? null : chosen;
    restart(chosen);
  });
  pre.addEventListener('scroll', () => {
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
    if (!atBottom && follow.checked && running) follow.checked = false;
  });
  follow.addEventListener('change', () => {
    if (follow.checked) pre.scrollTop = pre.scrollHeight;
  });

  function show(chunk) {
    if (!chunk) return;
    text.appendData(chunk);
    if (text.length > LOG_KEEP) {
      const cut = text.data.indexOf('\n', text.length - LOG_KEEP);
      text.deleteData(0, cut < 0 ? text.length - LOG_KEEP : cut + 1);
      text.insertData(0, '[… earlier output not shown; `app logs JOB` has all of it]\n');
    }
    if (follow.checked) pre.scrollTop = pre.scrollHeight;
  }

  function restart(which) {
    controller?.abort();
    controller = null;
    running = false;
    ended = false;
    attempt = which;
    offset = 0;
    text.data = '';
    state.textContent = 'loading…';
    loop();
  }

  async function loop() {
    if (running || stopped) return;
    running = true;
    controller = new AbortController();
    const { signal } = controller;
    try {
      for (;;) {
        const query = { offset, wait_ms: LOG_WAIT_MS };
        if (attempt > 0) query.attempt = attempt;
        const chunk = await get(`/api/jobs/${id}/log`, query, { signal });
        if (signal.aborted || stopped) return;
        if (attempt === 0 && chunk.attempt > 0) attempt = chunk.attempt;
        show(chunk.text);
        offset = chunk.next_offset;
        if (chunk.finished && chunk.next_offset === chunk.offset) {
          // The attempt has ended and everything it wrote is shown.
          if (!text.length) text.data = '(no output)';
          ended = true;
          describe();
          return;
        }
        state.textContent = chunk.attempt === 0 ? 'waiting for the job to start…' : `following attempt ${chunk.attempt}…`;
      }
    } catch (error) {
      if (error.name === 'AbortError' || stopped) return;
      state.textContent = `log: ${error.message}; trying again`;
      setTimeout(() => {
        if (controller?.signal === signal) loop();
      }, 3000);
    } finally {
      if (controller?.signal === signal) running = false;
    }
  }

  function describe() {
    const job = currentJob();
    if (!ended) return;
    if (job && pinned === null && !isFinal(job) && job.attempt === attempt) state.textContent = `attempt ${attempt} ended; waiting for the next one…`;
    else state.textContent = `attempt ${attempt} ended`;
  }

  return {
    element,
    /** Called with every fresh copy of the job: a new attempt restarts the tail on it. */
    jobChanged(job) {
      if (job.attempt !== shownAttempts) {
        shownAttempts = job.attempt;
        fill(picker, Array.from({ length: Math.max(job.attempt, 1) }, (_, i) => i + 1).reverse()
          .map((n) => h('option', { value: n, selected: n === (pinned ?? job.attempt) }, n === job.attempt ? `${n} (latest)` : String(n))));
        picker.disabled = job.attempt <= 1;
      }
      if (pinned === null && job.attempt !== attempt) restart(job.attempt);
      else if (!running && !ended) loop();
      else describe();
    },
    stop() {
      stopped = true;
      controller?.abort();
    },
  };
}

function isFinal(job) {
  return job.status === 'succeeded' || job.status === 'failed' || job.status === 'cancelled';
}

