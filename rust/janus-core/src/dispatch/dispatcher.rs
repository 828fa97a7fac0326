//! The online dispatcher: per-model FIFO queues, per-group EPDT, pre-pull window.
//!
//! Clock-injected: every method that needs a time takes `now`, so the daemon (real clock)
//! and the simulator (virtual clock) drive the same object. Nothing here reads a clock.
//!
//! Groups: every instance belongs to a device group (`add_instance(id, model, group)`;
//! the binding's default is the instance's own id). One worker steps the models of a
//! group one after another, so the group has one `Load` (epdt.rs): assign, complete and
//! cancel charge it, and every instance of the group has the group's EPDT and busy time.
//! `remove_instance` takes the instance's outstanding jobs out of the group's load (and
//! hands them back); the group goes when its last instance does.
//!
//! `tick(now)`:
//! 1. requeue, per model with queued work: a queued job past its latest start
//!    (`now > deadline - p_min`, p_min its least time over its model's instances: each
//!    instance's own fit `a + b * tokens` when `set_prefill_fit` gave one, else the
//!    submitted estimate) cannot be on time even on an idle instance. `reject`
//!    drops it (reported by `take_rejected`); `relax` gives it `deadline = now +
//!    (original deadline - arrival) * relax_factor^k` on its k-th relaxation (a fresh,
//!    growing budget from now), at most `max_relax` times, then rejects it.
//! 2. `lst_imh`: one plan for every model with work. Machines = the device groups with a
//!    ready instance of such a model (ascending group id; two instances of one model in
//!    one group are one machine, the lower id takes the jobs), avail = the group's
//!    EPDT(now), and per model the group's speed: that instance's fit, else the submitted
//!    estimate, or none (the model has no ready instance there: its jobs cannot go there).
//!    Jobs = every model's live backlog in submission order (equal deadlines go first-come
//!    first), so co-located models compete for a group in one earliest-deadline order and
//!    one model's plan sees the others' queued work. With identical machines (no fits,
//!    every model everywhere) this is the paper's LST-IMH. `plan = global` (default)
//!    plans over all machines, balances the selected jobs (plan.rs) when that keeps all
//!    on time, and commits on
//!    each machine only the prefix whose planned start is inside the pre-pull window
//!    (`busy_until - window <= now`, busy_until the group's after the jobs committed
//!    before it); the rest stays queued (FIFO order kept) and is planned again next tick.
//!    `plan = window` plans over the machines inside the window only, and each takes its
//!    whole selected subset.
//! 3. `round_robin` / `least_load` (`plan` unused): models are served by their earliest
//!    live deadline (equal: lower model index); each ready instance inside the window
//!    takes one job, oldest first, in rotating id order / by (outstanding work, id).
//!
//! `next_wakeup` (dispatcher_tick.rs) wakes at each ready instance's window edge
//! (`busy_until - window`) after the last tick: exactly when a job the global plan
//! deferred there can be committed. complete/cancel/submit/instance and fit changes mark
//! the state dirty (tick now), so a group's EPDT moving earlier is seen at once by a shell
//! that asks (`wants_tick`: dirty with work queued) after each worker event.
//! Requests are submitted, completed and cancelled in dispatcher_jobs.rs; instances join and
//! leave, and report readiness, prefill fit and decode load, in dispatcher_members.rs.
//! `check_integrity` (dispatcher_integrity.rs): every request is in exactly one place.

use std::collections::HashMap;

use super::config::{DispatcherConfig, Policy, Requeue, Stats};
use super::epdt::Load;
use super::{check_time, DispatchError};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Place {
    Queued,
    Assigned(i64),
}

#[derive(Debug, Clone)]
struct Request {
    model: usize,
    seq: u64,
    arrival: f64,
    original_deadline: f64,
    deadline: f64,
    est: f64,
    /// Prompt tokens: what an instance's prefill fit (`set_prefill_fit`) reads.
    tokens: f64,
    /// Value under `Objective::Tokens` (1 unless given by `submit_weighted`).
    weight: f64,
    relaxed: u32,
    place: Place,
}

