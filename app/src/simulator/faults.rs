//! Fault injection: the failures an exactly-once client must survive, on demand.
//!
//! **API faults** act on the calls named by `operations` (default: all of them):
//! `create_payment_intent` (`POST /v1/payment_intents`), `capture_payment_intent` (`POST
//! /v1/payment_intents/{id}/capture`), `cancel_payment_intent` (`POST
//! /v1/payment_intents/{id}/cancel`), `create_refund` (`POST /v1/refunds`) and `read` (`GET` of a
//! PaymentIntent, a search, a refund, the refund list, a charge). They strike
//! after authentication, validation and the idempotency check, where Stripe would start executing:
//!
//! | fault                    | what the client sees            | executed? | result saved? |
//! |--------------------------|---------------------------------|-----------|---------------|
//! | `latency_ms`/`jitter_ms` | a slow answer                   | as usual  | as usual      |
//! | `fail_rate`              | 500 `api_error`, should retry   | no        | no            |
//! | `timeout_rate`           | nothing until its own timeout   | yes       | yes           |
//! | `drop_after_charge_rate` | a broken connection             | yes       | yes           |
//!
//! A read "executes" nothing: held, it answers the state as it is when the hold ends; dropped,
//! it loses the answer. A create charges (a capture captures, a cancel cancels, a refund refunds)
//! exactly as without the fault.
//!
//! **Replays.** A request answered from a saved result waits the latency (Stripe serves replays
//! from the same servers) but never fails, holds or drops: those faults model what happens to an
//! *execution*, and a replay executes nothing. Replays do not count against `next_calls`.
//!
//! **`fail_rate` differs from Stripe on purpose.** It models an outage *in front of* Stripe's
//! idempotency layer (a load balancer, a gateway): the request never executes and no result is
//! saved, so a retry with the same key executes and succeeds. Real Stripe v1 also saves 500s that
//! happen *during* execution and replays them for that key; the simulator does not produce those.
//!
//! **Webhook faults** act on deliveries (see `webhooks::delivery`), whatever the API faults'
//! scope: `webhook_drop_rate` (the delivery is lost: never sent, never retried, so only
//! reconciliation can learn what happened), `webhook_duplicate_rate` (the event is delivered
//! twice, as two independent deliveries), `webhook_delay_ms` (each attempt waits first) and
//! `webhook_hold` (deliveries wait until `POST /_sim/webhooks/release`, which sends them in
//! reverse, shuffled or original order). `next_calls` running out clears the API faults only.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The longest latency, jitter or hold accepted: anything longer is almost certainly seconds
/// typed where milliseconds were meant.
const MAX_DELAY_MS: u64 = 600_000;

/// The faults to inject, as sent to `PUT /_sim/faults`. Every field is optional in JSON; the
/// defaults inject nothing.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Delay before an in-scope create call executes (and before a replay is answered).
    pub latency_ms: u64,
    /// Extra delay drawn uniformly from `0..=jitter_ms`, added to `latency_ms`.
    pub jitter_ms: u64,
    /// Probability (0..=1) of a 500 `api_error` with `Stripe-Should-Retry: true`: nothing is
    /// executed or saved (see the module docs for how this differs from Stripe).
    pub fail_rate: f64,
    /// Probability (0..=1) of holding the request for `timeout_hold_ms` (past the client's
    /// timeout) and *then* executing and saving it: the customer is charged although the client
    /// gave up. While held, the key is in use (409 for a concurrent retry).
    pub timeout_rate: f64,
    /// How long a timed-out request is held, in milliseconds (default 35 000: longer than a
    /// typical 30 s client timeout).
    pub timeout_hold_ms: u64,
    /// Probability (0..=1) of executing and saving, then losing the response: the client sees a
    /// transport error (the connection breaks mid-response), not a Stripe error.
    pub drop_after_charge_rate: f64,
    /// If set, faults apply only to create calls with this payment method.
    pub payment_method: Option<String>,
    /// If set, faults apply to the next N in-scope create calls, after which all faults reset
    /// to none. `GET /_sim/faults` shows how many remain.
    pub next_calls: Option<u32>,
    /// Seeds the draws (jitter, which fault, webhook drops and duplicates, a shuffled release)
    /// so a run can be reproduced. Without a seed the draws are random. Concurrent calls draw in
    /// arrival order, which a seed cannot fix.
    pub seed: Option<u64>,
    /// If set, the API faults apply only to these operations (default: all).
    pub operations: Option<Vec<Operation>>,
    /// Probability (0..=1) that a delivery of an event to an endpoint is lost: never sent and
    /// never retried. The event still exists (`GET /v1/events`); only asking Stripe finds it.
    pub webhook_drop_rate: f64,
    /// Probability (0..=1) that an event is delivered to an endpoint twice.
    pub webhook_duplicate_rate: f64,
    /// Delay before every delivery attempt, in milliseconds.
    pub webhook_delay_ms: u64,
    /// Hold every new delivery until `POST /_sim/webhooks/release`.
    pub webhook_hold: bool,
}

