// The `k6/http` module: synchronous requests for the script, carried out by the main thread.
//
// A request is checked and prepared here (unknown params are refused), sent to the main thread
// over the VU's channel, and this thread blocks until the answer is back, exactly as a k6 VU
// blocks in `http.post`. `http.batch` sends all its requests in one message; the main thread runs
// them in parallel within k6's `batch` / `batchPerHost` limits.

import { runtime, requireStage, strict, NotImplemented } from '../runtime.js';
import { parseDuration } from '../duration.js';

/** k6's default request timeout. */
const DEFAULT_TIMEOUT_MS = 60_000;
/** The request params the shim implements; any other is refused. */
const PARAMS = new Set(['headers', 'tags', 'timeout', 'responseCallback']);

/** What `http.expectedStatuses()` returns: the statuses that do not count as failed requests. */
class ExpectedStatuses {
  constructor(statuses, ranges) {
    this.statuses = statuses;
    this.ranges = ranges;
  }
}

/** Statuses (numbers, or `{min, max}` ranges) that make a response "expected" (not failed). */
export function expectedStatuses(...specs) {
  const statuses = [];
  const ranges = [];
  for (const spec of specs) {
    if (Number.isInteger(spec)) statuses.push(spec);
    else if (spec && Number.isInteger(spec.min) && Number.isInteger(spec.max)) ranges.push({ min: spec.min, max: spec.max });
    else throw new TypeError(`expectedStatuses: ${JSON.stringify(spec)} is neither a status nor a {min, max} range`);
  }
  return new ExpectedStatuses(statuses, ranges);
}

/** The rule as sent to the main thread; `null` turns `http_req_failed` off, as in k6. */
function callbackRule(callback) {
  if (callback === null) return null;
  if (callback instanceof ExpectedStatuses) return { statuses: callback.statuses, ranges: callback.ranges };
  throw new NotImplemented('a response callback other than http.expectedStatuses(…) (k6 does not allow one either)');
}

/** Sets the VU's default expected-status rule. */
export function setResponseCallback(callback) {
  runtime.responseCallback = callbackRule(callback);
}

/** Checks one request and turns it into the plain object the main thread executes. */
function prepare(method, url, body, params) {
  if (typeof method !== 'string' || method === '') throw new TypeError(`http: bad method ${JSON.stringify(method)}`);
  if (typeof url !== 'string') throw new NotImplemented(`a request URL that is not a string (${typeof url})`);
  params ??= {};
  if (typeof params !== 'object') throw new TypeError('http: params must be an object');
  for (const key of Object.keys(params)) {
    if (!PARAMS.has(key)) throw new NotImplemented(`the request param "${key}"`);
  }
  let payload = null;
  if (body !== undefined && body !== null) {
    if (typeof body !== 'string') throw new NotImplemented('a request body that is not a string (k6 would form-encode an object)');
    payload = body;
  }
  const headers = {};
  for (const [name, value] of Object.entries(params.headers ?? {})) headers[name] = String(value);
  const tags = {};
  for (const [name, value] of Object.entries(params.tags ?? {})) tags[name] = String(value);
  return {
    method: method.toUpperCase(),
    url,
    body: payload,
    headers,
    tags,
    timeoutMs: params.timeout === undefined ? DEFAULT_TIMEOUT_MS : parseDuration(params.timeout, 'request timeout'),
    expected: params.responseCallback === undefined ? runtime.responseCallback : callbackRule(params.responseCallback),
  };
}

/** `Retry-After` → `Retry-After`, `idempotent-replayed` → `Idempotent-Replayed` (Go's canonical form, as k6 shows them). */
function canonical(name) {
  return name.toLowerCase().replace(/(^|-)([a-z])/g, (_, dash, letter) => dash + letter.toUpperCase());
}

/** The response object a script sees. */
class Response {
  constructor(answer, request) {
    this.status = answer.status;
    this.status_text = answer.statusText;
    this.proto = answer.status ? 'HTTP/1.1' : '';
    this.url = request.url;
    this.body = answer.body;
    this.headers = Object.fromEntries(Object.entries(answer.headers).map(([name, value]) => [canonical(name), value]));
    this.timings = answer.timings;
    this.error = answer.error;
    this.error_code = answer.errorCode;
    this.remote_ip = answer.remoteIp;
    this.remote_port = answer.remotePort;
    this.request = { method: request.method, url: request.url, headers: request.headers, body: request.body ?? '' };
  }

  /** The body parsed as JSON (a GJSON selector is not implemented). */
  json(selector) {
    if (selector !== undefined) throw new NotImplemented('Response.json(selector)');
    if (this.body === null || this.body === undefined) throw new Error(`the response of ${this.url} has no body to parse as JSON`);
    return JSON.parse(this.body);
  }
}

/** Sends prepared requests and returns their responses, in order. */
function send(requests, batch) {
  requireStage('an HTTP request', 'setup', 'vu', 'teardown');
  const { responses } = runtime.channel.call({ type: 'http', requests, batch, tags: { ...runtime.tags, group: runtime.group } });
  return responses.map((answer, i) => strict(new Response(answer, requests[i]), 'Response'));
}

/** `http.request(method, url, body, params)`. */
export function request(method, url, body, params) {
  return send([prepare(method, url, body, params)], false)[0];
}

export const get = (url, params) => request('GET', url, null, params);
export const head = (url, params) => request('HEAD', url, null, params);
export const post = (url, body, params) => request('POST', url, body, params);
export const put = (url, body, params) => request('PUT', url, body, params);
export const patch = (url, body, params) => request('PATCH', url, body, params);
export const del = (url, body, params) => request('DELETE', url, body, params);
export const options = (url, body, params) => request('OPTIONS', url, body, params);

/** One element of `http.batch`: a URL (GET), `[method, url, body, params]` or `{method, url, body, params}`. */
function batchItem(item) {
  if (typeof item === 'string') return prepare('GET', item, null, {});
  if (Array.isArray(item)) return prepare(item[0], item[1], item[2], item[3]);
  if (item && typeof item === 'object') {
    for (const key of Object.keys(item)) {
      if (!['method', 'url', 'body', 'params'].includes(key)) throw new NotImplemented(`the batch request field "${key}"`);
    }
    return prepare(item.method ?? 'GET', item.url, item.body, item.params);
  }
  throw new TypeError(`http.batch: cannot read request ${JSON.stringify(item)}`);
}

/** `http.batch(requests)`: an array (answers an array) or an object of named requests (answers an object). */
export function batch(requests) {
  if (Array.isArray(requests)) return send(requests.map(batchItem), true);
  if (requests && typeof requests === 'object') {
    const names = Object.keys(requests);
    const responses = send(names.map((name) => batchItem(requests[name])), true);
    return Object.fromEntries(names.map((name, i) => [name, responses[i]]));
  }
  throw new TypeError('http.batch: expected an array or an object of requests');
}

export default strict(
  { request, get, head, post, put, patch, del, options, batch, expectedStatuses, setResponseCallback },
  'k6/http',
);
