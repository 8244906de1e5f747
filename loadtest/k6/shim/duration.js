// Go-style durations as k6 reads them ("500ms", "1m30s", "2.5s"); a bare number is milliseconds.

const UNITS = { ns: 1e-6, us: 1e-3, 'µs': 1e-3, ms: 1, s: 1000, m: 60_000, h: 3_600_000 };

/** Milliseconds in `value` (a duration string or a number of milliseconds); throws on anything else. */
export function parseDuration(value, what = 'duration') {
  if (typeof value === 'number' && Number.isFinite(value) && value >= 0) return value;
  if (typeof value !== 'string') throw new Error(`${what}: expected a duration such as "30s", got ${JSON.stringify(value)}`);
  const text = value.trim();
  const part = /(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)/y;
  let total = 0;
  let at = 0;
  while (at < text.length) {
    part.lastIndex = at;
    const match = part.exec(text);
    if (!match) throw new Error(`${what}: cannot read ${JSON.stringify(value)} as a duration (e.g. "500ms", "1m30s")`);
    total += Number(match[1]) * UNITS[match[2]];
    at = part.lastIndex;
  }
  if (text.length === 0) throw new Error(`${what}: empty duration`);
  return total;
}

/** A duration for people: "850µs", "12.3ms", "1.52s", "2m3s". */
export function formatDuration(ms) {
  if (!Number.isFinite(ms)) return String(ms);
  if (ms === 0) return '0s';
  if (ms < 1) return `${(ms * 1000).toFixed(0)}µs`;
  if (ms < 1000) return `${Number(ms.toFixed(2))}ms`;
  if (ms < 60_000) return `${Number((ms / 1000).toFixed(2))}s`;
  const minutes = Math.floor(ms / 60_000);
  return `${minutes}m${Number(((ms - minutes * 60_000) / 1000).toFixed(1))}s`;
}
