// Self-test of the shim (not a load test): uses a k6 API the shim does not implement
// (http.cookieJar). The shim must fail the run, never carry on without it.

import http from 'k6/http';

export const options = { iterations: 1 };

export function setup() {
  http.cookieJar();
}

export default function () {}
