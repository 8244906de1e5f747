// The main thread: reads the script's options, starts one worker thread per VU, runs setup(), the
// scenarios and teardown() in k6's order, carries out every HTTP request, collects the metrics,
// and decides the exit code.
//
// Timeline (as in k6): init every VU → setup() → scenarios (each at its startTime; on its end a
// VU finishes the iteration it is in, for up to gracefulStop) → teardown() → summary.

import { register } from 'node:module';
import { MessageChannel, Worker } from 'node:worker_threads';
import { writeFileSync } from 'node:fs';

import { consolidate } from './options.js';
import { runtime } from './runtime.js';
import { Registry } from './sinks.js';
import { renderSummary, summaryJson } from './summary.js';
import { evaluate, parseThresholds } from './thresholds.js';
import { Transport } from './transport.js';
import { formatDuration } from './duration.js';

/** k6's exit codes. */
export const EXIT = {
  ok: 0,
  thresholdsFailed: 99,
  setupTimeout: 100,
  teardownTimeout: 101,
  invalidConfig: 104,
  scriptException: 107,
  aborted: 108,
};

const VU_SCRIPT = new URL('./vu.js', import.meta.url);
const STOP = 0;
/** How often `abortOnFail` thresholds are looked at, as in k6. */
const ABORT_EVAL_MS = 2000;
/** Stack traces printed in full; later iteration errors are only counted (per first line). */
const ERRORS_SHOWN = 5;

/** A VU's (or setup's, or teardown's) worker thread and its end of the channel. */
class VuThread {
  constructor(engine, role, workerData) {
    const { port1, port2 } = new MessageChannel();
    this.role = role;
    this.vuId = workerData.vuId;
    this.flag = new Int32Array(new SharedArrayBuffer(4));
    this.port = port1;
    this.done = false;
    this.result = undefined;
    let markReady;
    this.ready = new Promise((resolve) => (markReady = resolve));
    this.markReady = markReady;
    this.worker = new Worker(VU_SCRIPT, {
      workerData: { ...workerData, role, port: port2, signal: this.flag.buffer },
      transferList: [port2],
    });
    this.exited = new Promise((resolve) => this.worker.once('exit', resolve)).then(() => {
      this.port.close();
      this.markReady(false); // a worker that died during init is "ready" to be waited for no more
    });
    this.port.on('message', (message) => engine.handle(this, message));
    this.worker.on('error', (error) => engine.fatal(role, error.stack ?? String(error)));
  }

  /** Answers the worker's pending synchronous call. */
  reply(message) {
    this.port.postMessage(message);
    Atomics.store(this.flag, 0, 1);
    Atomics.notify(this.flag, 0);
  }

  /** Stops the thread now, wherever it is. Returns whether it was still running. */
  terminate() {
    if (this.done) return false;
    this.done = true;
    this.worker.terminate();
    return true;
  }
}

export class Engine {
  /**
   * @param scriptPath the k6 script
   * @param env `__ENV` (process environment plus `-e` flags)
   * @param overrides command-line `vus` / `duration` / `iterations`
   * @param progress whether to show a live progress line on stderr
   * @param summaryExport where to write the summary as JSON, if anywhere
   */
  constructor({ scriptUrl, env, overrides, progress, summaryExport }) {
    this.scriptUrl = scriptUrl;
    this.env = env;
    this.overrides = overrides;
    this.progress = progress;
    this.summaryExport = summaryExport;
    this.nextVuId = 1;
    this.aborted = null;
    this.scriptErrors = [];
    this.iterationErrors = new Map();
    this.interrupted = 0;
    this.activeVus = 0;
  }

  /** Runs the whole test; resolves with the exit code. */
  async run() {
    // Init on the main thread: only to read the options and the metrics the script declares.
    globalThis.__ENV = this.env;
    globalThis.__VU = 0; // as in k6's first init, which only reads the options
    globalThis.__ITER = 0;
    register(new URL('./hooks.js', import.meta.url));
    let script;
    try {
      script = await import(this.scriptUrl);
    } catch (error) {
      console.error(`ERRO the script failed in the init context: ${error.stack ?? error}`);
      return EXIT.scriptException;
    }
    try {
      if (typeof script.handleSummary === 'function') throw new Error('handleSummary() is not implemented by the payonce k6 shim');
      this.plan = consolidate(script.options, this.overrides);
      this.registry = new Registry(runtime.metrics);
      this.thresholds = parseThresholds(this.plan.options.thresholds, this.registry);
    } catch (error) {
      console.error(`ERRO invalid options: ${error.message}`);
      return EXIT.invalidConfig;
    }
    this.transport = new Transport(this.registry, this.plan);
    this.printHeader();
    try {
      return await this.execute();
    } finally {
      this.transport.close();
    }
  }

