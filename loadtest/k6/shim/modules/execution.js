// The `k6/execution` module: who and where this VU is, and `test.abort()`.

import { runtime, requireStage, strict, TestAborted } from '../runtime.js';

function inVu(what) {
  requireStage(what, 'vu');
  return runtime.scenario;
}

const vu = strict(
  {
    get idInTest() {
      return runtime.vu.idInTest;
    },
    get idInInstance() {
      return runtime.vu.idInTest;
    },
    get iterationInInstance() {
      return inVu('exec.vu.iterationInInstance') && runtime.vu.iterationInInstance;
    },
    get iterationInScenario() {
      return inVu('exec.vu.iterationInScenario') && runtime.vu.iterationInScenario;
    },
  },
  'exec.vu',
);

const scenario = strict(
  {
    get name() {
      return inVu('exec.scenario.name').name;
    },
    get executor() {
      return inVu('exec.scenario.executor').executor;
    },
    get startTime() {
      return inVu('exec.scenario.startTime').startTime;
    },
    get iterationInTest() {
      return inVu('exec.scenario.iterationInTest').iterationInTest;
    },
    get iterationInInstance() {
      return inVu('exec.scenario.iterationInInstance').iterationInTest;
    },
  },
  'exec.scenario',
);

const instance = strict(
  {
    get currentTestRunDuration() {
      return Date.now() - runtime.testStart;
    },
  },
  'exec.instance',
);

const test = strict(
  {
    /** Stops the whole test now (exit code 108); the reason is printed. */
    abort(reason) {
      requireStage('exec.test.abort()', 'setup', 'vu', 'teardown');
      const text = reason === undefined ? '' : String(reason);
      runtime.channel.call({ type: 'abort', reason: text });
      throw new TestAborted(text);
    },
    get options() {
      return structuredClone(runtime.options);
    },
  },
  'exec.test',
);

export default strict({ vu, scenario, instance, test }, 'k6/execution');
