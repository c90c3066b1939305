// The sweep page's curves: one metric (picked from every metric the runs wrote) by step for the
// top runs, or for the runs ticked on the leaderboard, with smoothing (TensorBoard's debiased
// moving average) and a log y axis. A run's points are fetched again only when its summary
// says it has new ones.

import { get } from './api.js';
import { h, fill, number } from './dom.js';
import { Chart, joinRuns, metricPoints, smooth } from './charts.js';

const TOP_CURVES = 5;

export function curvesPanel() {
  const title = h('h2');
  const picker = h('select', { name: 'curve-metric', 'aria-label': 'metric' });
  const smoothing = h('input', { type: 'range', name: 'smoothing', min: '0', max: '0.99', step: '0.01', value: '0', 'aria-label': 'smoothing' });
  const smoothingValue = h('span.muted.smoothing-value', {}, '0');
  const logY = h('input', { type: 'checkbox', name: 'log-y' });
  const note = h('div');
  const target = h('div.chart');
  const element = h('section.panel.curves', {},
    title,
    h('div.toolbar.curve-controls', {},
      h('label', {}, 'metric ', picker),
      h('label', {}, 'smoothing ', smoothing, ' ', smoothingValue),
      h('label', {}, logY, ' log y')),
    note, target);
  const cache = new Map(); // job id → {key, series}
  let chart = null;
  let metric = null;
  let last = null;
  let stopped = false;

  picker.addEventListener('change', () => {
    metric = picker.value;
    draw();
  });
  smoothing.addEventListener('input', () => {
    smoothingValue.textContent = smoothing.value;
    draw();
  });
  logY.addEventListener('change', draw);

  /** `rows`: the leaderboard's rows in rank order; `compared`: ticked job ids (2-6) or null. */
  async function render(next) {
    last = next;
    const names = next.metricNames;
    if (!metric || !names.includes(metric)) metric = next.defaultMetric && names.includes(next.defaultMetric) ? next.defaultMetric : names[0] || null;
    fill(picker, names.map((name) => h('option', { value: name, selected: name === metric }, name)));
    picker.disabled = names.length < 2;
    await draw();
  }

  function runsToShow() {
    const { rows, compared } = last;
    if (compared) return rows.filter((row) => compared.includes(row.job_id));
    return rows.filter((row) => row.metrics?.[metric]).slice(0, TOP_CURVES);
  }

  async function fetchSeries(row, signal) {
    const key = JSON.stringify(Object.entries(row.metrics || {}).map(([name, summary]) => [name, summary.count]));
    const cached = cache.get(row.job_id);
    if (cached && cached.key === key) return cached.series;
    const series = await get(`/api/jobs/${row.job_id}/metrics`, {}, { signal }).catch(() => cached?.series ?? []);
    cache.set(row.job_id, { key, series });
    return series;
  }

  async function draw() {
    if (!last) return;
    const { compared, signal } = last;
    if (!metric) {
      fill(title, 'Curves');
      fill(note, h('p.muted', {}, 'No metrics yet. Jobs append JSON lines like {"step": 3, "val_loss": 0.12} to $APP_METRICS_FILE.'));
      drop();
      return;
    }
    const rows = runsToShow();
    const fetched = await Promise.all(rows.map((row) => fetchSeries(row, signal)));
    if (stopped) return;
    const weight = Number(smoothing.value);
    const runs = rows.map((row, i) => {
      const mine = fetched[i].find((item) => item.name === metric);
      if (!mine) return null;
      const points = metricPoints(mine);
      return { row, xs: points.xs, ys: smooth(points.ys, weight) };
    }).filter(Boolean);
    fill(title, compared ? `Compared runs: ${metric} by step` : `Top ${runs.length} runs: ${metric} by step`);
    element.dataset.metric = metric;
    element.dataset.runs = String(runs.length);
    if (!runs.length) {
      fill(note, h('p.muted', {}, `No run here has written ${metric}.`));
      drop();
      return;
    }
    const single = runs.every((run) => run.xs.length === 1);
    const hidden = logY.checked && runs.some((run) => run.ys.some((value) => value !== null && value <= 0));
    fill(note,
      single ? h('p.muted', {}, `Each run wrote ${metric} once: the points are those values.`) : null,
      hidden ? h('p.muted', {}, 'Values at or below 0 are left out on a log scale.') : null);
    const series = runs.map((run) => ({
      label: `${run.row.rank ? `#${run.row.rank} ` : ''}job ${run.row.job_id}${weight ? ' (smoothed)' : ''}`,
    }));
    const data = joinRuns(runs);
    const changes = { y: { label: metric, log: logY.checked } };
    if (chart) chart.setSeries(series, data, changes);
    else chart = new Chart(target, { x: { label: 'step' }, ...changes, series, height: 260 }, data);
    target.dataset.lastValue = number(runs[0].ys[runs[0].ys.length - 1]);
  }

  function drop() {
    chart?.destroy();
    chart = null;
  }

  return {
    element,
    render,
    destroy() {
      stopped = true;
      drop();
    },
  };
}
