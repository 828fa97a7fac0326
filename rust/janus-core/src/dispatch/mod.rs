//! Request dispatch: Moore-Hodgson, LST-IMH and the online dispatcher (PAPER.md §6).
//!
//! - [`moore_hodgson`]: one machine free at `start`, maximise the number of jobs done by
//!   their deadlines (optimal, O(n log n)).
//! - [`lst_imh`]: machines free at different times; latest-free machine first, each takes
//!   the whole Moore-Hodgson subset of the jobs still unassigned (a 2-approximation).
//! - [`Dispatcher`]: per-model FIFO queues, one EPDT per device group (co-located
//!   instances share it), pre-pull window, requeue policies. LST-IMH plans every model's
//!   backlog at once over the device groups (a job only where its model has a ready
//!   instance, at that instance's own prefill time: `speed.rs`); with [`Plan::Global`]
//!   (default) over all those groups, balancing the selected jobs when that keeps them on
//!   time (`plan.rs`) and committing only what starts inside the window, with
//!   [`Plan::Window`] only the groups inside the window are planned over and take their
//!   whole subsets. The baselines serve models by earliest deadline. Time only ever comes
//!   in as an argument (the daemon and the simulator drive the same object with a real
//!   and a virtual clock).
//!
//! Every time is an `f64` in seconds. Inputs are validated up front (finite, `>= 0`,
//! equal lengths) and errors come back as [`DispatchError`]; nothing here panics on user
//! input.
//!
//! Tie-breaking (identical in the pure-Python reference `janusd.policy.dispatch`):
//! - jobs are taken in earliest-deadline order, equal deadlines by lower job index;
//! - when a job must be dropped, the longest one goes, equal lengths the higher index;
//! - LST-IMH visits machines by descending free time, equal free times by lower index;
//! - the global plan's balance step takes jobs in earliest-deadline order (equal: lower
//!   index) onto the machine free earliest among those that finish the job in time (equal:
//!   lower decode rank, then lower index = lower group id);
//! - LST-IMH's joint plan indexes the jobs of every model in submission order (equal
//!   deadlines: first come first, whatever the model);
//! - the baselines' tick serves models by earliest live deadline, equal deadlines by lower
//!   model index (order of first appearance).

mod backlog;
mod config;
mod dispatcher;
mod epdt;
mod lst_imh;
mod moore_hodgson;
mod plan;
mod speed;
#[cfg(test)]
mod shortcut_tests;
#[cfg(test)]
mod speed_tests;

pub use config::{Assignment, DispatcherConfig, Objective, Plan, Policy, Requeue, Stats};
pub use dispatcher::Dispatcher;
pub use lst_imh::lst_imh;
pub use moore_hodgson::{moore_hodgson, moore_hodgson_weighted};

use std::fmt;

/// Why a dispatch call refused its input. The binding turns every variant into `ValueError`.
#[derive(Debug, Clone, PartialEq)]
pub enum DispatchError {
    /// A time or length that is NaN, infinite or negative, or lists of unequal length.
    InvalidInput(String),
    /// An instance id that is not (or already) registered.
    Instance(String),
    /// A request id that is not (or already) known.
    Request(String),
}

impl fmt::Display for DispatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DispatchError::InvalidInput(m)
            | DispatchError::Instance(m)
            | DispatchError::Request(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for DispatchError {}

/// Checks that `x` is a finite time `>= 0` and returns it with `-0.0` turned into `0.0`
/// (so that ordering by bit pattern matches numeric order).
pub(crate) fn check_time(what: &str, x: f64) -> Result<f64, DispatchError> {
    if !x.is_finite() {
        return Err(DispatchError::InvalidInput(format!(
            "{what} must be finite, got {x}"
        )));
    }
    if x < 0.0 {
        return Err(DispatchError::InvalidInput(format!(
            "{what} must be >= 0, got {x}"
        )));
    }
    Ok(x + 0.0)
}

/// Validates a list of times in place (see [`check_time`]); the message names the first
/// bad element.
pub(crate) fn check_times(what: &str, mut xs: Vec<f64>) -> Result<Vec<f64>, DispatchError> {
    if let Some(i) = xs.iter().position(|x| !(x.is_finite() && *x >= 0.0)) {
        check_time(&format!("{what}[{i}]"), xs[i])?;
    }
    for x in &mut xs {
        *x += 0.0;
    }
    Ok(xs)
}

/// Job indices sorted by (deadline, index): the earliest-deadline-first order that every
/// machine reuses. Deadlines are finite and `>= +0.0`, so their bit patterns sort like
/// their values; packing (bits, index) into one `u128` sorts faster than a key closure
/// that chases `deadline[j]`. (The algorithms use the filtered twin in
/// `backlog.rs`; tests use this one.)
#[cfg(test)]
pub(crate) fn edd_order(deadline: &[f64]) -> Vec<u32> {
    let mut keys: Vec<u128> = deadline
        .iter()
        .enumerate()
        .map(|(j, d)| ((d.to_bits() as u128) << 32) | j as u128)
        .collect();
    keys.sort_unstable();
    keys.into_iter().map(|k| k as u32).collect()
}

/// The smallest float strictly greater than `x` (finite `x`): the first instant at which a
/// strict `now > x` test fires. `f64::next_up` needs Rust 1.86; the workspace allows 1.85.
pub(crate) fn next_up(x: f64) -> f64 {
    if x == 0.0 {
        return f64::from_bits(1);
    }
    let bits = x.to_bits();
    if x > 0.0 {
        f64::from_bits(bits + 1)
    } else {
        f64::from_bits(bits - 1)
    }
}
