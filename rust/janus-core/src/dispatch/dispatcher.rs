//! The online dispatcher: per-model FIFO queues, per-instance EPDT, pre-pull window.
//!
//! Clock-injected: every method that needs a time takes `now`, so the daemon (real clock)
//! and the simulator (virtual clock) drive the same object. Nothing here reads a clock.
//!
//! `tick(now)`, per model with queued work:
//! 1. requeue: a queued job past its latest start (`now > deadline - est`) cannot be on
//!    time even on an idle instance. `reject` drops it (reported by `take_rejected`);
//!    `relax` gives it `deadline = now + (original deadline - arrival) * relax_factor^k`
//!    on its k-th relaxation (a fresh, growing budget from now), at most `max_relax`
//!    times, then rejects it.
//! 2. candidates: the model's ready instances with `EPDT - prepull_window <= now`.
//! 3. `lst_imh`: LST-IMH over the model's whole backlog (FIFO order = job index, so equal
//!    deadlines go first-come first) with avail = each candidate's EPDT (candidates in
//!    ascending instance id, so equal EPDTs go to the lower id first); each candidate takes
//!    its selected jobs in execution order. Jobs not selected stay queued.
//!    `round_robin` / `least_load`: each candidate takes one job, oldest first, candidates
//!    in rotating id order / by (outstanding work, id).

use std::collections::HashMap;

use super::config::{DispatcherConfig, Policy, Stats};
use super::epdt::Load;
use super::{check_time, next_up, DispatchError};

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
    ready: bool,
    load: Load,
    /// Request id -> assignment counter, to hand them back in order on removal.
    assigned: HashMap<i64, u64>,
}

