// Shared by the payonce k6 scripts: configuration from __ENV, the payment request, what each
// answer means, the simulator's faults, and the ledger audit that fails a run on a double charge.

import http from 'k6/http';
import exec from 'k6/execution';
import { Counter } from 'k6/metrics';

// ── Configuration ────────────────────────────────────────────────────────────────────────────

/** A whole number from __ENV, or `fallback`. Anything else is an error, not a silent default. */
export function envInt(name, fallback) {
  const raw = __ENV[name];
  if (raw === undefined || raw === '') return fallback;
  if (!/^\d+$/.test(raw)) throw new Error(`${name}=${raw}: expected a whole number`);
  return Number(raw);
}

/** A number from __ENV (e.g. a rate between 0 and 1), or `fallback`. */
export function envNumber(name, fallback) {
  const raw = __ENV[name];
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (!Number.isFinite(value)) throw new Error(`${name}=${raw}: expected a number`);
  return value;
}

const trimSlash = (url) => url.trim().replace(/\/+$/, '');

export const config = {
  /** payonce servers, used round-robin (several servers on one database: the distributed race). */
  targets: (__ENV.BASE_URLS || 'http://127.0.0.1:3000').split(',').map(trimSlash).filter(Boolean),
  /** The Stripe simulator the servers charge through (its ledger is the audit's ground truth). */
  simUrl: trimSlash(__ENV.SIM_URL || 'http://127.0.0.1:12111'),
  /** A customer's API key (`payonce customers create NAME` prints one). */
  apiKey: __ENV.API_KEY || '',
  duration: __ENV.DURATION || '30s',
  /**
   * A lab server's claim strategy (`payonce serve --lab`): payments go to
   * `/lab/{STRATEGY}/v1/payments` instead of `/v1/payments`.
   */
  paymentsPath: __ENV.STRATEGY ? `/lab/${__ENV.STRATEGY}/v1/payments` : '/v1/payments',
  /** VUs, with a default per script. */
  vus: (fallback) => envInt('VUS', fallback),
};

if (!config.apiKey) {
  throw new Error('API_KEY is not set: create a customer with `payonce customers create NAME` and pass its key (-e API_KEY=po_…)');
}

// ── Metrics shared by the scripts ──────────────────────────────────────────────────────────

/** 201 without `Idempotent-Replayed`: payments this run believes it created. */
const created = new Counter('payments_created');
/** 201 with `Idempotent-Replayed: true`. */
const replayed = new Counter('payments_replayed');
/** 409: the key was in flight on some server; the client should come back after Retry-After. */
const inFlight = new Counter('answers_in_flight');
/** 422: the key was used with another payload. */
const keyReused = new Counter('answers_key_reused');
/** 503: the gateway gave no final answer; retrying with the same key is safe. */
const unavailable = new Counter('answers_unavailable');
/** No answer within the client's timeout (status 0, k6 error code 1050). */
const clientTimeouts = new Counter('client_timeouts');
/** Answers the scenario does not expect at that point (tagged with the answer and the request kind). */
export const unexpectedAnswers = new Counter('unexpected_answers');
/** Charges in the simulator's ledger for this run's keys (set by the audit in teardown). */
const ledgerCharges = new Counter('ledger_charges');
/** Keys of this run charged more than once (set by the audit in teardown; must stay 0). */
const doubleCharges = new Counter('double_charges');

// ── Requests and answers ───────────────────────────────────────────────────────────────────

// __VU (not exec.vu) because k6 defines it in the init context: each VU starts at another target.
let turn = __VU;
/** The next server, round-robin. */
export function nextTarget() {
  const target = config.targets[turn % config.targets.length];
  turn += 1;
  return target;
}

/** A run id for this test's keys: the audit looks only at keys that start with it. */
export function newRunId(scenario) {
  return `lt-${scenario}-${Date.now().toString(36)}-${Math.floor(Math.random() * 36 ** 6).toString(36)}`;
}

/** A valid payment body. */
export function payment(amount, extra = {}) {
  return { amount, currency: 'usd', payment_method: 'pm_card_visa', ...extra };
}

/**
 * `POST /v1/payments` as an `http.batch` item. Tagged `api:payments` (so thresholds can look at
 * the API alone, not the simulator's control calls) plus `tags`.
 */
export function paymentRequest(target, key, body, { tags = {}, timeout } = {}) {
  const params = {
    headers: { Authorization: `Bearer ${config.apiKey}`, 'Idempotency-Key': key, 'Content-Type': 'application/json' },
    tags: { api: 'payments', name: 'POST /v1/payments', ...tags },
  };
  if (timeout !== undefined) params.timeout = timeout;
  return ['POST', `${target}${config.paymentsPath}`, JSON.stringify(body), params];
}