  async execute() {
    const shared = { scriptUrl: this.scriptUrl, env: this.env, options: this.plan.options };
    for (const scenario of this.plan.scenarios) {
      scenario.control = new Int32Array(new SharedArrayBuffer(8));
      scenario.threads = [];
      for (let i = 0; i < scenario.vus; i += 1) {
        const data = { ...shared, vuId: this.nextVuId++, scenario: { ...scenario, control: undefined, threads: undefined }, control: scenario.control.buffer };
        scenario.threads.push(new VuThread(this, 'vu', data));
      }
    }
    const vuThreads = this.plan.scenarios.flatMap((s) => s.threads);
    const readiness = await Promise.all(vuThreads.map((t) => t.ready));
    if (this.scriptErrors.length > 0 || readiness.includes(false)) {
      vuThreads.forEach((t) => t.terminate());
      this.printScriptErrors();
      return EXIT.scriptException;
    }
    this.registry.add('vus_max', vuThreads.length, {});

    const setup = await this.transient('setup', undefined, this.plan.setupTimeoutMs);
    if (setup.timedOut) {
      vuThreads.forEach((t) => t.terminate());
      console.error(`ERRO setup() did not finish within ${formatDuration(this.plan.setupTimeoutMs)}`);
      return EXIT.setupTimeout;
    }
    if (this.scriptErrors.length > 0) vuThreads.forEach((t) => t.terminate());

    this.runStart = Date.now();
    const ticker = this.startTicker();
    if (this.scriptErrors.length === 0 && !this.aborted) {
      await Promise.all(this.plan.scenarios.map((scenario) => this.runScenario(scenario, setup.data)));
    }
    clearInterval(ticker);
    this.runEnd = Date.now();
    if (this.progress) process.stderr.write('\n');

    let teardownTimedOut = false;
    const setupFailed = this.scriptErrors.some((e) => e.stage === 'setup');
    if (!setupFailed && this.aborted?.stage !== 'teardown') {
      // teardown() runs after an abort too, so that it can clean up (e.g. clear injected faults).
      teardownTimedOut = (await this.transient('teardown', setup.data, this.plan.teardownTimeoutMs)).timedOut;
    }
    return this.finish(teardownTimedOut);
  }

  /** Runs setup() or teardown() in a worker of its own. */
  async transient(role, data, timeoutMs) {
    const thread = new VuThread(this, role, { scriptUrl: this.scriptUrl, env: this.env, options: this.plan.options, vuId: 0 });
    if (await thread.ready) thread.reply({ data, testStart: this.runStart ?? Date.now() });
    let timer;
    const timedOut = await Promise.race([
      thread.exited.then(() => false),
      new Promise((resolve) => (timer = setTimeout(() => resolve(true), timeoutMs))),
    ]);
    clearTimeout(timer);
    if (timedOut) thread.terminate();
    return { data: thread.result, timedOut };
  }

  /** Starts a scenario's VUs at its startTime and waits until the last one has stopped. */
  async runScenario(scenario, data) {
    if (scenario.startTimeMs > 0) await new Promise((resolve) => setTimeout(resolve, scenario.startTimeMs));
    if (this.aborted) return;
    this.setActiveVus(this.activeVus + scenario.vus);
    for (const thread of scenario.threads) thread.reply({ data, testStart: this.runStart });
    let hardStop;
    const stop = setTimeout(() => {
      Atomics.store(scenario.control, STOP, 1);
      hardStop = setTimeout(() => {
        for (const thread of scenario.threads) if (thread.terminate()) this.interrupted += 1;
      }, scenario.gracefulStopMs);
    }, scenario.durationMs);
    await Promise.all(scenario.threads.map((t) => t.exited.then(() => this.setActiveVus(this.activeVus - 1))));
    clearTimeout(stop);
    clearTimeout(hardStop);
  }

  /** The `vus` gauge is sampled when VUs start and then once a second, as k6 does (not on the way down to 0). */
  setActiveVus(count) {
    const rising = count > this.activeVus;
    this.activeVus = count;
    if (rising) this.registry.add('vus', count, {});
  }

  /** A message from a worker. */
  handle(thread, message) {
    switch (message.type) {
      case 'samples':
        for (const [metric, value, tags] of message.samples) this.registry.add(metric, value, tags);
        return;
      case 'http':
        this.transport.execute(message.requests, message.batch, message.tags).then(
          (responses) => thread.reply({ responses }),
          (error) => thread.reply({ error: error.message }),
        );
        return;
      case 'ready':
        thread.markReady(true);
        return; // answered when the VU's scenario starts
      case 'result':
        thread.result = message.data;
        thread.reply({});
        return;
      case 'error': {
        const first = message.error.split('\n')[0];
        const seen = this.iterationErrors.get(first) ?? 0;
        this.iterationErrors.set(first, seen + 1);
        if (seen === 0 && this.iterationErrors.size <= ERRORS_SHOWN) {
          this.clearProgress();
          console.error(`ERRO VU ${message.vu}, iteration ${message.iteration}: ${message.error}`);
        }
        return;
      }
      case 'abort':
        thread.reply({});
        this.abort(message.reason, thread.role === 'vu' ? 'default' : thread.role, EXIT.aborted);
        return;
      case 'fatal':
        thread.reply({});
        this.fatal(message.stage, message.error);
        return;
      case 'done':
        thread.done = true;
        thread.reply({});
        return;
      default:
        throw new Error(`shim: unknown message ${message.type} from a worker`);
    }
  }

