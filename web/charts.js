// Charts: a thin wrapper around uPlot (vendor/uPlot.iife.min.js, loaded before the modules as
// the global `uPlot`). Colours come from the page's CSS variables, so charts follow dark mode;
// a chart follows its container's width. A series with a single value in view is drawn as a
// point (a line needs two), so a metric written once never leaves a blank chart.

const uPlot = window.uPlot;

function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

/** The series colours, readable on both the light and the dark background. */
export function palette() {
  return Array.from({ length: 8 }, (_, i) => cssVar(`--series-${i + 1}`) || '#3b82f6');
}

/** A colour of the page by CSS variable name (`--failed`). */
export function colour(name) {
  return cssVar(name);
}

/** A tick label: short, exponent only for very small or large values. */
export function tick(value) {
  if (value === null || value === undefined) return '';
  if (value === 0) return '0';
  const magnitude = Math.abs(value);
  if (magnitude < 1e-3 || magnitude >= 1e6) return value.toExponential(2).replace(/\.?0+e/, 'e');
  return String(Number(value.toPrecision(4)));
}

const ticks = (_, splits) => splits.map(tick);

function axis(label, extra = {}) {
  const stroke = cssVar('--muted');
  const grid = cssVar('--grid');
  return {
    label,
    stroke,
    labelSize: label ? 18 : 0,
    labelFont: '12px system-ui, sans-serif',
    font: '11px system-ui, sans-serif',
    grid: { stroke: grid, width: 1 },
    ticks: { stroke: grid, width: 1 },
    ...extra,
  };
}

/** Non-null values of a series between two indices. */
function valuesIn(data, from, to) {
  let n = 0;
  for (let i = from; i <= to && i < data.length; i += 1) if (data[i] !== null && data[i] !== undefined) n += 1;
  return n;
}

/** A range that is never empty: one x or y value gets room around it. */
function roomy(pad) {
  return (_, min, max) => {
    if (min === null || max === null) return [0, 1];
    if (min !== max) return [min, max];
    const room = pad(min);
    return [min - room, max + room];
  };
}

/**
 * One uPlot chart in `container`.
 * options: {x: {label, time, log, range, values, splits}, y: {label, range, values, log},
 *           series: [{label, points, hollow, colour, step, width, size}],
 *           height, legend}
 * data: uPlot's aligned data, `[xs, ys1, ys2, ...]`.
 */
export class Chart {
  constructor(container, options, data) {
    this.container = container;
    this.options = options;
    this.plot = null;
    this.observer = new ResizeObserver(() => this.resize());
    this.observer.observe(container);
    this.setData(data);
  }

  width() {
    return Math.max(120, Math.floor(this.container.clientWidth || 400));
  }

  build(data) {
    const colours = palette();
    const { x = {}, y = {}, series, height = 200, legend = true } = this.options;
    const xRange = x.range || (x.log ? undefined : roomy((v) => (x.time ? 60 : Math.max(Math.abs(v) * 0.1, 1))));
    const options = {
      width: this.width(),
      height,
      legend: { show: legend, live: true },
      cursor: { drag: { x: true, y: false } },
      scales: {
        x: { time: Boolean(x.time), ...(x.log ? { distr: 3 } : {}), ...(xRange ? { range: xRange } : {}) },
        y: y.range ? { range: y.range } : y.log ? { distr: 3 } : { auto: true },
      },
      axes: [
        axis(x.label, { ...(x.time ? {} : { values: x.values || ticks }), ...(x.splits ? { splits: x.splits } : {}) }),
        axis(y.label, { size: 60, values: y.values || ticks }),
      ],
      series: [
        { label: x.label || (x.time ? 'time' : 'x'), ...(x.legendValue ? { value: x.legendValue } : {}) },
        ...series.map((item, i) => {
          const stroke = item.colour || colours[i % colours.length];
          if (item.points) {
            const size = item.size || 7;
            return {
              label: item.label,
              stroke,
              fill: stroke,
              paths: () => null,
              points: { show: true, size, width: 2, stroke, fill: item.hollow ? 'transparent' : stroke },
            };
          }
          return {
            label: item.label,
            stroke,
            width: item.width || 2,
            spanGaps: true,
            ...(item.step ? { paths: uPlot.paths.stepped({ align: 1 }) } : {}),
            // A line needs two values: with one in view, draw it as a point.
            points: { show: (u, si, from, to) => valuesIn(u.data[si], from, to) <= 1, size: 8, fill: stroke },
          };
        }),
      ],
    };
    this.plot = new uPlot(options, this.prepare(data), this.container);
  }

  /** On a log axis, values at or below zero cannot be drawn: they become gaps. */
  prepare(data) {
    if (!this.options.y?.log) return data;
    return data.map((column, i) => (i === 0 ? column : column.map((v) => (v !== null && v > 0 ? v : null))));
  }

  setData(data) {
    const seriesCount = this.options.series.length + 1;
    if (!this.plot || this.plot.series.length !== seriesCount) {
      this.plot?.destroy();
      this.build(data);
    } else {
      this.plot.setData(this.prepare(data));
    }
  }

  /** Replaces the options (series, axes) and data at once; rebuilds when they differ. */
  setSeries(series, data, changes = {}) {
    const next = { ...this.options, ...changes, series };
    const same = JSON.stringify(next) === JSON.stringify(this.options);
    this.options = next;
    if (!same) {
      this.plot?.destroy();
      this.plot = null;
    }
    this.setData(data);
  }

  resize() {
    if (!this.plot) return;
    const width = this.width();
    if (Math.abs(width - this.plot.width) > 4) this.plot.setSize({ width, height: this.plot.height });
  }

  destroy() {
    this.observer.disconnect();
    this.plot?.destroy();
    this.plot = null;
  }
}

/** Points of several runs, each `{xs, ys}` sorted by x, joined on one x axis (gaps as null). */
export function joinRuns(runs) {
  if (runs.length === 0) return [[]];
  return uPlot.join(runs.map((run) => [run.xs, run.ys]));
}

/** A metric series from the API (`{steps, values}`) as sorted `{xs, ys}`; step = index if absent. */
export function metricPoints(series) {
  const byStep = new Map();
  series.values.forEach((value, i) => {
    const step = series.steps[i] ?? i;
    byStep.set(step, value); // the last value written for a step wins
  });
  const xs = [...byStep.keys()].sort((a, b) => a - b);
  return { xs, ys: xs.map((step) => byStep.get(step)) };
}

/**
 * Exponential moving average with TensorBoard's debiasing: `weight` 0 is the raw curve, 0.99
 * nearly flat. The first values are not pulled towards zero (each is divided by 1 − weightⁿ).
 */
export function smooth(ys, weight) {
  if (!weight) return ys;
  let last = 0;
  let n = 0;
  return ys.map((value) => {
    if (value === null || value === undefined || !Number.isFinite(value)) return value;
    last = last * weight + (1 - weight) * value;
    n += 1;
    return last / (1 - weight ** n);
  });
}
