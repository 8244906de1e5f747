//! The overview's outcomes chart: events per interval over the last minutes, one line per kind,
//! drawn on the server as SVG (no script, no CDN; it prints and projects like text).
//!
//! Each series has a colour *and* a dash pattern and marker, so it can be told apart in the
//! legend on a washed-out projector or by a colour-blind reader; the numbers are also in a table.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::queries::Buckets;
use crate::idempotency::EventKind;
use crate::web::{Settled, format};

/// One series: an event kind and how the chart shows it.
pub struct Series {
    /// The `idempotency_events.kind` it counts.
    pub kind: &'static str,
    /// The legend's name.
    pub label: &'static str,
    /// The CSS class that gives its colour (in `payonce.css`, and mirrored in the legend).
    pub class: &'static str,
    /// SVG `stroke-dasharray`: solid, dashed, dotted, …
    pub dash: &'static str,
    /// Counts per bucket, oldest first.
    pub values: Vec<i64>,
}

impl Series {
    pub fn total(&self) -> i64 {
        self.values.iter().sum()
    }
}

/// The series the overview shows, empty.
pub fn outcome_series(buckets: usize) -> Vec<Series> {
    let series = |kind: EventKind, label, class, dash| Series {
        kind: kind.as_str(),
        label,
        class,
        dash,
        values: vec![0; buckets],
    };
    vec![
        series(EventKind::Claimed, "Claims (new keys)", "s-claims", ""),
        series(EventKind::Replayed, "Replays", "s-replays", "10 5"),
        series(EventKind::Conflict, "409 in flight", "s-conflicts", "3 4"),
        series(EventKind::Mismatch, "422 key reused", "s-mismatches", "14 4 3 4"),
        series(EventKind::Reclaimed, "Reclaims", "s-reclaims", "6 3"),
    ]
}

/// Puts into `series` (oldest bucket first, `values.len()` of them, the last being `read.now`)
/// the counts of the buckets before `from` from what `settled` kept, and of the others from
/// `read` (which counted from `from` on). Then keeps in `settled` what `read` says can no longer
/// change, and forgets what fell out of the window. So the overview reads the events of the last
/// minute or so on each refresh, not fifteen minutes' worth.
pub fn fill(series: &mut [Series], settled: &mut Settled, from: Option<i64>, read: Buckets) {
    let width = series.first().map_or(0, |s| s.values.len());
    let first = read.now - i64::try_from(width).unwrap_or(0) + 1;
    let mut fresh: BTreeMap<i64, Vec<(String, i64)>> = BTreeMap::new();
    for row in read.counted {
        fresh.entry(row.bucket).or_default().push((row.kind, row.count));
    }
    for (slot, bucket) in (first..=read.now).enumerate() {
        let kept = if from.is_some_and(|from| bucket < from) { &settled.counts } else { &fresh };
        for (kind, count) in kept.get(&bucket).into_iter().flatten() {
            if let Some(s) = series.iter_mut().find(|s| s.kind == kind) {
                s.values[slot] += count;
            }
        }
    }
    if settled.through.is_none_or(|through| through < read.settled) {
        let newly = from.unwrap_or(i64::MIN)..=read.settled;
        settled.counts.extend(fresh.into_iter().filter(|(bucket, _)| newly.contains(bucket)));
        settled.through = Some(read.settled);
    }
    settled.counts.retain(|bucket, _| *bucket >= first);
}

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 340.0;
const LEFT: f64 = 72.0;
const RIGHT: f64 = 24.0;
const TOP: f64 = 20.0;
const BOTTOM: f64 = 64.0;

/// The chart as an SVG element. `bucket_secs` is the width of one bucket, for the axis labels.
pub fn svg(series: &[Series], bucket_secs: u32) -> String {
    let buckets = series.first().map_or(0, |s| s.values.len()).max(2);
    let max = series.iter().flat_map(|s| s.values.iter().copied()).max().unwrap_or(0);
    let (step, steps) = y_ticks(max);
    let top = step * steps;
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |i: usize| LEFT + plot_w * i as f64 / (buckets - 1) as f64;
    let y = |v: i64| TOP + plot_h * (1.0 - v as f64 / top as f64);
    let span_min = (buckets as u32 * bucket_secs) / 60;

    let mut out = String::with_capacity(8 * 1024);
    let _ = write!(
        out,
        r#"<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-labelledby="chart-title" xmlns="http://www.w3.org/2000/svg">"#
    );
    let _ = write!(
        out,
        r#"<title id="chart-title">Key outcomes per {bucket_secs} seconds over the last {span_min} minutes</title>"#
    );
    // Horizontal grid lines and the y axis's labels.
    for k in 0..=steps {
        let value = step * k;
        let gy = y(value);
        let _ = write!(
            out,
            r#"<line class="grid" x1="{LEFT}" x2="{}" y1="{gy:.1}" y2="{gy:.1}"/><text class="tick" x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
            WIDTH - RIGHT,
            LEFT - 10.0,
            gy + 6.0,
            format::count(value),
        );
    }
    // The x axis: minutes ago, every five minutes (or at each end for short spans).
    let every = if span_min >= 10 { 5 * 60 / bucket_secs.max(1) } else { (buckets as u32 - 1).max(1) };
    for i in (0..buckets).rev().step_by(every.max(1) as usize) {
        let ago_secs = (buckets - 1 - i) as u32 * bucket_secs;
        let label = if ago_secs == 0 { "now".to_owned() } else { format!("−{} min", ago_secs / 60) };
        let _ = write!(
            out,
            r#"<line class="axis" x1="{0:.1}" x2="{0:.1}" y1="{1}" y2="{2}"/><text class="tick" x="{0:.1}" y="{3}" text-anchor="middle">{label}</text>"#,
            x(i),
            HEIGHT - BOTTOM,
            HEIGHT - BOTTOM + 8.0,
            HEIGHT - BOTTOM + 30.0
        );
    }
    let _ = write!(
        out,
        r#"<line class="axis" x1="{LEFT}" x2="{0}" y1="{1}" y2="{1}"/><line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{1}"/>"#,
        WIDTH - RIGHT,
        HEIGHT - BOTTOM
    );
    let _ = write!(
        out,
        r#"<text class="label" x="{}" y="{}" text-anchor="middle">time (each point: {bucket_secs} s)</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 8.0
    );
    let _ = write!(
        out,
        r#"<text class="label" transform="translate(20 {}) rotate(-90)" text-anchor="middle">events</text>"#,
        TOP + plot_h / 2.0
    );
    for s in series {
        let points: Vec<String> =
            s.values.iter().enumerate().map(|(i, &v)| format!("{:.1},{:.1}", x(i), y(v))).collect();
        let _ = write!(
            out,
            r#"<polyline class="line {}" stroke-dasharray="{}" points="{}"><title>{}: {} in the last {span_min} minutes</title></polyline>"#,
            s.class,
            s.dash,
            points.join(" "),
            s.label,
            s.total()
        );
    }
    out.push_str("</svg>");
    out
}

