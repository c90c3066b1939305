// DOM building and formatting helpers. Data only ever reaches the page as text (textContent,
// attribute values), never as HTML, so a job printing `<script>` shows the text.

/**
 * `h('a.link', {href: '#/'}, 'text', child)`: an element with classes, attributes or
 * properties (`on*` functions become listeners; `dataset`, `style` objects are merged), and
 * children (strings become text nodes; null, undefined and false are skipped; arrays flattened).
 */
export function h(tag, attributes = {}, ...children) {
  const [name, ...classes] = tag.split('.');
  const element = document.createElement(name || 'div');
  if (classes.length) element.className = classes.join(' ');
  for (const [key, value] of Object.entries(attributes || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on') && typeof value === 'function') {
      element.addEventListener(key.slice(2), value);
    } else if (key === 'dataset' || key === 'style') {
      Object.assign(element[key], value);
    } else if (key === 'class') {
      element.className = [element.className, value].filter(Boolean).join(' ');
    } else if (key in element && typeof value !== 'string') {
      element[key] = value;
    } else {
      element.setAttribute(key, value === true ? '' : String(value));
    }
  }
  append(element, children);
  return element;
}

function append(element, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(element, child);
    else element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replaces the children of `element`. */
export function fill(element, ...children) {
  element.replaceChildren();
  append(element, children);
  return element;
}

/** A status badge (`queued`, `running`, ..., `healthy`, `stale`, `lost`). */
export function badge(status) {
  return h('span.badge', { class: `status-${status}`, dataset: { status } }, status);
}

/** A job's (or leaderboard row's) badge: a run stopped early says so, with the decision on hover. */
export function runBadge(run) {
  if (!run.stopped_early || run.status !== 'cancelled') return badge(run.status);
  return h('span.badge.status-cancelled.stopped-early', { dataset: { status: run.status, stoppedEarly: String(run.stopped_early.rung) }, title: run.stopped_early.reason }, 'stopped early');
}

/** A bar of a sweep's jobs by status. */
export function progressBar(counts, big = false) {
  const order = ['succeeded', 'failed', 'cancelled', 'running', 'queued'];
  const all = order.reduce((sum, status) => sum + (counts?.[status] ?? 0), 0) || 1;
  return h('div.progress', {
    class: big ? 'big' : '',
    role: 'img',
    'aria-label': order.map((status) => `${counts?.[status] ?? 0} ${status}`).join(', '),
    title: order.map((status) => `${counts?.[status] ?? 0} ${status}`).join(', '),
  }, order.map((status) => (counts?.[status]
    ? h('span', { class: status, style: { width: `${(100 * counts[status]) / all}%` } })
    : null)));
}

export function message(text, kind = 'info') {
  return h('p.message', { class: kind, role: kind === 'error' ? 'alert' : 'status' }, text);
}

export function notFound(what) {
  return h('div.not-found', {}, h('h1', {}, 'Not found'), h('p', {}, `${what} not found.`),
    h('p', {}, h('a', { href: '#/' }, 'Back to the queue')));
}

// --- numbers, sizes, times -----------------------------------------------------------------

const integer = new Intl.NumberFormat();

export function count(n) {
  return integer.format(n ?? 0);
}

/** A metric value: up to 4 significant digits, exponent for very small or large values. */
export function number(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return '—';
  if (typeof value !== 'number') return String(value);
  if (Number.isInteger(value) && Math.abs(value) < 1e7) return String(value);
  const magnitude = Math.abs(value);
  if (magnitude !== 0 && (magnitude < 1e-3 || magnitude >= 1e6)) return value.toExponential(3);
  return String(Number(value.toPrecision(4)));
}

export function bytes(size) {
  if (size === null || size === undefined) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = size;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(value < 10 ? 1 : 0)} ${units[unit]}`;
}

/** A duration in ms as `3h 02m`, `4m 05s`, `12.3s`. */
export function duration(ms) {
  if (ms === null || ms === undefined || ms < 0) return '—';
  const seconds = ms / 1000;
  if (seconds < 60) return `${seconds.toFixed(seconds < 10 ? 1 : 0)}s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes}m ${String(Math.floor(seconds % 60)).padStart(2, '0')}s`;
  const hours = Math.floor(minutes / 60);
  if (hours < 48) return `${hours}h ${String(minutes % 60).padStart(2, '0')}m`;
  return `${Math.floor(hours / 24)}d ${hours % 24}h`;
}

const relativeFormat = new Intl.RelativeTimeFormat(undefined, { numeric: 'auto' });
const localFormat = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium', timeStyle: 'medium' });

export function localTime(ms) {
  return ms ? localFormat.format(new Date(ms)) : '';
}

export function relative(ms, now = Date.now()) {
  if (!ms) return '—';
  const seconds = Math.round((ms - now) / 1000);
  const magnitude = Math.abs(seconds);
  if (magnitude < 5) return 'just now';
  if (magnitude < 60) return relativeFormat.format(seconds, 'second');
  if (magnitude < 3600) return relativeFormat.format(Math.round(seconds / 60), 'minute');
  if (magnitude < 86400) return relativeFormat.format(Math.round(seconds / 3600), 'hour');
  return relativeFormat.format(Math.round(seconds / 86400), 'day');
}

/** A `<time>` showing `ms` relative to now (kept current by `tickTimes`), local time on hover. */
export function timeAgo(ms) {
  if (!ms) return h('span.muted', {}, '—');
  return h('time', { datetime: new Date(ms).toISOString(), title: localTime(ms), dataset: { since: String(ms) } },
    relative(ms));
}

/** How long something has run: from `start` to `end`, or to now while it runs (kept current). */
export function elapsed(start, end) {
  if (!start) return h('span.muted', {}, '—');
  if (end) return h('span', {}, duration(end - start));
  return h('span.live-duration', { dataset: { start: String(start) } }, duration(Date.now() - start));
}

/** Refreshes every relative time and running duration on the page (called each second). */
export function tickTimes() {
  const now = Date.now();
  for (const element of document.querySelectorAll('[data-since]')) {
    element.textContent = relative(Number(element.dataset.since), now);
  }
  for (const element of document.querySelectorAll('[data-start]')) {
    element.textContent = duration(now - Number(element.dataset.start));
  }
}

// --- loading -------------------------------------------------------------------------------

/**
 * Runs `load` on request with at most one run in flight: requests during a run are coalesced
 * into one more run after it; `schedule` waits `delay` ms first (debounce).
 */
export function refresher(load, delay = 150) {
  let running = false;
  let again = false;
  let timer = null;
  let stopped = false;
  async function now() {
    if (stopped) return;
    if (running) {
      again = true;
      return;
    }
    running = true;
    try {
      await load();
    } catch (error) {
      if (error.name !== 'AbortError') console.warn('refresh failed:', error);
    } finally {
      running = false;
      if (again && !stopped) {
        again = false;
        schedule();
      }
    }
  }
  function schedule(wait = delay) {
    if (stopped || timer) return;
    timer = setTimeout(() => {
      timer = null;
      now();
    }, wait);
  }
  return { now, schedule, stop() { stopped = true; clearTimeout(timer); } };
}

/** A short-lived note at the bottom of the page (action results). */
export function toast(text, kind = 'info') {
  let area = document.getElementById('toasts');
  if (!area) {
    area = h('div', { id: 'toasts', 'aria-live': 'polite' });
    document.body.append(area);
  }
  const note = h('div.toast', { class: kind }, text);
  area.append(note);
  setTimeout(() => note.remove(), kind === 'error' ? 8000 : 3000);
}
