// The submit page (#/submit): paste or upload a sweep YAML, check it with a dry run (form,
// job count, the first parameter sets, or the error with its line and column), then submit.
// Submit is enabled only for the exact text that passed the dry run.

import { api, url } from './api.js';
import { h, fill, message, count } from './dom.js';
import { paramsLine, exactLine } from './params.js';
import { links } from './nav.js';

const EXAMPLE = `name: my-sweep
command: python train.py --lr {lr} --batch_size {batch_size}
resources: {gpus: 1}
metric: {name: val_loss, goal: minimize}
grid:
  lr: [0.001, 0.0005]
  batch_size: [64, 128]
`;

/** What the page keeps between visits (the text being edited). */
const draft = { text: '', name: '', command: '' };

export function mount(root) {
  document.title = 'Submit · app';
  let checked = null; // the {text, name, command} that the last successful dry run checked
  let busy = false;

  const textarea = h('textarea', {
    name: 'yaml', rows: 18, spellcheck: 'false', placeholder: EXAMPLE, 'aria-label': 'sweep YAML',
    oninput: () => {
      draft.text = textarea.value;
      update();
    },
  });
  textarea.value = draft.text;
  const file = h('input', { type: 'file', accept: '.yaml,.yml,text/yaml,text/plain', 'aria-label': 'upload a sweep file', onchange: upload });
  const name = h('input', { name: 'name', placeholder: 'from the file', size: 18, value: draft.name, oninput: () => { draft.name = name.value; update(); } });
  const command = h('input', { name: 'command', placeholder: 'python main.py --config {config}', size: 36, value: draft.command, oninput: () => { draft.command = command.value; update(); } });
  const dryRunButton = h('button', { type: 'button', dataset: { action: 'dry-run' }, onclick: dryRun }, 'Dry run');
  const submitButton = h('button.primary', { type: 'button', dataset: { action: 'submit' }, disabled: true, onclick: submit }, 'Submit');
  const hint = h('span.muted');
  const result = h('div.result');

  fill(root,
    h('div.page-head', {}, h('div.grow', {}, h('h1', {}, 'Submit a sweep'),
      h('div.sub', {}, 'Native (grid + command), W&B sweep or CVLab-Kit config; the form is detected. A dry run stores nothing.'))),
    h('section.panel', {}, h('div.submit-form', {},
      h('div.row', {}, h('label', {}, 'Upload ', file), h('span.muted', {}, 'or paste the YAML below')),
      textarea,
      h('div.row', {},
        h('label', {}, 'Name if the file has none ', name),
        h('label', {}, 'Command (CVLab-Kit configs) ', command)),
      h('div.row', {}, dryRunButton, submitButton, hint))),
    result);

  function current() {
    return { text: textarea.value, name: name.value.trim(), command: command.value.trim() };
  }

  function same(a, b) {
    return a && b && a.text === b.text && a.name === b.name && a.command === b.command;
  }

  function update() {
    const ready = same(checked, current());
    submitButton.disabled = busy || !ready;
    dryRunButton.disabled = busy || !textarea.value.trim();
    hint.textContent = !textarea.value.trim() ? '' : ready ? 'checked; ready to submit' : 'run a dry run to check it first';
  }

  function query(input, dry) {
    return url('/api/sweeps', { dry_run: dry ? 'true' : '', name: input.name, command: input.command });
  }

  async function dryRun() {
    const input = current();
    busy = true;
    update();
    try {
      const answer = await api(query(input, true), { method: 'POST', body: input.text });
      checked = input;
      showPreview(answer);
    } catch (error) {
      checked = null;
      fill(result, h('section.panel.dry-run-error', {}, h('h2', {}, 'The sweep has a mistake'), message(error.message, 'error'),
        h('p.muted', {}, 'Nothing was submitted.')));
    } finally {
      busy = false;
      update();
    }
  }

  async function submit() {
    const input = current();
    if (!same(checked, input)) return;
    busy = true;
    update();
    try {
      const answer = await api(query(input, false), { method: 'POST', body: input.text });
      draft.text = '';
      draft.name = '';
      draft.command = '';
      checked = null;
      fill(result, h('section.panel.submitted', {}, h('h2', {}, 'Submitted'),
        h('p', {}, `Sweep `, h('a', { href: links.sweep(answer.name) }, answer.name),
          answer.search?.adaptive ? ` is queued: ${answer.search.adaptive}.` : ` with ${count(answer.count)} jobs is queued.`)));
      location.hash = links.sweep(answer.name);
    } catch (error) {
      fill(result, h('section.panel.dry-run-error', {}, h('h2', {}, 'Not submitted'), message(error.message, 'error')));
    } finally {
      busy = false;
      if (textarea.isConnected) update();
    }
  }

  function showPreview(answer) {
    const jobs = answer.preview || [];
    // An adaptive sweep has no jobs up front: it says how many runs it will make instead.
    const adaptive = answer.search?.adaptive;
    fill(result, h('section.panel.preview', {},
      h('h2', {}, 'Dry run'),
      h('div.summary-line', {}, h('strong', { dataset: { adaptive: adaptive ? 'true' : 'false' } }, adaptive || `${count(answer.count)} job${answer.count === 1 ? '' : 's'}`),
        ` · ${answer.form} form · sweep name `, h('strong', {}, answer.name)),
      answer.search?.early_stop ? h('p.early-stop', {}, answer.search.early_stop) : null,
      adaptive && jobs.length ? h('p.muted', {}, 'The first runs, drawn before any result is in:') : null,
      jobs.length
        ? h('div.table-wrap.short', {}, h('table.preview-table', {},
          h('thead', {}, h('tr', {}, h('th.num', {}, 'Index'), h('th', {}, 'Parameters'), h('th', {}, 'Command'))),
          h('tbody', {}, jobs.map((job) => h('tr', {},
            h('td.num', {}, String(job.index)),
            // One line per job: the full parameters and command are on hover.
            h('td.params', { title: exactLine(job.params) }, paramsLine(job.params)),
            h('td.mono.command-cell', { title: job.command }, job.command))))))
        : null,
      !adaptive && answer.count > jobs.length ? h('p.muted', {}, `The first ${jobs.length} of ${count(answer.count)} shown.`) : null));
  }

  async function upload() {
    const chosen = file.files?.[0];
    if (!chosen) return;
    textarea.value = await chosen.text();
    draft.text = textarea.value;
    if (!name.value.trim()) {
      // The file's stem names a sweep whose file has no `name:` (`app submit` puts its project
      // first, `myproj/sweep`; a page is not told which directory a chosen file is in).
      name.value = chosen.name.replace(/\.(ya?ml)$/i, '');
      draft.name = name.value;
    }
    dryRun();
  }

  update();
  return { destroy() {} };
}
