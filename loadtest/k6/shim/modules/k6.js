// The `k6` module: check, group, sleep, fail.

import { runtime, emit, requireStage } from '../runtime.js';

/**
 * Runs each named check on `value` and records one `checks` sample per check (tagged with its
 * name and group, plus `tags`). Returns true when every check passed.
 */
export function check(value, checks, tags = {}) {
  requireStage('check()', 'setup', 'vu', 'teardown');
  if (checks === null || typeof checks !== 'object') throw new TypeError('check(value, checks): checks must be an object of name → function');
  let all = true;
  for (const [name, predicate] of Object.entries(checks)) {
    const passed = Boolean(typeof predicate === 'function' ? predicate(value) : predicate);
    emit('checks', passed ? 1 : 0, { ...tags, check: name });
    all &&= passed;
  }
  return all;
}

/** Runs `fn` inside a named group (samples get the group path as their `group` tag). */
export function group(name, fn) {
  requireStage('group()', 'setup', 'vu', 'teardown');
  if (typeof name !== 'string' || name.includes('::')) throw new Error(`group name ${JSON.stringify(name)} must be a string without "::"`);
  if (typeof fn !== 'function') throw new TypeError('group(name, fn): fn must be a function');
  if (fn.constructor?.name === 'AsyncFunction') throw new Error('group() does not take an async function (k6 does not either)');
  const outer = runtime.group;
  runtime.group = `${outer}::${name}`;
  const started = performance.now();
  try {
    return fn();
  } finally {
    emit('group_duration', performance.now() - started, {});
    runtime.group = outer;
  }
}

/** Blocks this VU for `seconds` (the other VUs run on: each is a thread of its own). */
export function sleep(seconds) {
  requireStage('sleep()', 'setup', 'vu', 'teardown');
  const ms = Number(seconds) * 1000;
  if (!Number.isFinite(ms) || ms < 0) throw new TypeError(`sleep(${seconds}): expected a number of seconds`);
  if (ms > 0) Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

/** Ends the iteration with an error (the test goes on, as in k6). */
export function fail(message) {
  throw new Error(message === undefined ? 'fail() called' : String(message));
}