#[derive(Debug, Default)]
struct Model {
    /// (submission seq, request id) in arrival order; entries whose request is no longer
    /// queued with that seq are stale and dropped at the next tick.
    queue: Vec<(u64, i64)>,
    queued: usize,
    /// Deadline extensions granted to this model's requests (requeue = relax), ever.
    relaxed: u64,
    /// Instance ids, ascending.
    instances: Vec<i64>,
    /// Round robin: the instance served last.
    rr_last: Option<i64>,
}

#[derive(Debug)]
struct Instance {
    model: usize,
    group: i64,
    ready: bool,
    /// Request id -> assignment counter, to hand them back in order on removal.
    assigned: HashMap<i64, u64>,
    /// Its own prefill fit `a + b * tokens` (None: a job's submitted estimate).
    fit: Option<(f64, f64)>,
}

/// Instances stepped one after another by one worker: one EPDT for all of them.
#[derive(Debug, Default)]
struct Group {
    load: Load,
    /// Decode work the group's worker is doing (sequences past their prefill), as the
    /// caller reports it: the tie-break between equally free machines in the global plan.
    decode: f64,
    /// Instance ids, ascending.
    members: Vec<i64>,
}

#[derive(Debug)]
pub struct Dispatcher {
    cfg: DispatcherConfig,
    models: Vec<Model>,
    model_ids: HashMap<String, usize>,
    instances: HashMap<i64, Instance>,
    groups: HashMap<i64, Group>,
    requests: HashMap<i64, Request>,
    rejected: Vec<i64>,
    stats: Stats,
    seq: u64,
    /// Something changed since the last tick (submit, complete, an instance...).
    dirty: bool,
    last_tick: f64,
}

impl Dispatcher {
    pub fn new(cfg: DispatcherConfig) -> Result<Self, DispatchError> {
        check_time("prepull_window_s", cfg.prepull_window_s)?;
        if !(cfg.relax_factor.is_finite() && cfg.relax_factor >= 1.0) {
            return Err(DispatchError::InvalidInput(format!(
                "relax_factor must be finite and >= 1, got {}",
                cfg.relax_factor
            )));
        }
        if cfg.requeue == Requeue::Keep && cfg.policy == Policy::LstImh {
            return Err(DispatchError::InvalidInput(
                "requeue 'keep' is for the round_robin and least_load baselines: lst_imh \
                 never selects a late job, so it would wait forever"
                    .into(),
            ));
        }
        Ok(Dispatcher {
            cfg,
            models: Vec::new(),
            model_ids: HashMap::new(),
            instances: HashMap::new(),
            groups: HashMap::new(),
            requests: HashMap::new(),
            rejected: Vec::new(),
            stats: Stats::default(),
            seq: 0,
            dirty: false,
            last_tick: f64::NEG_INFINITY,
        })
    }

    pub fn config(&self) -> &DispatcherConfig {
        &self.cfg
    }

    fn model_id(&mut self, name: &str) -> usize {
        if let Some(&m) = self.model_ids.get(name) {
            return m;
        }
        self.models.push(Model::default());
        self.model_ids
            .insert(name.to_string(), self.models.len() - 1);
        self.models.len() - 1
    }

    fn instance(&self, id: i64) -> Result<&Instance, DispatchError> {
        self.instances
            .get(&id)
            .ok_or_else(|| DispatchError::Instance(format!("unknown instance {id}")))
    }

    /// The load of `group`; a group with no load is idle (cannot happen: a group lives
    /// as long as one of its instances).
    fn load(&self, group: i64) -> &Load {
        static IDLE: Load = Load::IDLE;
        self.groups.get(&group).map_or(&IDLE, |g| &g.load)
    }

    /// Whether a tick now could assign something the last tick could not: work is queued
    /// and something changed since (a prefill done early, an instance ready, a fit moved).
    /// A shell that ticks only when asked calls this after worker events.
    pub fn wants_tick(&self) -> bool {
        self.dirty && self.stats.pending > 0
    }

    pub fn take_rejected(&mut self) -> Vec<i64> {
        std::mem::take(&mut self.rejected)
    }

    /// The EPDT of the instance's group: when all the work given to the group so far is
    /// estimated done (never before `now`).
    pub fn epdt(&self, instance: i64, now: f64) -> Result<f64, DispatchError> {
        let now = check_time("now", now)?;
        Ok(self.load(self.instance(instance)?.group).epdt(now))
    }

