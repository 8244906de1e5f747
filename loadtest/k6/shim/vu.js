// A worker thread: one VU of a scenario, or the transient VU that runs setup() or teardown().
//
// It imports the script (the init stage, once per VU as in k6), tells the main thread it is
// ready, waits for the start signal (which carries setup()'s data), then runs its function:
// iterations until the scenario says stop, or setup/teardown once.

import { register } from 'node:module';
import { workerData } from 'node:worker_threads';

import { Channel, NotImplemented, TestAborted, runtime } from './runtime.js';

const { role, scriptUrl, env, vuId, scenario, control, port, signal, options } = workerData;
register(new URL('./hooks.js', import.meta.url));

const STOP = 0;
const COUNTER = 1;
const flags = control ? new Int32Array(control) : null;

runtime.channel = new Channel(port, signal);
runtime.env = env;
runtime.options = options;
runtime.vu.idInTest = vuId;
globalThis.__ENV = env;
Object.defineProperty(globalThis, '__VU', { get: () => runtime.vu.idInTest });
Object.defineProperty(globalThis, '__ITER', { get: () => runtime.vu.iterationInScenario });

/** Runs an exported function synchronously; an async one is refused rather than not awaited. */
function call(fn, data) {
  const result = fn(data);
  if (result && typeof result.then === 'function') throw new NotImplemented('an async exported function');
  return result;
}

/** What to tell the main thread about an exception thrown by the script. */
function describe(error) {
  return error instanceof Error ? error.stack ?? error.message : String(error);
}

async function main() {
  let script;
  try {
    script = await import(scriptUrl);
  } catch (error) {
    runtime.channel.call({ type: 'fatal', stage: 'init', error: describe(error) });
    return;
  }
  const { data: dataJson, testStart } = runtime.channel.call({ type: 'ready' });
  runtime.testStart = testStart;
  const data = dataJson === undefined ? undefined : JSON.parse(dataJson);

  if (role === 'setup' || role === 'teardown') {
    runtime.stage = role;
    try {
      const result = typeof script[role] === 'function' ? call(script[role], data) : undefined;
      runtime.channel.call({ type: 'result', data: result === undefined ? undefined : JSON.stringify(result) });
    } catch (error) {
      if (!(error instanceof TestAborted)) runtime.channel.call({ type: 'fatal', stage: role, error: describe(error) });
    }
    return;
  }

  const fn = script[scenario.exec];
  if (typeof fn !== 'function') {
    runtime.channel.call({ type: 'fatal', stage: 'init', error: `scenario ${scenario.name}: the script exports no function ${scenario.exec}` });
    return;
  }
  runtime.stage = 'vu';
  runtime.env = { ...env, ...scenario.env };
  globalThis.__ENV = runtime.env;
  runtime.tags = { scenario: scenario.name, ...scenario.tags };
  runtime.scenario = { name: scenario.name, executor: scenario.executor, startTime: scenario.startTimeMs, iterationInTest: 0 };
  for (let iteration = 0; ; iteration += 1) {
    if (Atomics.load(flags, STOP)) break;
    if (scenario.executor === 'per-vu-iterations' && iteration >= scenario.iterations) break;
    const number = Atomics.add(flags, COUNTER, 1);
    if (scenario.executor === 'shared-iterations' && number >= scenario.iterations) break;
    runtime.vu.iterationInScenario = iteration;
    runtime.vu.iterationInInstance = iteration;
    runtime.scenario.iterationInTest = number;
    runtime.group = '';
    const started = performance.now();
    try {
      call(fn, data);
    } catch (error) {
      if (error instanceof TestAborted) break;
      runtime.channel.flush();
      port.postMessage({ type: 'error', error: describe(error), vu: vuId, iteration });
    }
    runtime.group = '';
    runtime.channel.sample('iteration_duration', performance.now() - started, runtime.tags);
    runtime.channel.sample('iterations', 1, runtime.tags);
    runtime.channel.flush();
  }
  runtime.channel.call({ type: 'done' });
}

await main();
port.close();
