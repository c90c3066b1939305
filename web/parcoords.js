// A parallel-coordinates plot in SVG, written for this page (no library): one vertical axis per
// dimension (numbers on a linear or log scale, other values as evenly spaced categories), one
// line per run, coloured by the metric. Dragging along an axis brushes a range; a click on an
// axis clears its brush. Lines outside any brush are dimmed; `onBrush()` says the brushes
// changed and `filter()` answers a predicate over runs (null when nothing is brushed), so the
// leaderboard can show the same runs.

const SVG = 'http://www.w3.org/2000/svg';
const HEIGHT = 300;
const TOP = 42;
const BOTTOM = 26;
const SIDE = 76; // room for the first axis's tick labels
const MIN_GAP = 96; // px between axes before the plot scrolls sideways

function svg(tag, attributes = {}, ...children) {
  const element = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (value === undefined || value === null) continue;
    if (key === 'style') Object.assign(element.style, value);
    else if (key.startsWith('on')) element.addEventListener(key.slice(2), value);
    else element.setAttribute(key, String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    element.append(typeof child === 'string' ? document.createTextNode(child) : child);
  }
  return element;
}

/**
 * A scale for one dimension over `values`: `position(value)` in [0, 1] (0 at the bottom) or
 * null, and `ticks` as `[{at, text}]`.
 */
export function scaleOf(values, format) {
  const present = values.filter((value) => value !== null && value !== undefined);
  const numeric = present.length > 0 && present.every((value) => typeof value === 'number' && Number.isFinite(value));
  if (numeric) {
    const min = Math.min(...present);
    const max = Math.max(...present);
    const log = min > 0 && max / min >= 100;
    const f = log ? Math.log10 : (v) => v;
    const [lo, hi] = [f(min), f(max)];
    const position = (value) => (typeof value !== 'number' ? null : hi === lo ? 0.5 : (f(value) - lo) / (hi - lo));
    const ticks = min === max ? [{ at: 0.5, text: format(min) }] : [{ at: 0, text: format(min) }, { at: 1, text: format(max) }];
    return { kind: log ? 'log' : 'linear', position, ticks };
  }
  const key = (value) => (typeof value === 'string' ? value : JSON.stringify(value));
  const categories = [...new Set(present.map(key))].sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
  const position = (value) => {
    if (value === null || value === undefined) return null;
    const at = categories.indexOf(key(value));
    return at < 0 ? null : categories.length === 1 ? 0.5 : at / (categories.length - 1);
  };
  const ticks = categories.map((text, i) => ({ at: categories.length === 1 ? 0.5 : i / (categories.length - 1), text }));
  return { kind: 'category', position, ticks };
}

/**
 * `dimensions`: `[{key, label, value(row), format(value) → text}]`; `rows`: anything with
 * `job_id`; `colourOf(row)` → a CSS colour.
 */
export class ParallelCoordinates {
  constructor(container, { onBrush }) {
    this.container = container;
    this.onBrush = onBrush;
    this.brushes = new Map(); // dimension key → [low, high] in [0, 1]
    this.data = null;
    this.dragging = false; // a live refresh waits until the brush being dragged is let go
    this.observer = new ResizeObserver(() => this.redrawIfResized());
    this.observer.observe(container);
    this.drawnWidth = 0;
  }

  update(dimensions, rows, colourOf) {
    this.data = { dimensions, rows, colourOf };
    for (const key of [...this.brushes.keys()]) {
      if (!dimensions.some((dimension) => dimension.key === key)) this.brushes.delete(key);
    }
    if (!this.dragging) this.draw();
  }

  clear() {
    this.brushes.clear();
    if (this.data) this.draw();
    this.onBrush();
  }

  /** Whether a run lies inside every brush, for the runs last drawn; null without brushes. */
  filter() {
    if (!this.brushes.size || !this.data) return null;
    const scales = this.scales();
    return (row) => this.passes(row, scales);
  }

  scales() {
    const { dimensions, rows } = this.data;
    return new Map(dimensions.map((dimension) =>
      [dimension.key, { dimension, scale: scaleOf(rows.map((row) => dimension.value(row)), dimension.format) }]));
  }

  redrawIfResized() {
    if (this.data && !this.dragging && Math.abs(this.container.clientWidth - this.drawnWidth) > 4) this.draw();
  }

  /** Whether `row` lies inside every brush. */
  passes(row, scales) {
    for (const [key, [low, high]] of this.brushes) {
      const { dimension, scale } = scales.get(key);
      const at = scale.position(dimension.value(row));
      if (at === null || at < low - 1e-9 || at > high + 1e-9) return false;
    }
    return true;
  }

