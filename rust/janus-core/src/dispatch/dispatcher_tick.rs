//! `Dispatcher::tick`: requeue, candidate instances and the assignment policies.
//!
//! A child module of `dispatcher`, so it sees the dispatcher's private state; see the
//! module docs of `dispatcher.rs` for the semantics.

use super::super::config::{Assignment, Policy, Requeue};
use super::super::lst_imh::lst_imh_trusted;
use super::super::{check_time, DispatchError};
use super::{Dispatcher, Place};

impl Dispatcher {
    /// Applies the requeue policy and makes this tick's assignments (see module docs).
    pub fn tick(&mut self, now: f64) -> Result<Vec<Assignment>, DispatchError> {
        let now = check_time("now", now)?;
        self.stats.ticks += 1;
        self.dirty = false;
        self.last_tick = now;
        let mut out = Vec::new();
        for m in 0..self.models.len() {
            if self.models[m].queued == 0 {
                self.models[m].queue.clear();
                continue;
            }
            let backlog = self.requeue(m, now);
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
            if now > r.deadline - r.est {
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

    /// Ready instances of model `m` inside the pre-pull window, ascending id.
    ///
    /// Inside means `busy_until - window <= now`: the very expression `next_wakeup`
    /// schedules the wake-up at, so a tick at that instant finds the instance a candidate.
    /// (`epdt - now <= window` rounds differently and could miss by an ulp, leaving the
    /// backlog asleep until some job's latest start passed.)
    fn candidates(&self, m: usize, now: f64) -> Vec<(i64, f64)> {
        let window = self.cfg.prepull_window_s;
        self.models[m]
            .instances
            .iter()
            .filter_map(|&i| self.instances.get(&i).map(|inst| (i, inst)))
            .filter(|(_, inst)| inst.ready && inst.load.busy_until() - window <= now)
            .map(|(i, inst)| (i, inst.load.epdt(now)))
            .collect()
    }

    fn give(&mut self, req: i64, inst: i64, now: f64, out: &mut Vec<Assignment>) {
        let Some(r) = self.requests.get_mut(&req) else {
            return;
        };
        let Some(instance) = self.instances.get_mut(&inst) else {
            return;
        };
        r.place = Place::Assigned(inst);
        instance.load.assign(req, r.est, now);
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
        let cands = self.candidates(m, now);
        if cands.is_empty() || backlog.is_empty() {
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
        let avail: Vec<f64> = cands.iter().map(|c| c.1).collect();
        let plan = lst_imh_trusted(&proc, &deadline, &avail);
        let mut taken = vec![false; backlog.len()];
        for (c, jobs) in cands.iter().zip(plan) {
            for j in jobs {
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
        let mut cands = self.candidates(m, now);
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
}
