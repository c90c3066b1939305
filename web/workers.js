// The workers page (#/workers): one card per worker (state, last seen, running jobs) and one row
// per GPU with its utilisation and memory over the last hour, temperature and power, and the
// running jobs that hold it with the memory each declared, and what the worker's binary can run
// (the built-in trainer, with its torch and whether it found CUDA). Lost workers come last, dimmed.
// Above them, the GPU-hours each user's jobs held over the last 24 hours and 7 days.

import { get, segment } from './api.js';
import { h, fill, badge, message, timeAgo, bytes, number, refresher } from './dom.js';
import { Chart, palette } from './charts.js';
import { links } from './nav.js';

/** Telemetry arrives with heartbeats, which are not queue changes: refresh on a timer too. */
const POLL_MS = 10000;

export function mount(root) {
  document.title = 'Workers · app';
  const controller = new AbortController();
  const { signal } = controller;
  const rows = new Map(); // `${worker}/${gpu index}` → {element, util, memory, readings}
  const listBox = h('div.workers');
  const errorBox = h('div');
  const usageBox = h('section.panel.usage');
  fill(root,
    h('div.page-head', {}, h('div.grow', {}, h('h1', {}, 'Workers'),
      h('div.sub', {}, 'Each worker daemon and its GPUs; GPU readings of the last hour.'))),
    errorBox, usageBox, listBox);
  fill(listBox, h('p.muted', {}, 'Loading…'));

  async function load() {
    let workers;
    try {
      workers = await get('/api/workers', {}, { signal });
    } catch (error) {
      if (error.name !== 'AbortError') fill(errorBox, message(`Cannot load workers: ${error.message}`, 'error'));
      return;
    }
    fill(errorBox);
    const [telemetry, holdings, usage] = await Promise.all([
      Promise.all(workers.map((worker) =>
        get(`/api/workers/${segment(worker.name)}/telemetry`, {}, { signal }).catch((error) => (error.name === 'AbortError' ? [] : error)))),
      Promise.all(workers.map((worker) => (worker.running
        ? get('/api/jobs', { worker: worker.name, status: 'running', limit: 1000 }, { signal }).then((page) => page.jobs, () => [])
        : []))),
      get('/api/usage', {}, { signal }).catch((error) => error),
    ]);
    if (signal.aborted) return;
    renderUsage(usage);
    render(workers, telemetry, holdings);
  }

  /** One row per user: GPU-hours their jobs held over the last 24 hours and 7 days. */
  function renderUsage(usage) {
    if (usage instanceof Error) {
      fill(usageBox, h('h2', {}, 'GPU time by user'), message(`Cannot load GPU time: ${usage.message}`, 'error'));
      return;
    }
    const hours = (value) => (value === 0 ? h('span.muted', {}, '0') : number(value));
    const rows = usage.users.map((user) => h('tr', { dataset: { user: user.user } },
      h('td', {}, h('a', { href: links.queue({ owner: user.user }), title: `${user.user}'s sweeps and jobs` }, user.user)),
      h('td.num', { dataset: { window: '24h' } }, hours(user.gpu_hours_24h)),
      h('td.num', { dataset: { window: '7d' } }, hours(user.gpu_hours_7d))));
    fill(usageBox,
      h('h2', {}, 'GPU time by user'),
      h('p.muted', {}, 'GPU-hours (GPUs times hours) of attempts that ended in the window, as their workers measured them.'),
      h('div.table-wrap.short', {}, h('table', {},
        h('thead', {}, h('tr', {}, h('th', {}, 'User'), h('th.num', {}, 'Last 24 h'), h('th.num', {}, 'Last 7 days'))),
        h('tbody', {}, rows))));
  }

  /** 0 for a working worker, 1 for a lost one, 2 for one that left. */
  function away(state) {
    return state === 'lost' ? 1 : state === 'left' ? 2 : 0;
  }

  function render(workers, telemetry, holdings) {
    if (!workers.length) {
      fill(listBox, message('No worker has registered yet. Start one with `app --client-only --url URL`, or run `app` for a server with a local worker.'));
      return;
    }
    const seen = new Set();
    const cards = workers
      .slice()
      // Working workers first, then lost ones, then those that left.
      .sort((a, b) => away(a.state) - away(b.state) || a.name.localeCompare(b.name))
      .map((worker) => {
        const at = workers.indexOf(worker);
        const readings = telemetry[at];
        return card(worker, Array.isArray(readings) ? readings : [], readings instanceof Error ? readings : null, holdings[at], seen);
      });
    for (const [key, row] of rows) {
      if (!seen.has(key)) {
        row.util?.destroy();
        row.memory?.destroy();
        rows.delete(key);
      }
    }
    fill(listBox, cards);
  }

  function card(worker, samples, failed, jobs, seen) {
    const { state } = worker;
    const gpus = groupByGpu(samples);
    for (const slot of worker.capacity?.gpus || []) {
      if (!gpus.has(slot.index)) gpus.set(slot.index, { index: slot.index, name: `GPU ${slot.index}`, samples: [], slot });
      else gpus.get(slot.index).slot = slot;
    }
    const running = worker.running_jobs || [];
    const gpuRows = [...gpus.values()].sort((a, b) => a.index - b.index).map((gpu) => {
      const key = `${worker.name}/${gpu.index}`;
      seen.add(key);
      return gpuRow(key, gpu, jobs.filter((job) => job.gpus.includes(gpu.index)));
    });
    return h('section.panel.worker-card', { class: away(state) ? state : '', dataset: { worker: worker.name, state } },
      h('h2', {}, worker.name, badge(state)),
      state === 'lost'
        ? h('p.muted', {}, 'No heartbeat for longer than a lease: its jobs went back to the queue. It shows here again when it reconnects.')
        : null,
      state === 'left'
        ? h('p.muted', {}, 'Stopped cleanly (drained or stopped by its operator). It shows here again when it is started.')
        : null,
      h('div.facts', {},
        h('span', {}, 'last seen ', timeAgo(worker.last_seen_at)),
        h('span', {}, 'registered ', timeAgo(worker.registered_at)),
        h('span', {}, `${worker.running} running`, worker.capacity ? ` · ${worker.capacity.job_slots} job slots` : ''),
        h('span', {}, gpus.size ? `${gpus.size} GPU${gpus.size > 1 ? 's' : ''}` : 'CPU only'),
        capabilitiesFact(worker.capacity?.capabilities)),
      running.length
        ? h('div.facts', {}, 'running jobs: ', running.map((id) => h('a', { href: links.job(id) }, `#${id}`)).flatMap((link, i) => (i ? [' ', link] : [link])))
        : null,
      failed ? message(`Cannot load GPU readings: ${failed.message}`, 'error') : null,
      gpuRows);
  }

  /** Who holds a GPU: `#12 (2 GiB declared)`, `#13 (whole GPU)`. */
  function holders(jobs) {
    if (!jobs.length) return h('div.holders.muted', {}, 'no job');
    return h('div.holders', {}, jobs.map((job) => h('span.holder', { dataset: { jobId: String(job.id) } },
      h('a', { href: links.job(job.id) }, `#${job.id}`),
      h('span.muted', {}, job.resources.gpu_memory ? ` ${bytes(job.resources.gpu_memory)} declared` : ' whole GPU'))));
  }

  function gpuRow(key, gpu, jobs) {
    const samples = gpu.samples;
    const xs = samples.map((sample) => sample.at / 1000);
    const util = samples.map((sample) => sample.utilization ?? null);
    const memory = samples.map((sample) => sample.memory_used / 2 ** 30);
    const last = samples[samples.length - 1];
    const total = last?.memory_total ?? gpu.slot?.memory_total;
    let row = rows.get(key);
    if (!row) {
      const utilTarget = h('div.chart');
      const memoryTarget = h('div.chart');
      const readings = h('div.readings');
      const title = h('div.gpu-name');
      const held = h('div');
      const element = h('div.gpu-row', { dataset: { gpu: String(gpu.index) } },
        h('div.gpu-head', {}, title, held),
        h('div.spark', {}, h('h4', {}, 'utilisation %'), utilTarget),
        h('div.spark', {}, h('h4', {}, 'memory used (GiB)'), memoryTarget),
        readings);
      // Charts are made once the row is in the page and has a width.
      row = { element, title, held, readings, utilTarget, memoryTarget, util: null, memory: null };
      rows.set(key, row);
    }
    fill(row.held, holders(jobs));
    fill(row.title, `GPU ${gpu.index}`, h('small', {}, last?.name || gpu.name || ''), h('small', {}, total ? `${bytes(total)} total` : ''));
    fill(row.readings,
      h('div', {}, `util ${last?.utilization ?? '—'}${last?.utilization !== null && last?.utilization !== undefined ? '%' : ''}`),
      h('div', {}, `mem ${last ? bytes(last.memory_used) : '—'}`),
      h('div', {}, `temp ${last?.temperature ?? '—'}${last?.temperature !== null && last?.temperature !== undefined ? ' °C' : ''}`),
      h('div', {}, `power ${last?.power_watts !== null && last?.power_watts !== undefined ? `${last.power_watts.toFixed(0)} W` : '—'}`),
      h('div', {}, last ? ['read ', timeAgo(last.at)] : 'no readings yet'));
    row.pending = { util: [xs, util], memory: [xs, memory], total };
    return row.element;
  }

  /** Charts need their rows in the page; make or update them after each render. */
  function drawCharts() {
    for (const row of rows.values()) {
      if (!row.pending || !row.element.isConnected) continue;
      const { util, memory, total } = row.pending;
      row.pending = null;
      const spark = { height: 90, legend: false, x: { time: true } };
      if (row.util) row.util.setData(util);
      else row.util = new Chart(row.utilTarget, { ...spark, y: { range: [0, 100] }, series: [{ label: 'utilisation %' }] }, util);
      if (row.memory) row.memory.setData(memory);
      else row.memory = new Chart(row.memoryTarget, { ...spark, y: total ? { range: [0, total / 2 ** 30] } : {}, series: [{ label: 'memory GiB', colour: palette()[3] }] }, memory);
    }
  }

  const loader = refresher(async () => {
    await load();
    drawCharts();
  }, 500);
  const timer = setInterval(() => loader.schedule(), POLL_MS);
  loader.now();
  return {
    refresh: () => loader.schedule(),
    destroy() {
      clearInterval(timer);
      loader.stop();
      controller.abort();
      for (const row of rows.values()) {
        row.util?.destroy();
        row.memory?.destroy();
      }
    },
  };
}

/** `trainer (torch 2.11.0, CUDA)`, or `no trainer`: what the worker can run besides commands. */
function capabilitiesFact(capabilities) {
  if (!capabilities?.trainer) {
    return h('span', { dataset: { trainer: 'no' }, title: 'built without the torch feature: train: jobs go to other workers' }, 'no trainer');
  }
  const details = [];
  if (capabilities.torch) details.push(`torch ${capabilities.torch}`);
  if (capabilities.cuda === true) details.push('CUDA');
  if (capabilities.cuda === false) details.push('no CUDA');
  return h('span', { dataset: { trainer: 'yes' }, title: capabilities.cuda_error || '' },
    `trainer${details.length ? ` (${details.join(', ')})` : ''}`);
}

function groupByGpu(samples) {
  const gpus = new Map();
  for (const sample of samples.slice().sort((a, b) => a.at - b.at)) {
    if (!gpus.has(sample.index)) gpus.set(sample.index, { index: sample.index, name: sample.name, samples: [] });
    gpus.get(sample.index).samples.push(sample);
  }
  return gpus;
}
