// The sweep page's leaderboard: one row per run with its rank, status, the sweep metric's best,
// its parameters and its other metrics. Each metric column follows that metric's own direction
// as the server decided it (`directions`): its best is its max or its min, and a metric whose
// direction is unknown shows its min and its max instead. Columns sort on click; rows can be
// filtered (by the parallel-coordinates brushes) and ticked for comparison. When runs recorded
// their GPU use (per-job accounting), GPU columns follow: mean utilisation, peak memory, GPU-hours.

import { h, fill, runBadge, count, number, bytes } from './dom.js';
import { flatParams, paramFormatter, exactText } from './params.js';
import { links } from './nav.js';

const ROWS_STEP = 50;
export const MAX_COMPARED = 6;
const STATUS_ORDER = ['running', 'succeeded', 'failed', 'stopped early', 'cancelled', 'queued'];

/** The best of a metric summary by goal (`maximize`/`minimize`), or null. */
export function bestOf(summary, goal) {
  if (!summary) return null;
  return goal === 'maximize' ? summary.max : goal === 'minimize' ? summary.min : null;
}

/** ↑ when higher is better, ↓ when lower is. */
export function arrow(goal) {
  return goal === 'maximize' ? '↑' : goal === 'minimize' ? '↓' : '';
}

/**
 * The panel. `onTick(ids)` is called with the ticked job ids when they change; `onClear()`
 * when the user asks to drop the brushes' filter.
 */
