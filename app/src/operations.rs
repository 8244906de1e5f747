//! Every idempotent operation payonce serves, in one closed list: the API's handlers, the
//! sweeper, the dashboard's filter, labels and key pages, and the tests all read it, so they
//! cannot drift apart. Adding an operation is a compiler-guided checklist: a variant of [`Op`],
//! then every `match` below says what it must declare (its route, its name, its phases, the
//! [`Idempotent`] that drives its keys), and the engine (`idempotency/`) is not edited at all:
//! its phases and events are validated against this list, not against a list of the engine's
//! (`tests/api/operations.rs`).

use std::sync::Arc;

use crate::gateway::Gateway;
use crate::idempotency::{Idempotent, Operations, RecoveryPoint, Registered};
use crate::{captures, payments, refunds};

/// One idempotent operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `POST /v1/payments`: charge (or authorize) a payment method.
    Payment,
    /// `POST /v1/refunds`: give back part or all of a payment.
    Refund,
    /// `POST /v1/payments/{id}/capture`: move the money of an authorized payment.
    Capture,
    /// `POST /v1/payments/{id}/cancel`: release an authorized payment's hold.
    Cancel,
}

impl Op {
    /// All of them, in the order the dashboard lists them.
    pub const ALL: [Self; 4] = [Self::Payment, Self::Refund, Self::Capture, Self::Cancel];

    /// The method of its route.
    pub fn method(self) -> &'static str {
        "POST"
    }

    /// Its route template: with the method, the scope of its keys (a key first used on one
    /// route is refused on another), and what a key row records to say what it is for.
    pub fn route(self) -> &'static str {
        match self {
            Self::Payment => payments::ROUTE,
            Self::Refund => refunds::ROUTE,
            Self::Capture => captures::CAPTURE_ROUTE,
            Self::Cancel => captures::CANCEL_ROUTE,
        }
    }

    /// Its name: the dashboard's filter value and Operation column.
    pub fn name(self) -> &'static str {
        match self {
            Self::Payment => "payment",
            Self::Refund => "refund",
            Self::Capture => "capture",
            Self::Cancel => "cancel",
        }
    }

    /// The dashboard's label for its keys.
    pub fn label(self) -> &'static str {
        match self {
            Self::Payment => "Payments",
            Self::Refund => "Refunds",
            Self::Capture => "Captures",
            Self::Cancel => "Cancels",
        }
    }

    /// Its recovery points between `started` and `finished`, first one first: each is also the
    /// kind of the event its key's timeline records when it is reached.
    pub fn phases(self) -> &'static [RecoveryPoint] {
        static PAYMENT: [RecoveryPoint; 1] = [payments::process::PAYMENT_CREATED];
        static REFUND: [RecoveryPoint; 1] = [refunds::REFUND_CREATED];
        static CAPTURE: [RecoveryPoint; 1] = [captures::CAPTURE_REQUESTED];
        static CANCEL: [RecoveryPoint; 1] = [captures::CANCEL_REQUESTED];
        match self {
            Self::Payment => &PAYMENT,
            Self::Refund => &REFUND,
            Self::Capture => &CAPTURE,
            Self::Cancel => &CANCEL,
        }
    }

    /// What drives its keys, for a request, a retry and the sweeper alike.
    fn driver(self, gateway: &Gateway) -> Arc<dyn Idempotent> {
        match self {
            Self::Payment => Arc::new(payments::process::Payments::new(gateway.clone())),
            Self::Refund => Arc::new(refunds::Refunds::new(gateway.clone())),
            Self::Capture => Arc::new(captures::Settles { capture: true, gateway: gateway.clone() }),
            Self::Cancel => Arc::new(captures::Settles { capture: false, gateway: gateway.clone() }),
        }
    }

    /// The operation of a key recorded on `route`.
    pub fn of_route(route: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|op| op.route() == route)
    }

    /// The operation named `name` (a dashboard filter value).
    pub fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|op| op.name() == name)
    }
}

/// The engine's registry of every operation, by route: built once at startup and held in the
/// application's state, so a handler, the dashboard's actions and the sweeper drive a key with
/// the same [`Idempotent`].
pub fn registry(gateway: &Gateway) -> Operations {
    Op::ALL.into_iter().fold(Operations::default(), |registry, op| {
        registry.with(Registered { route: op.route(), first_phase: op.phases()[0].clone(), driver: op.driver(gateway) })
    })
}
