// The queue page (#/): counts by status, the newest sweeps with their owners, and every job in
// a filtered (status, sweep, worker, owner), sorted table paged by the server (it stays fast
// with 100,000 jobs); cancel, retry, priority, and cancel of a selection.

import { get, post } from './api.js';
import {
  h, fill, runBadge, progressBar, message, count, number, timeAgo, elapsed, refresher, toast,
} from './dom.js';
import { paramsLine, exactLine } from './params.js';
import { reasonText } from './reasons.js';
import { setQuery, links } from './nav.js';

const STATUSES = ['queued', 'running', 'succeeded', 'failed', 'cancelled'];
const PAGE_SIZES = [25, 50, 100, 250];
const SWEEPS_SHOWN = 6;

/**
 * Columns of the job table; `sort` names the server's sort key. Status comes right after the
 * id so a phone shows it without scrolling; `wide` columns are hidden on narrow screens.
 */
const COLUMNS = [
  { key: 'id', label: 'ID', sort: 'id', num: true },
  { key: 'status', label: 'Status', sort: 'status' },
  { key: 'sweep', label: 'Sweep', sort: 'sweep' },
  { key: 'params', label: 'Parameters', wide: true },
  { key: 'priority', label: 'Priority', sort: 'priority', num: true, wide: true },
  { key: 'worker', label: 'Worker', sort: 'worker' },
  { key: 'gpu', label: 'GPU', wide: true },
  { key: 'started', label: 'Started', sort: 'started_at', wide: true },
  { key: 'duration', label: 'Duration', sort: 'duration', num: true },
  { key: 'best', label: 'Best metric', num: true },
  { key: 'actions', label: '' },
];

function readQuery(query) {
  const size = PAGE_SIZES.includes(Number(query.size)) ? Number(query.size) : 50;
  return {
    status: STATUSES.includes(query.status) ? query.status : '',
    sweep: query.sweep || '',
    worker: query.worker || '',
    owner: query.owner || '',
    sort: query.sort && COLUMNS.some((column) => column.sort === query.sort) ? query.sort : 'id',
    order: query.order === 'asc' ? 'asc' : query.order === 'desc' ? 'desc' : '',
    page: Math.max(1, Number.parseInt(query.page, 10) || 1),
    size,
  };
}

/** Newest jobs first by default; other columns ascending unless asked. */
function orderOf(state) {
  return state.order || (state.sort === 'id' ? 'desc' : 'asc');
}

