// Capture storm: authorize now, capture later, under fire. However many keys capture or cancel one
// authorization at once, at most one capture or one cancel may reach the gateway.
//
// Each iteration authorizes one payment ("capture": "manual") and storms it: KEYS distinct keys,
// alternately capturing it (all of it, or a random part) and cancelling it, each sent BURST times
// (a double submit), all in one http.batch, round-robin over BASE_URLS. A key with no final answer
// (409 in flight, 503) is retried after Retry-After. Then every key is sent once more (a 200 must
// come back replayed, byte for byte; a 409 payment-not-capturable, refused again) and the key
// answered 200 with another body (422). The iteration then checks what its clients were told
// against one another and against payonce's payment (GET /v1/payments/{id}: the database):
// one key answered 200 at most, that key's 200s identical, the payment succeeded with what the
// 200 captured, or canceled.
//
// teardown() holds payonce's payments of the run against the simulator's ledger: a payment
// succeeded ⇔ exactly one ledger entry, of its amount_captured; canceled or still authorized ⇔
// none. With the iterations' checks that makes "a 200 capture ⇔ one entry of what it captured,
// a 200 cancel ⇔ none". Any violation aborts the test (exit code 108).
// INJECT_DOUBLE_CAPTURE=1 is its self-test: teardown first charges one captured payment's
// authorization a second time at the simulator, behind payonce's back; the audit must abort.
//
//   k6 run -e BASE_URLS=http://127.0.0.1:3000,http://127.0.0.1:3001 -e API_KEY=po_… loadtest/k6/capture_storm.js

import { check, sleep } from 'k6';
import exec from 'k6/execution';
import http from 'k6/http';
import { Counter, Trend } from 'k6/metrics';

import { clearFaults, config, envInt, newRunId, nextTarget, payment, retryAfterSeconds, setFaults, unexpectedAnswers } from './lib.js';

/** Distinct keys settling each payment at once (alternately capture and cancel). */
const KEYS = envInt('KEYS', 6);
/** Requests sent with each key at once. */
const BURST = envInt('BURST', 3);
/** Attempts of a key's client until a final answer. */
const MAX_ATTEMPTS = envInt('MAX_ATTEMPTS', 12);
/** The simulator's latency for captures and cancels (not authorizations), so that duplicates overlap. */
const GATEWAY_LATENCY_MS = envInt('GATEWAY_LATENCY_MS', 50);
const GATEWAY_JITTER_MS = envInt('GATEWAY_JITTER_MS', 100);
/** The self-test: a second capture made at the simulator, behind payonce's back, before the audit. */
const INJECT_DOUBLE_CAPTURE = __ENV.INJECT_DOUBLE_CAPTURE === '1';
/** Latency ceiling for the API (p99, ms). A guard against pathological slowness, not a benchmark. */
const P99_MS = envInt('P99_MS', 5000);

const NOT_CAPTURABLE = 'https://payonce.dev/problems/payment-not-capturable';
const KEY_REUSED = 'https://payonce.dev/problems/idempotency-key-reused';

export const options = {
  scenarios: {
    capture_storm: { executor: 'constant-vus', vus: config.vus(4), duration: config.duration, gracefulStop: '30s' },
  },
  // A storm is one batch: let all of it go at once.
  batchPerHost: KEYS * BURST,
  batch: KEYS * BURST,
  thresholds: {
    double_captures: ['count==0'],
    settlement_violations: ['count==0'],
    unexpected_answers: ['count==0'],
    checks: ['rate==1'],
    payments_settled: ['count>0'],
    'http_req_duration{api:payments}': [`p(99)<${P99_MS}`],
  },
  summaryTrendStats: ['avg', 'min', 'med', 'p(95)', 'p(99)', 'max'],
};

// 409 (in flight, not capturable), 422 (the reuse) and 503 are answers the storm expects.
http.setResponseCallback(http.expectedStatuses(200, 201, 409, 422, 503));

