//! The live progress line on stderr: requests, rate, and the mix of answers, four times a second.
//! On a terminal the line is redrawn in place; elsewhere (`--progress` into a log) one line a second.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::scenario::Run;
use crate::stats::Snapshot;

pub struct Progress {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Progress {
    pub fn start(run: Arc<Run>) -> Self {
        let (stop, mut stopped) = oneshot::channel();
        let terminal = std::io::stderr().is_terminal();
        let every = if terminal { Duration::from_millis(250) } else { Duration::from_secs(1) };
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            let mut last = (Instant::now(), 0);
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = tick.tick() => {}
                }
                let now = run.stats.snapshot();
                // The rate over the last tick, so that it shows what is happening now.
                let rate = (now.requests - last.1) as f64 / last.0.elapsed().as_secs_f64().max(1e-3);
                last = (Instant::now(), now.requests);
                let line = render(started.elapsed(), &now, rate);
                let mut err = std::io::stderr().lock();
                let _ = if terminal { write!(err, "\r\x1b[K{line}") } else { writeln!(err, "{line}") };
                let _ = err.flush();
            }
            if terminal {
                let _ = write!(std::io::stderr(), "\r\x1b[K");
            }
        });
        Self { stop, task }
    }

    /// Stops the line and clears it.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

fn render(elapsed: Duration, s: &Snapshot, rate: f64) -> String {
    let mut line = format!(
        "[{:>6.1}s] {} requests, {:.0}/s | 201 {} | replayed {} | 409 {} | 422 {} | other {}",
        elapsed.as_secs_f64(),
        s.requests,
        rate,
        s.created,
        s.replayed,
        s.in_flight,
        s.key_reused,
        s.other
    );
    if s.unexpected > 0 {
        line.push_str(&format!(" | UNEXPECTED {}", s.unexpected));
    }
    line
}
