#!/usr/bin/env node
// Runs a k6 script under Node.js: `node loadtest/k6/shim/run.js [flags] SCRIPT.js`.
// See loadtest/README.md ("The k6 shim") for what it implements and how it stays faithful to k6.

import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

import { EXIT, Engine } from './engine.js';

const USAGE = `usage: node loadtest/k6/shim/run.js [flags] SCRIPT.js

Runs a k6 script with the payonce k6 shim (k6's exit codes: 99 thresholds crossed, 104 invalid
options, 107 script exception, 108 aborted by the script).

flags (a subset of \`k6 run\`'s):
  -e, --env KEY=VALUE      set __ENV.KEY (repeatable; the process environment is there too)
  -u, --vus N              VUs (with --duration/--iterations, replaces the script's scenarios)
  -d, --duration D         e.g. 30s, 1m30s
  -i, --iterations N       total iterations shared by the VUs
  -q, --quiet              no progress line
      --progress           a progress line even when stderr is not a terminal
      --summary-export F   also write the summary as JSON to F
  -h, --help`;

function parseArgs(argv) {
  const args = { env: {}, overrides: {}, progress: process.stderr.isTTY, summaryExport: null, script: null };
  const value = (flag) => {
    const next = argv.shift();
    if (next === undefined) throw new Error(`${flag} needs a value`);
    return next;
  };
  const count = (flag, text) => {
    if (!/^[1-9]\d*$/.test(text)) throw new Error(`${flag} needs a positive integer, got ${JSON.stringify(text)}`);
    return Number(text);
  };
  while (argv.length > 0) {
    const arg = argv.shift();
    switch (arg) {
      case '-e':
      case '--env': {
        const pair = value(arg);
        const eq = pair.indexOf('=');
        if (eq < 1) throw new Error(`${arg} needs KEY=VALUE, got ${JSON.stringify(pair)}`);
        args.env[pair.slice(0, eq)] = pair.slice(eq + 1);
        break;
      }
      case '-u':
      case '--vus':
        args.overrides.vus = count(arg, value(arg));
        break;
      case '-d':
      case '--duration':
        args.overrides.duration = value(arg);
        break;
      case '-i':
      case '--iterations':
        args.overrides.iterations = count(arg, value(arg));
        break;
      case '-q':
      case '--quiet':
        args.progress = false;
        break;
      case '--progress':
        args.progress = true;
        break;
      case '--summary-export':
        args.summaryExport = value(arg);
        break;
      case '-h':
      case '--help':
        console.log(USAGE);
        process.exit(0);
        break;
      default:
        if (arg.startsWith('-')) throw new Error(`unknown flag ${arg} (the shim implements only the flags listed in --help)`);
        if (args.script) throw new Error(`one script at a time (got ${args.script} and ${arg})`);
        args.script = arg;
    }
  }
  if (!args.script) throw new Error('which script? (a path to a k6 script)');
  return args;
}

let args;
try {
  args = parseArgs(process.argv.slice(2));
  if (!existsSync(args.script)) throw new Error(`no such script: ${args.script}`);
} catch (error) {
  console.error(`${error.message}\n\n${USAGE}`);
  process.exit(EXIT.invalidConfig);
}

const engine = new Engine({
  scriptUrl: pathToFileURL(resolve(args.script)).href,
  // As `k6 run` does by default, __ENV holds the process environment; -e flags win.
  env: { ...process.env, ...args.env },
  overrides: args.overrides,
  progress: args.progress,
  summaryExport: args.summaryExport,
});
process.exitCode = await engine.run();