#[derive(Debug)]
pub struct Dispatcher {
    cfg: DispatcherConfig,
    models: Vec<Model>,
    model_ids: HashMap<String, usize>,
    instances: HashMap<i64, Instance>,
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
        Ok(Dispatcher {
            cfg,
            models: Vec::new(),
            model_ids: HashMap::new(),
            instances: HashMap::new(),
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

    pub fn add_instance(&mut self, id: i64, model: &str) -> Result<(), DispatchError> {
        if self.instances.contains_key(&id) {
            return Err(DispatchError::Instance(format!(
                "instance {id} already exists"
            )));
        }
        let m = self.model_id(model);
        let list = &mut self.models[m].instances;
        let pos = list.partition_point(|&x| x < id);
        list.insert(pos, id);
        let inst = Instance {
            model: m,
            ready: true,
            load: Load::default(),
            assigned: HashMap::new(),
        };
        self.instances.insert(id, inst);
        self.dirty = true;
        Ok(())
    }

    /// Removes the instance and returns, in assignment order, the requests it had been
    /// given and not completed. The dispatcher forgets them (the caller may resubmit
    /// them under the same ids); queued requests of its model stay queued.
    pub fn remove_instance(&mut self, id: i64) -> Result<Vec<i64>, DispatchError> {
        let inst = self
            .instances
            .remove(&id)
            .ok_or_else(|| DispatchError::Instance(format!("unknown instance {id}")))?;
        self.models[inst.model].instances.retain(|&x| x != id);
        let mut orphans: Vec<(u64, i64)> = inst.assigned.iter().map(|(&r, &k)| (k, r)).collect();
        orphans.sort_unstable();
        for &(_, r) in &orphans {
            self.requests.remove(&r);
        }
        self.stats.orphaned += orphans.len() as u64;
        self.stats.in_flight -= orphans.len() as u64;
        self.dirty = true;
        Ok(orphans.into_iter().map(|(_, r)| r).collect())
    }

    pub fn set_instance_ready(&mut self, id: i64, ready: bool) -> Result<(), DispatchError> {
        let inst = self
            .instances
            .get_mut(&id)
            .ok_or_else(|| DispatchError::Instance(format!("unknown instance {id}")))?;
        inst.ready = ready;
        self.dirty = true;
        Ok(())
    }

    pub fn submit(
        &mut self,
        id: i64,
        model: &str,
        arrival: f64,
        deadline: f64,
        est: f64,
    ) -> Result<(), DispatchError> {
        let arrival = check_time("arrival_s", arrival)?;
        let deadline = check_time("deadline_s", deadline)?;
        let est = check_time("est_proc_s", est)?;
        if self.requests.contains_key(&id) {
            return Err(DispatchError::Request(format!(
                "request {id} is already queued or in flight"
            )));
        }
        let m = self.model_id(model);
        self.seq += 1;
        let req = Request {
            model: m,
            seq: self.seq,
            arrival,
            original_deadline: deadline,
            deadline,
            est,
            relaxed: 0,
            place: Place::Queued,
        };
        self.requests.insert(id, req);
        self.models[m].queue.push((self.seq, id));
        self.models[m].queued += 1;
        self.stats.submitted += 1;
        self.stats.pending += 1;
        self.dirty = true;
        Ok(())
    }

    /// The request's prefill finished: its remaining estimated work leaves its instance.
    pub fn complete(&mut self, id: i64, now: f64) -> Result<(), DispatchError> {
        let now = check_time("now", now)?;
        let inst_id = match self.requests.get(&id).map(|r| r.place) {
            None => return Err(DispatchError::Request(format!("unknown request {id}"))),
            Some(Place::Queued) => {
                return Err(DispatchError::Request(format!(
                    "request {id} is queued, not assigned"
                )))
            }
            Some(Place::Assigned(i)) => i,
        };
        self.requests.remove(&id);
        if let Some(inst) = self.instances.get_mut(&inst_id) {
            inst.load.remove(id, Some(now));
            inst.assigned.remove(&id);
        }
        self.stats.completed += 1;
        self.stats.in_flight -= 1;
        self.dirty = true;
        Ok(())
    }

    /// Removes a queued or assigned request; false when the id is not known. An assigned
    /// one takes its work still ahead as of the instance's last event with it; use
    /// [`Dispatcher::cancel_at`] when the time is known.
    pub fn cancel(&mut self, id: i64) -> bool {
        self.cancel_inner(id, None)
    }

    /// [`Dispatcher::cancel`] at `now`: time since the instance's last event counts as
    /// work done first (as in `complete`), so a running job cancelled halfway takes only
    /// its unfinished half with it and the jobs behind it keep their real start.
    pub fn cancel_at(&mut self, id: i64, now: f64) -> Result<bool, DispatchError> {
        let now = check_time("now", now)?;
        Ok(self.cancel_inner(id, Some(now)))
    }

    fn cancel_inner(&mut self, id: i64, now: Option<f64>) -> bool {
        let Some(req) = self.requests.remove(&id) else {
            return false;
        };
        match req.place {
            Place::Queued => {
                self.models[req.model].queued -= 1;
                self.stats.pending -= 1;
            }
            Place::Assigned(i) => {
                if let Some(inst) = self.instances.get_mut(&i) {
                    inst.load.remove(id, now);
                    inst.assigned.remove(&id);
                }
                self.stats.in_flight -= 1;
            }
        }
        self.stats.cancelled += 1;
        self.dirty = true;
        true
    }

    pub fn take_rejected(&mut self) -> Vec<i64> {
        std::mem::take(&mut self.rejected)
    }

    pub fn epdt(&self, instance: i64, now: f64) -> Result<f64, DispatchError> {
        let now = check_time("now", now)?;
        Ok(self.instance(instance)?.load.epdt(now))
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

    /// When `tick` should next run: the earliest of (a) an instance of a model with queued
    /// work reaching its pre-pull window (EPDT - window) after the last tick, (b) a queued
    /// job passing its latest start (reject/relax is due), (c) `now` when the state
    /// changed since the last tick or, for the one-job-per-tick policies, while a
    /// candidate is still inside its window. A result `<= now` means "tick now".
    /// `None` when nothing is queued.
    pub fn next_wakeup(&self, now: f64) -> Result<Option<f64>, DispatchError> {
        let now = check_time("now", now)?;
        if self.stats.pending == 0 {
            return Ok(None);
        }
        if self.dirty {
            return Ok(Some(now));
        }
        let mut best = f64::INFINITY;
        for model in self.models.iter().filter(|m| m.queued > 0) {
            for inst in model
                .instances
                .iter()
                .filter_map(|i| self.instances.get(i))
                .filter(|i| i.ready)
            {
                // An instance idle since before the last tick has nothing new to offer.
                // Same expression as the candidate test in `tick` (see `candidates`).
                let at = inst.load.busy_until() - self.cfg.prepull_window_s;
                if at > self.last_tick {
                    best = best.min(at);
                } else if self.cfg.policy != Policy::LstImh {
                    best = best.min(now);
                }
            }
            for &(seq, id) in &model.queue {
                if let Some(r) = self
                    .requests
                    .get(&id)
                    .filter(|r| r.seq == seq && r.place == Place::Queued)
                {
                    best = best.min(next_up(r.deadline - r.est));
                }
            }
        }
        Ok(Some(best))
    }
}

// The tick itself (requeue, candidates, the assignment policies) lives in its own file.
#[path = "dispatcher_tick.rs"]
mod tick;

#[cfg(test)]
#[path = "dispatcher_tests.rs"]
mod tests;
