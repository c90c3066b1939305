// The sweep page's analysis panels, drawn from GET /api/sweeps/NAME/analysis: how much each
// parameter matters (computed on the server; the method is named under the bars), the best
// result over time, and the finish estimate shown with the progress bar.

import { h, fill, count, duration, number, message } from './dom.js';
import { Chart, colour } from './charts.js';
import { arrow } from './leaderboard.js';

/** The estimate in words: `about 4m 10s left (3 at a time, 1m 20s per run on average)`. */
export function etaText(eta) {
  if (!eta) return '';
  if (eta.remaining_ms === 0) return 'every job has ended';
  if (eta.remaining_ms === null || eta.remaining_ms === undefined) return `no estimate yet: ${eta.note}`;
  return `about ${duration(eta.remaining_ms)} left (${eta.note})`;
}

export function importancePanel() {
  const body = h('div');
  const element = h('section.panel.importance', {}, h('h2', {}, 'Parameter importance'), body);

  function render(analysis) {
    const metric = analysis?.metric;
    if (!metric) {
      fill(body, h('p.muted', {}, 'No run has reported a metric yet.'));
      return;
    }
    const items = analysis.importance;
    const bars = items.map((item) => {
      const percent = Math.round(item.importance * 100);
      const trend = item.correlation === null || item.correlation === undefined ? ''
        : Math.abs(item.correlation) < 0.1 ? ' · no clear trend'
          : ` · higher ${item.name}, ${item.correlation > 0 ? 'higher' : 'lower'} ${metric.name} (ρ ${number(item.correlation)})`;
      return h('div.bar-row', { dataset: { param: item.name, importance: String(item.importance) } },
        h('span.bar-name', { title: item.name }, item.name),
        h('span.bar', {}, h('span.fill', { style: { width: `${Math.max(percent, 0.5)}%` } })),
        h('span.bar-value', { title: `${item.groups} groups${trend}` }, `${percent}%`));
    });
    fill(body,
      h('p.muted', {}, `${metric.name} ${arrow(metric.goal)} over ${count(analysis.runs_used)} runs`),
      items.length ? h('div.bars', {}, bars)
        : h('p.muted', {}, analysis.runs_used < 4 ? 'Importance needs at least 4 runs that reported the metric.' : 'No parameter varies across these runs.'),
      h('p.method', {}, h('strong', {}, 'Method: '), analysis.importance_method, '.'));
  }

  return { element, render };
}

export function bestSoFarPanel() {
  const note = h('div');
  const target = h('div.chart');
  const element = h('section.panel.best-so-far', {}, h('h2', {}, 'Best so far'), note, target);
  let chart = null;

  function render(analysis) {
    const points = analysis?.best_so_far || [];
    const metric = analysis?.metric;
    if (!metric || !metric.goal) {
      fill(note, h('p.muted', {}, metric ? `Which way ${metric.name} improves is unknown, so there is no best to follow.` : 'No metric yet.'));
      chart?.destroy();
      chart = null;
      return;
    }
    if (!points.length) {
      fill(note, h('p.muted', {}, `No finished run has reported ${metric.name} yet.`));
      chart?.destroy();
      chart = null;
      return;
    }
    const last = points[points.length - 1];
    fill(note, h('p.muted', {}, `${metric.name} ${arrow(metric.goal)}: best ${number(last.best)} after ${count(points.length)} finished runs`));
    const data = [points.map((point) => point.at / 1000), points.map((point) => point.value), points.map((point) => point.best)];
    const series = [
      { label: `each run's ${metric.name}`, points: true, size: 6, colour: colour('--muted') },
      { label: 'best so far', step: true },
    ];
    target.dataset.points = String(points.length);
    if (chart) chart.setSeries(series, data);
    else chart = new Chart(target, { x: { time: true }, y: { label: metric.name }, series, height: 220 }, data);
  }

  return { element, render, destroy: () => chart?.destroy() };
}

export function analysisError(box, error) {
  fill(box, message(`Cannot load the analysis: ${error.message}`, 'error'));
}
