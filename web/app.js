// The page's shell: routes on the URL fragment (#/, #/sweeps/NAME, #/jobs/ID, #/workers,
// #/submit), mounts one view at a time, and keeps it live from one EventSource on /api/events.
//
// A view module exports `mount(root, route)` returning `{refresh, update?, destroy}`:
// `refresh()` refetches the view's data (called on every queue change, debounced and
// single-flight by the view), `update(query)` applies a new query of the same page (filters,
// paging), `destroy()` stops its timers, requests and charts.

import * as queue from './queue.js';
import * as sweep from './sweep.js';
import * as job from './job.js';
import * as workers from './workers.js';
import * as submit from './submit.js';
import { h, fill, tickTimes } from './dom.js';
import { parseHash } from './nav.js';

const routes = [
  { name: 'queue', pattern: /^\/?$/, view: queue },
  { name: 'sweep', pattern: /^\/sweeps\/([^/]+)\/?$/, view: sweep },
  { name: 'job', pattern: /^\/jobs\/([^/]+)\/?$/, view: job },
  { name: 'workers', pattern: /^\/workers\/?$/, view: workers },
  { name: 'submit', pattern: /^\/submit\/?$/, view: submit },
];

const root = document.getElementById('view');
let current = null; // {name, key, view}

function route() {
  const { path, query } = parseHash();
  const match = routes.map((entry) => ({ entry, found: path.match(entry.pattern) })).find(({ found }) => found);
  highlightNav(match?.entry.name);
  if (!match) {
    unmount();
    document.title = 'Not found · app';
    fill(root, h('div.not-found', {}, h('h1', {}, 'Not found'), h('p', {}, `There is no page at ${path}.`),
      h('p', {}, h('a', { href: '#/' }, 'Back to the queue'))));
    return;
  }
  const params = match.found.slice(1).map((part) => safeDecode(part));
  const key = `${match.entry.name}:${params.join('/')}`;
  if (current && current.key === key && current.view.update) {
    current.view.update(query);
    return;
  }
  unmount();
  fill(root);
  root.scrollTop = 0;
  window.scrollTo(0, 0);
  const view = match.entry.view.mount(root, { params, query });
  current = { name: match.entry.name, key, view };
}

function safeDecode(part) {
  try {
    return decodeURIComponent(part);
  } catch {
    return part;
  }
}

function unmount() {
  if (!current) return;
  try {
    current.view.destroy?.();
  } finally {
    current = null;
  }
}

function remount() {
  unmount();
  route();
}

function highlightNav(name) {
  for (const link of document.querySelectorAll('nav a[data-nav]')) {
    link.classList.toggle('active', link.dataset.nav === name);
    if (link.dataset.nav === name) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
}

// --- live updates --------------------------------------------------------------------------

const liveDot = document.getElementById('live');
let source = null;
let pollTimer = null;

function setLive(state, text) {
  liveDot.dataset.state = state;
  liveDot.title = text;
  liveDot.querySelector('.label').textContent = state === 'live' ? 'live' : state === 'polling' ? 'polling' : 'offline';
}

function changed() {
  current?.view.refresh?.();
}

/** Falls back to polling every 5 s while the event stream is unavailable. */
function startPolling() {
  if (pollTimer) return;
  pollTimer = setInterval(changed, 5000);
}

function stopPolling() {
  clearInterval(pollTimer);
  pollTimer = null;
}

function connect() {
  if (!('EventSource' in window)) {
    setLive('polling', 'this browser has no EventSource; refreshing every 5 s');
    startPolling();
    return;
  }
  source = new EventSource('/api/events');
  source.addEventListener('change', changed);
  source.addEventListener('open', () => {
    stopPolling();
    setLive('live', 'live updates from the server');
  });
  source.addEventListener('error', () => {
    if (source.readyState === EventSource.CLOSED) {
      // The stream was refused (the server is down or restarting): poll, and try again later.
      setLive('polling', 'no event stream; refreshing every 5 s');
      startPolling();
      setTimeout(connect, 15000);
    } else {
      setLive('offline', 'reconnecting to the server…');
    }
  });
}

// After signing in, the refused event stream and the current view start over.
window.addEventListener('app:signed-in', () => {
  source?.close();
  stopPolling();
  connect();
  remount();
});
window.addEventListener('hashchange', route);
window.matchMedia('(prefers-color-scheme: dark)').addEventListener('change', remount);
document.addEventListener('visibilitychange', () => {
  if (document.visibilityState === 'visible') changed();
});
setInterval(tickTimes, 1000);

route();
connect();
