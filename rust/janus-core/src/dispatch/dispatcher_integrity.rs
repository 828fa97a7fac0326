//! `Dispatcher::check_integrity`: every known request is in exactly one place, and the
//! counters, instance lists and group loads agree with that.
//!
//! A child module of `dispatcher` (it reads the private state). O(state); meant for tests
//! and for a debug endpoint, not for every tick.

use std::collections::{HashMap, HashSet};

use super::{Dispatcher, Place};

impl Dispatcher {
    /// `Err` with a message naming the first broken rule found:
    /// - a Queued request has exactly one live entry (same seq) in its model's queue; an
    ///   Assigned(i) one has instance i, is in its `assigned` map and is live in no queue;
    /// - every instance's assigned ids are Assigned to that instance (and its model);
    /// - each model's `queued` equals its live queue entries; `stats.pending` equals the
    ///   queued total and `stats.in_flight` the assigned total;
    /// - instances, models and groups list each other consistently;
    /// - every job id held in a group's load is a request assigned to an instance of that
    ///   group, at most once.
    pub fn check_integrity(&self) -> Result<(), String> {
        let (live, queued_total) = self.check_queues()?;
        let (queued, assigned) = self.check_requests(&live)?;
        let held = self.check_instances()?;
        self.check_groups()?;
        let s = &self.stats;
        if s.pending != queued || queued != queued_total {
            return Err(format!(
                "stats.pending is {} but {queued} requests are queued ({queued_total} by the models)",
                s.pending
            ));
        }
        if s.in_flight != assigned || assigned != held {
            return Err(format!(
                "stats.in_flight is {} but {assigned} requests are assigned ({held} held by instances)",
                s.in_flight
            ));
        }
        Ok(())
    }

    /// Each model's queue (live entries and their count, its instance list): the requests
    /// live in the queues (id -> entries) and their total.
    fn check_queues(&self) -> Result<(HashMap<i64, usize>, u64), String> {
        let mut live: HashMap<i64, usize> = HashMap::new();
        let mut queued_total = 0u64;
        for (m, model) in self.models.iter().enumerate() {
            let mut n = 0usize;
            for &(seq, id) in &model.queue {
                let Some(r) = self.requests.get(&id).filter(|r| r.seq == seq) else {
                    continue; // stale: dropped at the next tick
                };
                if r.model != m {
                    return Err(format!(
                        "request {id} is in model {m}'s queue but belongs to model {}",
                        r.model
                    ));
                }
                if let Place::Assigned(i) = r.place {
                    return Err(format!(
                        "request {id} is assigned to instance {i} but still live in model {m}'s queue"
                    ));
                }
                *live.entry(id).or_default() += 1;
                n += 1;
            }
            if n != model.queued {
                return Err(format!(
                    "model {m} counts {} queued requests but its queue holds {n} live entries",
                    model.queued
                ));
            }
            queued_total += n as u64;
            if model.instances.windows(2).any(|w| w[0] >= w[1]) {
                return Err(format!(
                    "model {m}'s instance list is not strictly ascending"
                ));
            }
            for &i in &model.instances {
                if self.instances.get(&i).is_none_or(|inst| inst.model != m) {
                    return Err(format!(
                        "model {m} lists instance {i}, which is not its own"
                    ));
                }
            }
        }
        Ok((live, queued_total))
    }

    /// Each request's place against the queues (`live`) and the instances: the numbers
    /// queued and assigned.
    fn check_requests(&self, live: &HashMap<i64, usize>) -> Result<(u64, u64), String> {
        let (mut queued, mut assigned) = (0u64, 0u64);
        for (&id, r) in &self.requests {
            match r.place {
                Place::Queued => {
                    queued += 1;
                    let n = live.get(&id).copied().unwrap_or(0);
                    if n != 1 {
                        return Err(format!(
                            "request {id} is queued with {n} live entries in model {}'s queue",
                            r.model
                        ));
                    }
                }
                Place::Assigned(i) => {
                    assigned += 1;
                    let Some(inst) = self.instances.get(&i) else {
                        return Err(format!("request {id} is assigned to unknown instance {i}"));
                    };
                    if !inst.assigned.contains_key(&id) {
                        return Err(format!(
                            "request {id} is assigned to instance {i}, which does not hold it"
                        ));
                    }
                    if inst.model != r.model {
                        return Err(format!(
                            "request {id} of model {} is assigned to instance {i} of model {}",
                            r.model, inst.model
                        ));
                    }
                }
            }
        }
        Ok((queued, assigned))
    }

    /// Each instance's assigned requests, model list and group: the number held.
    fn check_instances(&self) -> Result<u64, String> {
        let mut held = 0u64;
        for (&i, inst) in &self.instances {
            for &id in inst.assigned.keys() {
                let place = self.requests.get(&id).map(|r| r.place);
                if place != Some(Place::Assigned(i)) {
                    return Err(format!(
                        "instance {i} holds request {id}, whose place is {place:?}"
                    ));
                }
            }
            held += inst.assigned.len() as u64;
            if !self
                .models
                .get(inst.model)
                .is_some_and(|m| m.instances.contains(&i))
            {
                return Err(format!("instance {i} is missing from its model's list"));
            }
            if !self
                .groups
                .get(&inst.group)
                .is_some_and(|g| g.members.contains(&i))
            {
                return Err(format!(
                    "instance {i} is missing from its group {}",
                    inst.group
                ));
            }
        }
        Ok(held)
    }

    /// Each group's members and the jobs its load holds.
    fn check_groups(&self) -> Result<(), String> {
        for (&g, group) in &self.groups {
            if group.members.is_empty() || group.members.windows(2).any(|w| w[0] >= w[1]) {
                return Err(format!("group {g}'s member list is empty or not ascending"));
            }
            if let Some(&i) = group
                .members
                .iter()
                .find(|i| self.instances.get(i).is_none_or(|inst| inst.group != g))
            {
                return Err(format!(
                    "group {g} lists instance {i}, which is not its member"
                ));
            }
            let mut seen = HashSet::new();
            for id in group.load.ids() {
                let ok = match self.requests.get(&id).map(|r| r.place) {
                    Some(Place::Assigned(i)) => {
                        self.instances.get(&i).is_some_and(|inst| inst.group == g)
                    }
                    _ => false,
                };
                if !ok {
                    return Err(format!(
                        "group {g}'s load holds job {id}, not assigned to an instance of the group"
                    ));
                }
                if !seen.insert(id) {
                    return Err(format!("group {g}'s load holds job {id} twice"));
                }
            }
        }
        Ok(())
    }
}
