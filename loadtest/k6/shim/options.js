// The script's `options` (with command-line overrides) turned into scenario plans. Every option
// and scenario field the shim does not implement is refused by name.

import { parseDuration } from './duration.js';
import { NotImplemented } from './runtime.js';

/** Top-level options the shim honours. */
const OPTIONS = new Set([
  'vus',
  'duration',
  'iterations',
  'scenarios',
  'thresholds',
  'setupTimeout',
  'teardownTimeout',
  'summaryTrendStats',
  'batch',
  'batchPerHost',
]);

/** Fields of each executor the shim implements (beyond the common ones). */
const EXECUTORS = {
  'constant-vus': ['vus', 'duration'],
  'per-vu-iterations': ['vus', 'iterations', 'maxDuration'],
  'shared-iterations': ['vus', 'iterations', 'maxDuration'],
};
const COMMON = ['executor', 'exec', 'startTime', 'gracefulStop', 'env', 'tags'];

const DEFAULT_TREND_STATS = ['avg', 'min', 'med', 'max', 'p(90)', 'p(95)'];

function positiveInteger(value, what) {
  if (!Number.isInteger(value) || value < 1) throw new Error(`${what} must be a positive integer, got ${JSON.stringify(value)}`);
  return value;
}

function stringMap(value, what) {
  if (value === undefined) return {};
  if (value === null || typeof value !== 'object') throw new Error(`${what} must be an object of strings`);
  return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, String(v)]));
}

/** One scenario's plan, with defaults filled in as k6 fills them. */
function scenarioPlan(name, spec) {
  const fields = EXECUTORS[spec.executor];
  if (!fields) {
    throw new NotImplemented(
      `the executor ${JSON.stringify(spec.executor)} (scenario ${name}; the shim has ${Object.keys(EXECUTORS).join(', ')})`,
    );
  }
  for (const key of Object.keys(spec)) {
    if (!COMMON.includes(key) && !fields.includes(key)) throw new NotImplemented(`the field "${key}" of a ${spec.executor} scenario (${name})`);
  }
  const plan = {
    name,
    executor: spec.executor,
    exec: spec.exec ?? 'default',
    startTimeMs: parseDuration(spec.startTime ?? '0s', `${name}.startTime`),
    gracefulStopMs: parseDuration(spec.gracefulStop ?? '30s', `${name}.gracefulStop`),
    env: stringMap(spec.env, `${name}.env`),
    tags: stringMap(spec.tags, `${name}.tags`),
    vus: positiveInteger(spec.vus ?? 1, `${name}.vus`),
  };
  if (spec.executor === 'constant-vus') {
    if (spec.duration === undefined) throw new Error(`scenario ${name}: a constant-vus scenario needs a duration`);
    plan.durationMs = parseDuration(spec.duration, `${name}.duration`);
  } else {
    plan.iterations = positiveInteger(spec.iterations ?? 1, `${name}.iterations`);
    plan.durationMs = parseDuration(spec.maxDuration ?? '10m', `${name}.maxDuration`);
    if (spec.executor === 'shared-iterations' && plan.vus > plan.iterations) plan.vus = plan.iterations; // as k6 does
  }
  return plan;
}

/**
 * The consolidated options: the script's `options` with the command line's `--vus`, `--duration`
 * and `--iterations` on top. As in k6, those shortcuts replace the script's scenarios with one
 * scenario named "default".
 */
export function consolidate(scriptOptions, overrides) {
  const options = { ...(scriptOptions ?? {}) };
  for (const key of Object.keys(options)) {
    if (!OPTIONS.has(key)) throw new NotImplemented(`the option "${key}"`);
  }
  const shortcut = ['vus', 'duration', 'iterations'].some((key) => overrides[key] !== undefined);
  if (shortcut) {
    delete options.scenarios;
    for (const key of ['vus', 'duration', 'iterations']) if (overrides[key] !== undefined) options[key] = overrides[key];
  }
  if (options.scenarios && ['vus', 'duration', 'iterations'].some((key) => options[key] !== undefined)) {
    throw new Error('options: use either scenarios or the vus/duration/iterations shortcuts, not both');
  }
  let scenarios = options.scenarios;
  if (!scenarios) {
    // k6's shortcut rules: iterations → shared-iterations; a duration → constant-vus; else one iteration.
    if (options.iterations !== undefined) {
      scenarios = { default: { executor: 'shared-iterations', vus: options.vus ?? 1, iterations: options.iterations } };
      if (options.duration !== undefined) scenarios.default.maxDuration = options.duration;
    } else if (options.duration !== undefined) {
      scenarios = { default: { executor: 'constant-vus', vus: options.vus ?? 1, duration: options.duration } };
    } else {
      scenarios = { default: { executor: 'shared-iterations', vus: 1, iterations: 1 } };
    }
  }
  return {
    options,
    scenarios: Object.entries(scenarios).map(([name, spec]) => scenarioPlan(name, spec)),
    setupTimeoutMs: parseDuration(options.setupTimeout ?? '60s', 'setupTimeout'),
    teardownTimeoutMs: parseDuration(options.teardownTimeout ?? '60s', 'teardownTimeout'),
    trendStats: options.summaryTrendStats ?? DEFAULT_TREND_STATS,
    batch: options.batch ?? 10,
    batchPerHost: options.batchPerHost ?? 6,
  };
}