/** Payments authorized, and those a key was told were captured or canceled. */
const authorized = new Counter('payments_authorized');
const settled = new Counter('payments_settled');
const captured = new Counter('payments_captured');
const canceled = new Counter('payments_canceled');
/** Settle answers by class. */
const answers = {
  settled: new Counter('answers_200'),
  replayed: new Counter('answers_200_replayed'),
  not_capturable: new Counter('answers_409_not_capturable'),
  in_flight: new Counter('answers_409_in_flight'),
  unavailable: new Counter('answers_503'),
  key_reused: new Counter('answers_422'),
};
/** Ledger entries of the run (teardown), and payments with more than one: must stay 0. */
const ledgerCaptures = new Counter('ledger_captures');
const doubleCaptures = new Counter('double_captures');
/** Every other broken promise (tagged `check`): must stay 0. */
const violations = new Counter('settlement_violations');
/** From the storm's release to every key's final answer. */
const stormDuration = new Trend('storm_duration', true);

export function setup() {
  if (GATEWAY_LATENCY_MS > 0 || GATEWAY_JITTER_MS > 0) {
    setFaults({ latency_ms: GATEWAY_LATENCY_MS, jitter_ms: GATEWAY_JITTER_MS, operations: ['capture_payment_intent', 'cancel_payment_intent'] });
  }
  return { runId: newRunId('capture-storm'), start: Date.now() };
}

/** One violation: counted, tagged and printed. */
function violation(name, detail) {
  violations.add(1, { check: name });
  console.error(`${name.toUpperCase()}: ${detail}`);
}

function headers(key) {
  return { Authorization: `Bearer ${config.apiKey}`, 'Idempotency-Key': key, 'Content-Type': 'application/json' };
}

/** `POST /v1/payments/{id}/{action}` as an http.batch item. */
function settleRequest(id, action, key, body) {
  const params = { headers: headers(key), tags: { api: 'payments', name: `POST /v1/payments/{id}/${action}` } };
  return ['POST', `${nextTarget()}/v1/payments/${id}/${action}`, JSON.stringify(body), params];
}

function problemType(res) {
  try {
    return res.json().type;
  } catch (_) {
    return undefined;
  }
}

/** settled (200), replayed (200 replayed), not_capturable, in_flight, unavailable, key_reused, or status_NNN. */
function classify(res) {
  if (res.status === 0) return res.error_code === 1050 ? 'timeout' : 'transport_error';
  if (res.status === 200) return res.headers['Idempotent-Replayed'] === 'true' ? 'replayed' : 'settled';
  if (res.status === 409) return problemType(res) === NOT_CAPTURABLE ? 'not_capturable' : 'in_flight';
  if (res.status === 422 && problemType(res) === KEY_REUSED) return 'key_reused';
  if (res.status === 503) return 'unavailable';
  return `status_${res.status}`;
}

/** Classifies and counts a settle answer; an answer a settle request may not get is unexpected. */
function record(res) {
  const answer = classify(res);
  answers[answer]?.add(1);
  const ok = check(res, {
    'settle → 200, 409 not capturable, or 409/503 with Retry-After': () =>
      answer === 'settled' || answer === 'replayed' || answer === 'not_capturable' ||
      ((answer === 'in_flight' || answer === 'unavailable') && retryAfterSeconds(res) >= 1),
  });
  if (!ok) unexpectedAnswers.add(1, { answer, kind: 'settle' });
  return answer;
}

/** The payment authorized for this iteration, or null (counted as unexpected). */
function authorize(run, n) {
  const key = `${run.runId}-auth-${n}`;
  const amount = 1000 + Math.floor(Math.random() * 9000);
  const body = payment(amount, { capture: 'manual', metadata: { loadtest_run: run.runId } });
  for (let attempt = 1; attempt <= MAX_ATTEMPTS; attempt += 1) {
    const res = http.post(`${nextTarget()}/v1/payments`, JSON.stringify(body), {
      headers: headers(key),
      tags: { api: 'payments', name: 'POST /v1/payments' },
    });
    if (res.status === 201) {
      const paid = res.json();
      const ok = check(paid, {
        'authorization → 201 requires_capture, all of it capturable': (p) =>
          p.status === 'requires_capture' && p.amount === amount && p.amount_capturable === amount && p.amount_captured === 0 &&
          typeof p.payment_intent === 'string',
      });
      if (!ok) {
        unexpectedAnswers.add(1, { answer: 'created', kind: 'authorize' });
        return null;
      }
      authorized.add(1);
      return paid;
    }
    if ((res.status === 409 || res.status === 503) && retryAfterSeconds(res) >= 1) {
      sleep(retryAfterSeconds(res) + Math.random() * 0.2);
      continue;
    }
    unexpectedAnswers.add(1, { answer: `status_${res.status}`, kind: 'authorize' });
    return null;
  }
  unexpectedAnswers.add(1, { answer: 'unanswered', kind: 'authorize' });
  return null;
}

