// The sweep page (#/sweeps/NAME): progress by status with a finish estimate, a parallel-
// coordinates plot whose brushes filter the leaderboard, metric curves (any metric, smoothed,
// log y) of the top or the ticked runs, a parameter-vs-metric scatter with failed and stopped
// runs marked, a comparison of ticked runs, parameter importance and the best result over time
// (both computed by the server), the sortable leaderboard, and CSV and JSON downloads. When no
// connected worker can run its queued jobs, the progress panel says why.

import { get, post, url, segment } from './api.js';
import { h, fill, progressBar, message, notFound, count, timeAgo, refresher, toast } from './dom.js';
import { flatParams, paramFormatter } from './params.js';
import { links } from './nav.js';
import { leaderboardPanel, bestOf, arrow } from './leaderboard.js';
import { ParallelCoordinates } from './parcoords.js';
import { curvesPanel } from './curves.js';
import { scatterPanel } from './scatter.js';
import { comparePanel } from './compare.js';
import { importancePanel, bestSoFarPanel, etaText, analysisError } from './analysis.js';

const STATUSES = ['queued', 'running', 'succeeded', 'failed', 'cancelled'];
const SUMMARY_ROWS = 1000; // rows fetched for the leaderboard and the plots
const MAX_AXES = 12; // parameters on the parallel coordinates, most important first
/**
 * The analysis reads every run of the sweep on the server: it is fetched again when the counts
 * by status change, else at most this often (metrics of running jobs, the estimate's clock).
 */
const ANALYSIS_EVERY_MS = 10000;

