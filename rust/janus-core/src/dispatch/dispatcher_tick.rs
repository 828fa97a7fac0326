//! `Dispatcher::tick` and `next_wakeup`: requeue, fair model order, the machines, the
//! assignment policies and the commit of a global plan.
//!
//! A child module of `dispatcher`, so it sees the dispatcher's private state; see the
//! module docs of `dispatcher.rs` for the semantics.

use super::super::config::{Assignment, Objective, Plan, Policy, Requeue};
use super::super::lst_imh::lst_imh_trusted;
use super::super::plan::plan_global;
use super::super::{check_time, next_up, DispatchError};
use super::{Dispatcher, Place};

/// (submission seq, request id) entries of a model's queue, FIFO.
type Queue = Vec<(u64, i64)>;

impl Dispatcher {
    /// Applies the requeue policy and makes this tick's assignments (see module docs).
    pub fn tick(&mut self, now: f64) -> Result<Vec<Assignment>, DispatchError> {
        let now = check_time("now", now)?;
        self.stats.ticks += 1;
        self.dirty = false;
        self.last_tick = now;
        // Requeue every model (model order), then serve them by earliest live deadline.
        let mut work: Vec<(f64, usize, Queue)> = Vec::new();
        for m in 0..self.models.len() {
            if self.models[m].queued == 0 {
                self.models[m].queue.clear();
                continue;
            }
            let backlog = self.requeue(m, now);
            if backlog.is_empty() {
                continue;
            }
            let first = backlog
                .iter()
                .filter_map(|(_, id)| self.requests.get(id))
                .map(|r| r.deadline)
                .fold(f64::INFINITY, f64::min);
            work.push((first, m, backlog));
        }
        work.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut out = Vec::new();
        for (_, m, backlog) in work {
            let left = match self.cfg.policy {
                Policy::LstImh => self.assign_lst_imh(m, backlog, now, &mut out),
                Policy::RoundRobin | Policy::LeastLoad => {
                    self.assign_one_each(m, backlog, now, &mut out)
                }
            };
            self.models[m].queue = left;
        }
        Ok(out)
    }

    /// Drops stale queue entries and applies reject/relax; returns the live backlog.
    fn requeue(&mut self, m: usize, now: f64) -> Vec<(u64, i64)> {
        let queue = std::mem::take(&mut self.models[m].queue);
        let mut live = Vec::with_capacity(self.models[m].queued);
        for (seq, id) in queue {
            let Some(r) = self.requests.get_mut(&id) else {
                continue;
            };
            if r.seq != seq || r.place != Place::Queued {
                continue;
            }
            if self.cfg.requeue == Requeue::Relax {
                let budget = (r.original_deadline - r.arrival).max(0.0);
                while now > r.deadline - r.est && r.relaxed < self.cfg.max_relax {
                    r.relaxed += 1;
                    r.deadline = now + budget * self.cfg.relax_factor.powi(r.relaxed as i32);
                    self.stats.relaxed += 1;
                    self.models[m].relaxed += 1;
                }
            }
            if self.cfg.requeue != Requeue::Keep && now > r.deadline - r.est {
                self.requests.remove(&id);
                self.rejected.push(id);
                self.models[m].queued -= 1;
                self.stats.pending -= 1;
                self.stats.rejected += 1;
                continue;
            }
            live.push((seq, id));
        }
        live
    }

    /// Whether instance `i`'s group is inside the pre-pull window at `now`.
    ///
    /// Inside means `busy_until - window <= now`: the very expression `next_wakeup`
    /// schedules the wake-up at, so a tick at that instant finds the instance inside.
    /// (`epdt - now <= window` rounds differently and could miss by an ulp, leaving the
    /// backlog asleep until some job's latest start passed.) For the global plan's commit
    /// the group's busy time already includes the jobs committed before, so "planned start
    /// inside the window" is this same test.
    fn inside_window(&self, i: i64, now: f64) -> bool {
        self.instances.get(&i).is_some_and(|inst| {
            self.load(inst.group).busy_until() - self.cfg.prepull_window_s <= now
        })
    }

    /// Ready instances of model `m`, ascending id, with their group's EPDT(now): all of
    /// them, or (`in_window`) those inside the pre-pull window; `per_group` keeps only the
    /// lowest id of each group (instances of one group are one machine to plan over).
    fn machines(&self, m: usize, now: f64, in_window: bool, per_group: bool) -> Vec<(i64, f64)> {
        let mut seen: Vec<i64> = Vec::new();
        let mut out = Vec::new();
        for &i in &self.models[m].instances {
            let Some(inst) = self.instances.get(&i) else {
                continue;
            };
            if !inst.ready || (in_window && !self.inside_window(i, now)) {
                continue;
            }
            if per_group {
                if seen.contains(&inst.group) {
                    continue;
                }
                seen.push(inst.group);
            }
            out.push((i, self.load(inst.group).epdt(now)));
        }
        out
    }

