// The k6 runtime as one thread sees it: which stage the script is in, which VU this is, and the
// channel to the main thread. The k6 modules (shim/modules/*.js) read and write this state.
//
// The main thread imports the script once in the init stage only (to read `options` and the
// custom metrics it declares); every VU, and setup and teardown, run in a worker thread of their
// own that imports the script again, as k6 runs the init code once per VU.

import { receiveMessageOnPort } from 'node:worker_threads';

/** A k6 API the shim does not implement. Thrown, never ignored. */
export class NotImplemented extends Error {
  constructor(what) {
    super(`${what} is not implemented by the payonce k6 shim (loadtest/k6/shim): run the script with real k6, or add it to the shim`);
    this.name = 'NotImplemented';
  }
}

/** Thrown through the script's stack by `exec.test.abort()`: it ends the iteration and the VU. */
export class TestAborted extends Error {
  constructor(reason) {
    super(reason ? `test aborted: ${reason}` : 'test aborted');
    this.name = 'TestAborted';
  }
}

/** Samples are sent to the main thread in batches of this size (and at the end of each iteration). */
const SAMPLE_BATCH = 256;

/**
 * A synchronous call to the main thread: the worker posts a message, blocks in `Atomics.wait`
 * until the main thread has posted its answer and raised the flag, then takes the answer off the
 * port with `receiveMessageOnPort`. Fire-and-forget messages (metric samples) use the same port,
 * so the main thread sees everything a VU did in the order it did it.
 */
export class Channel {
  constructor(port, signal) {
    this.port = port;
    this.flag = new Int32Array(signal);
    this.pending = [];
  }

  /** Queues a metric sample; flushed in batches. */
  sample(metric, value, tags) {
    this.pending.push([metric, value, tags]);
    if (this.pending.length >= SAMPLE_BATCH) this.flush();
  }

  flush() {
    if (this.pending.length === 0) return;
    this.port.postMessage({ type: 'samples', samples: this.pending });
    this.pending = [];
  }

  /** Sends `message` and blocks until the main thread answers it. */
  call(message) {
    this.flush();
    Atomics.store(this.flag, 0, 0);
    this.port.postMessage(message);
    while (Atomics.load(this.flag, 0) === 0) Atomics.wait(this.flag, 0, 0);
    const reply = receiveMessageOnPort(this.port);
    if (!reply) throw new Error('shim: the main thread raised the flag without an answer');
    if (reply.message.error) throw new Error(reply.message.error);
    return reply.message;
  }
}

/** The state of this thread's VU. */
export const runtime = {
  /** 'init' while the script's top level runs, then 'setup', 'vu' or 'teardown'. */
  stage: 'init',
  /** `__ENV` of this VU (the process environment, `-e` flags and the scenario's `env`). */
  env: {},
  /** The channel to the main thread; null on the main thread, which only reads the init stage. */
  channel: null,
  /** Custom metrics declared by the script: name → { type, isTime }. */
  metrics: new Map(),
  /** This VU: ids and iteration counters as `k6/execution` reports them. */
  vu: { idInTest: 0, iterationInScenario: 0, iterationInInstance: 0 },
  /** The running scenario ({ name, executor, startTime, iterationInTest }), null outside VU code. */
  scenario: null,
  /** Tags put on every sample of this VU (the scenario's name and tags, the current group). */
  tags: {},
  /** The current group path ("" at the top, "::outer::inner" inside groups). */
  group: '',
  /** The default expected-status rule of `k6/http` (what counts as a failed request). */
  responseCallback: { statuses: [], ranges: [{ min: 200, max: 399 }] },
  /** The consolidated options (for `exec.test.options` and the batch limits). */
  options: {},
  /** When the test started (ms since the epoch). */
  testStart: Date.now(),
};

/** Throws unless the script is in one of `stages`; `what` names the API for the message. */
export function requireStage(what, ...stages) {
  if (!stages.includes(runtime.stage)) {
    const where = runtime.stage === 'init' ? 'the init context' : `${runtime.stage}()`;
    throw new Error(`${what} cannot be used in ${where} (k6 forbids it there too)`);
  }
}

/** Records one sample of `metric` with this VU's tags plus `tags`. */
export function emit(metric, value, tags) {
  if (!runtime.channel) throw new Error(`shim: metric ${metric} emitted outside a VU`);
  runtime.channel.sample(metric, value, { ...runtime.tags, group: runtime.group, ...tags });
}

/**
 * Wraps a k6 API object so that reading a member the shim does not implement throws instead of
 * returning `undefined`: a script must never silently get less than it asked for.
 */
export function strict(target, name) {
  return new Proxy(target, {
    get(object, property, receiver) {
      if (typeof property === 'symbol' || property in object) return Reflect.get(object, property, receiver);
      // Looked up by Promise resolution and by console.log / util.inspect, never by scripts.
      if (property === 'then' || property === 'toJSON' || property === 'inspect') return undefined;
      throw new NotImplemented(`${name}.${property}`);
    },
  });
}
