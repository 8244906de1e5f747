// The main thread's HTTP client: carries out the requests of every VU concurrently (node:http,
// keep-alive connections) and records the `http_req_*` metrics of each.
//
// Timings follow k6's definitions: `http_req_duration` runs from the moment the request can be
// written on a connected socket to the last byte of the body, so it excludes waiting for a
// connection (`http_req_blocked`) and connecting (`http_req_connecting`), which are recorded
// apart. A request that times out gets status 0, error code 1050, and is a failed request.

import http from 'node:http';
import { performance } from 'node:perf_hooks';

import { NotImplemented } from './runtime.js';

/** k6's error codes for the failures a local run meets. */
const ERROR_CODES = { timeout: 1050, ECONNREFUSED: 1212, ECONNRESET: 1220, EPIPE: 1220, ENOTFOUND: 1101, EINVAL: 1020 };

class RequestTimeout extends Error {
  constructor(ms) {
    super(`request timeout after ${ms}ms`);
    this.code = 'timeout';
  }
}

/** Whether `status` is expected under `rule` (null rule: no verdict). */
function isExpected(rule, status) {
  return rule.statuses.includes(status) || rule.ranges.some((r) => status >= r.min && status <= r.max);
}

export class Transport {
  /**
   * @param registry where the http_req_* samples go
   * @param limits k6's `batch` (parallel requests of one http.batch) and `batchPerHost`; 0 = no limit
   */
  constructor(registry, { batch = 10, batchPerHost = 6 } = {}) {
    this.registry = registry;
    this.batchLimit = batch || Infinity;
    this.perHostLimit = batchPerHost || Infinity;
    this.agent = new http.Agent({ keepAlive: true, maxSockets: Infinity });
  }

  /** Runs one VU message's requests (in parallel for a batch) and answers them in order. */
  async execute(requests, batch, tags) {
    for (const request of requests) {
      const { protocol } = new URL(request.url); // throws on a malformed URL
      if (protocol !== 'http:') throw new NotImplemented(`a ${protocol} URL (the shim speaks plain http)`);
    }
    if (!batch) return [await this.send(requests[0], tags)];
    return this.limited(requests, tags);
  }

  /** A batch, at most `batch` requests at once and `batchPerHost` per host. */
  limited(requests, tags) {
    return new Promise((resolve, reject) => {
      const results = new Array(requests.length);
      const queue = requests.map((request, index) => ({ request, index, host: new URL(request.url).host }));
      const perHost = new Map();
      let running = 0;
      let finished = 0;
      const pump = () => {
        for (let i = 0; i < queue.length && running < this.batchLimit; ) {
          const { request, index, host } = queue[i];
          if ((perHost.get(host) ?? 0) >= this.perHostLimit) {
            i += 1;
            continue;
          }
          queue.splice(i, 1);
          running += 1;
          perHost.set(host, (perHost.get(host) ?? 0) + 1);
          this.send(request, tags).then((answer) => {
            results[index] = answer;
            running -= 1;
            perHost.set(host, perHost.get(host) - 1);
            if (++finished === requests.length) resolve(results);
            else pump();
          }, reject);
        }
      };
      if (requests.length === 0) resolve(results);
      else pump();
    });
  }

  /** One request: resolves with the answer the VU turns into a Response, never rejects on HTTP errors. */
  send(request, tags) {
    const url = new URL(request.url);
    const headers = { 'User-Agent': 'payonce-k6-shim', ...request.headers };
    if (request.body !== null && !Object.keys(headers).some((h) => h.toLowerCase() === 'content-length')) {
      headers['Content-Length'] = Buffer.byteLength(request.body);
    }
    return new Promise((resolve) => {
      const t = { start: performance.now(), socket: null, connected: null, headers: null };
      let settled = false;
      const settle = (answer) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        this.record(request, tags, answer);
        resolve(answer);
      };
      const req = http.request({
        agent: this.agent,
        method: request.method,
        hostname: url.hostname,
        port: url.port || 80,
        path: `${url.pathname}${url.search}`,
        headers,
      });
      const timer = setTimeout(() => req.destroy(new RequestTimeout(request.timeoutMs)), request.timeoutMs);
      req.on('socket', (socket) => {
        t.socket = performance.now();
        if (socket.connecting) socket.once('connect', () => (t.connected = performance.now()));
        else t.connected = t.socket;
      });
      req.on('response', (res) => {
        t.headers = performance.now();
        const chunks = [];
        res.on('data', (chunk) => chunks.push(chunk));
        res.on('end', () => {
          const body = Buffer.concat(chunks).toString('utf8');
          const headers = {};
          for (const [name, value] of Object.entries(res.headers)) headers[name] = Array.isArray(value) ? value.join(', ') : value;
          settle({
            status: res.statusCode,
            statusText: `${res.statusCode} ${res.statusMessage}`,
            headers,
            body,
            error: '',
            errorCode: 0,
            remoteIp: res.socket?.remoteAddress ?? '',
            remotePort: res.socket?.remotePort ?? 0,
            timings: timings(t, performance.now()),
          });
        });
        res.on('error', (err) => settle(failure(err, t)));
      });
      req.on('error', (err) => settle(failure(err, t)));
      req.end(request.body ?? undefined);
    });
  }

  /** The http_req_* samples of one finished request. */
  record(request, tags, answer) {
    const expected = request.expected ? isExpected(request.expected, answer.status) : null;
    const sampleTags = {
      ...tags,
      ...request.tags,
      method: request.method,
      url: request.url,
      name: request.tags.name ?? request.url,
      status: String(answer.status),
      proto: answer.status ? 'HTTP/1.1' : '',
    };
    if (expected !== null) sampleTags.expected_response = String(expected);
    if (answer.errorCode) sampleTags.error_code = String(answer.errorCode);
    const add = (metric, value) => this.registry.add(metric, value, sampleTags);
    add('http_reqs', 1);
    add('http_req_duration', answer.timings.duration);
    add('http_req_waiting', answer.timings.waiting);
    add('http_req_blocked', answer.timings.blocked);
    add('http_req_connecting', answer.timings.connecting);
    if (expected !== null) add('http_req_failed', !expected);
  }

  close() {
    this.agent.destroy();
  }
}

/** k6's timings (ms) from the instants of one request. */
function timings(t, end) {
  const sent = t.connected ?? t.socket ?? t.start;
  const headers = t.headers ?? end;
  return {
    blocked: (t.socket ?? end) - t.start,
    connecting: t.connected !== null && t.socket !== null ? t.connected - t.socket : 0,
    tls_handshaking: 0,
    sending: 0,
    waiting: headers - sent,
    receiving: end - headers,
    duration: end - sent,
  };
}

/** The answer for a request that got no HTTP response: status 0 and k6's error code. */
function failure(err, t) {
  return {
    status: 0,
    statusText: '',
    headers: {},
    body: null,
    error: err.message,
    errorCode: ERROR_CODES[err.code] ?? 1000,
    remoteIp: '',
    remotePort: 0,
    timings: timings(t, performance.now()),
  };
}