/// The calls API faults can be scoped to.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    /// `POST /v1/payment_intents`.
    CreatePaymentIntent,
    /// `POST /v1/payment_intents/{id}/capture`.
    CapturePaymentIntent,
    /// `POST /v1/payment_intents/{id}/cancel`.
    CancelPaymentIntent,
    /// `POST /v1/refunds`.
    CreateRefund,
    /// A `GET` of a PaymentIntent, a PaymentIntent search, a refund, the refund list or a charge.
    Read,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            latency_ms: 0,
            jitter_ms: 0,
            fail_rate: 0.0,
            timeout_rate: 0.0,
            timeout_hold_ms: 35_000,
            drop_after_charge_rate: 0.0,
            payment_method: None,
            next_calls: None,
            seed: None,
            operations: None,
            webhook_drop_rate: 0.0,
            webhook_duplicate_rate: 0.0,
            webhook_delay_ms: 0,
            webhook_hold: false,
        }
    }
}

/// Why a [`Faults`] value was rejected.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum FaultsError {
    /// A probability outside 0..=1 (or NaN).
    #[error("{field} must be a probability between 0 and 1, got {value}")]
    RateOutOfRange { field: &'static str, value: f64 },
    /// Fail, timeout and drop are decided by one draw per call, so their rates must fit in 1.
    #[error(
        "fail_rate + timeout_rate + drop_after_charge_rate must be at most 1 (one draw per call \
         picks at most one of them), got {sum}"
    )]
    RatesExceedOne { sum: f64 },
    /// A latency, jitter or hold longer than ten minutes (600 000 ms).
    #[error("{field} must be at most {MAX_DELAY_MS} ms (ten minutes), got {value}")]
    DelayTooLong { field: &'static str, value: u64 },
    /// `next_calls: 0` would scope the faults to nothing.
    #[error("next_calls must be at least 1; omit it (or send null) to apply faults to every call")]
    ZeroNextCalls,
    /// `payment_method: ""` would match no call.
    #[error(
        "payment_method must not be empty; omit it (or send null) to apply faults to every \
         payment method"
    )]
    EmptyPaymentMethod,
    /// `operations: []` would scope the faults to nothing.
    #[error("operations must not be empty; omit it (or send null) to apply faults to every operation")]
    NoOperations,
}

impl Faults {
    /// Checks every field; the first problem found is reported.
    pub fn validate(&self) -> Result<(), FaultsError> {
        let rates = [
            ("fail_rate", self.fail_rate),
            ("timeout_rate", self.timeout_rate),
            ("drop_after_charge_rate", self.drop_after_charge_rate),
            ("webhook_drop_rate", self.webhook_drop_rate),
            ("webhook_duplicate_rate", self.webhook_duplicate_rate),
        ];
        for (field, value) in rates {
            if !(0.0..=1.0).contains(&value) {
                return Err(FaultsError::RateOutOfRange { field, value });
            }
        }
        let sum = self.fail_rate + self.timeout_rate + self.drop_after_charge_rate;
        // A small tolerance so that e.g. 0.1 + 0.2 + 0.7 (1.0000000000000002) is accepted.
        if sum > 1.0 + 1e-9 {
            return Err(FaultsError::RatesExceedOne { sum });
        }
        let delays = [
            ("latency_ms", self.latency_ms),
            ("jitter_ms", self.jitter_ms),
            ("timeout_hold_ms", self.timeout_hold_ms),
            ("webhook_delay_ms", self.webhook_delay_ms),
        ];
        for (field, value) in delays {
            if value > MAX_DELAY_MS {
                return Err(FaultsError::DelayTooLong { field, value });
            }
        }
        if self.next_calls == Some(0) {
            return Err(FaultsError::ZeroNextCalls);
        }
        if self.payment_method.as_deref() == Some("") {
            return Err(FaultsError::EmptyPaymentMethod);
        }
        if self.operations.as_ref().is_some_and(Vec::is_empty) {
            return Err(FaultsError::NoOperations);
        }
        Ok(())
    }

