// Mixed traffic: new payments, replays of finished ones, and keys reused with another payload, in
// realistic proportions (MIX, default 70/25/5). Each answer class is checked:
//   new key                       → 201, not replayed, a succeeded payment of that amount
//   same key, same payload        → 201 with Idempotent-Replayed: true and the original payment id
//   same key, different payload   → 422 problem `idempotency-key-reused`
// Replays and reuses go round-robin too, so most of them reach another server than the original.
// teardown() audits the simulator's ledger: exactly one charge per key.
//
//   k6 run -e BASE_URLS=http://127.0.0.1:3000,http://127.0.0.1:3001 -e API_KEY=po_… loadtest/k6/mixed.js

import { check } from 'k6';
import exec from 'k6/execution';
import http from 'k6/http';

import {
  auditLedger,
  config,
  envInt,
  isPaymentOf,
  newRunId,
  payment,
  postPayment,
  nextTarget,
  record,
  unexpectedAnswers,
} from './lib.js';

/** Percentages of new / replay / reuse requests. */
const MIX = (() => {
  const parts = (__ENV.MIX || '70/25/5').split('/').map(Number);
  if (parts.length !== 3 || parts.some((p) => !Number.isFinite(p) || p < 0) || parts[0] + parts[1] + parts[2] !== 100) {
    throw new Error(`MIX=${__ENV.MIX}: expected NEW/REPLAY/REUSE percentages adding up to 100, e.g. 70/25/5`);
  }
  return { replayFrom: parts[0], reuseFrom: parts[0] + parts[1] };
})();
/** How many finished payments each VU remembers for replays and reuses. */
const MEMORY = 200;
/** Latency ceiling for the API (p99, ms). A guard against pathological slowness, not a benchmark. */
const P99_MS = envInt('P99_MS', 5000);

export const options = {
  scenarios: {
    mixed: { executor: 'constant-vus', vus: config.vus(8), duration: config.duration, gracefulStop: '10s' },
  },
  thresholds: {
    double_charges: ['count==0'],
    checks: ['rate==1'],
    payments_created: ['count>0'],
    'unexpected_answers{kind:new}': ['count==0'],
    'unexpected_answers{kind:replay}': ['count==0'],
    'unexpected_answers{kind:reuse}': ['count==0'],
    'http_req_duration{kind:new}': [`p(99)<${P99_MS}`],
    'http_req_duration{kind:replay}': [`p(99)<${P99_MS}`],
  },
  summaryTrendStats: ['avg', 'min', 'med', 'p(95)', 'p(99)', 'max'],
};

// A 422 is this script's expected answer to a reused key: only other statuses are failed requests.
http.setResponseCallback(http.expectedStatuses(201, 422));

/** This VU's finished payments: { key, body, id }. */
const finished = [];

export function setup() {
  return { runId: newRunId('mixed') };
}

export default function (run) {
  const roll = Math.random() * 100;
  if (finished.length === 0 || roll < MIX.replayFrom) newPayment(run);
  else if (roll < MIX.reuseFrom) replay(pick());
  else reuse(pick());
}

export function teardown(run) {
  auditLedger(run.runId);
}

function pick() {
  return finished[Math.floor(Math.random() * finished.length)];
}

/** Counts an answer and, if it is not the one expected for this kind of request, says so. */
function expect(res, kind, ok) {
  const answer = record(res);
  if (!ok) unexpectedAnswers.add(1, { kind, answer });
  return ok;
}

function newPayment(run) {
  const key = `${run.runId}-${exec.vu.idInTest}-${exec.vu.iterationInScenario}`;
  const body = payment(100 + Math.floor(Math.random() * 9900), {
    description: `order ${exec.vu.iterationInScenario}`,
    metadata: { order: `${exec.vu.idInTest}-${exec.vu.iterationInScenario}` },
  });
  const res = postPayment(nextTarget(), key, body, { tags: { kind: 'new' } });
  const ok = check(
    res,
    { 'new key → 201 with a succeeded payment': (r) => isPaymentOf(r, body) && r.headers['Idempotent-Replayed'] === undefined },
    { kind: 'new' },
  );
  if (expect(res, 'new', ok)) {
    finished.push({ key, body, id: res.json().id });
    if (finished.length > MEMORY) finished.shift();
  }
}

function replay(original) {
  const res = postPayment(nextTarget(), original.key, original.body, { tags: { kind: 'replay' } });
  const ok = check(
    res,
    {
      'same key, same payload → 201 replayed, same payment': (r) =>
        r.status === 201 && r.headers['Idempotent-Replayed'] === 'true' && r.json().id === original.id,
    },
    { kind: 'replay' },
  );
  expect(res, 'replay', ok);
}

function reuse(original) {
  const body = { ...original.body, amount: original.body.amount + 1 };
  const res = postPayment(nextTarget(), original.key, body, { tags: { kind: 'reuse' } });
  const ok = check(
    res,
    {
      'same key, other payload → 422 idempotency-key-reused': (r) =>
        r.status === 422 && String(r.json().type).endsWith('/idempotency-key-reused'),
    },
    { kind: 'reuse' },
  );
  expect(res, 'reuse', ok);
}