  /** An exception in the init context, setup() or teardown(): the run fails with 107. */
  fatal(stage, error) {
    this.clearProgress();
    this.scriptErrors.push({ stage, error });
    console.error(`ERRO ${stage === 'init' ? 'the init context' : `${stage}()`} threw: ${error}`);
  }

  /** Stops the test now (exec.test.abort(), or an abortOnFail threshold). */
  abort(reason, stage, code) {
    if (this.aborted) return;
    this.aborted = { reason, stage, code };
    this.clearProgress();
    console.error(`ERRO test aborted in ${stage}${reason ? `: ${reason}` : ''}`);
    for (const scenario of this.plan.scenarios) {
      Atomics.store(scenario.control, STOP, 1);
      for (const thread of scenario.threads) if (thread.terminate()) this.interrupted += 1;
    }
  }

  /** Progress on stderr, and the evaluation of `abortOnFail` thresholds. */
  startTicker() {
    let lastAbortCheck = Date.now();
    let lastVusSample = 0;
    return setInterval(() => {
      const elapsed = Date.now() - this.runStart;
      if (elapsed - lastVusSample >= 1000 && this.activeVus > 0) {
        lastVusSample = elapsed;
        this.registry.add('vus', this.activeVus, {});
      }
      if (this.progress) {
        const iterations = this.registry.metrics.get('iterations').sink.count;
        const requests = this.registry.metrics.get('http_reqs').sink.count;
        process.stderr.write(
          `\rrunning (${formatDuration(elapsed)}), ${this.activeVus} VUs, ${iterations} iterations, ${requests} requests, ${this.interrupted} interrupted   `,
        );
      }
      if (Date.now() - lastAbortCheck >= ABORT_EVAL_MS) {
        lastAbortCheck = Date.now();
        for (const threshold of this.thresholds) {
          if (!threshold.abortOnFail || elapsed < threshold.delayAbortEvalMs) continue;
          if (!evaluate(threshold, elapsed / 1000).passed) {
            this.abort(`threshold ${threshold.key} '${threshold.source}' failed`, 'thresholds', EXIT.thresholdsFailed);
          }
        }
      }
    }, 250);
  }

  clearProgress() {
    if (this.progress) process.stderr.write('\r\x1b[K');
  }

  printHeader() {
    const lines = [`  execution: local (payonce k6 shim, Node.js ${process.version})`, `     script: ${this.scriptUrl}`, '', '  scenarios:'];
    for (const s of this.plan.scenarios) {
      const what =
        s.executor === 'constant-vus'
          ? `${s.vus} looping VUs for ${formatDuration(s.durationMs)}`
          : `${s.iterations} ${s.executor === 'per-vu-iterations' ? 'iterations for each of' : 'iterations shared among'} ${s.vus} VUs (maxDuration: ${formatDuration(s.durationMs)})`;
      lines.push(`  * ${s.name}: ${what} (exec: ${s.exec}, startTime: ${formatDuration(s.startTimeMs)}, gracefulStop: ${formatDuration(s.gracefulStopMs)})`);
    }
    console.log(`${lines.join('\n')}\n`);
  }

  printScriptErrors() {
    for (const { stage, error } of this.scriptErrors) console.error(`ERRO in ${stage}: ${error.split('\n')[0]}`);
  }

  /** Prints the summary and picks the exit code. */
  finish(teardownTimedOut) {
    const seconds = Math.max((this.runEnd - this.runStart) / 1000, 1e-3);
    console.log(renderSummary(this.registry, this.thresholds, seconds, this.plan.trendStats));
    const iterations = this.registry.metrics.get('iterations').sink.count;
    console.log(`\n     run: ${formatDuration(seconds * 1000)}, ${iterations} complete and ${this.interrupted} interrupted iterations`);
    for (const [first, count] of this.iterationErrors) console.log(`     ERRORS: ${count} iteration(s) threw: ${first}`);
    if (this.summaryExport) {
      writeFileSync(this.summaryExport, `${JSON.stringify(summaryJson(this.registry, this.thresholds, seconds, this.plan.trendStats), null, 2)}\n`);
    }

    const failed = this.thresholds.filter((t) => !evaluate(t, seconds).passed);
    let code = EXIT.ok;
    let verdict = 'passed';
    if (this.aborted) {
      code = this.aborted.code;
      verdict = `ABORTED in ${this.aborted.stage}${this.aborted.reason ? `: ${this.aborted.reason}` : ''}`;
    } else if (teardownTimedOut) {
      code = EXIT.teardownTimeout;
      verdict = 'FAILED: teardown() timed out';
    } else if (this.scriptErrors.length > 0) {
      code = EXIT.scriptException;
      verdict = `FAILED: ${this.scriptErrors.map((e) => `${e.stage}() threw`).join(', ')}`;
    } else if (failed.length > 0) {
      code = EXIT.thresholdsFailed;
      verdict = `FAILED: ${failed.length} threshold(s) crossed: ${failed.map((t) => `${t.key} '${t.source}'`).join(', ')}`;
    }
    console.log(`\n     result: ${verdict} (exit code ${code})\n`);
    return code;
  }
}
