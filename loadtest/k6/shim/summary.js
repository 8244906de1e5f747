// The end-of-test summary, laid out like k6's: checks, then every metric with its submetrics
// (a threshold's ✓/✗ in front of its metric), then each threshold with the value it was judged on.

import { formatDuration } from './duration.js';
import { evaluate } from './thresholds.js';

function formatNumber(value) {
  if (Number.isInteger(value)) return String(value);
  const magnitude = Math.abs(value);
  return String(Number(value.toFixed(magnitude >= 100 ? 1 : magnitude >= 1 ? 2 : 4)));
}

function formatValue(metric, value) {
  return metric.isTime ? formatDuration(value) : formatNumber(value);
}

/** The figures of one sink, as shown after the dots. */
function describeSink(metric, sink, seconds, trendStats) {
  switch (metric.type) {
    case 'counter':
      return `${formatValue(metric, sink.count).padEnd(8)} ${formatNumber(sink.get('rate', seconds))}/s`;
    case 'gauge':
      return sink.samples === 0
        ? '0'
        : `${formatValue(metric, sink.value).padEnd(8)} min=${formatValue(metric, sink.min)} max=${formatValue(metric, sink.max)}`;
    case 'rate': {
      const percent = `${(sink.get() * 100).toFixed(2)}%`;
      return `${percent.padEnd(8)} ✓ ${String(sink.trues).padEnd(8)} ✗ ${sink.samples - sink.trues}`;
    }
    case 'trend':
      return trendStats.map((stat) => `${stat}=${stat === 'count' ? sink.samples : formatValue(metric, sink.get(stat))}`).join(' ');
  }
  throw new Error(`metric type ${metric.type}`);
}

/** Metrics without samples are left out (as k6 does), unless a threshold names them. */
function shown(metric, thresholds) {
  return metric.sink.samples > 0 || thresholds.some((t) => t.metric === metric);
}

/**
 * Renders the summary.
 * @param registry the run's metrics
 * @param thresholds the parsed thresholds
 * @param seconds the run's length (for counter rates)
 * @param trendStats the trend columns (`summaryTrendStats`)
 */
export function renderSummary(registry, thresholds, seconds, trendStats) {
  const lines = [''];
  for (const [group, checks] of registry.checks) {
    const depth = group ? group.split('::').length - 1 : 0;
    const indent = '     ' + '  '.repeat(depth);
    if (group) lines.push(`${indent}█ ${group.split('::').pop()}`, '');
    for (const [name, { passes, fails }] of checks) {
      lines.push(`${indent}${fails === 0 ? '✓' : '✗'} ${name}`);
      if (fails > 0) {
        const percent = Math.floor((passes / (passes + fails)) * 100);
        lines.push(`${indent} ↳  ${percent}% — ✓ ${passes} / ✗ ${fails}`);
      }
    }
    lines.push('');
  }

  const rows = [];
  const metrics = [...registry.metrics.values()].filter((m) => shown(m, thresholds)).sort((a, b) => a.name.localeCompare(b.name));
  for (const metric of metrics) {
    const own = thresholds.filter((t) => t.sink === metric.sink);
    const mark = own.length === 0 ? ' ' : own.every((t) => evaluate(t, seconds).passed) ? '✓' : '✗';
    rows.push({ mark, label: metric.name, text: describeSink(metric, metric.sink, seconds, trendStats) });
    for (const sub of metric.submetrics) {
      const subThresholds = thresholds.filter((t) => t.sink === sub.sink);
      const subMark = subThresholds.length === 0 ? ' ' : subThresholds.every((t) => evaluate(t, seconds).passed) ? '✓' : '✗';
      const label = `  { ${Object.entries(sub.tags).map(([k, v]) => `${k}:${v}`).join(', ')} }`;
      rows.push({ mark: subMark, label, text: describeSink(metric, sub.sink, seconds, trendStats) });
    }
  }
  const width = Math.max(...rows.map((r) => r.label.length)) + 3;
  for (const row of rows) lines.push(`   ${row.mark} ${row.label.padEnd(width, '.')}: ${row.text}`);

  if (thresholds.length > 0) {
    lines.push('', '     THRESHOLDS');
    for (const threshold of thresholds) {
      const { passed, value, empty } = evaluate(threshold, seconds);
      const shownValue = `${threshold.aggregation}=${formatValue(threshold.metric, value)}`;
      lines.push(
        `     ${passed ? '✓' : '✗'} ${threshold.key} '${threshold.source}' ${shownValue}${empty ? ' (no samples)' : ''}`,
      );
    }
  }
  return lines.join('\n');
}

/** The same figures as JSON (`--summary-export`). */
export function summaryJson(registry, thresholds, seconds, trendStats) {
  const sinkJson = (metric, sink) => {
    switch (metric.type) {
      case 'counter':
        return { count: sink.count, rate: sink.get('rate', seconds) };
      case 'gauge':
        return { value: sink.value, min: sink.min, max: sink.max };
      case 'rate':
        return { rate: sink.get(), passes: sink.trues, fails: sink.samples - sink.trues };
      default:
        return Object.fromEntries([...trendStats, 'count'].map((s) => [s, s === 'count' ? sink.samples : sink.get(s)]));
    }
  };
  const metrics = {};
  for (const metric of registry.metrics.values()) {
    if (!shown(metric, thresholds)) continue;
    metrics[metric.name] = { type: metric.type, values: sinkJson(metric, metric.sink) };
    for (const sub of metric.submetrics) metrics[sub.key] = { type: metric.type, values: sinkJson(metric, sub.sink) };
  }
  const results = thresholds.map((t) => ({ metric: t.key, threshold: t.source, ...evaluate(t, seconds) }));
  const checks = [];
  for (const [group, tally] of registry.checks) {
    for (const [name, counts] of tally) checks.push({ group, name, ...counts });
  }
  return { durationSeconds: seconds, metrics, thresholds: results, checks };
}
