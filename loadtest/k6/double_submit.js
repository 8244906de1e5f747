// Double submit: many clients send the same key at the same instant, for many keys.
//
// Time is cut into slots of SLOT_MS. Every VU sleeps until the next slot boundary, so all of them
// wake together, and sends that slot's key (the same key, the same payload) BURST times at once
// with http.batch, round-robin over BASE_URLS. Per key, VUS × BURST requests race on one or more
// servers; exactly one may create the payment, the others must get 409 (in flight, Retry-After)
// or a replay. teardown() audits the simulator's ledger: exactly one charge per key.
//
//   k6 run -e BASE_URLS=http://127.0.0.1:3000,http://127.0.0.1:3001 -e API_KEY=po_… loadtest/k6/double_submit.js

import { check, sleep } from 'k6';
import http from 'k6/http';

import {
  auditLedger,
  clearFaults,
  config,
  envInt,
  isPaymentOf,
  newRunId,
  nextTarget,
  payment,
  paymentRequest,
  record,
  retryAfterSeconds,
  setFaults,
  unexpectedAnswers,
} from './lib.js';

/** Same-key requests each VU sends at once, per slot. */
const BURST = envInt('BURST', 2);
/** Length of a slot: every VU fires at each slot boundary it is ready for. */
const SLOT_MS = envInt('SLOT_MS', 250);
/** Optional gateway latency (simulator fault), so that the first request is still in flight when the others land. */
const GATEWAY_LATENCY_MS = envInt('GATEWAY_LATENCY_MS', 0);
/** Latency ceiling for the API (p99, ms). A guard against pathological slowness, not a benchmark. */
const P99_MS = envInt('P99_MS', 5000);

export const options = {
  scenarios: {
    double_submit: { executor: 'constant-vus', vus: config.vus(10), duration: config.duration, gracefulStop: '10s' },
  },
  // k6 sends at most 6 requests of a batch to one host at a time: let the whole burst go at once.
  batchPerHost: Math.max(6, BURST),
  batch: Math.max(10, BURST),
  thresholds: {
    double_charges: ['count==0'],
    checks: ['rate==1'],
    unexpected_answers: ['count==0'],
    payments_created: ['count>0'],
    'http_req_duration{api:payments}': [`p(99)<${P99_MS}`],
  },
  summaryTrendStats: ['avg', 'min', 'med', 'p(95)', 'p(99)', 'max'],
};

// 409 is an expected answer here: only other statuses count as failed requests.
http.setResponseCallback(http.expectedStatuses(201, 409));

export function setup() {
  if (GATEWAY_LATENCY_MS > 0) setFaults({ latency_ms: GATEWAY_LATENCY_MS });
  // The first slot starts a little later, when every VU is surely looping.
  return { runId: newRunId('double-submit'), start: Date.now() + 500 };
}

export default function (run) {
  // Sleep to the next slot boundary: every VU that is ready wakes at the same instant.
  const now = Date.now();
  const slot = Math.max(0, Math.floor((now - run.start) / SLOT_MS) + 1);
  sleep(Math.max(0, run.start + slot * SLOT_MS - now) / 1000);

  const key = `${run.runId}-${slot}`;
  const body = payment(1000 + (slot % 1000), { metadata: { slot: String(slot) } });
  const requests = [];
  for (let i = 0; i < BURST; i += 1) requests.push(paymentRequest(nextTarget(), key, body));
  for (const res of http.batch(requests)) {
    const answer = record(res);
    const ok = check(res, {
      'same key at once → 201, a replay, or 409 with Retry-After': (r) =>
        ((answer === 'created' || answer === 'replayed') && isPaymentOf(r, body)) ||
        (answer === 'in_flight' && retryAfterSeconds(r) >= 1),
    });
    if (!ok) unexpectedAnswers.add(1, { answer });
  }
}

export function teardown(run) {
  if (GATEWAY_LATENCY_MS > 0) clearFaults();
  auditLedger(run.runId);
}
