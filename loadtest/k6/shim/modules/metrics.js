// The `k6/metrics` module: Counter, Gauge, Rate, Trend.

import { runtime, emit, requireStage, strict } from '../runtime.js';

const NAME = /^[a-zA-Z_][a-zA-Z0-9_]{0,127}$/;

class Metric {
  constructor(type, name, isTime = false) {
    requireStage(`new ${this.constructor.name}()`, 'init');
    if (typeof name !== 'string' || !NAME.test(name)) {
      throw new Error(`invalid metric name ${JSON.stringify(name)}: letters, digits and underscores, not starting with a digit`);
    }
    const declared = runtime.metrics.get(name);
    if (declared && (declared.type !== type || declared.isTime !== Boolean(isTime))) {
      throw new Error(`metric ${name} is already declared as a ${declared.type}${declared.isTime ? ' of times' : ''}`);
    }
    runtime.metrics.set(name, { type, isTime: Boolean(isTime) });
    this.name = name;
    this.type = type;
  }

  /** Adds one sample with optional extra tags. */
  add(value, tags = {}) {
    requireStage(`${this.name}.add()`, 'setup', 'vu', 'teardown');
    const number = this.type === 'rate' ? (value ? 1 : 0) : Number(value);
    if (!Number.isFinite(number)) throw new TypeError(`${this.name}.add(${value}): not a number`);
    emit(this.name, number, tags);
    return true;
  }
}

export class Counter extends Metric {
  constructor(name, isTime) {
    super('counter', name, isTime);
  }
}

export class Gauge extends Metric {
  constructor(name, isTime) {
    super('gauge', name, isTime);
  }
}

export class Rate extends Metric {
  constructor(name) {
    super('rate', name, false);
  }
}

export class Trend extends Metric {
  constructor(name, isTime) {
    super('trend', name, isTime);
  }
}

export default strict({ Counter, Gauge, Rate, Trend }, 'k6/metrics');
