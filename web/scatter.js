// The sweep page's parameter-vs-metric scatter: each run's best value of the ranking metric
// against one parameter (picked in its heading). Failed and stopped (cancelled) runs are drawn
// hollow in their status colour, so a crash is not mistaken for a result; runs of theirs that
// reported nothing are counted under the chart.

import { h, fill } from './dom.js';
import { flatParams, exactText, paramFormatter } from './params.js';
import { Chart, colour } from './charts.js';

export function scatterPanel() {
  const head = h('h2');
  const note = h('div');
  const target = h('div.chart');
  const element = h('section.panel.scatter', {}, head, note, target);
  let chart = null;
  let chosen = null;
  let key = '';
  let last = null;

  function drop() {
    chart?.destroy();
    chart = null;
    key = '';
  }

  /** `scoreOf(row)` is the run's value of `metric`. */
  function render(rows, metric, scoreOf) {
    last = { rows, metric, scoreOf };
    const flat = rows.map((row) => flatParams(row.params));
    const keys = [];
    for (const params of flat) for (const name of Object.keys(params)) if (!keys.includes(name)) keys.push(name);
    const varying = keys.filter((name) => new Set(flat.map((params) => JSON.stringify(params[name]))).size > 1);
    const choices = varying.length ? varying : keys;
    if (!chosen || !choices.includes(chosen)) chosen = choices[0] || null;
    fill(head, 'Parameter vs metric ',
      choices.length > 1
        ? h('select', { name: 'param', 'aria-label': 'parameter', onchange: (event) => { chosen = event.target.value; render(last.rows, last.metric, last.scoreOf); } },
          choices.map((name) => h('option', { value: name, selected: name === chosen }, name)))
        : null);
    if (!metric || !chosen) {
      fill(note, h('p.muted', {}, !metric ? 'No metrics yet.' : 'The runs have no parameters.'));
      drop();
      return;
    }
    const points = [];
    let silent = 0;
    rows.forEach((row, i) => {
      const score = scoreOf(row);
      const bad = row.status === 'failed' || row.status === 'cancelled';
      if (score === null || score === undefined) {
        if (bad) silent += 1;
        return;
      }
      if (chosen in flat[i]) points.push({ value: flat[i][chosen], score, status: row.status });
    });
    element.dataset.failedPoints = String(points.filter((point) => point.status === 'failed').length);
    element.dataset.stoppedPoints = String(points.filter((point) => point.status === 'cancelled').length);
    fill(note, silent ? h('p.muted', {}, `${silent} failed or stopped run${silent === 1 ? '' : 's'} reported no ${metric.name}.`) : null);
    if (!points.length) {
      note.append(h('p.muted', {}, `No run has reported ${metric.name} yet.`));
      drop();
      return;
    }
    const numeric = points.every((point) => typeof point.value === 'number');
    let x;
    let xs;
    if (numeric) {
      const values = points.map((point) => point.value);
      const min = Math.min(...values);
      const max = Math.max(...values);
      x = { label: chosen, log: min > 0 && max / min >= 100 };
      xs = values;
    } else {
      // Categories (strings, lists, booleans) become positions 0..n-1, labelled by value.
      const format = paramFormatter(points.map((point) => point.value));
      const labels = [...new Set(points.map((point) => exactText(point.value)))];
      const shown = labels.map((label) => format(points.find((point) => exactText(point.value) === label).value).text);
      x = {
        label: chosen,
        range: [-0.5, labels.length - 0.5],
        splits: () => labels.map((_, i) => i),
        values: (_, splits) => splits.map((v) => shown[v] ?? ''),
      };
      xs = points.map((point) => labels.indexOf(exactText(point.value)));
    }
    const order = xs.map((_, i) => i).sort((a, b) => xs[a] - xs[b]);
    const column = (test) => order.map((i) => (test(points[i].status) ? points[i].score : null));
    const data = [
      order.map((i) => xs[i]),
      column((status) => status !== 'failed' && status !== 'cancelled'),
      column((status) => status === 'failed'),
      column((status) => status === 'cancelled'),
    ];
    const fresh = JSON.stringify([chosen, metric.name, data]);
    if (chart && fresh === key) return;
    key = fresh;
    const series = [
      { label: metric.name, points: true },
      { label: 'failed', points: true, hollow: true, colour: colour('--failed'), size: 9 },
      { label: 'stopped', points: true, hollow: true, colour: colour('--cancelled'), size: 9 },
    ];
    drop();
    key = fresh;
    chart = new Chart(target, { x, y: { label: metric.name }, series, height: 260 }, data);
  }

  return { element, render, destroy: drop };
}