    /// How long request `r` takes on instance `inst`: its fit, else the request's estimate.
    fn proc_on(inst: &Instance, r: &Request) -> f64 {
        inst.fit.map_or(r.est, |(a, b)| a + b * r.tokens)
    }

    /// The least time `r` takes on any instance of its model (its submitted estimate
    /// when the model has none): its latest start is `deadline - min_proc`, the moment
    /// no instance, even an idle one, can finish it in time any more.
    fn min_proc(&self, r: &Request) -> f64 {
        let mut best = f64::INFINITY;
        for i in &self.models[r.model].instances {
            if let Some(inst) = self.instances.get(i) {
                best = best.min(Self::proc_on(inst, r));
            }
        }
        if best == f64::INFINITY { r.est } else { best }
    }

    /// The earliest any of `instances` could finish a prefill of `tokens` (estimate `est`
    /// where an instance has no fit) given the work it has: min of EPDT(now) + its own
    /// time for it. None for no instances. The core's early-refusal test.
    pub fn earliest_finish(&self, instances: &[i64], tokens: f64, est: f64, now: f64) -> Result<Option<f64>, DispatchError> {
        let now = check_time("now", now)?;
        let probe = Request {
            model: 0,
            seq: 0,
            arrival: now,
            original_deadline: now,
            deadline: now,
            est: check_time("est", est)?,
            tokens: check_time("tokens", tokens)?,
            weight: 0.0,
            relaxed: 0,
            place: Place::Queued,
        };
        let mut best: Option<f64> = None;
        for &i in instances {
            let inst = self.instance(i)?;
            let t = self.load(inst.group).epdt(now) + Self::proc_on(inst, &probe);
            if best.is_none_or(|b| t < b) {
                best = Some(t);
            }
        }
        Ok(best)
    }

    /// What a refusal reports of an instance: its group's EPDT(now), whether it takes
    /// work (ready), and the requests it was given whose prefill is not done yet.
    pub fn instance_figures(&self, instance: i64, now: f64) -> Result<(f64, bool, usize), DispatchError> {
        let now = check_time("now", now)?;
        let inst = self.instance(instance)?;
        Ok((self.load(inst.group).epdt(now), inst.ready, inst.assigned.len()))
    }

    /// The least EPDT over `instances` (None for none): the core's early-refusal test
    /// asks it for every request over the model's instances, one call instead of one per
    /// instance. The first of equal values, as a left-to-right `min` would give.
    pub fn min_epdt(&self, instances: &[i64], now: f64) -> Result<Option<f64>, DispatchError> {
        let mut best: Option<f64> = None;
        for &i in instances {
            let e = self.epdt(i, now)?;
            if best.is_none_or(|b| e < b) {
                best = Some(e);
            }
        }
        Ok(best)
    }

    /// Queued requests of `model` (0 for a model never seen).
    pub fn pending(&self, model: &str) -> usize {
        self.model_ids
            .get(model)
            .map_or(0, |&m| self.models[m].queued)
    }

    /// Deadline extensions granted to `model`'s requests so far (the per-model share of
    /// `stats().relaxed`); 0 for a model never seen.
    pub fn relaxed(&self, model: &str) -> u64 {
        self.model_ids
            .get(model)
            .map_or(0, |&m| self.models[m].relaxed)
    }

    pub fn stats(&self) -> Stats {
        self.stats.clone()
    }
}

// The tick itself (requeue, fair order, the assignment policies, the commit of a global
// plan) and next_wakeup live in their own file; so do a request's calls (submit, complete,
// cancel), the instance and group membership calls and check_integrity.
#[path = "dispatcher_tick.rs"]
mod tick;

#[path = "dispatcher_jobs.rs"]
mod jobs;

#[path = "dispatcher_members.rs"]
mod members;

#[path = "dispatcher_integrity.rs"]
mod integrity;

#[cfg(test)]
#[path = "dispatcher_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "dispatcher_group_tests.rs"]
mod group_tests;

#[cfg(test)]
#[path = "dispatcher_conservation_tests.rs"]
mod conservation_tests;

#[cfg(test)]
#[path = "dispatcher_group_integrity_tests.rs"]
mod group_integrity_tests;
