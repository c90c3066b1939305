// The sweep page (#/sweeps/NAME): progress by status, the leaderboard ranked by the sweep's
// metric with the parameters as columns, the metric curves of the top runs, a
// parameter-vs-metric scatter, and the summary as CSV and JSON downloads.

import { get, post, url, segment } from './api.js';
import {
  h, fill, badge, progressBar, message, notFound, count, number, timeAgo, flatParams, paramText, refresher, toast,
} from './dom.js';
import { Chart, joinRuns, metricPoints } from './charts.js';
import { links } from './nav.js';

const STATUSES = ['queued', 'running', 'succeeded', 'failed', 'cancelled'];
const SUMMARY_ROWS = 1000; // rows fetched for the leaderboard and the scatter
const TOP_CURVES = 5;
const ROWS_STEP = 50;

export function mount(root, route) {
  const name = route.params[0];
  document.title = `${name} · app`;
  const base = `/api/sweeps/${segment(name)}`;
  let sweep = null;
  let summary = null;
  let stopped = false;
  let rowsShown = ROWS_STEP;
  let scatterParam = route.query.param || null;
  let curvesKey = '';
  let curvesAt = 0;
  const controller = new AbortController();
  const { signal } = controller;
  let curvesChart = null;
  let scatterChart = null;
  let scatterKey = '';

  const headBox = h('div.page-head');
  const errorBox = h('div');
  const progressBox = h('section.panel');
  const boardBox = h('section.panel');
  const curvesTarget = h('div.chart');
  const curvesNote = h('div');
  const curvesBox = h('section.panel.curves', {}, h('h2', {}, 'Top runs'), curvesNote, curvesTarget);
  const scatterTarget = h('div.chart');
  const scatterHead = h('h2');
  const scatterNote = h('div');
  const scatterBox = h('section.panel.scatter', {}, scatterHead, scatterNote, scatterTarget);
  fill(root, h('p.muted', {}, 'Loading…'));

  async function load() {
    let fresh;
    try {
      fresh = await get(base, {}, { signal });
    } catch (error) {
      if (error.name === 'AbortError') return;
      if (error.status === 404) {
        stop();
        fill(root, notFound(`Sweep ${name}`));
        return;
      }
      fill(sweep ? errorBox : root, message(`Cannot load sweep ${name}: ${error.message}`, 'error'));
      return;
    }
    const first = sweep === null;
    sweep = fresh;
    if (first) {
      fill(root, headBox, errorBox, progressBox, h('div.grid-2', {}, curvesBox, scatterBox), boardBox);
      renderHead();
    }
    renderProgress();
    try {
      summary = await get(`${base}/summary`, { top: SUMMARY_ROWS }, { signal });
      fill(errorBox);
    } catch (error) {
      if (error.name === 'AbortError') return;
      fill(errorBox, message(`Cannot load the leaderboard: ${error.message}`, 'error'));
      return;
    }
    if (stopped) return;
    renderBoard();
    renderScatter();
    await loadCurves();
  }

  const loader = refresher(load, 300);

  /** The metric that ranks runs: the sweep's, or else the first metric any run wrote. */
  function rankMetric() {
    if (summary?.metric) return summary.metric;
    const row = summary?.rows.find((item) => Object.keys(item.metrics || {}).length);
    return row ? { name: Object.keys(row.metrics)[0], goal: null } : null;
  }

  function scoreOf(row, metric) {
    if (row.score !== null && row.score !== undefined) return row.score;
    const value = row.metrics?.[metric?.name];
    if (!value) return null;
    return metric.goal === 'maximize' ? value.max : metric.goal === 'minimize' ? value.min : value.last;
  }

  function renderHead() {
    const metric = sweep.metric;
    fill(headBox,
      h('div.grow', {},
        h('h1', {}, sweep.name),
        h('div.sub', {}, `${sweep.form} sweep · `,
          metric ? `ranked by ${metric.name} (${metric.goal})` : 'no metric declared', ' · created ', timeAgo(sweep.created_at))),
      h('div.toolbar', {},
        h('a.button', { href: links.queue({ sweep: sweep.name }) }, 'Jobs in the queue'),
        h('a.button', { href: url(`${base}/summary`, { format: 'csv' }), download: `${sweep.name}-summary.csv`, dataset: { download: 'csv' } }, 'Summary CSV'),
        h('a.button', { href: `${base}/summary`, download: `${sweep.name}-summary.json`, dataset: { download: 'json' } }, 'Summary JSON'),
        h('button.danger', { type: 'button', onclick: cancelSweep }, 'Cancel sweep')),
      h('details.source', { style: { flexBasis: '100%' } }, h('summary', {}, 'Sweep file'), h('pre.command', {}, sweep.source || '')));
  }

  function renderProgress() {
    const counts = sweep.counts;
    const all = STATUSES.reduce((sum, status) => sum + counts[status], 0);
    const done = counts.succeeded + counts.failed + counts.cancelled;
    fill(progressBox,
      h('h2', {}, `Progress: ${count(done)} of ${count(all)} finished`),
      progressBar(counts, true),
      h('div.legend', {}, STATUSES.map((status) => h('a', { href: links.queue({ sweep: sweep.name, status }), dataset: { count: status } },
        h('i', { class: `status-${status}`, style: { background: `var(--${status})` } }), `${count(counts[status])} ${status}`))));
  }

  function renderBoard() {
    const rows = summary.rows;
    const metric = rankMetric();
    const paramKeys = [];
    const flat = rows.map((row) => flatParams(row.params));
    for (const params of flat) for (const key of Object.keys(params)) if (!paramKeys.includes(key)) paramKeys.push(key);
    const metricNames = [];
    for (const row of rows) for (const key of Object.keys(row.metrics || {})) if (!metricNames.includes(key)) metricNames.push(key);
    const others = metricNames.filter((key) => key !== metric?.name);
    const scoreLabel = metric ? `${metric.name} (${metric.goal === 'maximize' ? 'max' : metric.goal === 'minimize' ? 'min' : 'last'})` : 'score';
    const body = rows.slice(0, rowsShown).map((row, i) => h('tr', { dataset: { jobId: String(row.job_id) } },
      h('td.num', {}, row.rank ?? '—'),
      h('td.num', {}, h('a', { href: links.job(row.job_id) }, String(row.job_id))),
      h('td', {}, badge(row.status)),
      h('td.num', {}, h('strong', {}, number(scoreOf(row, metric)))),
      paramKeys.map((key) => h('td.mono', {}, key in flat[i] ? paramText(flat[i][key]) : '')),
      others.map((key) => h('td.num', { title: 'last value' }, row.metrics?.[key] ? number(row.metrics[key].last) : ''))));
    const more = rows.length > rowsShown
      ? h('button.small', { type: 'button', onclick: () => { rowsShown += ROWS_STEP; renderBoard(); } }, `show ${Math.min(ROWS_STEP, rows.length - rowsShown)} more`)
      : null;
    fill(boardBox,
      h('h2', {}, 'Leaderboard', h('span.muted', { style: { fontWeight: 400 } },
        rows.length >= SUMMARY_ROWS ? `best ${count(SUMMARY_ROWS)} runs (the CSV has all)` : `${count(rows.length)} runs`)),
      rows.length === 0 ? h('p.muted', {}, 'No runs yet.') : h('div.table-wrap', {}, h('table.leaderboard', {},
        h('thead', {}, h('tr', {}, h('th.num', {}, 'Rank'), h('th.num', {}, 'Job'), h('th', {}, 'Status'), h('th.num', {}, scoreLabel),
          paramKeys.map((key) => h('th', {}, key)), others.map((key) => h('th.num', {}, key)))),
        h('tbody', {}, body))),
      more);
  }

  async function loadCurves() {
    const metric = rankMetric();
    if (!metric) {
      fill(curvesNote, h('p.muted', {}, 'No metrics yet. Jobs append JSON lines like {"step": 3, "val_loss": 0.12} to $APP_METRICS_FILE.'));
      return;
    }
    const top = summary.rows.filter((row) => row.metrics?.[metric.name]).slice(0, TOP_CURVES);
    const key = `${metric.name}:${top.map((row) => `${row.job_id}/${row.metrics[metric.name].count}`).join(',')}`;
    // Refetch only when the top runs or their point counts changed, and at most every 3 s.
    if (key === curvesKey || Date.now() - curvesAt < 3000) {
      if (key !== curvesKey) loader.schedule(3000);
      return;
    }
    curvesKey = key;
    curvesAt = Date.now();
    const runs = await Promise.all(top.map(async (row) => {
      const series = await get(`/api/jobs/${row.job_id}/metrics`, {}, { signal }).catch(() => []);
      const mine = series.find((item) => item.name === metric.name);
      return mine ? { row, ...metricPoints(mine) } : null;
    }));
    if (stopped) return;
    const present = runs.filter(Boolean);
    curvesBox.querySelector('h2').textContent = `Top ${present.length} runs: ${metric.name} by step`;
    if (!present.length) {
      fill(curvesNote, h('p.muted', {}, 'No metric points yet.'));
      return;
    }
    fill(curvesNote);
    const series = present.map((run) => ({ label: `#${run.row.rank ?? '–'} job ${run.row.job_id}` }));
    const data = joinRuns(present);
    if (curvesChart) curvesChart.setSeries(series, data);
    else curvesChart = new Chart(curvesTarget, { x: { label: 'step' }, y: { label: metric.name }, series, height: 260 }, data);
  }

  function renderScatter() {
    const metric = rankMetric();
    const flat = summary.rows.map((row) => flatParams(row.params));
    // Parameters that vary across the runs; those are the interesting axes.
    const keys = [];
    for (const params of flat) for (const key of Object.keys(params)) if (!keys.includes(key)) keys.push(key);
    const varying = keys.filter((key) => new Set(flat.map((params) => JSON.stringify(params[key]))).size > 1);
    const choices = varying.length ? varying : keys;
    if (!scatterParam || !choices.includes(scatterParam)) scatterParam = choices[0] || null;
    fill(scatterHead, 'Parameter vs metric ',
      choices.length > 1
        ? h('select', { name: 'param', 'aria-label': 'parameter', onchange: (event) => { scatterParam = event.target.value; renderScatter(); } },
          choices.map((key) => h('option', { value: key, selected: key === scatterParam }, key)))
        : null);
    if (!metric || !scatterParam) {
      fill(scatterNote, h('p.muted', {}, !metric ? 'No metrics yet.' : 'The runs have no parameters.'));
      scatterChart?.destroy();
      scatterChart = null;
      return;
    }
    const points = [];
    summary.rows.forEach((row, i) => {
      const score = scoreOf(row, metric);
      if (score === null || score === undefined || !(scatterParam in flat[i])) return;
      points.push({ value: flat[i][scatterParam], score });
    });
    if (!points.length) {
      fill(scatterNote, h('p.muted', {}, `No run has reported ${metric.name} yet.`));
      scatterChart?.destroy();
      scatterChart = null;
      return;
    }
    fill(scatterNote);
    const numeric = points.every((point) => typeof point.value === 'number');
    let x;
    let xs;
    if (numeric) {
      const values = points.map((point) => point.value);
      const min = Math.min(...values);
      const max = Math.max(...values);
      const log = min > 0 && max / min >= 100;
      x = { label: scatterParam, log };
      xs = values;
    } else {
      // Categories (strings, lists, booleans) become positions 0..n-1, labelled by value.
      const labels = [...new Set(points.map((point) => paramText(point.value)))];
      x = {
        label: scatterParam,
        range: [-0.5, labels.length - 0.5],
        splits: () => labels.map((_, i) => i),
        values: (_, splits) => splits.map((v) => labels[v] ?? ''),
      };
      xs = points.map((point) => labels.indexOf(paramText(point.value)));
    }
    const order = xs.map((_, i) => i).sort((a, b) => xs[a] - xs[b]);
    const data = [order.map((i) => xs[i]), order.map((i) => points[i].score)];
    const key = JSON.stringify([scatterParam, metric.name, data]);
    if (scatterChart && key === scatterKey) return;
    scatterKey = key;
    const options = { x, y: { label: metric.name }, series: [{ label: metric.name, points: true }], height: 260, legend: false };
    scatterChart?.destroy();
    scatterChart = new Chart(scatterTarget, options, data);
  }

  async function cancelSweep() {
    if (!window.confirm(`Cancel every queued and running job of ${sweep.name}?`)) return;
    try {
      const result = await post(`${base}/cancel`);
      toast(`Cancelled ${result.cancelled}, cancel requested for ${result.cancel_requested} running`);
    } catch (error) {
      toast(`Cancel failed: ${error.message}`, 'error');
    }
    loader.now();
  }

  function stop() {
    stopped = true;
    loader.stop();
    controller.abort();
    curvesChart?.destroy();
    scatterChart?.destroy();
  }

  loader.now();
  return {
    refresh: () => loader.schedule(),
    destroy: stop,
  };
}
