// Every request of the page goes through here. Error answers ({"error": "..."}) become thrown
// ApiErrors with the status; a 401 opens the sign-in dialog and the request is sent again.

import { signIn } from './auth.js';

/** Headers sent with every API request. */
export const requestHeaders = {};

export class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
  }

  get notFound() {
    return this.status === 404;
  }
}

/** `path` with its query: `url('/api/jobs', {status: 'queued'})`; empty values are left out. */
export function url(path, query = {}) {
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(query)) {
    if (value !== undefined && value !== null && value !== '') params.set(key, String(value));
  }
  const text = params.toString();
  return text ? `${path}?${text}` : path;
}

/** One path segment (a sweep name, a file path's part) made safe for a URL. */
export const segment = encodeURIComponent;

/**
 * Fetches `path` and answers its JSON. `options.json` is sent as a JSON body, `options.body`
 * as is (text); `options.signal` aborts it.
 */
export async function api(path, options = {}) {
  try {
    return await request(path, options);
  } catch (error) {
    if (!(error instanceof ApiError) || error.status !== 401) throw error;
    await signIn();
    return request(path, options);
  }
}

async function request(path, options) {
  const headers = { Accept: 'application/json', ...requestHeaders };
  let body = options.body;
  if (options.json !== undefined) {
    body = JSON.stringify(options.json);
    headers['Content-Type'] = 'application/json';
  } else if (body !== undefined) {
    headers['Content-Type'] = 'text/plain; charset=utf-8';
  }
  const method = options.method || (body === undefined ? 'GET' : 'POST');
  let response;
  try {
    response = await fetch(path, { method, headers, body, signal: options.signal });
  } catch (error) {
    if (error.name === 'AbortError') throw error;
    throw new ApiError(`cannot reach the server (${error.message})`, 0);
  }
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!response.ok) {
    const message = data && typeof data.error === 'string' ? data.error : `${response.status} ${response.statusText}`;
    throw new ApiError(message, response.status);
  }
  return data;
}

export const get = (path, query, options = {}) => api(url(path, query), options);
export const post = (path, json, options = {}) => api(path, { ...options, method: 'POST', json });
