//! The dispatcher's settings and counters: policy names as the config spells them.

use super::DispatchError;

/// How a tick assigns queued jobs to candidate instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The paper's: LST-IMH over the model's whole backlog.
    LstImh,
    /// Baseline: one job per candidate per tick, candidates in rotating id order.
    RoundRobin,
    /// Baseline: one job per candidate per tick, least outstanding work first.
    LeastLoad,
}

impl Policy {
    pub fn parse(s: &str) -> Result<Self, DispatchError> {
        match s {
            "lst_imh" => Ok(Policy::LstImh),
            "round_robin" => Ok(Policy::RoundRobin),
            "least_load" => Ok(Policy::LeastLoad),
            _ => Err(DispatchError::InvalidInput(format!(
                "policy must be 'lst_imh', 'round_robin' or 'least_load', got {s:?}"
            ))),
        }
    }
}

/// What happens to a queued job past its latest start (`now > deadline - est`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    /// Drop it (reported by `take_rejected`).
    Reject,
    /// Extend its deadline up to `max_relax` times, then reject it.
    Relax,
    /// Never drop it: it is served late. What a router without deadlines does; for the
    /// round-robin and least-load baselines only (LST-IMH would starve a job it never
    /// selects, so `Dispatcher::new` refuses the pair).
    Keep,
}

impl Requeue {
    pub fn parse(s: &str) -> Result<Self, DispatchError> {
        match s {
            "reject" => Ok(Requeue::Reject),
            "relax" => Ok(Requeue::Relax),
            "keep" => Ok(Requeue::Keep),
            _ => Err(DispatchError::InvalidInput(format!(
                "requeue must be 'reject', 'relax' or 'keep', got {s:?}"
            ))),
        }
    }
}

/// Which instances LST-IMH plans over and what a tick commits (policy `lst_imh` only;
/// the one-job-per-tick baselines ignore it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Plan over all the model's ready instances (each at its group's EPDT), balance the
    /// selected jobs across them when that keeps every one on time, and commit only the
    /// jobs whose planned start is inside the pre-pull window; the rest stay queued and
    /// are planned again at the next tick.
    Global,
    /// Plan over the instances inside the pre-pull window only; each takes its whole
    /// Moore-Hodgson subset at once (the behaviour before `Global` existed).
    Window,
}

impl Plan {
    pub fn parse(s: &str) -> Result<Self, DispatchError> {
        match s {
            "global" => Ok(Plan::Global),
            "window" => Ok(Plan::Window),
            _ => Err(DispatchError::InvalidInput(format!(
                "plan must be 'global' or 'window', got {s:?}"
            ))),
        }
    }

    /// The name `parse` takes.
    pub fn name(self) -> &'static str {
        match self {
            Plan::Global => "global",
            Plan::Window => "window",
        }
    }
}

/// What LST-IMH maximises when not every queued job can be on time (policy `lst_imh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Objective {
    /// The number of jobs on time: Moore-Hodgson as the paper states it.
    Requests,
    /// Their value: each job weighs what `submit_weighted` gave it (the daemon gives a
    /// request's expected output tokens, so the plan keeps the most tokens on time, the
    /// quantity per-token attainment counts). Equal weights give `Requests`' plan.
    Tokens,
}

impl Objective {
    pub fn parse(s: &str) -> Result<Self, DispatchError> {
        match s {
            "requests" => Ok(Objective::Requests),
            "tokens" => Ok(Objective::Tokens),
            _ => Err(DispatchError::InvalidInput(format!(
                "objective must be 'requests' or 'tokens', got {s:?}"
            ))),
        }
    }
    /// The name `parse` takes.
    pub fn name(self) -> &'static str {
        match self {
            Objective::Requests => "requests",
            Objective::Tokens => "tokens",
        }
    }
}

/// Mirrors `janusd.config.DispatchConfig` (the window in seconds here, ms there).
#[derive(Debug, Clone)]
pub struct DispatcherConfig {
    pub policy: Policy,
    pub prepull_window_s: f64,
    pub requeue: Requeue,
    pub relax_factor: f64,
    pub max_relax: u32,
    pub plan: Plan,
    pub objective: Objective,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        DispatcherConfig {
            policy: Policy::LstImh,
            prepull_window_s: 0.02,
            requeue: Requeue::Reject,
            relax_factor: 1.5,
            max_relax: 2,
            plan: Plan::Global,
            objective: Objective::Requests,
        }
    }
}

/// Counters since creation; `pending` and `in_flight` are current sizes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    pub submitted: u64,
    pub assigned: u64,
    pub completed: u64,
    pub rejected: u64,
    pub relaxed: u64,
    pub cancelled: u64,
    /// Assigned requests handed back by `remove_instance` (then forgotten).
    pub orphaned: u64,
    pub pending: u64,
    pub in_flight: u64,
    pub ticks: u64,
}

/// (request id, instance id).
pub type Assignment = (i64, i64);