    fn in_scope(&self, operation: Operation, payment_method: Option<&str>) -> bool {
        let operation_in_scope = self.operations.as_ref().is_none_or(|operations| operations.contains(&operation));
        let payment_method_in_scope = match &self.payment_method {
            None => true,
            Some(scope) => payment_method == Some(scope.as_str()),
        };
        operation_in_scope && payment_method_in_scope
    }

    /// These faults without the API ones: what stays once `next_calls` runs out.
    fn webhook_only(&self) -> Self {
        Self {
            seed: self.seed,
            webhook_drop_rate: self.webhook_drop_rate,
            webhook_duplicate_rate: self.webhook_duplicate_rate,
            webhook_delay_ms: self.webhook_delay_ms,
            webhook_hold: self.webhook_hold,
            ..Self::default()
        }
    }
}

/// What happens to one create call that is about to execute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Wait this long first (latency + jitter).
    pub delay: Duration,
    pub action: Action,
}

impl Plan {
    /// No fault: for calls the faults never touch.
    pub fn none() -> Self {
        Self { delay: Duration::ZERO, action: Action::Execute }
    }
}

/// The fault drawn for one execution; at most one per call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// No fault: execute and answer.
    Execute,
    /// Answer 500 without executing or saving.
    Fail,
    /// Hold this long, then execute and save.
    Hold(Duration),
    /// Execute and save, then break the connection instead of answering.
    LoseResponse,
}

/// What happens to one delivery of one event to one endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeliveryPlan {
    /// Lost: never sent.
    pub dropped: bool,
    /// Sent twice, as two independent deliveries.
    pub duplicated: bool,
    /// Wait before each attempt.
    pub delay: Duration,
    /// Held until released.
    pub hold: bool,
}

/// The current faults and the random source their draws come from (`fastrand::Rng::default()`
/// is a fresh, randomly seeded generator).
#[derive(Debug, Default)]
pub(crate) struct FaultState {
    faults: Faults,
    rng: fastrand::Rng,
}

impl FaultState {
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Replaces the faults (and reseeds the draws) if they are valid.
    pub fn set(&mut self, faults: Faults) -> Result<(), FaultsError> {
        faults.validate()?;
        self.rng = faults.seed.map_or_else(fastrand::Rng::new, fastrand::Rng::with_seed);
        self.faults = faults;
        Ok(())
    }

    /// Draws the plan for a call that is about to execute, and counts it against `next_calls`
    /// if it is in scope.
    pub fn plan_execution(&mut self, operation: Operation, payment_method: Option<&str>) -> Plan {
        if !self.faults.in_scope(operation, payment_method) {
            return Plan { delay: Duration::ZERO, action: Action::Execute };
        }
        let delay = self.draw_delay();
        let faults = &self.faults;
        let draw = self.rng.f64(); // uniform in [0, 1): a rate of 1 always fires, 0 never.
        let action = if draw < faults.fail_rate {
            Action::Fail
        } else if draw < faults.fail_rate + faults.timeout_rate {
            Action::Hold(Duration::from_millis(faults.timeout_hold_ms))
        } else if draw < faults.fail_rate + faults.timeout_rate + faults.drop_after_charge_rate {
            Action::LoseResponse
        } else {
            Action::Execute
        };
        self.count_call();
        Plan { delay, action }
    }

    /// The delay before answering a replay: latency applies, nothing else, and it is not counted.
    pub fn replay_delay(&mut self, operation: Operation, payment_method: Option<&str>) -> Duration {
        if self.faults.in_scope(operation, payment_method) { self.draw_delay() } else { Duration::ZERO }
    }

    /// Draws what happens to one delivery of an event to one endpoint.
    pub fn plan_delivery(&mut self) -> DeliveryPlan {
        let faults = &self.faults;
        let (drop_rate, duplicate_rate) = (faults.webhook_drop_rate, faults.webhook_duplicate_rate);
        let delay = Duration::from_millis(faults.webhook_delay_ms);
        let hold = faults.webhook_hold;
        // Draw only for a rate that can fire, so that setting one rate does not shift the other's
        // seeded sequence.
        let dropped = drop_rate > 0.0 && self.rng.f64() < drop_rate;
        let duplicated = !dropped && duplicate_rate > 0.0 && self.rng.f64() < duplicate_rate;
        DeliveryPlan { dropped, duplicated, delay, hold }
    }

