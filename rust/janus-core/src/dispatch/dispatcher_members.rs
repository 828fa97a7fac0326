//! The dispatcher's instance and group membership: instances join (into a device group,
//! which one EPDT serves), leave (handing back what they held), and report readiness,
//! their own prefill fit and their group's decode load.
//!
//! A child module of `dispatcher` (it writes the private state).

use std::collections::HashMap;

use super::super::{check_time, DispatchError};
use super::{Dispatcher, Instance};

impl Dispatcher {
    /// Registers a ready instance of `model` in device group `group` (any id; a group
    /// that does not exist yet starts idle). The instances of a group share one EPDT.
    pub fn add_instance(&mut self, id: i64, model: &str, group: i64) -> Result<(), DispatchError> {
        if self.instances.contains_key(&id) {
            return Err(DispatchError::Instance(format!(
                "instance {id} already exists"
            )));
        }
        let m = self.model_id(model);
        let list = &mut self.models[m].instances;
        let pos = list.partition_point(|&x| x < id);
        list.insert(pos, id);
        let members = &mut self.groups.entry(group).or_default().members;
        let pos = members.partition_point(|&x| x < id);
        members.insert(pos, id);
        let inst = Instance {
            model: m,
            group,
            ready: true,
            assigned: HashMap::new(),
            fit: None,
        };
        self.instances.insert(id, inst);
        self.dirty = true;
        Ok(())
    }

    /// Removes the instance and returns, in assignment order, the requests it had been
    /// given and not completed. The dispatcher forgets them (the caller may resubmit
    /// them under the same ids) and takes their work still ahead out of the group's load;
    /// queued requests of its model stay queued.
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
        if let Some(g) = self.groups.get_mut(&inst.group) {
            for &(_, r) in &orphans {
                g.load.remove(r, None);
            }
            g.members.retain(|&x| x != id);
            if g.members.is_empty() {
                self.groups.remove(&inst.group);
            }
        }
        self.stats.orphaned += orphans.len() as u64;
        self.stats.in_flight -= orphans.len() as u64;
        self.dirty = true;
        Ok(orphans.into_iter().map(|(_, r)| r).collect())
    }

    /// The decode load of a group's worker (e.g. sequences decoding there), used only to
    /// break ties between equally free machines (plan.rs); an unknown group is ignored
    /// (it has no instance yet). Does not wake the dispatcher.
    pub fn set_group_decode_load(&mut self, group: i64, load: f64) -> Result<(), DispatchError> {
        let load = check_time("decode load", load)?;
        if let Some(g) = self.groups.get_mut(&group) {
            g.decode = load;
        }
        Ok(())
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

    /// The instance's own prefill fit: a job given to it takes `a + b * tokens` there
    /// (EPDT, the plan, the latest start). None: each job's submitted estimate. Both
    /// finite and `>= 0`.
    pub fn set_prefill_fit(&mut self, instance: i64, fit: Option<(f64, f64)>) -> Result<(), DispatchError> {
        let fit = match fit {
            Some((a, b)) => Some((check_time("fit a", a)?, check_time("fit b", b)?)),
            None => None,
        };
        let inst = self
            .instances
            .get_mut(&instance)
            .ok_or_else(|| DispatchError::Instance(format!("unknown instance {instance}")))?;
        if inst.fit != fit {
            inst.fit = fit;
            self.dirty = true;
        }
        Ok(())
    }
}