export function leaderboardPanel({ onTick, onClear }) {
  const element = h('section.panel.leaderboard-panel');
  let sort = null; // {key, descending}
  let rowsShown = ROWS_STEP;
  let last = null;
  const ticked = new Set();

  /** Parameters with one value in every run (two runs or more): said once, not as columns. */
  function constantsOf(rows) {
    if (rows.length < 2) return [];
    const flat = rows.map((row) => flatParams(row.params));
    return Object.keys(flat[0]).filter((name) => flat.every((params) => name in params && exactText(params[name]) === exactText(flat[0][name])))
      .map((name) => [name, flat[0][name]]);
  }

  function columnsOf(rows, directions, metric, constants) {
    const flat = new Map(rows.map((row) => [row.job_id, flatParams(row.params)]));
    const fixed = new Set(constants.map(([name]) => name));
    const paramNames = [];
    for (const params of flat.values()) for (const key of Object.keys(params)) if (!paramNames.includes(key) && !fixed.has(key)) paramNames.push(key);
    const metricNames = directions.map((direction) => direction.name).filter((name) => name !== metric?.name);
    const clash = new Set(paramNames.filter((name) => metricNames.includes(name) || name === metric?.name));
    const goalOf = new Map(directions.map((direction) => [direction.name, direction.goal]));
    const columns = [
      { key: 'rank', label: 'Rank', num: true, value: (row) => row.rank },
      { key: 'job', label: 'Job', num: true, value: (row) => row.job_id },
      { key: 'status', label: 'Status', value: (row) => STATUS_ORDER.indexOf(row.stopped_early ? 'stopped early' : row.status) },
    ];
    if (metric) {
      columns.push({
        key: 'score', label: metric.goal ? `${metric.name} best ${arrow(metric.goal)}` : `${metric.name} last`, num: true, kind: 'metric', group: 'fixed', goal: metric.goal,
        metricName: metric.name,
        title: `${metric.name}: each run's best (${metric.goal === 'maximize' ? 'highest' : metric.goal === 'minimize' ? 'lowest' : 'last'}) value; the sweep is ranked by it`,
        value: (row) => row.score ?? bestOf(row.metrics?.[metric.name], metric.goal) ?? row.metrics?.[metric.name]?.last ?? null,
      });
    }
    for (const name of paramNames) {
      const values = rows.map((row) => flat.get(row.job_id)[name]);
      const format = paramFormatter(values);
      columns.push({
        key: `param:${name}`, label: clash.has(name) ? `${name} (param)` : name, kind: 'param', group: 'param', format,
        title: `parameter ${name}`, value: (row) => flat.get(row.job_id)[name],
      });
    }
    for (const name of metricNames) {
      const goal = goalOf.get(name);
      const label = clash.has(name) ? `${name} (metric)` : name;
      if (goal) {
        columns.push({
          key: `best:${name}`, label: `${label} best ${arrow(goal)}`, num: true, kind: 'metric', group: 'metric', goal, metricName: name,
          title: `metric ${name}: each run's ${goal === 'maximize' ? 'highest' : 'lowest'} value (${goal === 'maximize' ? 'higher' : 'lower'} is better)`,
          value: (row) => bestOf(row.metrics?.[name], goal),
        });
      } else {
        // Which way it improves is unknown: no "best", its range instead.
        for (const end of ['min', 'max']) {
          columns.push({
            key: `${end}:${name}`, label: `${label} ${end}`, num: true, kind: 'metric', group: 'metric', metricName: name,
            title: `metric ${name}: each run's ${end === 'min' ? 'lowest' : 'highest'} value (which way is better is unknown)`,
            value: (row) => row.metrics?.[name]?.[end] ?? null,
          });
        }
      }
    }
    if (rows.some((row) => row.gpu_usage)) columns.push(...gpuColumns());
    return columns;
  }

  /** What each run used of its GPUs, as its worker measured it. */
  function gpuColumns() {
    const usage = (row) => row.gpu_usage || null;
    return [
      {
        key: 'gpu:util', label: 'GPU util %', num: true, kind: 'gpu', group: 'gpu',
        title: 'mean GPU utilisation over the run (a shared GPU counted in equal parts); ⚠ a GPU it held was mostly idle',
        value: (row) => usage(row)?.utilization_mean ?? null,
        text: (row) => {
          const used = usage(row);
          if (!used || used.utilization_mean === null || used.utilization_mean === undefined) return '';
          return `${used.idle_gpus?.length ? '⚠ ' : ''}${used.utilization_mean.toFixed(0)}`;
        },
        hint: (row) => {
          const used = usage(row);
          if (!used) return undefined;
          const idle = used.idle_gpus?.length ? ` · GPU mostly idle: input-bound? (GPU ${used.idle_gpus.join(', ')})` : '';
          return `mean ${number(used.utilization_mean)}% · p95 ${number(used.utilization_p95)}% over ${used.samples} readings${idle}`;
        },
      },
      {
        key: 'gpu:memory', label: 'GPU mem peak', num: true, kind: 'gpu', group: 'gpu',
        title: 'the most GPU memory the run\'s processes held at once, all its GPUs together',
        value: (row) => usage(row)?.memory_peak ?? null,
        text: (row) => (usage(row)?.memory_peak !== null && usage(row)?.memory_peak !== undefined ? bytes(usage(row).memory_peak) : ''),
      },
      {
        key: 'gpu:hours', label: 'GPU h', num: true, kind: 'gpu', group: 'gpu',
        title: 'GPU time held: wall time × GPUs (a shared GPU in equal parts)',
        value: (row) => usage(row)?.gpu_hours ?? null,
        text: (row) => (usage(row) ? usage(row).gpu_hours.toFixed(usage(row).gpu_hours < 1 ? 3 : 1) : ''),
      },
    ];
  }

  function compare(a, b) {
    const missing = (value) => value === null || value === undefined;
    if (missing(a) || missing(b)) return missing(a) - missing(b);
    if (typeof a === 'number' && typeof b === 'number') return a - b;
    return exactText(a).localeCompare(exactText(b), undefined, { numeric: true });
  }

  function sorted(rows, columns) {
    if (!sort) return rows;
    const column = columns.find((item) => item.key === sort.key);
    if (!column) return rows;
    return rows
      .map((row, position) => ({ row, position, value: column.value(row) }))
      .sort((a, b) => {
        const empty = (a.value === null || a.value === undefined) - (b.value === null || b.value === undefined);
        if (empty) return empty; // runs without a value stay last either way
        const order = compare(a.value, b.value);
        return (sort.descending ? -order : order) || a.position - b.position;
      })
      .map((item) => item.row);
  }

  function clickSort(column) {
    if (sort?.key === column.key) sort = { key: column.key, descending: !sort.descending };
    // A metric's first click puts its best first.
    else sort = { key: column.key, descending: column.goal === 'maximize' };
    render();
  }

  function toggle(id, on) {
    if (on && ticked.size < MAX_COMPARED) ticked.add(id);
    else ticked.delete(id);
    onTick([...ticked]);
    render();
  }

  function header(columns) {
    // The group row names which columns are parameters and which are metrics.
    const spans = [{ group: 'fixed', span: 1 }];
    for (const column of columns) {
      const group = column.group || 'fixed';
      if (spans[spans.length - 1].group === group) spans[spans.length - 1].span += 1;
      else spans.push({ group, span: 1 });
    }
    const titles = { fixed: '', param: 'Parameters', metric: 'Metrics', gpu: 'GPU' };
    const groups = h('tr.groups', {}, spans.map(({ group, span }) =>
      h('th', { colSpan: span, class: `group-${group}` }, titles[group])));
    const params = columns.some((column) => column.group === 'param');
    const metrics = columns.some((column) => column.group === 'metric');
    const names = h('tr.names', {},
      h('th.tick', { title: `tick 2 to ${MAX_COMPARED} runs to compare them` }, 'Compare'),
      columns.map((column) => {
        const active = sort?.key === column.key;
        return h('th.sortable', {
          // The rank, job, status and score columns take what they need; the rest share the width.
          class: [column.num ? 'num' : '', column.kind ? `kind-${column.kind}` : '', (column.group || 'fixed') === 'fixed' ? 'narrow' : '']
            .filter(Boolean).join(' '),
          title: column.title ? `${column.title}; click to sort` : 'click to sort',
          'aria-sort': active ? (sort.descending ? 'descending' : 'ascending') : 'none',
          dataset: { column: column.key },
          onclick: () => clickSort(column),
        }, column.label, active ? h('span.arrow', {}, sort.descending ? '▼' : '▲') : null);
      }));
    return [params || metrics ? groups : null, names];
  }

  function cell(column, row) {
    const value = column.value(row);
    if (column.key === 'rank') return h('td.num', {}, value ?? '—');
    if (column.key === 'job') return h('td.num', {}, h('a', { href: links.job(row.job_id) }, String(row.job_id)));
    if (column.key === 'status') return h('td', {}, runBadge(row));
    if (column.kind === 'gpu') {
      const idle = column.key === 'gpu:util' && row.gpu_usage?.idle_gpus?.length;
      return h('td.num', { title: column.hint?.(row), class: idle ? 'gpu-idle' : '', dataset: { gpu: column.key } }, column.text(row));
    }
    if (column.kind === 'param') {
      if (value === undefined) return h('td.mono', {}, '');
      const { text, exact } = column.format(value);
      return h('td.mono', { title: exact ?? undefined, dataset: { exact: exact ?? undefined } }, text);
    }
    const summary = row.metrics?.[column.metricName];
    const title = summary ? `last ${number(summary.last)} · min ${number(summary.min)} · max ${number(summary.max)} · ${summary.count} values` : undefined;
    const text = number(value ?? null);
    return h('td.num', { title }, column.key === 'score' ? h('strong', {}, text) : text);
  }

  /** Draws the rows that pass `filter` (all when null). */
  function render(next) {
    if (next) last = next;
    if (!last) return;
    const { summary, directions, metric, filter, capped } = last;
    // Not when capped: the same in the best rows shown is not the same in every run.
    const constants = capped ? [] : constantsOf(summary.rows);
    const columns = columnsOf(summary.rows, directions, metric, constants);
    const present = new Set(summary.rows.map((row) => row.job_id));
    for (const id of [...ticked]) if (!present.has(id)) ticked.delete(id);
    const shown = filter ? summary.rows.filter(filter) : summary.rows;
    const rows = sorted(shown, columns);
    const body = rows.slice(0, rowsShown).map((row) => h('tr', {
      class: ticked.has(row.job_id) ? 'selected' : '',
      dataset: { jobId: String(row.job_id), status: row.status },
    },
    h('td.tick', {}, h('input', {
      type: 'checkbox', checked: ticked.has(row.job_id), 'aria-label': `compare job ${row.job_id}`,
      disabled: !ticked.has(row.job_id) && ticked.size >= MAX_COMPARED,
      onchange: (event) => toggle(row.job_id, event.target.checked),
    })),
    columns.map((column) => cell(column, row))));
    const more = rows.length > rowsShown
      ? h('button.small', { type: 'button', onclick: () => { rowsShown += ROWS_STEP; render(); } }, `show ${Math.min(ROWS_STEP, rows.length - rowsShown)} more`)
      : null;
    const counted = capped ? `best ${count(summary.rows.length)} runs (the CSV has all)` : `${count(summary.rows.length)} runs`;
    fill(element,
      h('h2', {}, 'Leaderboard', h('span.muted', { style: { fontWeight: 400 } }, counted),
        ticked.size ? h('span.muted.compare-count', { style: { fontWeight: 400 } }, `· ${ticked.size} ticked to compare`) : null),
      constants.length
        ? h('p.muted.constants', { dataset: { constants: constants.map(([name]) => name).join(',') } }, 'The same in every run: ',
          constants.map(([name, value], at) => [at ? ', ' : '', h('code', {}, `${name}=${exactText(value)}`)]))
        : null,
      filter
        ? h('p.filter-note', { dataset: { shown: String(shown.length) } }, `${count(shown.length)} of ${count(summary.rows.length)} runs inside the brushed ranges of the parallel coordinates. `,
          h('button.small', { type: 'button', onclick: onClear }, 'clear brushes'))
        : null,
      summary.rows.length === 0 ? h('p.muted', {}, 'No runs yet.') : h('div.table-wrap', {}, h('table.leaderboard', {},
        h('thead', {}, header(columns)),
        h('tbody', {}, body))),
      more);
  }

  return {
    element,
    render,
    untick(id) {
      ticked.delete(id);
      onTick([...ticked]);
      render();
    },
    clearTicks() {
      ticked.clear();
      onTick([]);
      render();
    },
  };
}