export function mount(root, route) {
  let state = readQuery(route.query);
  const selected = new Set();
  let data = { overview: null, sweeps: [], workers: [], page: null, error: null, jobsError: null };
  let controller = null;
  let showAllSweeps = false;

  const countsBox = h('div.counts');
  const sweepsBox = h('section.panel.sweeps');
  const filterBox = h('div.toolbar');
  const selectionBox = h('div.toolbar.selection');
  const tableBox = h('div.table-wrap');
  const pagerBox = h('div.pager');
  const errorBox = h('div');
  fill(root,
    h('div.page-head', {}, h('div.grow', {}, h('h1', {}, 'Queue'), h('div.sub', {}, 'Every job of every sweep; updates live.'))),
    errorBox, countsBox, sweepsBox,
    h('section.panel.jobs', {}, h('h2', {}, 'Jobs'), filterBox, selectionBox, tableBox, pagerBox));
  document.title = 'Queue · app';

  async function load() {
    controller?.abort();
    controller = new AbortController();
    const { signal } = controller;
    const jobsQuery = {
      status: state.status,
      sweep: state.sweep,
      worker: state.worker,
      owner: state.owner,
      sort: state.sort,
      order: orderOf(state),
      limit: state.size,
      offset: (state.page - 1) * state.size,
    };
    const [overview, sweeps, workers, page] = await Promise.allSettled([
      get('/api/overview', {}, { signal }),
      get('/api/sweeps', {}, { signal }),
      get('/api/workers', {}, { signal }),
      get('/api/jobs', jobsQuery, { signal }),
    ]);
    if (signal.aborted) return;
    data = {
      overview: overview.status === 'fulfilled' ? overview.value : null,
      sweeps: sweeps.status === 'fulfilled' ? sweeps.value : data.sweeps,
      workers: workers.status === 'fulfilled' ? workers.value : data.workers,
      page: page.status === 'fulfilled' ? page.value : null,
      jobsError: page.status === 'rejected' ? page.reason : null,
      error: sweeps.status === 'rejected' ? sweeps.reason : null,
    };
    render();
  }

  const loader = refresher(load, 250);

  function render() {
    fill(errorBox, data.error ? message(`Cannot load the queue: ${data.error.message}`, 'error') : null);
    renderCounts();
    renderSweeps();
    renderFilters();
    renderTable();
  }

  function renderCounts() {
    const counts = data.overview?.counts;
    const cards = STATUSES.map((status) => h('button.count-card', {
      type: 'button',
      class: `status-${status}${state.status === status ? ' active' : ''}`,
      title: state.status === status ? 'show every status' : `show only ${status} jobs`,
      dataset: { count: status },
      onclick: () => change({ status: state.status === status ? '' : status, page: 1 }),
    }, h('span.n', {}, counts ? count(counts[status]) : '—'), h('span.what', {}, status)));
    const workers = data.overview?.workers;
    if (workers) {
      cards.push(h('a.count-card', { href: links.workers(), title: 'workers: healthy / stale / lost / left' },
        h('span.n', {}, count(workers.healthy)),
        h('span.what', {}, `healthy worker${workers.healthy === 1 ? '' : 's'}${workers.stale ? `, ${workers.stale} stale` : ''}${workers.lost ? `, ${workers.lost} lost` : ''}${workers.left ? `, ${workers.left} left` : ''}`)));
    }
    fill(countsBox, cards);
  }

  function renderSweeps() {
    // The owner filter keeps one user's sweeps here too; the list is fetched whole, so the
    // filter's choices stay every owner.
    const owned = state.owner ? data.sweeps.filter((sweep) => sweep.owner === state.owner) : data.sweeps;
    const sweeps = showAllSweeps ? owned : owned.slice(0, SWEEPS_SHOWN);
    const rows = sweeps.map((sweep) => h('tr', { dataset: { sweep: sweep.name, owner: sweep.owner } },
      h('td', {}, h('a', { href: links.sweep(sweep.name) }, sweep.name),
        sweep.paused ? h('span.badge.status-failed', { title: sweep.paused.reason, dataset: { paused: '' } }, 'paused') : null),
      h('td.col-owner', {}, h('a', { href: links.queue({ owner: sweep.owner }), title: `only ${sweep.owner}'s sweeps and jobs` }, sweep.owner)),
      h('td', {}, progressBar(sweep.counts)),
      h('td.num', {}, `${count(sweep.counts.succeeded + sweep.counts.failed + sweep.counts.cancelled)} / ${count(total(sweep.counts))}`),
      h('td', {}, sweep.metric ? `${sweep.metric.name} (${sweep.metric.goal === 'maximize' ? 'max' : 'min'})` : h('span.muted', {}, '—')),
      h('td', {}, timeAgo(sweep.created_at)),
      h('td', {}, h('button.small', { type: 'button', onclick: () => change({ sweep: sweep.name, page: 1 }) }, 'jobs'))));
    const more = owned.length > SWEEPS_SHOWN
      ? h('button.small', { type: 'button', onclick: () => { showAllSweeps = !showAllSweeps; renderSweeps(); } },
        showAllSweeps ? 'show fewer' : `show all ${owned.length}`)
      : null;
    let empty = null;
    if (data.sweeps.length === 0) empty = 'No sweeps yet. Submit one on the Submit page or with `app submit sweep.yaml`.';
    else if (owned.length === 0) empty = `No sweeps of ${state.owner}.`;
    fill(sweepsBox,
      h('h2', {}, 'Sweeps', more),
      empty
        ? message(empty)
        : h('div.table-wrap.short', {}, h('table', {},
          h('thead', {}, h('tr', {}, ['Sweep', 'Owner', 'Progress', 'Done', 'Metric', 'Created', ''].map((label) => h('th', {}, label)))),
          h('tbody', {}, rows))));
  }

  function renderFilters() {
    const sweepNames = data.sweeps.map((sweep) => sweep.name);
    if (state.sweep && !sweepNames.includes(state.sweep)) sweepNames.unshift(state.sweep);
    const workerNames = data.workers.map((worker) => worker.name);
    if (state.worker && !workerNames.includes(state.worker)) workerNames.unshift(state.worker);
    const owners = [...new Set(data.sweeps.map((sweep) => sweep.owner))].sort();
    if (state.owner && !owners.includes(state.owner)) owners.unshift(state.owner);
    const select = (name, label, values, value) => h('label', {}, `${label} `,
      h('select', { name, onchange: (event) => change({ [name]: event.target.value, page: 1 }) },
        h('option', { value: '' }, 'all'),
        values.map((item) => h('option', { value: item, selected: item === value }, item))));
    fill(filterBox,
      select('status', 'Status', STATUSES, state.status),
      select('sweep', 'Sweep', sweepNames, state.sweep),
      select('worker', 'Worker', workerNames, state.worker),
      select('owner', 'Owner', owners, state.owner),
      (state.status || state.sweep || state.worker || state.owner)
        ? h('button.small', { type: 'button', onclick: () => change({ status: '', sweep: '', worker: '', owner: '', page: 1 }) }, 'clear filters')
        : null,
      h('span.spacer'),
      h('label', {}, 'Per page ', h('select', { name: 'size', onchange: (event) => change({ size: event.target.value, page: 1 }) },
        PAGE_SIZES.map((size) => h('option', { value: size, selected: size === state.size }, String(size))))));
  }

  function metricOf(sweepName) {
    return data.sweeps.find((sweep) => sweep.name === sweepName)?.metric ?? null;
  }

  function bestMetric(job) {
    const metrics = job.metrics || {};
    const metric = metricOf(job.sweep);
    if (metric && metrics[metric.name]) {
      const summary = metrics[metric.name];
      const value = metric.goal === 'maximize' ? summary.max : summary.min;
      return h('span', { title: `${metric.name}, best (${metric.goal}) of ${summary.count} values; last ${number(summary.last)}` }, number(value));
    }
    const [name, summary] = Object.entries(metrics)[0] || [];
    if (!name) return h('span.muted', {}, '—');
    return h('span', { title: `${name}, last value` }, `${name} ${number(summary.last)}`);
  }

  // A queued job holds no worker or GPU, whatever its last attempt held: only a running or
  // finished job's placement is shown, and only a running job's duration counts.
  function placed(job) {
    return job.status !== 'queued';
  }

  function workerText(job) {
    if (placed(job) && job.worker) return job.worker;
    if (job.status === 'queued' && job.attempt > 0) {
      return h('span.muted', { title: reasonText(job.reason) || 'back in the queue', dataset: { requeued: '' } }, 'requeued');
    }
    return h('span.muted', {}, '—');
  }

  function gpuText(job) {
    if (!placed(job) || !Array.isArray(job.gpus)) return h('span.muted', {}, '—');
    if (job.gpus.length === 0) return job.started_at ? h('span.muted', {}, 'CPU') : h('span.muted', {}, '—');
    return job.gpus.join(', ');
  }

  function durationOf(job) {
    if (!placed(job)) return h('span.muted', {}, '—');
    return elapsed(job.started_at, job.status === 'running' ? null : job.finished_at || job.started_at);
  }

  function actions(job) {
    const buttons = [];
    if ((job.status === 'queued' || job.status === 'running') && !job.cancel_requested) {
      buttons.push(h('button.small.danger', { type: 'button', dataset: { action: 'cancel' }, onclick: () => act(job, 'cancel') }, 'Cancel'));
    }
    if (job.cancel_requested && job.status === 'running') buttons.push(h('span.muted', {}, job.stopped_early ? 'stopping early…' : 'cancelling…'));
    if (job.status === 'failed' || job.status === 'cancelled') {
      buttons.push(h('button.small', { type: 'button', dataset: { action: 'retry' }, onclick: () => act(job, 'retry') }, 'Retry'));
    }
    return buttons;
  }

  function priorityCell(job) {
    const changeable = job.status === 'queued' || job.status === 'running';
    return h('td.num.col-priority.wide', {},
      changeable ? h('button.small', { type: 'button', title: 'lower priority', dataset: { action: 'lower' }, onclick: () => setPriority(job, job.priority - 1) }, '−') : null,
      h('span', { style: { display: 'inline-block', minWidth: '2.5em', textAlign: 'center' } }, String(job.priority)),
      changeable ? h('button.small', { type: 'button', title: 'raise priority', dataset: { action: 'raise' }, onclick: () => setPriority(job, job.priority + 1) }, '+') : null);
  }

  function renderTable() {
    const page = data.page;
    const head = h('tr', {},
      h('th', {}, h('input', {
        type: 'checkbox', title: 'select every cancellable job on this page', 'aria-label': 'select all',
        checked: Boolean(page && page.jobs.length && cancellable(page.jobs).every((job) => selected.has(job.id)) && cancellable(page.jobs).length),
        onchange: (event) => {
          for (const job of cancellable(page?.jobs || [])) {
            if (event.target.checked) selected.add(job.id);
            else selected.delete(job.id);
          }
          renderTable();
        },
      })),
      COLUMNS.map((column) => {
        const classes = [column.num ? 'num' : '', `col-${column.key}`, column.wide ? 'wide' : ''].filter(Boolean).join(' ');
        if (!column.sort) return h('th', { class: classes }, column.label);
        const active = state.sort === column.sort;
        const order = orderOf(state);
        return h('th.sortable', {
          class: classes,
          title: `sort by ${column.label.toLowerCase()}`,
          'aria-sort': active ? (order === 'asc' ? 'ascending' : 'descending') : 'none',
          onclick: () => change({ sort: column.sort, order: active && order === 'asc' ? 'desc' : active ? 'asc' : column.sort === 'id' ? 'desc' : 'asc', page: 1 }),
        }, column.label, active ? h('span.arrow', {}, order === 'asc' ? '▲' : '▼') : null);
      }));
    let body;
    if (data.jobsError) {
      body = [h('tr.empty-row', {}, h('td', { colSpan: COLUMNS.length + 1 }, `Cannot load jobs: ${data.jobsError.message}`))];
    } else if (!page) {
      body = [h('tr.empty-row', {}, h('td', { colSpan: COLUMNS.length + 1 }, 'Loading…'))];
    } else if (page.jobs.length === 0) {
      body = [h('tr.empty-row', {}, h('td', { colSpan: COLUMNS.length + 1 }, page.total ? 'No jobs on this page.' : 'No jobs match.'))];
    } else {
      body = page.jobs.map((job) => h('tr', {
        class: selected.has(job.id) ? 'selected' : '',
        dataset: { jobId: String(job.id), status: job.status, sweep: job.sweep },
      },
      h('td', {}, cancellable([job]).length
        ? h('input', {
          type: 'checkbox', checked: selected.has(job.id), 'aria-label': `select job ${job.id}`,
          onchange: (event) => {
            if (event.target.checked) selected.add(job.id);
            else selected.delete(job.id);
            renderSelection();
            event.target.closest('tr').classList.toggle('selected', event.target.checked);
          },
        })
        : null),
      h('td.num.col-id', {}, h('a', { href: links.job(job.id) }, String(job.id))),
      h('td.col-status', {}, runBadge(job)),
      h('td.col-sweep', {}, h('a', { href: links.sweep(job.sweep) }, job.sweep), h('span.muted', {}, ` #${job.index}`)),
      h('td.params.col-params.wide', { title: exactLine(job.params) }, paramsLine(job.params)),
      priorityCell(job),
      h('td.col-worker', {}, workerText(job)),
      h('td.col-gpu.wide', {}, gpuText(job)),
      h('td.col-started.wide', {}, placed(job) ? timeAgo(job.started_at) : h('span.muted', {}, '—')),
      h('td.num.col-duration', {}, durationOf(job)),
      h('td.num.col-best', {}, bestMetric(job)),
      h('td.col-actions', {}, h('div.actions', {}, actions(job)))));
    }
    fill(tableBox, h('table.jobs-table', {}, h('thead', {}, head), h('tbody', {}, body)));
    renderSelection();
    renderPager();
  }

  function renderSelection() {
    // Keep only what is still cancellable on this page; a job that finished drops out.
    const onPage = new Map((data.page?.jobs || []).map((job) => [job.id, job]));
    for (const id of [...selected]) {
      const job = onPage.get(id);
      if (job && !cancellable([job]).length) selected.delete(id);
    }
    fill(selectionBox, selected.size
      ? [h('span', {}, `${selected.size} selected`),
        h('button.small.danger', { type: 'button', dataset: { action: 'cancel-selected' }, onclick: cancelSelected }, `Cancel ${selected.size} selected`),
        h('button.small', { type: 'button', onclick: () => { selected.clear(); renderTable(); } }, 'clear selection')]
      : null);
  }

  function renderPager() {
    const page = data.page;
    if (!page) {
      fill(pagerBox);
      return;
    }
    const pages = Math.max(1, Math.ceil(page.total / state.size));
    const first = page.total ? (state.page - 1) * state.size + 1 : 0;
    const last = Math.min(page.total, state.page * state.size);
    fill(pagerBox,
      h('button.small', { type: 'button', disabled: state.page <= 1, onclick: () => change({ page: 1 }) }, '« first'),
      h('button.small', { type: 'button', disabled: state.page <= 1, onclick: () => change({ page: state.page - 1 }) }, '‹ previous'),
      h('span', {}, `${count(first)}–${count(last)} of ${count(page.total)} · page ${count(state.page)} of ${count(pages)}`),
      h('button.small', { type: 'button', disabled: state.page >= pages, onclick: () => change({ page: state.page + 1 }) }, 'next ›'),
      h('button.small', { type: 'button', disabled: state.page >= pages, onclick: () => change({ page: pages }) }, 'last »'));
  }

  function change(patch) {
    const next = { ...state, ...patch };
    setQuery({
      status: next.status,
      sweep: next.sweep,
      worker: next.worker,
      owner: next.owner,
      sort: next.sort === 'id' ? '' : next.sort,
      order: next.order,
      page: next.page > 1 ? next.page : '',
      size: next.size === 50 ? '' : next.size,
    });
  }

  async function act(job, action) {
    try {
      await post(`/api/jobs/${job.id}/${action}`);
      toast(action === 'cancel' ? `Job ${job.id}: cancel sent` : `Job ${job.id} is queued again`);
    } catch (error) {
      toast(`Job ${job.id}: ${error.message}`, 'error');
    }
    loader.now();
  }

  async function setPriority(job, priority) {
    try {
      await post(`/api/jobs/${job.id}/priority`, { priority });
    } catch (error) {
      toast(`Job ${job.id}: ${error.message}`, 'error');
    }
    loader.now();
  }

  async function cancelSelected() {
    const ids = [...selected];
    try {
      const result = await post('/api/jobs/cancel', { ids });
      const skipped = result.skipped?.length ? `, ${result.skipped.length} skipped (already finished)` : '';
      toast(`Cancelled ${result.cancelled}, cancel requested for ${result.cancel_requested} running${skipped}`);
      selected.clear();
    } catch (error) {
      toast(`Cancel failed: ${error.message}`, 'error');
    }
    loader.now();
  }

  loader.now();
  return {
    refresh: () => loader.schedule(),
    update(query) {
      state = readQuery(query);
      selected.clear();
      data.page = null;
      renderFilters();
      renderCounts();
      loader.now();
    },
    destroy() {
      loader.stop();
      controller?.abort();
    },
  };
}

function cancellable(jobs) {
  return jobs.filter((job) => (job.status === 'queued' || job.status === 'running') && !job.cancel_requested);
}

function total(counts) {
  return STATUSES.reduce((sum, status) => sum + (counts?.[status] ?? 0), 0);
}
