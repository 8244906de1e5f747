//! Failpoints: named places in the payment flow where a crash test can stop this process dead.
//!
//! With `PAYONCE_FAILPOINT=<name>` in its environment, the process writes
//! `payonce: failpoint <name> reached` to stderr when it first gets there, then parks the task
//! forever, holding whatever it held. The test waits for that line and `kill -9`s the process, so
//! the crash lands exactly between two recovery points. Without the variable (always, outside
//! tests) a failpoint costs one comparison.
//!
//! The names, in the order a payment passes them:
//!
//! | name                    | committed so far        | not done yet                      |
//! |-------------------------|-------------------------|-----------------------------------|
//! | `after_claim`           | the key (`started`)     | the payment row, the charge       |
//! | `after_payment_created` | the pending payment     | the gateway call                  |
//! | `after_charge`          | the pending payment     | recording the gateway's answer    |

use std::sync::LazyLock;

static ARMED: LazyLock<Option<String>> =
    LazyLock::new(|| std::env::var("PAYONCE_FAILPOINT").ok().filter(|name| !name.is_empty()));

/// Parks the current task forever if the failpoint `name` is armed.
pub async fn hit(name: &'static str) {
    if ARMED.as_deref() == Some(name) {
        eprintln!("payonce: failpoint {name} reached");
        tracing::warn!(failpoint = name, "failpoint reached; parking this task");
        std::future::pending::<()>().await;
    }
}