export default function (run) {
  const n = exec.scenario.iterationInTest;
  const paid = authorize(run, n);
  if (paid === null) return;
  const keys = [];
  for (let i = 0; i < KEYS; i += 1) {
    const capture = i % 2 === 0;
    const amount = capture && Math.random() < 0.5 ? 100 + Math.floor(Math.random() * (paid.amount - 99)) : undefined;
    keys.push({
      key: `${run.runId}-${n}-${i}-${capture ? 'capture' : 'cancel'}`,
      action: capture ? 'capture' : 'cancel',
      body: amount === undefined ? {} : { amount_to_capture: amount },
      finals: [], // { answer: 'settled' | 'replayed' | 'not_capturable', body }
      retryAfter: NaN,
    });
  }

  // The storm: every key BURST times, in one batch.
  const started = Date.now();
  const requests = [];
  for (const k of keys) for (let d = 0; d < BURST; d += 1) requests.push(settleRequest(paid.id, k.action, k.key, k.body));
  http.batch(requests).forEach((res, r) => noteAnswer(keys[Math.floor(r / BURST)], res));

  // A key with no final answer: its client comes back after Retry-After.
  for (const k of keys) {
    for (let attempt = 1; k.finals.length === 0 && attempt <= MAX_ATTEMPTS; attempt += 1) {
      sleep((Number.isNaN(k.retryAfter) ? 0 : k.retryAfter) + Math.random() * 0.2);
      const [method, url, body, params] = settleRequest(paid.id, k.action, k.key, k.body);
      if (!noteAnswer(k, http.request(method, url, body, params))) break;
    }
  }
  stormDuration.add(Date.now() - started);

  // Each key once more: a 200 replayed byte for byte, a refusal refused again; the winner's key
  // with another body: 422.
  const answered = keys.filter((k) => k.finals.length > 0);
  const winners = keys.filter((k) => k.finals.some((f) => f.answer !== 'not_capturable'));
  const resends = answered.map((k) => settleRequest(paid.id, k.action, k.key, k.body));
  const reuses = winners.map((k) =>
    settleRequest(paid.id, 'capture', k.key, k.action === 'capture' ? { amount_to_capture: (k.body.amount_to_capture ?? 0) + 1 } : {}),
  );
  const replies = http.batch([...resends, ...reuses]);
  answered.forEach((k, i) => {
    const res = replies[i];
    const answer = record(res);
    const won = winners.includes(k);
    if (won && (answer !== 'replayed' || res.body !== firstBody(k))) {
      violation('lost_acknowledgement', `key ${k.key} answered 200, then ${answer} after the storm`);
    }
    if (!won && answer !== 'not_capturable') violation('refusal_not_repeated', `key ${k.key} refused, then ${answer}`);
  });
  winners.forEach((k, i) => {
    const res = replies[answered.length + i];
    const answer = classify(res);
    answers[answer]?.add(1);
    if (!check(res, { 'the same key with another body → 422': () => answer === 'key_reused' })) {
      unexpectedAnswers.add(1, { answer, kind: 'reuse' });
    }
  });

  auditStorm(paid, keys, winners);
}

