// The URL fragment is the page's state: `#/path?key=value`. Views read their query from it and
// change it with `setQuery`, so a reload or a shared link shows the same filters and page.

/** The fragment as `{path, query}`: `#/?status=queued` → `{path: '/', query: {status: 'queued'}}`. */
export function parseHash(hash = location.hash) {
  const raw = hash.replace(/^#/, '') || '/';
  const at = raw.indexOf('?');
  const path = at < 0 ? raw : raw.slice(0, at);
  const query = Object.fromEntries(new URLSearchParams(at < 0 ? '' : raw.slice(at + 1)));
  return { path: path.startsWith('/') ? path : `/${path}`, query };
}

/** Replaces the fragment's query of the current path (no new history entry). */
export function setQuery(query) {
  const { path } = parseHash();
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(query)) {
    if (value !== undefined && value !== null && value !== '') params.set(key, String(value));
  }
  const text = params.toString();
  const hash = `#${path}${text ? `?${text}` : ''}`;
  if (hash !== location.hash) location.replace(hash);
}

/** Links inside the page. */
export const links = {
  queue: (query = {}) => {
    const text = new URLSearchParams(Object.entries(query).filter(([, v]) => v !== undefined && v !== '')).toString();
    return `#/${text ? `?${text}` : ''}`;
  },
  sweep: (name) => `#/sweeps/${encodeURIComponent(name)}`,
  job: (id) => `#/jobs/${id}`,
  workers: () => '#/workers',
};
