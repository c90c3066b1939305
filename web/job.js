// The job page (#/jobs/ID): what it runs and with which parameters, its attempts, a live log
// tail (long poll on /api/jobs/ID/log), its metric charts, its GPUs (what it used of them, as
// its worker measured) and its result files. A queued job says why it waits: its place in the
// queue, or why no connected worker can run it.
//
// What the job holds now follows its status: a queued job (new, retried or requeued after a
// lost worker) holds no worker and no GPU and its duration does not count, whatever its last
// attempt held; the attempts table keeps where each attempt ran.

import { get, post, segment } from './api.js';
import {
  h, fill, badge, runBadge, message, notFound, number, bytes, timeAgo, elapsed, localTime, refresher, toast,
} from './dom.js';
import { flatParams, paramFormatter } from './params.js';
import { reasonText } from './reasons.js';
import { Chart, metricPoints } from './charts.js';
import { links } from './nav.js';
import { logPanel } from './log.js';
import { gpuPanel } from './jobgpu.js';

export function mount(root, route) {
  const id = Number(route.params[0]);
  document.title = `Job ${route.params[0]} · app`;
  if (!Number.isSafeInteger(id) || id <= 0 || !/^\d+$/.test(route.params[0])) {
    fill(root, notFound(`Job ${route.params[0]}`));
    return { destroy() {} };
  }

  let job = null;
  let stopped = false;
  let controller = new AbortController();
  let metricsLoadedAt = 0;
  let metricsStatus = null;
  const charts = new Map(); // metric name → {box, chart}

  const headBox = h('div.page-head');
  const errorBox = h('div');
  const detailsBox = h('section.panel');
  const paramsBox = h('section.panel');
  const attemptsBox = h('section.panel');
  const chartsGrid = h('div.charts');
  const chartsBox = h('section.panel', {}, h('h2', {}, 'Metrics'), chartsGrid);
  const artifactsBox = h('section.panel');
  const log = logPanel(id, () => job);
  const gpu = gpuPanel(id);
  fill(root, h('p.muted', {}, 'Loading…'));

  async function load() {
    const { signal } = controller;
    let fresh;
    try {
      fresh = await get(`/api/jobs/${id}`, {}, { signal });
    } catch (error) {
      if (error.name === 'AbortError') return;
      if (error.status === 404) {
        stop();
        fill(root, notFound(`Job ${id}`));
        return;
      }
      if (!job) fill(root, message(`Cannot load job ${id}: ${error.message}`, 'error'));
      else fill(errorBox, message(`Cannot refresh: ${error.message}`, 'error'));
      return;
    }
    const first = job === null;
    job = fresh;
    if (first) {
      fill(root, headBox, errorBox, h('div.grid-2', {}, detailsBox, paramsBox), log.element, chartsBox, gpu.element,
        attemptsBox, artifactsBox);
    }
    fill(errorBox);
    renderHead();
    renderDetails();
    renderParams();
    log.jobChanged(job);
    const [attempts, events, results] = await Promise.allSettled([
      get(`/api/jobs/${id}/attempts`, {}, { signal }),
      get(`/api/jobs/${id}/events`, {}, { signal }),
      get(`/api/jobs/${id}/results`, {}, { signal }),
    ]);
    if (stopped) return;
    renderAttempts(attempts, events);
    renderArtifacts(results);
    await Promise.all([
      loadMetrics(signal),
      gpu.update(job, attempts.status === 'fulfilled' ? attempts.value : null, signal),
    ]);
  }

  async function loadMetrics(signal) {
    // While the job runs, at most every 2 s; once it has ended, once more and then never.
    const now = Date.now();
    if (metricsStatus === job.status && (job.status !== 'running' || now - metricsLoadedAt < 2000)) return;
    metricsLoadedAt = now;
    let series;
    try {
      series = await get(`/api/jobs/${id}/metrics`, {}, { signal });
    } catch (error) {
      if (error.name !== 'AbortError') fill(chartsGrid, message(`Cannot load metrics: ${error.message}`, 'error'));
      return;
    }
    metricsStatus = job.status;
    renderCharts(series);
  }

  const loader = refresher(load);

  function renderHead() {
    const controls = [];
    if ((job.status === 'queued' || job.status === 'running') && !job.cancel_requested) {
      controls.push(h('button.danger', { type: 'button', dataset: { action: 'cancel' }, onclick: () => act('cancel') }, 'Cancel'));
    }
    if (job.status === 'failed' || job.status === 'cancelled') {
      controls.push(h('button', { type: 'button', dataset: { action: 'retry' }, onclick: () => act('retry') }, 'Retry'));
    }
    if (job.status === 'queued' || job.status === 'running') {
      controls.push(h('span.muted', {}, ' priority '),
        h('button.small', { type: 'button', title: 'lower priority', onclick: () => setPriority(job.priority - 1) }, '−'),
        h('strong', {}, ` ${job.priority} `),
        h('button.small', { type: 'button', title: 'raise priority', onclick: () => setPriority(job.priority + 1) }, '+'));
    }
    fill(headBox,
      h('div.grow', {},
        h('h1', {}, `Job ${job.id} `, runBadge(job), job.cancel_requested && job.status === 'running' ? h('span.muted', {}, job.stopped_early ? ' stopping early…' : ' cancelling…') : null),
        h('div.sub', {}, 'sweep ', h('a', { href: links.sweep(job.sweep) }, job.sweep), ` (${job.owner}'s) · index ${job.index} · attempt ${job.attempt}`),
        job.reason ? h('div.reason', { dataset: { reason: job.reason } }, reasonText(job.reason)) : null),
      h('div.toolbar', {}, controls));
  }

  function renderDetails() {
    const queued = job.status === 'queued';
    const waiting = queued ? waitingText(job) : null;
    const when = (ms) => (ms ? [timeAgo(ms), h('span.muted', {}, ` ${localTime(ms)}`)] : '—');
    const rows = [
      ['Command', h('pre.command', {}, job.command)],
      ['Status', [runBadge(job), job.reason ? h('span', { dataset: { reason: job.reason } }, ` ${reasonText(job.reason)}`) : '']],
      ['Worker', queued ? waiting : job.worker ? [job.worker, ' ', h('a', { href: links.workers() }, '(workers)')] : '—'],
      ['GPUs', queued ? '—' : job.gpus?.length ? job.gpus.join(', ') : (job.started_at ? 'none (CPU)' : '—')],
      ['Resources', resourcesText(job.resources)],
      ['Created', when(job.created_at)],
      ['Started', queued ? '—' : when(job.started_at)],
      ['Finished', queued ? '—' : when(job.finished_at)],
      ['Duration', queued ? h('span.muted', { dataset: { duration: 'none' } }, '—')
        : elapsed(job.started_at, job.status === 'running' ? null : job.finished_at)],
      ['Exit code', queued ? '—' : job.exit_code ?? '—'],
      ['GPU use', gpuUseText(job.gpu_usage)],
      ['Notes', job.notes?.length ? h('ul.notes', {}, job.notes.map((note) => h('li', { class: note.startsWith('GPU mostly idle') ? 'gpu-idle' : '' }, note))) : '—'],
      ['Attempts', `${job.attempt} (crashes ${job.crash_count}, retries left ${job.retries_left})`],
      ['Timeout', job.timeout_secs ? `${job.timeout_secs} s` : 'none'],
    ];
    fill(detailsBox, h('h2', {}, 'Details'), kvTable(rows));
  }

  function renderParams() {
    const flat = flatParams(job.params);
    const rows = Object.entries(flat).map(([key, value]) => {
      const { text, exact } = paramFormatter([value])(value);
      return [key, h('span.mono', { title: exact ?? undefined, dataset: { param: key } }, text)];
    });
    const metrics = Object.entries(job.metrics || {}).map(([name, summary]) =>
      [name, h('span.mono', { title: `${summary.count} values` }, `last ${number(summary.last)} · min ${number(summary.min)} · max ${number(summary.max)}`)]);
    fill(paramsBox,
      h('h2', {}, 'Parameters'),
      rows.length ? kvTable(rows) : h('p.muted', {}, 'No parameters.'),
      metrics.length ? [h('h2', { style: { marginTop: '14px' } }, 'Metrics (latest attempt)'), kvTable(metrics)] : null);
  }

  function renderAttempts(attempts, events) {
    const history = events.status === 'fulfilled' ? events.value : [];
    const list = attempts.status === 'fulfilled' ? attempts.value : [];
    const note = attempts.status === 'rejected' ? message(`Cannot load attempts: ${attempts.reason.message}`, 'error') : null;
    const rows = list.slice().reverse().map((attempt) => h('tr', { dataset: { attempt: String(attempt.attempt) } },
      h('td.num', {}, String(attempt.attempt)),
      // An attempt that ended in `queued` was requeued (a retry or a lost worker).
      h('td', {}, attempt.status === 'queued' ? h('span.badge.status-queued', {}, 'requeued') : badge(attempt.status)),
      h('td', {}, attempt.worker || '—'),
      h('td', {}, Array.isArray(attempt.gpus) ? (attempt.gpus.length ? attempt.gpus.join(', ') : 'CPU') : '—'),
      h('td', { title: localTime(attempt.started_at) }, timeAgo(attempt.started_at)),
      h('td', { title: localTime(attempt.ended_at) }, attempt.ended_at ? timeAgo(attempt.ended_at) : h('span.muted', {}, 'running')),
      h('td.num', {}, elapsed(attempt.started_at, attempt.ended_at)),
      h('td.num', {}, attempt.exit_code ?? '—'),
      h('td.reason-cell', {}, reasonText(attempt.reason))));
    const historyRows = history.slice().reverse().map((event) => h('tr', {},
      h('td', { title: localTime(event.at) }, timeAgo(event.at)),
      h('td', {}, event.from ? badge(event.from) : h('span.muted', {}, 'new')), h('td', {}, '→ ', badge(event.to)),
      h('td.num', {}, String(event.attempt)), h('td', {}, event.worker || ''), h('td.reason-cell', {}, reasonText(event.reason))));
    fill(attemptsBox,
      h('h2', {}, 'Attempts'), note,
      rows.length
        ? h('div.table-wrap.short', {}, h('table.attempts', {},
          h('thead', {}, h('tr', {}, ['#', 'Status', 'Worker', 'GPU', 'Started', 'Ended', 'Duration', 'Exit code', 'Reason'].map((label) => h('th', {}, label)))),
          h('tbody', {}, rows)))
        : h('p.muted', {}, 'Not started yet.'),
      historyRows.length
        ? h('details', { style: { marginTop: '10px' } }, h('summary', {}, `History (${historyRows.length} change${historyRows.length === 1 ? '' : 's'})`),
          h('div.table-wrap.short', {}, h('table', {},
            h('thead', {}, h('tr', {}, ['When', 'From', 'To', 'Attempt', 'Worker', 'Reason'].map((label) => h('th', {}, label)))),
            h('tbody', {}, historyRows))))
        : null);
  }

  function renderCharts(series) {
    if (!series.length) {
      for (const { chart } of charts.values()) chart.destroy();
      charts.clear();
      fill(chartsGrid, h('p.muted', {}, job.status === 'queued' ? 'No metrics yet.' :
        'No metrics. A job appends JSON lines like {"step": 3, "val_loss": 0.12} to $APP_METRICS_FILE.'));
      return;
    }
    if (!charts.size) fill(chartsGrid);
    for (const item of series) {
      const points = metricPoints(item);
      const data = [points.xs, points.ys];
      let entry = charts.get(item.name);
      if (!entry) {
        const target = h('div.chart');
        const single = h('div.single-value');
        const box = h('div.chart-box', { dataset: { metric: item.name } }, h('h3', {}, item.name), single, target);
        chartsGrid.append(box);
        const chart = new Chart(target, { x: { label: 'step' }, y: {}, series: [{ label: item.name }], height: 190 }, data);
        entry = { box, chart, single };
        charts.set(item.name, entry);
      } else {
        entry.chart.setData(data);
      }
      // One value makes a point, not a curve: say the number too.
      fill(entry.single, points.ys.length === 1
        ? [h('strong', {}, number(points.ys[0])), h('span.muted', {}, ` (one value, step ${points.xs[0]})`)]
        : null);
    }
  }

  /** The code snapshot an attempt ran: its digest, commit, whether the tree was dirty, where it started. */
  function codeLine(code) {
    if (!code) return null;
    const where = code.dir ? ` · started in ${code.dir}/` : '';
    return h('p.muted.code-snapshot', { dataset: { codeDigest: code.digest, dirty: String(Boolean(code.dirty)) }, style: { margin: '0 0 6px' } },
      'Code: snapshot ', h('span.mono', { title: `sha256:${code.digest}` }, code.digest.slice(0, 12)),
      code.commit ? ` · git ${code.commit.slice(0, 10)}` : ' · not in git',
      code.dirty ? ' (dirty: changed or untracked files were shipped)' : '',
      where);
  }

  function renderArtifacts(results) {
    if (results.status === 'rejected') {
      fill(artifactsBox, h('h2', {}, 'Artifacts'), message(`Cannot load results: ${results.reason.message}`, 'error'));
      return;
    }
    const versions = results.value.slice().reverse();
    fill(artifactsBox, h('h2', {}, 'Artifacts'),
      versions.length === 0
        ? h('p.muted', {}, job.status === 'queued' || job.status === 'running'
          ? 'Files written to $APP_OUTPUT_DIR are uploaded when the attempt ends.'
          : 'No result files.')
        : versions.map((version) => h('div.version', { style: { marginBottom: '14px' } },
          h('div', { style: { marginBottom: '6px' } },
            h('strong', {}, `Attempt ${version.attempt}`),
            h('span.muted', {}, ` · ${version.record?.outcome || ''} · ${version.record?.worker || ''}`,
              version.record?.gpus?.length ? ` · ${version.record.gpus.join(', ')}` : '',
              version.record?.git_commit ? ` · git ${version.record.git_commit.slice(0, 10)}` : '',
              ' · stored '), timeAgo(version.stored_at)),
          codeLine(version.record?.code),
          version.files.length === 0 ? h('p.muted', {}, 'No files.') :
            h('div.table-wrap.short', {}, h('table.files', {},
              h('thead', {}, h('tr', {}, h('th', {}, 'File'), h('th.num', {}, 'Size'), h('th', {}, 'SHA-256'))),
              h('tbody', {}, version.files.map((file) => h('tr', {},
                h('td', {}, h('a', { href: fileUrl(id, version.attempt, file.path), download: file.path.split('/').pop() }, file.path)),
                h('td.num', { title: `${file.size} bytes` }, bytes(file.size)),
                h('td.sha', {}, file.sha256)))))))));
  }

  async function act(action) {
    try {
      await post(`/api/jobs/${id}/${action}`);
      toast(action === 'cancel' ? `Job ${id}: cancel sent` : `Job ${id} is queued again`);
    } catch (error) {
      toast(`Job ${id}: ${error.message}`, 'error');
    }
    loader.now();
  }

  async function setPriority(priority) {
    try {
      await post(`/api/jobs/${id}/priority`, { priority });
    } catch (error) {
      toast(`Job ${id}: ${error.message}`, 'error');
    }
    loader.now();
  }

  function stop() {
    stopped = true;
    loader.stop();
    controller.abort();
    log.stop();
    gpu.destroy();
    for (const { chart } of charts.values()) chart.destroy();
    charts.clear();
  }

  loader.now();
  return {
    refresh: () => loader.schedule(),
    destroy: stop,
  };
}

