// k6 thresholds: `{ 'metric{tag:value}': ['p(95)<500', { threshold: 'rate<0.01', abortOnFail: true }] }`.
// Parsed (and checked against the declared metrics) before the test starts, evaluated at the end,
// and every two seconds for those with `abortOnFail`.

import { parseDuration } from './duration.js';
import { supportsAggregation } from './sinks.js';

const EXPRESSION = /^\s*(avg|min|max|med|count|rate|value|p\(\d+(?:\.\d+)?\))\s*(<=|>=|===|==|!=|<|>)\s*(-?\d+(?:\.\d+)?)\s*$/;
const KEY = /^([a-zA-Z_][a-zA-Z0-9_]*)(?:\{(.*)\})?$/;
const THRESHOLD_FIELDS = new Set(['threshold', 'abortOnFail', 'delayAbortEval']);

const COMPARE = {
  '<': (a, b) => a < b,
  '<=': (a, b) => a <= b,
  '>': (a, b) => a > b,
  '>=': (a, b) => a >= b,
  '==': (a, b) => a === b,
  '===': (a, b) => a === b,
  '!=': (a, b) => a !== b,
};

/** `name{a:1, b:2}` → { name, tags: { a: '1', b: '2' } }. */
function parseKey(key) {
  const match = KEY.exec(key.trim());
  if (!match) throw new Error(`threshold metric ${JSON.stringify(key)}: expected name or name{tag:value,…}`);
  const tags = {};
  if (match[2] !== undefined) {
    for (const pair of match[2].split(',')) {
      const colon = pair.indexOf(':');
      if (colon < 1) throw new Error(`threshold metric ${JSON.stringify(key)}: tag filter ${JSON.stringify(pair)} is not tag:value`);
      tags[pair.slice(0, colon).trim()] = pair.slice(colon + 1).trim().replace(/^(["'])(.*)\1$/, '$2');
    }
  }
  return { name: match[1], tags };
}

/** Every threshold of `options.thresholds`, checked against the metrics in `registry`. */
export function parseThresholds(option, registry) {
  const thresholds = [];
  for (const [key, list] of Object.entries(option ?? {})) {
    const { name, tags } = parseKey(key);
    const metric = registry.metrics.get(name);
    if (!metric) {
      throw new Error(
        `threshold on ${JSON.stringify(key)}: no metric ${name} (the shim produces ${[...registry.metrics.keys()].join(', ')})`,
      );
    }
    const sink = Object.keys(tags).length ? registry.submetric(name, tags).sink : metric.sink;
    for (const item of Array.isArray(list) ? list : [list]) {
      const spec = typeof item === 'string' ? { threshold: item } : item;
      for (const field of Object.keys(spec ?? {})) {
        if (!THRESHOLD_FIELDS.has(field)) throw new Error(`threshold on ${key}: unknown field ${field}`);
      }
      const match = EXPRESSION.exec(spec.threshold ?? '');
      if (!match) throw new Error(`threshold on ${key}: cannot read ${JSON.stringify(spec.threshold)} (e.g. "p(95)<500", "rate<0.01", "count==0")`);
      const [, aggregation, operator, bound] = match;
      if (!supportsAggregation(metric.type, aggregation)) {
        throw new Error(`threshold on ${key}: ${aggregation} does not apply to a ${metric.type}`);
      }
      thresholds.push({
        key,
        source: spec.threshold.trim(),
        metric,
        sink,
        aggregation,
        compare: COMPARE[operator],
        bound: Number(bound),
        abortOnFail: Boolean(spec.abortOnFail),
        delayAbortEvalMs: spec.delayAbortEval === undefined ? 0 : parseDuration(spec.delayAbortEval, 'delayAbortEval'),
      });
    }
  }
  return thresholds;
}

/**
 * Evaluates one threshold: { passed, value, empty }. As in current k6, a metric without samples
 * is evaluated with zero values (so `count>0` fails); `empty` lets the summary say so.
 */
export function evaluate(threshold, seconds) {
  const value = threshold.sink.get(threshold.aggregation, seconds);
  return { passed: threshold.compare(value, threshold.bound), value, empty: threshold.sink.samples === 0 };
}
