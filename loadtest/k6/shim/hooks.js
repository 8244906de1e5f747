// Module resolution for k6 scripts under Node: `k6`, `k6/http`, `k6/metrics` and `k6/execution`
// resolve to the shim's modules; any other k6 module (or a remote jslib import) is refused with a
// message that says so, instead of Node's "package not found".

const MODULES = {
  k6: './modules/k6.js',
  'k6/http': './modules/http.js',
  'k6/metrics': './modules/metrics.js',
  'k6/execution': './modules/execution.js',
};

export async function resolve(specifier, context, nextResolve) {
  if (Object.hasOwn(MODULES, specifier)) {
    return { url: new URL(MODULES[specifier], import.meta.url).href, shortCircuit: true };
  }
  if (specifier.startsWith('k6/') || /^https?:\/\//.test(specifier)) {
    throw new Error(
      `import "${specifier}" is not implemented by the payonce k6 shim (it provides ${Object.keys(MODULES).join(', ')}): ` +
        'run the script with real k6, or add the module to loadtest/k6/shim',
    );
  }
  return nextResolve(specifier, context);
}