    fn decode_load_of(&self, inst: i64) -> f64 {
        self.instances
            .get(&inst)
            .and_then(|i| self.groups.get(&i.group))
            .map_or(0.0, |g| g.decode)
    }

    fn give(&mut self, req: i64, inst: i64, now: f64, out: &mut Vec<Assignment>) {
        let Some(r) = self.requests.get_mut(&req) else {
            return;
        };
        let Some(instance) = self.instances.get_mut(&inst) else {
            return;
        };
        let Some(group) = self.groups.get_mut(&instance.group) else {
            return;
        };
        r.place = Place::Assigned(inst);
        group.load.assign(req, r.est, now);
        instance.assigned.insert(req, self.stats.assigned);
        self.models[r.model].queued -= 1;
        self.stats.pending -= 1;
        self.stats.in_flight += 1;
        self.stats.assigned += 1;
        out.push((req, inst));
    }

    fn assign_lst_imh(
        &mut self,
        m: usize,
        backlog: Vec<(u64, i64)>,
        now: f64,
        out: &mut Vec<Assignment>,
    ) -> Vec<(u64, i64)> {
        let global = self.cfg.plan == Plan::Global;
        let machines = self.machines(m, now, !global, true);
        // Global: nothing can be committed while no machine is inside its window.
        if backlog.is_empty() || !machines.iter().any(|c| self.inside_window(c.0, now)) {
            return backlog;
        }
        let (proc, deadline): (Vec<f64>, Vec<f64>) = backlog
            .iter()
            .map(|(_, id)| {
                self.requests
                    .get(id)
                    .map_or((0.0, 0.0), |r| (r.est, r.deadline))
            })
            .unzip();
        let weight: Option<Vec<f64>> = (self.cfg.objective == Objective::Tokens).then(|| {
            backlog
                .iter()
                .map(|(_, id)| self.requests.get(id).map_or(0.0, |r| r.weight))
                .collect()
        });
        let avail: Vec<f64> = machines.iter().map(|c| c.1).collect();
        let plan = if global {
            let rank: Vec<f64> = machines.iter().map(|c| self.decode_load_of(c.0)).collect();
            plan_global(&proc, &deadline, &avail, &rank, weight.as_deref())
        } else {
            lst_imh_trusted(&proc, &deadline, &avail, weight.as_deref())
        };
        let mut taken = vec![false; backlog.len()];
        for (c, jobs) in machines.iter().zip(plan) {
            for j in jobs {
                // Global: commit the prefix that starts inside the window; the rest waits.
                if global && !self.inside_window(c.0, now) {
                    break;
                }
                taken[j] = true;
                self.give(backlog[j].1, c.0, now, out);
            }
        }
        backlog
            .into_iter()
            .zip(taken)
            .filter(|(_, t)| !t)
            .map(|(e, _)| e)
            .collect()
    }

    fn assign_one_each(
        &mut self,
        m: usize,
        backlog: Vec<(u64, i64)>,
        now: f64,
        out: &mut Vec<Assignment>,
    ) -> Vec<(u64, i64)> {
        let mut cands = self.machines(m, now, true, false);
        if self.cfg.policy == Policy::LeastLoad {
            // By outstanding work (EPDT - now), then id.
            cands.sort_by(|a, b| (a.1 - now).total_cmp(&(b.1 - now)).then(a.0.cmp(&b.0)));
        } else if let Some(last) = self.models[m].rr_last {
            // Rotate so that the first id after the one served last comes first.
            let k = cands.partition_point(|c| c.0 <= last);
            cands.rotate_left(k);
        }
        let n = cands.len().min(backlog.len());
        for (c, &(_, req)) in cands.iter().zip(&backlog).take(n) {
            self.give(req, c.0, now, out);
            if self.cfg.policy == Policy::RoundRobin {
                self.models[m].rr_last = Some(c.0);
            }
        }
        backlog[n..].to_vec()
    }

    /// When `tick` should next run: the earliest of (a) an instance of a model with queued
    /// work reaching its pre-pull window (its group's EPDT - window) after the last tick
    /// (with `plan = global` that is when a job planned there and deferred can be
    /// committed: the commit test is the same expression), (b) a queued
    /// job passing its latest start (reject/relax is due; never under `keep`), (c) `now` when the state
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
                // Same expression as the window test in `tick` (see `inside_window`).
                let at = self.load(inst.group).busy_until() - self.cfg.prepull_window_s;
                if at > self.last_tick {
                    best = best.min(at);
                } else if self.cfg.policy != Policy::LstImh {
                    best = best.min(now);
                }
            }
            // Under `keep` a latest start passing changes nothing: no wake-up for it (one
            // in the past would ask for a tick at every call).
            let queue: &[(u64, i64)] = if self.cfg.requeue == Requeue::Keep { &[] } else { &model.queue };
            for &(seq, id) in queue {
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
