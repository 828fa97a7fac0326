//! `Dispatcher::tick` and `next_wakeup`: requeue, fair model order, the machines, the
//! assignment policies and the commit of a global plan.
//!
//! A child module of `dispatcher`, so it sees the dispatcher's private state; see the
//! module docs of `dispatcher.rs` for the semantics.

use super::super::config::{Assignment, Objective, Plan, Policy, Requeue};
use super::super::lst_imh::lst_imh_on;
use super::super::plan::plan_on;
use super::super::speed::{Jobs, Machines, Row, Speed};
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
        if self.cfg.policy == Policy::LstImh {
            self.assign_lst_imh(work, now, &mut out);
            return Ok(out);
        }
        for (_, m, backlog) in work {
            let left = self.assign_one_each(m, backlog, now, &mut out);
            self.models[m].queue = left;
        }
        Ok(out)
    }

    /// Drops stale queue entries and applies reject/relax; returns the live backlog.
    fn requeue(&mut self, m: usize, now: f64) -> Vec<(u64, i64)> {
        let queue = std::mem::take(&mut self.models[m].queue);
        let mut live = Vec::with_capacity(self.models[m].queued);
        for (seq, id) in queue {
            let Some(r) = self.requests.get(&id) else {
                continue;
            };
            if r.seq != seq || r.place != Place::Queued {
                continue;
            }
            let p = self.min_proc(r);
            let Some(r) = self.requests.get_mut(&id) else {
                continue;
            };
            if self.cfg.requeue == Requeue::Relax {
                let budget = (r.original_deadline - r.arrival).max(0.0);
                while now > r.deadline - p && r.relaxed < self.cfg.max_relax {
                    r.relaxed += 1;
                    r.deadline = now + budget * self.cfg.relax_factor.powi(r.relaxed as i32);
                    self.stats.relaxed += 1;
                    self.models[m].relaxed += 1;
                }
            }
            if self.cfg.requeue != Requeue::Keep && now > r.deadline - p {
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
        group.load.assign(req, Self::proc_on(instance, r), now);
        instance.assigned.insert(req, self.stats.assigned);
        self.models[r.model].queued -= 1;
        self.stats.pending -= 1;
        self.stats.in_flight += 1;
        self.stats.assigned += 1;
        out.push((req, inst));
    }

    /// LST-IMH over every model's backlog at once (module docs of dispatcher.rs, step 3):
    /// machines are the device groups with a ready instance of a model with queued work,
    /// each with its own processing time per model (the instance's fit, speed.rs); a job
    /// runs only on a group where its model has a ready instance. Models sharing a group
    /// are planned together, so one model's plan sees the others' queued work; jobs are
    /// indexed in submission order (equal deadlines: first come first).
    fn assign_lst_imh(&mut self, work: Vec<(f64, usize, Queue)>, now: f64, out: &mut Vec<Assignment>) {
        // Global plans over every group and commits what starts inside the window
        let global = self.cfg.plan == Plan::Global;
        // classes: the models with work, in `work` order
        let models: Vec<usize> = work.iter().map(|w| w.1).collect();
        let mut entries: Vec<(u64, i64, u32)> = Vec::new();
        for (c, (_, _, backlog)) in work.iter().enumerate() {
            entries.extend(backlog.iter().map(|&(seq, id)| (seq, id, c as u32)));
        }
        entries.sort_unstable();
        let (groups, targets, rows) = self.plan_machines(&models, now, !global);
        let inside: Vec<bool> = groups.iter().map(|g| self.group_inside_window(*g, now)).collect();
        if entries.is_empty() || !inside.iter().any(|&x| x) {
            self.requeue_left(&models, &entries, &[]);
            return;
        }
        let mut est = Vec::with_capacity(entries.len());
        let mut tokens = Vec::with_capacity(entries.len());
        let mut deadline = Vec::with_capacity(entries.len());
        let mut weight = Vec::with_capacity(entries.len());
        let class: Vec<u32> = entries.iter().map(|e| e.2).collect();
        for &(_, id, _) in &entries {
            let (e, t, d, w) = self.requests.get(&id).map_or((0.0, 0.0, 0.0, 0.0), |r| (r.est, r.tokens, r.deadline, r.weight));
            est.push(e);
            tokens.push(t);
            deadline.push(d);
            weight.push(w);
        }
        let weighted = self.cfg.objective == Objective::Tokens;
        let jobs = Jobs { est: &est, tokens: &tokens, deadline: &deadline, class: &class,
                          weight: weighted.then_some(&weight[..]) };
        let avail: Vec<f64> = groups.iter().map(|&g| self.load(g).epdt(now)).collect();
        // identical machines (every group runs every model at the submitted estimate): the
        // paper's case, planned exactly as before machines could differ
        let identical = rows.iter().all(|r| r.iter().all(|s| *s == Some(Speed::EST)));
        let machines = Machines { avail: &avail, rows: if identical { &[] } else { &rows } };
        let rank: Vec<f64> = groups.iter().map(|g| self.groups.get(g).map_or(0.0, |x| x.decode)).collect();
        let plan = match self.cfg.plan {
            Plan::Global => plan_on(&jobs, &machines, &rank),
            Plan::Window => lst_imh_on(&jobs, &machines),
        };
        let mut taken = vec![false; entries.len()];
        for (k, js) in plan.into_iter().enumerate() {
            for j in js {
                // Global: commit the prefix that starts inside the window; the rest waits.
                if global && !self.group_inside_window(groups[k], now) {
                    break;
                }
                let Some(inst) = targets[k][class[j] as usize] else {
                    continue;
                };
                taken[j] = true;
                self.give(entries[j].1, inst, now, out);
            }
        }
        self.requeue_left(&models, &entries, &taken);
    }

    /// Puts the entries not taken back into their models' queues (FIFO order kept).
    fn requeue_left(&mut self, models: &[usize], entries: &[(u64, i64, u32)], taken: &[bool]) {
        for &m in models {
            self.models[m].queue.clear();
        }
        for (k, &(seq, id, c)) in entries.iter().enumerate() {
            if !taken.get(k).copied().unwrap_or(false) {
                self.models[models[c as usize]].queue.push((seq, id));
            }
        }
    }

    /// The machines of a joint plan: device groups (ascending id) with a ready instance of
    /// one of `models` (`in_window`: only groups inside the pre-pull window), per group the
    /// instance to give each model's jobs to (its lowest ready id there) and its row of
    /// speeds (the instance's fit, else the submitted estimate; None: no such instance).
    #[allow(clippy::type_complexity)]
    fn plan_machines(&self, models: &[usize], now: f64, in_window: bool) -> (Vec<i64>, Vec<Vec<Option<i64>>>, Vec<Row>) {
        let mut groups: Vec<i64> = Vec::new();
        for &m in models {
            for &i in &self.models[m].instances {
                if let Some(inst) = self.instances.get(&i).filter(|x| x.ready) {
                    groups.push(inst.group);
                }
            }
        }
        groups.sort_unstable();
        groups.dedup();
        if in_window {
            groups.retain(|&g| self.group_inside_window(g, now));
        }
        let mut targets = vec![vec![None; models.len()]; groups.len()];
        let mut rows: Vec<Row> = vec![vec![None; models.len()]; groups.len()];
        for (c, &m) in models.iter().enumerate() {
            for &i in &self.models[m].instances {
                let Some(inst) = self.instances.get(&i).filter(|x| x.ready) else {
                    continue;
                };
                let Ok(k) = groups.binary_search(&inst.group) else {
                    continue;
                };
                if targets[k][c].is_none() {
                    targets[k][c] = Some(i);
                    rows[k][c] = Some(inst.fit.map_or(Speed::EST, |(a, b)| Speed::fit(a, b)));
                }
            }
        }
        (groups, targets, rows)
    }

    /// Whether `group` is inside the pre-pull window at `now` (see `inside_window`).
    fn group_inside_window(&self, group: i64, now: f64) -> bool {
        self.load(group).busy_until() - self.cfg.prepull_window_s <= now
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
                    best = best.min(next_up(r.deadline - self.min_proc(r)));
                }
            }
        }
        Ok(Some(best))
    }
}
