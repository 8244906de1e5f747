// Retry storm: clients with a short timeout, against a slow and flaky gateway, retrying with the
// same key until they get a final answer.
//
// setup() makes the simulator slow (GATEWAY_LATENCY_MS + up to GATEWAY_JITTER_MS) and flaky
// (FAIL_RATE: 500 before executing; TIMEOUT_RATE: held TIMEOUT_HOLD_MS, then charged;
// DROP_RATE: charged, then the connection breaks). Each iteration is one payment: the client
// gives up on an attempt after CLIENT_TIMEOUT and retries with the same key and payload, at most
// MAX_ATTEMPTS times, until it gets a 201. It honours Retry-After on 409 and 503 and otherwise
// backs off exponentially with full jitter. teardown() clears the faults and audits the ledger:
// however many attempts, exactly one charge per key.
//
//   k6 run -e BASE_URLS=http://127.0.0.1:3000,http://127.0.0.1:3001 -e API_KEY=po_… loadtest/k6/retry_storm.js

import { check, sleep } from 'k6';
import exec from 'k6/execution';
import http from 'k6/http';
import { Counter, Trend } from 'k6/metrics';

import {
  auditLedger,
  clearFaults,
  config,
  envInt,
  envNumber,
  isPaymentOf,
  newRunId,
  nextTarget,
  payment,
  postPayment,
  record,
  retryAfterSeconds,
  setFaults,
  unexpectedAnswers,
} from './lib.js';

const CLIENT_TIMEOUT = __ENV.CLIENT_TIMEOUT || '400ms';
const MAX_ATTEMPTS = envInt('MAX_ATTEMPTS', 12);
const BACKOFF_BASE_MS = envInt('BACKOFF_BASE_MS', 100);
const BACKOFF_CAP_MS = envInt('BACKOFF_CAP_MS', 2000);
const FAULTS = {
  latency_ms: envInt('GATEWAY_LATENCY_MS', 200),
  jitter_ms: envInt('GATEWAY_JITTER_MS', 400),
  fail_rate: envNumber('FAIL_RATE', 0.1),
  timeout_rate: envNumber('TIMEOUT_RATE', 0.05),
  timeout_hold_ms: envInt('TIMEOUT_HOLD_MS', 3000),
  drop_after_charge_rate: envNumber('DROP_RATE', 0.05),
};

/** Answers after which the client tries again with the same key. */
const RETRY = new Set(['in_flight', 'unavailable', 'timeout']);

export const options = {
  scenarios: {
    retry_storm: { executor: 'constant-vus', vus: config.vus(20), duration: config.duration, gracefulStop: '30s' },
  },
  thresholds: {
    double_charges: ['count==0'],
    checks: ['rate==1'],
    unexpected_answers: ['count==0'],
    payments_completed: ['count>0'],
    payments_unfinished: ['count==0'],
  },
  summaryTrendStats: ['avg', 'min', 'med', 'p(95)', 'p(99)', 'max'],
};

// 409 and 503 are the service telling the client to come back: not failed requests. Timeouts are.
http.setResponseCallback(http.expectedStatuses(201, 409, 503));

/** Payments that ended with a 201 (first attempt or a retry). */
const completed = new Counter('payments_completed');
/** Payments abandoned after MAX_ATTEMPTS, or on an answer that is not worth retrying. */
const unfinished = new Counter('payments_unfinished');
/** Attempts a payment took until its 201 (1 = no retry). */
const attemptsPerPayment = new Trend('attempts_per_payment');
/** Retries sent (attempts after the first). */
const retries = new Counter('retries');
/** Time from a payment's first attempt to its 201. */
const timeToSuccess = new Trend('payment_time_to_success', true);

export function setup() {
  setFaults(FAULTS);
  return { runId: newRunId('retry-storm') };
}

export default function (run) {
  const key = `${run.runId}-${exec.vu.idInTest}-${exec.vu.iterationInScenario}`;
  const body = payment(100 + Math.floor(Math.random() * 9900));
  const started = Date.now();
  for (let attempt = 1; attempt <= MAX_ATTEMPTS; attempt += 1) {
    if (attempt > 1) retries.add(1);
    const res = postPayment(nextTarget(), key, body, { timeout: CLIENT_TIMEOUT, tags: { attempt: attempt === 1 ? 'first' : 'retry' } });
    const answer = record(res);
    const final = answer === 'created' || answer === 'replayed';
    const ok = check(res, {
      'answer is 201 (the payment), 409/503 with Retry-After, or a client timeout': (r) =>
        (final && isPaymentOf(r, body)) || ((answer === 'in_flight' || answer === 'unavailable') && retryAfterSeconds(r) >= 1) || answer === 'timeout',
    });
    if (!ok) unexpectedAnswers.add(1, { answer });
    if (final) {
      completed.add(1);
      attemptsPerPayment.add(attempt);
      timeToSuccess.add(Date.now() - started);
      return;
    }
    if (!RETRY.has(answer)) break;
    sleep(waitBeforeRetry(res, attempt) / 1000);
  }
  unfinished.add(1);
}

/**
 * How long to wait before attempt `attempt + 1`: at least Retry-After when the server sent one,
 * and an exponential backoff with full jitter (uniform in 0..min(cap, base·2^(attempt-1))), so
 * that clients that failed together do not come back together.
 */
function waitBeforeRetry(res, attempt) {
  const backoff = Math.random() * Math.min(BACKOFF_CAP_MS, BACKOFF_BASE_MS * 2 ** (attempt - 1));
  const retryAfter = retryAfterSeconds(res);
  return Number.isNaN(retryAfter) ? backoff : retryAfter * 1000 + backoff;
}

export function teardown(run) {
  clearFaults();
  auditLedger(run.runId);
}