/** Keeps a final answer of key `k`; remembers Retry-After otherwise. Whether to go on retrying. */
function noteAnswer(k, res) {
  const answer = record(res);
  if (answer === 'settled' || answer === 'replayed' || answer === 'not_capturable') {
    k.finals.push({ answer, body: res.body });
    return false;
  }
  k.retryAfter = Math.max(Number.isNaN(k.retryAfter) ? 0 : k.retryAfter, retryAfterSeconds(res) || 0);
  return answer === 'in_flight' || answer === 'unavailable' || answer === 'timeout';
}

function firstBody(k) {
  return k.finals.find((f) => f.answer !== 'not_capturable')?.body;
}

/** This storm's answers against one another and against payonce's payment now. */
function auditStorm(paid, keys, winners) {
  for (const k of keys) {
    const oks = k.finals.filter((f) => f.answer !== 'not_capturable');
    if (k.finals.length === 0) violation('no_final_answer', `key ${k.key}`);
    if (oks.filter((f) => f.answer === 'settled').length > 1) violation('answered_fresh_twice', `key ${k.key}`);
    if (oks.some((f) => f.body !== oks[0].body)) violation('replays_differ', `key ${k.key}`);
    if (oks.length > 0 && oks.length < k.finals.length) violation('settled_and_refused', `key ${k.key}`);
  }
  if (winners.length > 1) violation('settled_twice', `payment ${paid.id}: ${winners.map((k) => k.key).join(', ')}`);
  const res = http.get(`${config.targets[0]}/v1/payments/${paid.id}`, {
    headers: { Authorization: `Bearer ${config.apiKey}` },
    tags: { api: 'read', name: 'GET /v1/payments/{id}' },
  });
  const now = res.status === 200 ? res.json() : {};
  if (winners.length === 0) {
    if (now.status !== 'requires_capture') violation('settled_untold', `payment ${paid.id} is ${now.status}, no key answered 200`);
    return;
  }
  const winner = winners[0];
  const told = JSON.parse(firstBody(winner));
  const asked = winner.action === 'capture'
    ? told.status === 'succeeded' && told.amount_captured === (winner.body.amount_to_capture ?? paid.amount)
    : told.status === 'canceled' && told.amount_captured === 0;
  if (!asked || told.id !== paid.id || told.amount_capturable !== 0) {
    violation('not_what_was_asked', `key ${winner.key} (${JSON.stringify(winner.body)}) answered ${told.status}, ${told.amount_captured} captured`);
  }
  if (now.status !== told.status || now.amount_captured !== told.amount_captured || now.amount_capturable !== 0) {
    violation('payonce_disagrees', `payment ${paid.id}: answered ${told.status} ${told.amount_captured}, payonce shows ${now.status} ${now.amount_captured}`);
  }
  settled.add(1);
  (winner.action === 'capture' ? captured : canceled).add(1);
}

/** Milliseconds of an RFC 3339 UTC time, whatever its fraction's length. */
function millis(rfc3339) {
  const m = /^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z$/.exec(rfc3339);
  return m ? Date.parse(`${m[1]}Z`) + Number(`0${m[2] ?? ''}`) * 1000 : NaN;
}

/** payonce's payments of this run (its metadata), newest first, read until older than the run. */
function paymentsOfRun(run) {
  const found = [];
  let after = '';
  for (;;) {
    const res = http.get(`${config.targets[0]}/v1/payments?limit=100${after}`, {
      headers: { Authorization: `Bearer ${config.apiKey}` },
      tags: { api: 'read', name: 'GET /v1/payments' },
    });
    if (res.status !== 200) throw new Error(`cannot list the payments: ${res.status} ${res.body}`);
    const page = res.json();
    found.push(...page.data.filter((p) => p.metadata?.loadtest_run === run.runId));
    const last = page.data[page.data.length - 1];
    // A minute of slack for clocks: the servers' and k6's are the same machine's here.
    if (!page.has_more || !last || millis(last.created) < run.start - 60000) return found;
    after = `&starting_after=${last.id}`;
  }
}

function ledger() {
  const res = http.get(`${config.simUrl}/_sim/charges`, { tags: { api: 'sim', name: 'GET /_sim/charges' } });
  if (res.status !== 200) throw new Error(`cannot read the ledger at ${config.simUrl}/_sim/charges: ${res.status} ${res.error}`);
  return res.json().charges;
}