/// The y axis's tick interval (1, 2 or 5 times a power of ten) and how many intervals reach
/// `max`: at most five, at least one.
fn y_ticks(max: i64) -> (i64, i64) {
    let mut magnitude = 1;
    loop {
        for step in [magnitude, 2 * magnitude, 5 * magnitude] {
            let steps = (max + step - 1) / step;
            if steps <= 5 {
                return (step, steps.max(1));
            }
        }
        magnitude *= 10;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The y axis ends on a round number at or above the highest value, in at most five steps.
    #[test]
    fn y_axis_ticks() {
        assert_eq!(y_ticks(0), (1, 1));
        assert_eq!(y_ticks(3), (1, 3));
        assert_eq!(y_ticks(5), (1, 5));
        assert_eq!(y_ticks(6), (2, 3));
        assert_eq!(y_ticks(11), (5, 3));
        assert_eq!(y_ticks(26), (10, 3));
        assert_eq!(y_ticks(1234), (500, 3));
    }

    /// The chart names itself, labels both axes and draws every series.
    #[test]
    fn draws_every_series_with_labels() {
        let mut series = outcome_series(30);
        series[0].values[29] = 7;
        let svg = svg(&series, 30);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("<title id=\"chart-title\">Key outcomes per 30 seconds over the last 15 minutes"));
        assert!(svg.contains(">now</text>") && svg.contains(">−5 min</text>") && svg.contains(">−10 min</text>"));
        assert_eq!(svg.matches("<polyline").count(), 5);
        assert!(svg.contains(">events</text>"));
        // A busy class: the axis's numbers with thousands separators, as every count.
        series[0].values[29] = 12_000;
        let busy = super::svg(&series, 30);
        assert!(busy.contains(">10,000</text>") && busy.contains(">15,000</text>"), "{busy}");
    }

    /// Loads that keep what is settled show what one full count would, refresh after refresh.
    #[test]
    fn settled_buckets_are_counted_once_and_shown_every_time() {
        use super::super::queries::{Bucketed, Buckets};
        // Events (bucket, kind, seen from): an event is dated by its transaction's start, so
        // half of them show up a bucket late, as a transaction that commits later would.
        let events: Vec<(i64, &str, i64)> = (0..400)
            .map(|i| (60 + i / 7, if i % 3 == 0 { "replayed" } else { "claimed" }, 60 + i / 7 + i % 2))
            .collect();
        let count = |from: i64, now: i64| {
            let mut counted: BTreeMap<(i64, &str), i64> = BTreeMap::new();
            for &(bucket, kind, _) in events.iter().filter(|(b, _, seen)| (from..=now).contains(b) && *seen <= now) {
                *counted.entry((bucket, kind)).or_default() += 1;
            }
            let counted = counted
                .into_iter()
                .map(|((bucket, kind), count)| Bucketed { kind: kind.into(), bucket, count })
                .collect();
            Buckets { now, settled: now - 2, counted }
        };
        let mut settled = Settled::default();
        for now in 70..130 {
            let from = settled.through.map(|t| t + 1);
            let mut cached = outcome_series(30);
            fill(&mut cached, &mut settled, from, count(from.unwrap_or(now - 29).max(now - 29), now));
            let mut whole = outcome_series(30);
            fill(&mut whole, &mut Settled::default(), None, count(now - 29, now));
            for (c, w) in cached.iter().zip(&whole) {
                assert_eq!(c.values, w.values, "{} at bucket {now}", c.kind);
            }
            assert!(settled.counts.len() <= 30, "the window's buckets only");
        }
        assert_eq!(settled.through, Some(127));
    }
}
