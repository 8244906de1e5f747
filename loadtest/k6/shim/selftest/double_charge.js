// Self-test of the audit (not a load test): charges one key twice straight through the
// simulator, bypassing payonce, so teardown()'s audit must find a double charge and abort the
// run with exit code 108. `.ci/loadtest-smoke` runs it and fails if it does *not* fail: an audit
// that cannot see a double charge would make every other green run meaningless.

import http from 'k6/http';

import { auditLedger, newRunId } from '../../lib.js';

export const options = {
  scenarios: { charge_twice: { executor: 'shared-iterations', vus: 1, iterations: 1 } },
  thresholds: { double_charges: ['count==0'] },
};

export function setup() {
  return { runId: newRunId('selftest') };
}

export default function (run) {
  const form = [
    'amount=4200',
    'currency=usd',
    'payment_method=pm_card_visa',
    'confirm=true',
    `metadata[payonce_idempotency_key]=${run.runId}-1`,
    'metadata[payonce_customer]=cus_selftest',
  ].join('&');
  for (let i = 0; i < 2; i += 1) {
    const res = http.post(`${__ENV.SIM_URL}/v1/payment_intents`, form, {
      headers: { Authorization: 'Bearer sk_test_selftest', 'Content-Type': 'application/x-www-form-urlencoded' },
    });
    if (res.status !== 200) throw new Error(`the simulator did not charge: ${res.status} ${res.body}`);
  }
}

export function teardown(run) {
  auditLedger(run.runId);
}