    /// Shuffles held deliveries for a `shuffle` release, with the seeded draws.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        self.rng.shuffle(items);
    }

    fn draw_delay(&mut self) -> Duration {
        let jitter = match self.faults.jitter_ms {
            0 => 0,
            max => self.rng.u64(0..=max),
        };
        Duration::from_millis(self.faults.latency_ms.saturating_add(jitter))
    }

    fn count_call(&mut self) {
        match self.faults.next_calls {
            Some(1) => self.faults = self.faults.webhook_only(),
            Some(remaining) => self.faults.next_calls = Some(remaining - 1),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(faults: Faults) -> FaultState {
        let mut state = FaultState::default();
        state.set(faults).expect("valid faults");
        state
    }

    /// Out-of-range values are rejected with a message naming the field.
    #[test]
    fn validation() {
        let faults = |edit: fn(&mut Faults)| {
            let mut faults = Faults::default();
            edit(&mut faults);
            faults.validate().map_err(|error| error.to_string())
        };
        let rejected = [
            (faults(|f| f.fail_rate = 1.5), "fail_rate must be a probability"),
            (faults(|f| f.timeout_rate = f64::NAN), "timeout_rate must be a probability"),
            (faults(|f| f.drop_after_charge_rate = -0.1), "drop_after_charge_rate must be"),
            (faults(|f| (f.fail_rate, f.timeout_rate) = (0.6, 0.6)), "must be at most 1"),
            (faults(|f| f.latency_ms = 600_001), "latency_ms must be at most"),
            (faults(|f| f.next_calls = Some(0)), "next_calls must be at least 1"),
            (faults(|f| f.payment_method = Some(String::new())), "must not be empty"),
        ];
        for (result, expected) in rejected {
            let message = result.expect_err(expected);
            assert!(message.contains(expected), "{message}");
        }
        // 0.1 + 0.2 + 0.7 is 1.0000000000000002 in floating point, and still valid.
        let fits = faults(|f| (f.fail_rate, f.timeout_rate, f.drop_after_charge_rate) = (0.1, 0.2, 0.7));
        assert_eq!(fits, Ok(()));
    }

    /// The same seed gives the same sequence of plans; rates are honoured roughly.
    #[test]
    fn seeded_draws_are_reproducible() {
        let faults =
            Faults { jitter_ms: 50, fail_rate: 0.3, drop_after_charge_rate: 0.3, seed: Some(7), ..Faults::default() };
        let plans = |faults: &Faults| {
            let mut state = state(faults.clone());
            (0..200)
                .map(|_| state.plan_execution(Operation::CreatePaymentIntent, Some("pm_card_visa")))
                .collect::<Vec<_>>()
        };
        let first = plans(&faults);
        assert_eq!(first, plans(&faults));
        let fails = first.iter().filter(|plan| plan.action == Action::Fail).count();
        let drops = first.iter().filter(|plan| plan.action == Action::LoseResponse).count();
        assert!((30..=90).contains(&fails), "{fails} fails in 200 draws at 0.3");
        assert!((30..=90).contains(&drops), "{drops} drops in 200 draws at 0.3");
        assert!(first.iter().all(|plan| plan.delay <= Duration::from_millis(50)));
    }

    /// `next_calls` counts in-scope executions only, then clears every fault.
    #[test]
    fn next_calls_counts_down_then_resets() {
        let mut state = state(Faults {
            fail_rate: 1.0,
            payment_method: Some("pm_card_mastercard".into()),
            next_calls: Some(2),
            ..Faults::default()
        });
        assert_eq!(state.plan_execution(Operation::CreatePaymentIntent, Some("pm_card_visa")).action, Action::Execute);
        assert_eq!(state.replay_delay(Operation::CreatePaymentIntent, Some("pm_card_mastercard")), Duration::ZERO);
        assert_eq!(state.faults().next_calls, Some(2), "out of scope and replays don't count");
        assert_eq!(
            state.plan_execution(Operation::CreatePaymentIntent, Some("pm_card_mastercard")).action,
            Action::Fail
        );
        assert_eq!(state.faults().next_calls, Some(1));
        assert_eq!(
            state.plan_execution(Operation::CreatePaymentIntent, Some("pm_card_mastercard")).action,
            Action::Fail
        );
        assert_eq!(state.faults(), &Faults::default());
        assert_eq!(
            state.plan_execution(Operation::CreatePaymentIntent, Some("pm_card_mastercard")).action,
            Action::Execute
        );
    }
}