/**
 * The self-test: one captured payment's authorization charged again at the simulator, under its
 * metadata; when no payment of the run was captured, an authorization charged twice instead. Two
 * movements of money for one authorization either way.
 */
function injectDoubleCapture(payments, charges) {
  const victim = payments.find((p) => p.status === 'succeeded') ?? payments[0];
  if (!victim) throw new Error('INJECT_DOUBLE_CAPTURE: no payment of the run to charge again');
  const entry = charges.find((c) => c.payment_intent === victim.payment_intent);
  const form = {
    amount: String(entry?.amount ?? victim.amount),
    currency: 'usd',
    payment_method: 'pm_card_visa',
    'payment_method_types[]': 'card',
    confirm: 'true',
  };
  for (const [name, value] of Object.entries(entry?.metadata ?? { payonce_payment: victim.id })) form[`metadata[${name}]`] = value;
  for (let n = entry ? 1 : 2; n > 0; n -= 1) {
    const res = http.post(`${config.simUrl}/v1/payment_intents`, form, {
      headers: { Authorization: 'Bearer sk_test_loadtest_selftest' },
      tags: { api: 'sim', name: 'POST /v1/payment_intents' },
    });
    if (res.status !== 200) throw new Error(`the simulator did not charge: ${res.status} ${res.body}`);
    console.log(`self-test: ${victim.id} charged ${form.amount} again at the simulator, behind payonce, as ${res.json().id}`);
  }
}

export function teardown(run) {
  if (GATEWAY_LATENCY_MS > 0 || GATEWAY_JITTER_MS > 0) clearFaults();
  const payments = paymentsOfRun(run);
  if (INJECT_DOUBLE_CAPTURE) injectDoubleCapture(payments, ledger());
  // The run's entries: those naming a payment of the run (payonce_payment), or one of its
  // authorization keys.
  const ids = new Set(payments.map((p) => p.id));
  const entries = ledger().filter(
    (c) => ids.has(c.metadata?.payonce_payment) || (c.metadata?.payonce_idempotency_key ?? '').startsWith(`${run.runId}-`),
  );
  const byPayment = new Map();
  for (const entry of entries) {
    const id = entry.metadata?.payonce_payment;
    byPayment.set(id, [...(byPayment.get(id) ?? []), entry]);
  }
  ledgerCaptures.add(entries.length);
  let doubles = 0;
  let found = 0;
  for (const p of payments) {
    const list = byPayment.get(p.id) ?? [];
    byPayment.delete(p.id);
    if (list.length > 1) {
      doubles += 1;
      console.error(`CAPTURED TWICE: ${p.id}: ${list.map((c) => `${c.payment_intent} (${c.amount})`).join(', ')}`);
    } else if (p.status === 'succeeded' && (list.length === 0 || list[0].amount !== p.amount_captured || list[0].payment_intent !== p.payment_intent)) {
      found += 1;
      violation('captured_without_entry', `${p.id} succeeded with ${p.amount_captured}; ledger: ${JSON.stringify(list)}`);
    } else if (p.status !== 'succeeded' && list.length > 0) {
      found += 1;
      violation('settled_yet_captured', `${p.id} is ${p.status}, yet captured at the gateway: ${list[0].payment_intent}`);
    }
  }
  for (const [id, list] of byPayment) {
    found += 1;
    violation('unknown_entry', `${list.length} ledger entr(ies) of the run for ${id}, not a payment of the run`);
  }
  doubleCaptures.add(doubles);
  console.log(`audit: run ${run.runId}: ${payments.length} payments, ${entries.length} captures in the ledger; ${doubles} captured more than once, ${found} other violation(s)`);
  if (doubles > 0) exec.test.abort(`${doubles} payment(s) captured more than once (see CAPTURED TWICE lines)`);
  if (found > 0) exec.test.abort(`${found} payment(s) whose ledger disagrees with payonce (see the lines above)`);
  if (payments.length === 0) exec.test.abort(`no payment of run ${run.runId} was found: nothing was audited`);
}
