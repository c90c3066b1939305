// Charts: a thin wrapper around uPlot (vendor/uPlot.iife.min.js, loaded before the modules as
// the global `uPlot`). Colours come from the page's CSS variables, so charts follow dark mode;
// a chart follows its container's width.

const uPlot = window.uPlot;

function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

/** The series colours, readable on both the light and the dark background. */
export function palette() {
  return Array.from({ length: 8 }, (_, i) => cssVar(`--series-${i + 1}`) || '#3b82f6');
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

/**
 * One uPlot chart in `container`.
 * options: {x: {label, time, log, range, values, splits}, y: {label, range, values},
 *           series: [{label, points}],
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
    return Math.max(200, Math.floor(this.container.clientWidth || 400));
  }

  build(data) {
    const colours = palette();
    const { x = {}, y = {}, series, height = 200, legend = true } = this.options;
    const options = {
      width: this.width(),
      height,
      legend: { show: legend, live: true },
      cursor: { drag: { x: true, y: false } },
      scales: {
        x: { time: Boolean(x.time), ...(x.log ? { distr: 3 } : {}), ...(x.range ? { range: x.range } : {}) },
        y: y.range ? { range: y.range } : { auto: true },
      },
      axes: [
        axis(x.label, { ...(x.time ? {} : { values: x.values || ticks }), ...(x.splits ? { splits: x.splits } : {}) }),
        axis(y.label, { size: 60, values: y.values || ticks }),
      ],
      series: [
        { label: x.label || 'x', ...(x.legendValue ? { value: x.legendValue } : {}) },
        ...series.map((item, i) => {
          const colour = item.colour || colours[i % colours.length];
          if (item.points) {
            return {
              label: item.label,
              stroke: colour,
              fill: colour,
              paths: () => null,
              points: { show: true, size: 7, stroke: colour, fill: colour },
            };
          }
          return {
            label: item.label,
            stroke: colour,
            width: 2,
            spanGaps: true,
            points: { show: false },
          };
        }),
      ],
    };
    this.plot = new uPlot(options, data, this.container);
  }

  setData(data) {
    const seriesCount = this.options.series.length + 1;
    if (!this.plot || this.plot.series.length !== seriesCount) {
      this.plot?.destroy();
      this.build(data);
    } else {
      this.plot.setData(data);
    }
  }

  /** Replaces the series (labels) and data at once. */
  setSeries(series, data) {
    const same = series.length === this.options.series.length &&
      series.every((item, i) => item.label === this.options.series[i].label);
    this.options = { ...this.options, series };
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