function fileUrl(id, attempt, path) {
  return `/api/jobs/${id}/results/${attempt}/files/${path.split('/').map(segment).join('/')}`;
}

/** Why a queued job waits: why no worker can run it, or its place in the queue. */
function waitingText(job) {
  const attempt = job.attempt > 0 ? ` for attempt ${job.attempt + 1}` : '';
  const reason = job.waiting?.reason;
  if (reason) return h('span.waiting-never', { dataset: { waiting: 'never' } }, `— cannot run on any connected worker: ${reason}`);
  const position = job.waiting?.position;
  const place = position === undefined || position === null ? 'waiting in the queue'
    : position === 0 ? 'next in the queue' : `waiting in the queue, ${number(position)} ahead`;
  return h('span.muted', { dataset: { waiting: position ?? '' } }, `— (${place}${attempt})`);
}

/** What the latest attempt used of its GPUs, in a line; the idle flag stands out. */
function gpuUseText(usage) {
  if (!usage) return '—';
  const parts = [];
  if (usage.utilization_mean !== null && usage.utilization_mean !== undefined) {
    parts.push(`utilisation mean ${number(usage.utilization_mean)}%, p95 ${number(usage.utilization_p95)}%`);
  }
  if (usage.memory_peak !== null && usage.memory_peak !== undefined) parts.push(`peak memory ${bytes(usage.memory_peak)}`);
  parts.push(`${usage.gpu_hours.toFixed(usage.gpu_hours < 1 ? 3 : 1)} GPU-hours`);
  return h('span', { dataset: { gpuUse: '' } }, parts.join(' · '),
    usage.idle_gpus?.length ? h('strong.gpu-idle', {}, ` · GPU mostly idle: input-bound? (GPU ${usage.idle_gpus.join(', ')})`) : null);
}

function resourcesText(resources) {
  if (!resources) return '—';
  const parts = [];
  parts.push(resources.gpus === null || resources.gpus === undefined ? 'GPUs: 1 on a GPU box, else CPU' : `GPUs: ${resources.gpus}`);
  if (resources.gpu_memory) parts.push(`GPU memory ${bytes(resources.gpu_memory)} each`);
  if (resources.exclusive !== null && resources.exclusive !== undefined) parts.push(resources.exclusive ? 'exclusive' : 'shared');
  if (resources.trainer) parts.push('built-in trainer');
  return parts.join(' · ');
}

function kvTable(rows) {
  return h('table.kv', {}, h('tbody', {}, rows.map(([key, value]) => h('tr', {}, h('th', {}, key), h('td', {}, value)))));
}
