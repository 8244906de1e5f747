// Where samples end up on the main thread: one sink per metric (and per submetric, a metric
// filtered by tags, e.g. `http_req_duration{kind:new}`), aggregated as k6 aggregates them.

/** The built-in metrics the shim produces. A threshold on any other built-in k6 metric is refused. */
export const BUILTIN_METRICS = {
  checks: { type: 'rate', isTime: false },
  group_duration: { type: 'trend', isTime: true },
  http_req_blocked: { type: 'trend', isTime: true },
  http_req_connecting: { type: 'trend', isTime: true },
  http_req_duration: { type: 'trend', isTime: true },
  http_req_failed: { type: 'rate', isTime: false },
  http_req_waiting: { type: 'trend', isTime: true },
  http_reqs: { type: 'counter', isTime: false },
  iteration_duration: { type: 'trend', isTime: true },
  iterations: { type: 'counter', isTime: false },
  vus: { type: 'gauge', isTime: false },
  vus_max: { type: 'gauge', isTime: false },
};

/** Which aggregations each metric type supports, as in k6 thresholds. */
const AGGREGATIONS = {
  counter: ['count', 'rate'],
  gauge: ['value'],
  rate: ['rate'],
  trend: ['avg', 'min', 'max', 'med'], // and p(N)
};

class CounterSink {
  count = 0;
  samples = 0;
  add(value) {
    this.count += value;
    this.samples += 1;
  }
  get(aggregation, seconds) {
    if (aggregation === 'count') return this.count;
    return seconds > 0 ? this.count / seconds : 0; // 'rate': per second over the run
  }
}

class GaugeSink {
  value = 0;
  min = Infinity;
  max = -Infinity;
  samples = 0;
  add(value) {
    this.value = value;
    this.min = Math.min(this.min, value);
    this.max = Math.max(this.max, value);
    this.samples += 1;
  }
  get(aggregation) {
    return aggregation === 'min' ? this.min : aggregation === 'max' ? this.max : this.value;
  }
}

class RateSink {
  trues = 0;
  samples = 0;
  add(value) {
    if (value) this.trues += 1;
    this.samples += 1;
  }
  get() {
    return this.samples === 0 ? 0 : this.trues / this.samples;
  }
}

class TrendSink {
  values = [];
  sum = 0;
  sorted = true;
  get samples() {
    return this.values.length;
  }
  add(value) {
    if (this.values.length > 0 && value < this.values[this.values.length - 1]) this.sorted = false;
    this.values.push(value);
    this.sum += value;
  }
  /** The p-th percentile (0..100), interpolated between neighbours as k6 does. */
  percentile(p) {
    if (this.values.length === 0) return 0;
    if (!this.sorted) {
      this.values.sort((a, b) => a - b);
      this.sorted = true;
    }
    const at = (p / 100) * (this.values.length - 1);
    const low = this.values[Math.floor(at)];
    const high = this.values[Math.ceil(at)];
    return low + (high - low) * (at - Math.floor(at));
  }
  get(aggregation) {
    if (this.values.length === 0) return 0;
    switch (aggregation) {
      case 'avg':
        return this.sum / this.values.length;
      case 'min':
        return this.percentile(0);
      case 'max':
        return this.percentile(100);
      case 'med':
        return this.percentile(50);
      case 'count':
        return this.values.length;
    }
    const p = /^p\((\d+(?:\.\d+)?)\)$/.exec(aggregation);
    if (p) return this.percentile(Number(p[1]));
    throw new Error(`trend aggregation ${aggregation}`);
  }
}

const SINKS = { counter: CounterSink, gauge: GaugeSink, rate: RateSink, trend: TrendSink };

/** Whether `aggregation` ("p(95)", "count", …) applies to a metric of `type`. */
export function supportsAggregation(type, aggregation) {
  if (type === 'trend' && /^p\(\d+(\.\d+)?\)$/.test(aggregation)) {
    const p = Number(aggregation.slice(2, -1));
    return p >= 0 && p <= 100;
  }
  return AGGREGATIONS[type].includes(aggregation);
}

/** Every metric of the run, its submetrics, and the pass/fail tally of each named check. */
export class Registry {
  constructor(custom) {
    /** name → { name, type, isTime, sink, submetrics: [{ key, tags, sink }] } */
    this.metrics = new Map();
    /** group path → check name → { passes, fails } */
    this.checks = new Map();
    for (const [name, spec] of Object.entries(BUILTIN_METRICS)) this.define(name, spec);
    for (const [name, spec] of custom) this.define(name, spec);
  }

  define(name, { type, isTime }) {
    const known = this.metrics.get(name);
    if (known) {
      if (known.type !== type) throw new Error(`metric ${name} is a built-in ${known.type}; it cannot be declared as a ${type}`);
      return known;
    }
    const metric = { name, type, isTime, sink: new SINKS[type](), submetrics: [] };
    this.metrics.set(name, metric);
    return metric;
  }

  /** The submetric of `name` for samples carrying all of `tags` (created on first use). */
  submetric(name, tags) {
    const metric = this.metrics.get(name);
    const key = `${name}{${Object.entries(tags).map(([k, v]) => `${k}:${v}`).join(',')}}`;
    let sub = metric.submetrics.find((s) => s.key === key);
    if (!sub) {
      sub = { key, tags, sink: new SINKS[metric.type]() };
      metric.submetrics.push(sub);
    }
    return sub;
  }

  add(name, value, tags) {
    const metric = this.metrics.get(name);
    if (!metric) throw new Error(`a sample of the undeclared metric ${name} (declare metrics in the init context)`);
    metric.sink.add(value);
    for (const sub of metric.submetrics) {
      if (Object.entries(sub.tags).every(([k, v]) => tags[k] === v)) sub.sink.add(value);
    }
    if (name === 'checks') {
      const group = tags.group ?? '';
      if (!this.checks.has(group)) this.checks.set(group, new Map());
      const tally = this.checks.get(group);
      const counts = tally.get(tags.check) ?? { passes: 0, fails: 0 };
      if (value) counts.passes += 1;
      else counts.fails += 1;
      tally.set(tags.check, counts);
    }
  }
}