export function mount(root, route) {
  const name = route.params[0];
  document.title = `${name} · app`;
  const base = `/api/sweeps/${segment(name)}`;
  let sweep = null;
  let board = null; // the leaderboard JSON: {sweep, metric, rows, directions}
  let analysis = null;
  let analysisKey = '';
  let analysisAt = 0;
  let compared = [];
  let stopped = false;
  const controller = new AbortController();
  const { signal } = controller;

  const headBox = h('div.page-head');
  const errorBox = h('div');
  const progressBox = h('section.panel.progress-panel');
  const pcTarget = h('div.parcoords-wrap');
  const pcNote = h('p.muted.pc-note');
  const pcBox = h('section.panel.parallel', {}, h('h2', {}, 'Parallel coordinates'), pcNote, pcTarget);
  const parallel = new ParallelCoordinates(pcTarget, { onBrush: () => renderBoard() });
  const leaderboard = leaderboardPanel({
    onTick: (ids) => {
      compared = ids;
      renderCompare();
      drawCurves();
    },
    onClear: () => parallel.clear(),
  });
  const curves = curvesPanel();
  const scatter = scatterPanel();
  const compare = comparePanel({ onClear: () => leaderboard.clearTicks() });
  const importance = importancePanel();
  const bestSoFar = bestSoFarPanel();
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
      fill(root, headBox, errorBox, progressBox, pcBox, h('div.grid-2', {}, curves.element, scatter.element),
        compare.element, h('div.grid-2', {}, importance.element, bestSoFar.element), leaderboard.element);
      renderHead();
    }
    const countsKey = JSON.stringify(sweep.counts);
    const analyse = countsKey !== analysisKey || Date.now() - analysisAt >= ANALYSIS_EVERY_MS;
    if (!analyse) loader.schedule(ANALYSIS_EVERY_MS - (Date.now() - analysisAt));
    const [summaryResult, analysisResult] = await Promise.allSettled([
      get(`${base}/summary`, { top: SUMMARY_ROWS }, { signal }),
      analyse ? get(`${base}/analysis`, {}, { signal }) : Promise.resolve(analysis),
    ]);
    if (stopped || signal.aborted) return;
    if (summaryResult.status === 'rejected') {
      fill(errorBox, message(`Cannot load the leaderboard: ${summaryResult.reason.message}`, 'error'));
      return;
    }
    fill(errorBox);
    board = summaryResult.value;
    if (analysisResult.status === 'fulfilled') {
      analysis = analysisResult.value;
      if (analyse) {
        analysisKey = countsKey;
        analysisAt = Date.now();
      }
    } else {
      analysisError(errorBox, analysisResult.reason);
    }
    renderProgress();
    renderParallel();
    renderBoard();
    renderCompare();
    scatter.render(board.rows, rankMetric(), scoreOf);
    importance.render(analysis);
    bestSoFar.render(analysis);
    await drawCurves();
  }

  const loader = refresher(load, 300);

  /** The metric that ranks runs: the sweep's, or else the one the server analysed. */
  function rankMetric() {
    if (board?.metric) return board.metric;
    const chosen = analysis?.metric;
    return chosen ? { name: chosen.name, goal: chosen.goal } : null;
  }

  /** A run's value of the ranking metric: its best when the direction is known, else its last. */
  function scoreOf(row) {
    const metric = rankMetric();
    const summary = metric && row.metrics?.[metric.name];
    if (!summary) return null;
    return metric.goal ? bestOf(summary, metric.goal) : summary.last;
  }

  function renderHead() {
    const metric = sweep.metric;
    fill(headBox,
      h('div.grow', {},
        h('h1', {}, sweep.name),
        h('div.sub', {}, `${sweep.form} sweep · `,
          metric ? `ranked by ${metric.name} (${metric.goal})` : 'no metric declared', ' · created ', timeAgo(sweep.created_at),
          ' by ', h('a', { href: links.queue({ owner: sweep.owner }), dataset: { owner: sweep.owner } }, sweep.owner))),
      h('div.toolbar', {},
        h('a.button', { href: links.queue({ sweep: sweep.name }) }, 'Jobs in the queue'),
        h('a.button', { href: url(`${base}/summary`, { format: 'csv' }), download: `${fileStem(sweep.name)}-summary.csv`, dataset: { download: 'csv' } }, 'Summary CSV'),
        h('a.button', { href: `${base}/summary`, download: `${fileStem(sweep.name)}-summary.json`, dataset: { download: 'json' } }, 'Summary JSON'),
        sweep.paused ? h('button', { type: 'button', dataset: { action: 'resume' }, onclick: resumeSweep }, 'Resume sweep') : null,
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
        h('i', { class: `status-${status}`, style: { background: `var(--${status})` } }), `${count(counts[status])} ${status}`))),
      searchLine(sweep.search),
      sweep.paused
        ? h('pre.paused.waiting-never', { dataset: { paused: '' } }, `Paused ${timeAgo(sweep.paused.at)}: ${sweep.paused.reason.replace(/^paused: /, '')}`)
        : null,
      sweep.metric_missing ? h('p.waiting-never', { dataset: { metricMissing: sweep.metric_missing.name } }, metricMissingText(sweep.metric_missing)) : null,
      sweep.unplaceable
        ? h('p.waiting-never', { dataset: { unplaceable: '' } }, `Its queued jobs cannot run on any connected worker: ${sweep.unplaceable}. They wait until such a worker connects.`)
        : null,
      analysis ? h('p.eta', { dataset: { eta: analysis.eta.remaining_ms ?? 'none' } }, 'Estimate: ', etaText(analysis.eta)) : null);
  }

  /** Where the sweep's controller stands: runs made (of the cap), runs stopped early, notes. */
  function searchLine(search) {
    if (!search) return null;
    const parts = [];
    if (search.method !== 'fixed') {
      const cap = search.run_cap === null || search.run_cap === undefined ? 'until stopped' : `of up to ${count(search.run_cap)}`;
      parts.push(`Adaptive (${search.method}): ${count(search.proposed)} runs made ${cap}${search.open ? '' : ', no more to come'}.`);
    }
    if (search.early_stop) parts.push(` ${count(search.stopped_early)} run${search.stopped_early === 1 ? '' : 's'} stopped early.`);
    return h('div.search-state', { dataset: { proposed: String(search.proposed), stoppedEarly: String(search.stopped_early) } },
      h('p', {}, parts.join('')),
      search.notes.length ? h('ul.muted', {}, search.notes.map((note) => h('li', {}, note))) : null);
  }

  function renderParallel() {
    const metric = rankMetric();
    const rows = board.rows;
    const flat = new Map(rows.map((row) => [row.job_id, flatParams(row.params)]));
    const names = [];
    for (const params of flat.values()) for (const key of Object.keys(params)) if (!names.includes(key)) names.push(key);
    const varying = names.filter((key) => new Set(rows.map((row) => JSON.stringify(flat.get(row.job_id)[key]))).size > 1);
    const rankOf = new Map((analysis?.importance || []).map((item, i) => [item.name, i]));
    const chosen = varying.slice().sort((a, b) => (rankOf.get(a) ?? 1e9) - (rankOf.get(b) ?? 1e9)).slice(0, MAX_AXES)
      .sort((a, b) => names.indexOf(a) - names.indexOf(b));
    if (!rows.length || (!chosen.length && !metric)) {
      fill(pcNote, rows.length ? 'No parameter varies across the runs.' : 'No runs yet.');
      pcTarget.replaceChildren();
      return;
    }
    const dimensions = chosen.map((key) => {
      const format = paramFormatter(rows.map((row) => flat.get(row.job_id)[key]));
      return { key: `param:${key}`, label: key, value: (row) => flat.get(row.job_id)[key], format: (value) => format(value).text };
    });
    const scores = rows.map(scoreOf).filter((value) => value !== null && Number.isFinite(value));
    if (metric) {
      const format = paramFormatter(scores);
      dimensions.push({ key: `metric:${metric.name}`, label: `${metric.name} ${arrow(metric.goal)}`.trim(), value: scoreOf, format: (value) => format(value).text });
    }
    const low = Math.min(...scores);
    const high = Math.max(...scores);
    const colourOf = (row) => {
      const value = scoreOf(row);
      if (value === null || !Number.isFinite(value) || !metric?.goal) return 'var(--muted)';
      let t = high === low ? 1 : (value - low) / (high - low);
      if (metric.goal === 'minimize') t = 1 - t;
      return `color-mix(in srgb, var(--accent) ${Math.round(15 + 85 * t)}%, var(--muted))`;
    };
    fill(pcNote, varying.length > MAX_AXES ? `The ${MAX_AXES} most important of ${varying.length} varying parameters. ` : '',
      'Drag along an axis to keep only the runs in that range (the leaderboard follows); click an axis to clear it.',
      metric?.goal ? ` Stronger colour: better ${metric.name}.` : '');
    parallel.update(dimensions, rows, colourOf);
  }

  function renderBoard() {
    if (!board) return;
    leaderboard.render({
      summary: board, directions: board.directions, metric: rankMetric(), filter: parallel.filter(),
      capped: board.rows.length >= SUMMARY_ROWS,
    });
  }

  function comparedRows() {
    return compared.length >= 2 ? board.rows.filter((row) => compared.includes(row.job_id)) : [];
  }

  function renderCompare() {
    if (!board) return;
    compare.render(comparedRows(), board.directions);
  }

  async function drawCurves() {
    if (!board) return;
    const metricNames = board.directions.map((direction) => direction.name);
    await curves.render({
      rows: board.rows, metricNames, defaultMetric: rankMetric()?.name,
      compared: compared.length >= 2 ? compared : null, signal,
    });
  }

  /** The sweep's metric that no finished run reported, with what they did report. */
  function metricMissingText(missing) {
    const runs = missing.finished === 1 ? 'run has' : 'runs have';
    let text = `The metric ${missing.name} has not arrived: ${count(missing.finished)} succeeded ${runs} not reported it`;
    text += missing.arrived.length ? `; they reported ${missing.arrived.join(', ')}` : '; no run reported any metric (write JSON lines to $APP_METRICS_FILE)';
    if (missing.did_you_mean) text += `. Did you mean ${missing.did_you_mean}?`;
    return text;
  }

  async function resumeSweep() {
    try {
      const result = await post(`${base}/resume`);
      toast(result.resumed ? `${sweep.name} resumed: its queued jobs may run again` : `${sweep.name} was not paused`);
    } catch (error) {
      toast(`Resume failed: ${error.message}`, 'error');
    }
    loader.now();
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
    parallel.destroy();
    curves.destroy();
    scatter.destroy();
    bestSoFar.destroy();
  }

  loader.now();
  return {
    refresh: () => loader.schedule(),
    destroy: stop,
  };
}

/** A sweep's name as the start of a file name: `myproj/sweep` → `myproj+sweep`, as on the server's disk. */
function fileStem(name) {
  return name.replaceAll('/', '+');
}
