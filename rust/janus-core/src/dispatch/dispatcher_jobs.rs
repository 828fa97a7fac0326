//! A request's life in the dispatcher, from the caller's side: `submit` (and its
//! weighted and token-counted forms) queues it, `complete` or `cancel` ends it and takes
//! its remaining work off its group's load. The tick (dispatcher_tick.rs) moves it from
//! queued to assigned in between.
//!
//! A child module of `dispatcher` (it writes the private state); split off to keep
//! dispatcher.rs, the state and its queries, under the 400-line rule.

use super::super::{check_time, DispatchError};
use super::{Dispatcher, Place, Request};

impl Dispatcher {
    pub fn submit(
        &mut self,
        id: i64,
        model: &str,
        arrival: f64,
        deadline: f64,
        est: f64,
    ) -> Result<(), DispatchError> {
        self.submit_weighted(id, model, arrival, deadline, est, 1.0)
    }

    /// [`Dispatcher::submit`] with the job's value for `Objective::Tokens` (finite, `>= 0`;
    /// the daemon passes the request's expected output tokens).
    pub fn submit_weighted(
        &mut self,
        id: i64,
        model: &str,
        arrival: f64,
        deadline: f64,
        est: f64,
        weight: f64,
    ) -> Result<(), DispatchError> {
        self.submit_job(id, model, arrival, deadline, est, weight, 0.0)
    }

    /// [`Dispatcher::submit_weighted`] with the prompt's `tokens` (finite, `>= 0`): on an
    /// instance with a prefill fit the job takes `a + b * tokens` there, not `est`.
    #[allow(clippy::too_many_arguments)]
    pub fn submit_job(
        &mut self,
        id: i64,
        model: &str,
        arrival: f64,
        deadline: f64,
        est: f64,
        weight: f64,
        tokens: f64,
    ) -> Result<(), DispatchError> {
        let weight = check_time("weight", weight)?;
        let tokens = check_time("tokens", tokens)?;
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
            tokens,
            weight,
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
        self.unassign(inst_id, id, Some(now));
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
                self.unassign(i, id, now);
                self.stats.in_flight -= 1;
            }
        }
        self.stats.cancelled += 1;
        self.dirty = true;
        true
    }

    /// Takes request `id` off instance `inst` and its work still ahead off the group load.
    fn unassign(&mut self, inst: i64, id: i64, now: Option<f64>) {
        if let Some(instance) = self.instances.get_mut(&inst) {
            instance.assigned.remove(&id);
            if let Some(g) = self.groups.get_mut(&instance.group) {
                g.load.remove(id, now);
            }
        }
    }
}
