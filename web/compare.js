// The sweep page's comparison of 2-6 runs ticked on the leaderboard: their parameters side by
// side, those that differ first, and each metric's value in each run. Their curves are overlaid
// in the curves panel.

import { h, fill, badge, number } from './dom.js';
import { flatParams, paramFormatter, exactText } from './params.js';
import { bestOf, arrow } from './leaderboard.js';
import { links } from './nav.js';

export function comparePanel({ onClear }) {
  const element = h('section.panel.compare', { hidden: true });

  function render(rows, directions) {
    if (rows.length < 2) {
      element.hidden = true;
      fill(element);
      return;
    }
    element.hidden = false;
    const flat = rows.map((row) => flatParams(row.params));
    const names = [];
    for (const params of flat) for (const name of Object.keys(params)) if (!names.includes(name)) names.push(name);
    const differs = (name) => new Set(flat.map((params) => exactText(params[name]))).size > 1;
    const different = names.filter(differs);
    const same = names.filter((name) => !differs(name));
    const paramRow = (name) => {
      const format = paramFormatter(flat.map((params) => params[name]));
      return h('tr', { dataset: { param: name } }, h('th', {}, name),
        flat.map((params) => {
          const { text, exact } = name in params ? format(params[name]) : { text: '—', exact: null };
          return h('td.mono', { title: exact ?? undefined }, text);
        }));
    };
    const metricRow = (direction) => h('tr', { dataset: { metric: direction.name } },
      h('th', {}, `${direction.name} ${direction.goal ? `best ${arrow(direction.goal)}` : 'last'}`),
      rows.map((row) => {
        const summary = row.metrics?.[direction.name];
        const value = direction.goal ? bestOf(summary, direction.goal) : summary?.last;
        return h('td.num', { title: summary ? `last ${number(summary.last)} · min ${number(summary.min)} · max ${number(summary.max)}` : undefined }, number(value ?? null));
      }));
    fill(element,
      h('h2', {}, `Comparing ${rows.length} runs`, h('button.small', { type: 'button', onclick: onClear }, 'clear')),
      h('div.table-wrap.short', {}, h('table.compare-table', {},
        h('thead', {}, h('tr', {}, h('th', {}, ''), rows.map((row) => h('th', {},
          h('a', { href: links.job(row.job_id) }, `job ${row.job_id}`), ' ', badge(row.status))))),
        h('tbody', {},
          different.length ? h('tr.section', {}, h('th', { colSpan: rows.length + 1 }, 'Parameters that differ')) : null,
          different.map(paramRow),
          directions.length ? h('tr.section', {}, h('th', { colSpan: rows.length + 1 }, 'Metrics')) : null,
          directions.map(metricRow)))),
      same.length
        ? h('p.muted.same-params', {}, `The same in all: ${same.map((name) => `${name}=${paramFormatter([flat[0][name]])(flat[0][name]).text}`).join('  ')}`)
        : null);
  }

  return { element, render };
}
