//! Changing the state and starting what the change set off, with the lock released in between.
//!
//! Every state change that can emit an event or schedule a later transition goes through
//! [`transact`]: the closure runs under the lock and queues work in `State::outbox`; the work is
//! started only after the lock is dropped. So a webhook delivery, however slow its endpoint, never
//! holds the lock, and no API call ever waits for one.

use super::state::{Job, Simulator, State};
use super::webhooks::delivery;

/// Runs `change` under the lock, then starts the jobs it queued.
pub(crate) fn transact<R>(sim: &Simulator, change: impl FnOnce(&mut State) -> R) -> R {
    let (result, jobs) = {
        let mut state = sim.state();
        let result = change(&mut state);
        (result, std::mem::take(&mut state.outbox))
    };
    start(sim, jobs);
    result
}

/// Starts jobs, each on its own task. Must be called without the lock held.
pub(crate) fn start(sim: &Simulator, jobs: Vec<Job>) {
    for job in jobs {
        let sim = sim.clone();
        match job {
            Job::Deliver(delivery) => {
                tokio::spawn(delivery::run(sim, delivery));
            }
            Job::Later { after, epoch, apply } => {
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    transact(&sim, |state| {
                        if state.epoch == epoch {
                            apply(state);
                        }
                    });
                });
            }
        }
    }
}
