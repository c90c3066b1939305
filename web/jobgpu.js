// The job page's GPU panel: utilisation and memory over an attempt's run (GET /api/jobs/ID/gpu).
// Once the attempt has ended with per-job accounting, the charts show its own share (its worker
// split each GPU's utilisation among the jobs on it and counted its processes' memory); before
// that, or without accounting, the worker's telemetry: whole GPUs, where jobs sharing a GPU are
// named, since their use is mixed in.

import { get } from './api.js';
import { h, fill, bytes, duration, message } from './dom.js';
import { Chart } from './charts.js';
import { links } from './nav.js';

/** While the attempt runs, its readings are fetched again at most this often. */
const REFRESH_MS = 10000;

export function gpuPanel(id) {
  const note = h('div.gpu-note');
  const utilTarget = h('div.chart');
  const memoryTarget = h('div.chart');
  const utilTitle = h('h3', {}, 'GPU utilisation %');
  const memoryTitle = h('h3', {}, 'GPU memory used (GiB)');
  const chartsBox = h('div.charts', {},
    h('div.chart-box', { dataset: { gpuChart: 'utilization' } }, utilTitle, utilTarget),
    h('div.chart-box', { dataset: { gpuChart: 'memory' } }, memoryTitle, memoryTarget));
  const element = h('section.panel.job-gpu', { hidden: true }, h('h2', {}, 'GPUs'), note, chartsBox);
  let util = null;
  let memory = null;
  let loadedKey = '';
  let loadedAt = 0;

  /** Shows the latest attempt that started, if it held GPUs. */
  async function update(job, attempts, signal) {
    const latest = attempts?.[attempts.length - 1];
    if (!latest || !latest.gpus?.length) {
      element.hidden = true;
      return;
    }
    element.hidden = false;
    const key = `${latest.attempt}:${latest.ended_at ?? 'running'}`;
    if (key === loadedKey && (latest.ended_at || Date.now() - loadedAt < REFRESH_MS)) return;
    let usage;
    try {
      usage = await get(`/api/jobs/${id}/gpu`, { attempt: latest.attempt }, { signal });
    } catch (error) {
      if (error.name !== 'AbortError') fill(note, message(`Cannot load GPU readings: ${error.message}`, 'error'));
      return;
    }
    loadedKey = key;
    loadedAt = Date.now();
    render(usage);
  }

  function render(usage) {
    if (usage.timeline?.length) {
      renderOwn(usage);
      return;
    }
    utilTitle.textContent = 'GPU utilisation %';
    memoryTitle.textContent = 'GPU memory used (GiB)';
    chartsBox.dataset.source = 'telemetry';
    const shared = usage.shared_with.length
      ? [' Shared with ', usage.shared_with.map((other) => h('a', { href: links.job(other) }, `#${other}`))
        .flatMap((link, i) => (i ? [', ', link] : [link])), ': their use is in these readings too.']
      : ' Readings are of the whole GPU.';
    fill(note, h('p.muted', {},
      `Attempt ${usage.attempt} on ${usage.worker ?? 'its worker'}, GPU ${usage.gpus.join(', ')}`,
      usage.gpu_memory ? `, ${bytes(usage.gpu_memory)} declared per GPU` : '', '.', shared));
    if (!usage.samples.length) {
      note.append(h('p.muted', { dataset: { gpuEmpty: '' } }, usage.to && Date.now() - usage.to > usage.retention_ms
        ? `No readings left: the server keeps GPU readings for ${duration(usage.retention_ms)}.`
        : 'No readings yet: they arrive with the worker\'s heartbeats.'));
    }
    const indices = [...new Set(usage.samples.map((sample) => sample.index))].sort((a, b) => a - b);
    const times = [...new Set(usage.samples.map((sample) => sample.at))].sort((a, b) => a - b);
    const column = (index, pick) => times.map((at) => {
      const sample = usage.samples.find((item) => item.at === at && item.index === index);
      return sample ? pick(sample) : null;
    });
    const xs = times.map((at) => at / 1000);
    const series = indices.map((index) => ({ label: `GPU ${index}` }));
    const utilData = [xs, ...indices.map((index) => column(index, (sample) => sample.utilization ?? null))];
    const memoryData = [xs, ...indices.map((index) => column(index, (sample) => sample.memory_used / 2 ** 30))];
    const total = Math.max(0, ...usage.samples.map((sample) => sample.memory_total)) / 2 ** 30;
    chartsBox.dataset.samples = String(usage.samples.length);
    const base = { x: { time: true }, height: 160 };
    if (util) util.setSeries(series, utilData, { y: { range: [0, 100] } });
    else util = new Chart(utilTarget, { ...base, y: { range: [0, 100] }, series }, utilData);
    const memoryY = total ? { range: [0, total] } : {};
    if (memory) memory.setSeries(series, memoryData, { y: memoryY });
    else memory = new Chart(memoryTarget, { ...base, y: memoryY, series }, memoryData);
  }

  /** The attempt's own use, from its worker's accounting. */
  function renderOwn(usage) {
    const own = usage.usage;
    const idle = own?.idle_gpus?.length
      ? h('strong.gpu-idle', {}, ` GPU mostly idle: input-bound? (GPU ${own.idle_gpus.join(', ')} under 30% busy on average)`)
      : null;
    fill(note, h('p.muted', {},
      `Attempt ${usage.attempt} on ${usage.worker ?? 'its worker'}, GPU ${usage.gpus.join(', ')}: this job's own use, as its worker measured it`,
      own ? ` (mean ${own.utilization_mean ?? '—'}%, p95 ${own.utilization_p95 ?? '—'}%, ${own.samples} readings).` : '.', idle));
    utilTitle.textContent = 'GPU utilisation % (this job\'s share)';
    memoryTitle.textContent = 'GPU memory held by this job (GiB)';
    const points = usage.timeline;
    const xs = points.map((point) => point.at / 1000);
    const utilData = [xs, points.map((point) => point.utilization ?? null)];
    const memoryData = [xs, points.map((point) => (point.memory === null || point.memory === undefined ? null : point.memory / 2 ** 30))];
    chartsBox.dataset.samples = String(points.length);
    chartsBox.dataset.source = 'accounting';
    const series = [{ label: `job ${usage.job_id}` }];
    const base = { x: { time: true }, height: 160 };
    if (util) util.setSeries(series, utilData, { y: { range: [0, 100] } });
    else util = new Chart(utilTarget, { ...base, y: { range: [0, 100] }, series }, utilData);
    if (memory) memory.setSeries(series, memoryData, { y: {} });
    else memory = new Chart(memoryTarget, { ...base, y: {}, series }, memoryData);
  }

  function destroy() {
    util?.destroy();
    memory?.destroy();
  }

  return { element, update, destroy };
}