  draw() {
    const { dimensions, rows, colourOf } = this.data;
    this.drawnWidth = this.container.clientWidth;
    const width = Math.max(this.drawnWidth || 600, SIDE * 2 + MIN_GAP * Math.max(dimensions.length - 1, 1));
    const plotHeight = HEIGHT - TOP - BOTTOM;
    const gap = dimensions.length > 1 ? (width - SIDE * 2) / (dimensions.length - 1) : 0;
    const xOf = (i) => (dimensions.length > 1 ? SIDE + i * gap : width / 2);
    const yOf = (at) => TOP + (1 - at) * plotHeight;
    const scales = this.scales();

    const lines = svg('g', { class: 'pc-lines' });
    let inside = 0;
    for (const row of rows) {
      let path = '';
      let pen = false;
      dimensions.forEach((dimension, i) => {
        const at = scales.get(dimension.key).scale.position(dimension.value(row));
        if (at === null) {
          pen = false;
          return;
        }
        path += `${pen ? 'L' : 'M'}${xOf(i).toFixed(1)},${yOf(at).toFixed(1)}`;
        pen = true;
      });
      if (!path) continue;
      const passing = this.passes(row, scales);
      if (passing) inside += 1;
      lines.append(svg('path', {
        d: path, class: passing ? 'pc-line' : 'pc-line pc-dim', 'data-job-id': row.job_id, style: { stroke: colourOf(row) },
      }, svg('title', {}, `job ${row.job_id}`)));
    }
    // Brushed lines on top of the dimmed ones.
    for (const line of [...lines.querySelectorAll('.pc-line:not(.pc-dim)')]) lines.append(line);

    const axes = dimensions.map((dimension, i) => this.axis(dimension, scales.get(dimension.key).scale, xOf(i), yOf, plotHeight));
    const plot = svg('svg', {
      width, height: HEIGHT, viewBox: `0 0 ${width} ${HEIGHT}`, class: 'parcoords', role: 'img',
      'aria-label': `parallel coordinates of ${rows.length} runs over ${dimensions.map((d) => d.label).join(', ')}`,
      'data-inside': inside,
    }, lines, ...axes);
    this.container.replaceChildren(plot);
  }

  axis(dimension, scale, x, yOf, plotHeight) {
    const label = dimension.label.length > 16 ? `${dimension.label.slice(0, 15)}…` : dimension.label;
    const group = svg('g', { class: 'pc-axis', 'data-dimension': dimension.key },
      svg('line', { x1: x, x2: x, y1: yOf(1), y2: yOf(0) }),
      svg('text', { x, y: 16, 'text-anchor': 'middle', class: 'pc-label' }, label, svg('title', {}, dimension.label)),
      scale.kind === 'log' ? svg('text', { x, y: 30, 'text-anchor': 'middle', class: 'pc-scale' }, 'log scale') : null);
    const many = scale.ticks.length > 8;
    scale.ticks.forEach((tick, i) => {
      if (many && i % Math.ceil(scale.ticks.length / 8) !== 0 && i !== scale.ticks.length - 1) return;
      const text = tick.text.length > 12 ? `${tick.text.slice(0, 11)}…` : tick.text;
      group.append(svg('text', { x: x - 6, y: yOf(tick.at) + 4, 'text-anchor': 'end', class: 'pc-tick' }, text));
    });
    const brush = this.brushes.get(dimension.key);
    const band = svg('rect', { x: x - 9, width: 18, class: 'pc-brush', visibility: brush ? 'visible' : 'hidden' });
    const place = ([low, high]) => {
      band.setAttribute('y', String(yOf(high)));
      band.setAttribute('height', String(Math.max(1, (high - low) * plotHeight)));
    };
    if (brush) place(brush);
    const hit = svg('rect', {
      x: x - 14, y: yOf(1) - 6, width: 28, height: plotHeight + 12, class: 'pc-hit',
      'data-brush': dimension.key,
    }, svg('title', {}, `drag along ${dimension.label} to brush a range; click to clear it`));
    const toUnit = (event) => {
      const box = hit.ownerSVGElement.getBoundingClientRect();
      const y = (event.clientY - box.top) * (HEIGHT / box.height);
      return Math.min(1, Math.max(0, 1 - (y - yOf(1)) / plotHeight));
    };
    let start = null;
    hit.addEventListener('pointerdown', (event) => {
      event.preventDefault();
      hit.setPointerCapture(event.pointerId);
      start = { at: toUnit(event), y: event.clientY };
      this.dragging = true;
    });
    hit.addEventListener('pointermove', (event) => {
      if (!start) return;
      const at = toUnit(event);
      place([Math.min(start.at, at), Math.max(start.at, at)]);
      band.setAttribute('visibility', 'visible');
    });
    hit.addEventListener('pointerup', (event) => {
      if (!start) return;
      const at = toUnit(event);
      const moved = Math.abs(event.clientY - start.y) > 3;
      if (moved) this.brushes.set(dimension.key, [Math.min(start.at, at), Math.max(start.at, at)]);
      else this.brushes.delete(dimension.key);
      start = null;
      this.dragging = false;
      this.changed();
    });
    hit.addEventListener('pointercancel', () => {
      start = null;
      this.dragging = false;
      this.draw();
    });
    group.append(band, hit);
    return group;
  }

  changed() {
    this.draw();
    this.onBrush();
  }

  destroy() {
    this.observer.disconnect();
  }
}