/** Sends one payment request. */
export function postPayment(target, key, body, options) {
  const [method, url, payload, params] = paymentRequest(target, key, body, options);
  return http.request(method, url, payload, params);
}

/**
 * What an answer means: created, replayed, in_flight (409), key_reused (422), declined (402),
 * unavailable (503), timeout (the client gave up), transport_error, or status_NNN.
 */
export function classify(res) {
  if (res.status === 0) return res.error_code === 1050 ? 'timeout' : 'transport_error';
  switch (res.status) {
    case 201:
      return res.headers['Idempotent-Replayed'] === 'true' ? 'replayed' : 'created';
    case 402:
      return 'declined';
    case 409:
      return 'in_flight';
    case 422:
      return 'key_reused';
    case 503:
      return 'unavailable';
    default:
      return `status_${res.status}`;
  }
}

const COUNTERS = {
  created,
  replayed,
  in_flight: inFlight,
  key_reused: keyReused,
  unavailable,
  timeout: clientTimeouts,
};

/** Classifies an answer and counts it; returns the class. */
export function record(res) {
  const answer = classify(res);
  COUNTERS[answer]?.add(1);
  return answer;
}

/** The `Retry-After` header in seconds, or NaN when it is missing or not a number of seconds. */
export function retryAfterSeconds(res) {
  const raw = res.headers['Retry-After'];
  return raw !== undefined && /^\d+$/.test(raw) ? Number(raw) : NaN;
}

/** Whether a 201 carries a succeeded payment (`pay_…`) of the amount that was asked for. */
export function isPaymentOf(res, body) {
  if (res.status !== 201) return false;
  const paid = res.json();
  return typeof paid.id === 'string' && paid.id.startsWith('pay_') && paid.status === 'succeeded' && paid.amount === body.amount;
}

// ── The simulator ──────────────────────────────────────────────────────────────────────────

/** Params of the simulator's control calls: tagged apart, and judged by their own statuses. */
const SIM_CALL = { responseCallback: http.expectedStatuses({ min: 200, max: 299 }) };

/** Replaces the simulator's faults (`PUT /_sim/faults`); throws if it refuses them. */
export function setFaults(faults) {
  const res = http.put(`${config.simUrl}/_sim/faults`, JSON.stringify(faults), {
    ...SIM_CALL,
    headers: { 'Content-Type': 'application/json' },
    tags: { api: 'sim', name: 'PUT /_sim/faults' },
  });
  if (res.status !== 200) throw new Error(`the simulator refused the faults ${JSON.stringify(faults)}: ${res.status} ${res.error || res.body}`);
}

/** Clears every fault. */
export function clearFaults() {
  setFaults({});
}

/**
 * The audit: reads every charge from the simulator's ledger, keeps those of this run's keys,
 * groups them by key (a run is one customer's: a second charge is a double charge whatever
 * customer it names) and counts the keys charged more than once. Records `ledger_charges` and
 * `double_charges`, and aborts the test (exit code 108) on a double charge, or when the ledger
 * holds no charge of the run at all: every scenario pays, so an audit that finds nothing to audit
 * (no traffic got through, or payonce's metadata changed) proves nothing.
 */
export function auditLedger(runId) {
  const res = http.get(`${config.simUrl}/_sim/charges`, { ...SIM_CALL, tags: { api: 'sim', name: 'GET /_sim/charges' } });
  if (res.status !== 200) throw new Error(`cannot read the ledger at ${config.simUrl}/_sim/charges: ${res.status} ${res.error}`);
  const charges = res.json().charges.filter((c) => (c.metadata?.payonce_idempotency_key ?? '').startsWith(`${runId}-`));
  const byKey = new Map();
  for (const charge of charges) {
    const key = charge.metadata.payonce_idempotency_key;
    byKey.set(key, [...(byKey.get(key) ?? []), charge]);
  }
  const doubles = [...byKey].filter(([, group]) => group.length > 1);
  ledgerCharges.add(charges.length);
  doubleCharges.add(doubles.length);
  console.log(`audit: run ${runId}: ${charges.length} charges in the ledger for ${byKey.size} keys; ${doubles.length} keys charged more than once`);
  if (doubles.length > 0) {
    for (const [key, list] of doubles.slice(0, 10)) {
      const customers = [...new Set(list.map((c) => c.metadata.payonce_customer))].join(', ');
      const detail = list.map((c) => `${c.payment_intent} (${c.amount} ${c.currency}, downstream key ${c.idempotency_key})`);
      console.error(`DOUBLE CHARGE: customer ${customers}, Idempotency-Key ${key}: ${detail.join(', ')}`);
    }
    exec.test.abort(`${doubles.length} idempotency key(s) charged more than once (see DOUBLE CHARGE lines)`);
  }
  if (charges.length === 0) {
    exec.test.abort(`the ledger holds no charge for run ${runId}: nothing was audited`);
  }
}
