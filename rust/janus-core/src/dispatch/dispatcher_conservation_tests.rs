//! The dispatcher's conservation law, by property: whatever the sequence of instances
//! joining (alone or beside another model's instance on one device group), leaving,
//! changing readiness and prefill fit, submissions, ticks, completions and cancellations,
//! no request is lost or assigned twice, and what LST-IMH assigns is on time by each
//! instance's own processing time after the work its group already has.

use super::super::config::{Plan, Policy, Requeue};
use super::tests::disp_plan;
use super::*;
use proptest::prelude::*;
use std::collections::HashSet;

#[derive(Debug, Clone)]
enum Op {
    Add(i64, u8, i64),
    Remove(i64),
    Ready(i64, bool),
    Fit(i64, Option<(f64, f64)>),
    Submit(u8, f64, f64, f64),
    Tick(f64),
    Complete(usize),
    Cancel(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0i64..4, 0u8..2, 0i64..3).prop_map(|(i, m, g)| Op::Add(i, m, g)),
        1 => (0i64..4).prop_map(Op::Remove),
        1 => (0i64..4, any::<bool>()).prop_map(|(i, r)| Op::Ready(i, r)),
        1 => (0i64..4, prop::option::of((0.0f64..0.02, 0.0f64..0.0002))).prop_map(|(i, f)| Op::Fit(i, f)),
        4 => (0u8..2, 0.0f64..0.5, 0.0f64..0.1, 0.0f64..400.0).prop_map(|(m, s, p, t)| Op::Submit(m, s, p, t)),
        3 => (0.0f64..0.05).prop_map(Op::Tick),
        2 => (0usize..64).prop_map(Op::Complete),
        1 => (0usize..64).prop_map(Op::Cancel),
    ]
}

proptest! {
    /// Every submitted request ends up exactly once in: assigned (then completed,
    /// cancelled or orphaned), rejected, cancelled from the queue, or still queued; and
    /// an LST-IMH assignment is on time under the EPDT estimate at the moment it is made.
    #[test]
    fn no_request_lost_or_assigned_twice(
        ops in prop::collection::vec(op(), 1..80),
        policy in prop_oneof![Just(Policy::LstImh), Just(Policy::RoundRobin), Just(Policy::LeastLoad)],
        relax in any::<bool>(),
        plan in prop_oneof![Just(Plan::Global), Just(Plan::Window)],
    ) {
        let requeue = if relax { Requeue::Relax } else { Requeue::Reject };
        let mut d = disp_plan(policy, requeue, 0.02, plan);
        let models = ["a", "b"];
        let mut now = 0.0;
        let mut next_id = 0i64;
        let mut queued: HashSet<i64> = HashSet::new();
        let mut flying: Vec<i64> = Vec::new();
        let mut ended: HashSet<i64> = HashSet::new();
        // request -> (model, deadline, est, tokens)
        let mut info: HashMap<i64, (usize, f64, f64, f64)> = HashMap::new();
        let mut inst_model: HashMap<i64, usize> = HashMap::new();
        let mut inst_group: HashMap<i64, i64> = HashMap::new();
        let mut fits: HashMap<i64, (f64, f64)> = HashMap::new();
        let mut ready: HashMap<i64, bool> = HashMap::new();
        for o in ops {
            match o {
                Op::Add(i, m, g) => {
                    let ok = d.add_instance(i, models[m as usize], g).is_ok();
                    prop_assert_eq!(ok, !inst_model.contains_key(&i));
                    if ok {
                        inst_model.insert(i, m as usize);
                        inst_group.insert(i, g);
                        fits.remove(&i);
                        ready.insert(i, true);
                    }
                }
                Op::Fit(i, f) => {
                    prop_assert_eq!(d.set_prefill_fit(i, f).is_ok(), inst_model.contains_key(&i));
                    if inst_model.contains_key(&i) {
                        match f { Some(x) => { fits.insert(i, x); } None => { fits.remove(&i); } }
                    }
                }
                Op::Remove(i) => match d.remove_instance(i) {
                    Ok(back) => {
                        for r in back {
                            let pos = flying.iter().position(|&x| x == r);
                            prop_assert!(pos.is_some());
                            flying.remove(pos.unwrap());
                            ended.insert(r);
                        }
                        inst_model.remove(&i);
                        inst_group.remove(&i);
                    }
                    Err(_) => prop_assert!(!inst_model.contains_key(&i)),
                },
                Op::Ready(i, r) => {
                    prop_assert_eq!(d.set_instance_ready(i, r).is_ok(), inst_model.contains_key(&i));
                    if inst_model.contains_key(&i) { ready.insert(i, r); }
                }
                Op::Submit(m, slack, p, tokens) => {
                    d.submit_job(next_id, models[m as usize], now, now + slack, p, 1.0, tokens).unwrap();
                    queued.insert(next_id);
                    info.insert(next_id, (m as usize, now + slack, p, tokens));
                    next_id += 1;
                }
                Op::Tick(dt) => {
                    // Reject/relax never comes due before the time next_wakeup named.
                    let wake = d.next_wakeup(now).unwrap().unwrap_or(f64::INFINITY);
                    let relaxed = d.stats().relaxed;
                    now += dt;
                    let early = now < wake;
                    // per group: EPDT before the tick, then each job's own time on its instance
                    let before: HashMap<i64, f64> =
                        inst_model.keys().map(|&i| (inst_group[&i], d.epdt(i, now).unwrap())).collect();
                    let mut finish = before.clone();
                    for (r, i) in d.tick(now).unwrap() {
                        prop_assert!(queued.remove(&r), "request {} assigned but not queued", r);
                        prop_assert_eq!(inst_model[&i], info[&r].0);
                        prop_assert!(ready[&i]);
                        let g = inst_group[&i];
                        prop_assert!(before[&g] - 0.02 <= now);
                        let (_, _, est, tokens) = info[&r];
                        let f = finish.get_mut(&g).unwrap();
                        *f += fits.get(&i).map_or(est, |&(a, b)| a + b * tokens);
                        if policy == Policy::LstImh && !relax {
                            prop_assert!(*f <= info[&r].1 + 1e-9);
                        }
                        flying.push(r);
                    }
                    if early {
                        prop_assert_eq!(d.stats().relaxed, relaxed);
                    }
                    for r in d.take_rejected() {
                        prop_assert!(!early, "request {} rejected before the wake-up {}", r, wake);
                        prop_assert!(queued.remove(&r));
                        ended.insert(r);
                    }
                    for &i in inst_model.keys() {
                        prop_assert!(d.epdt(i, now).unwrap() >= now);
                    }
                    if let Some(w) = d.next_wakeup(now).unwrap() {
                        prop_assert!(!queued.is_empty() && w.is_finite());
                    } else {
                        prop_assert!(queued.is_empty());
                    }
                }
                Op::Complete(k) => {
                    if !flying.is_empty() {
                        let r = flying.remove(k % flying.len());
                        d.complete(r, now).unwrap();
                        ended.insert(r);
                    }
                }
                Op::Cancel(k) => {
                    let target = k as i64 % (next_id + 1);
                    let known = queued.remove(&target) || flying.contains(&target);
                    flying.retain(|&x| x != target);
                    // Both forms: without a time and at the current time.
                    let got = if k % 2 == 0 { d.cancel(target) } else { d.cancel_at(target, now).unwrap() };
                    prop_assert_eq!(got, known);
                    if known { ended.insert(target); }
                }
            }
            if let Err(e) = d.check_integrity() {
                prop_assert!(false, "integrity: {}", e);
            }
            let s = d.stats();
            prop_assert_eq!(s.pending as usize, queued.len());
            prop_assert_eq!(s.in_flight as usize, flying.len());
            prop_assert_eq!(d.pending("a") + d.pending("b"), queued.len());
            prop_assert_eq!(s.submitted, next_id as u64);
            prop_assert_eq!(
                s.submitted,
                s.completed + s.rejected + s.cancelled + s.orphaned + s.pending + s.in_flight
            );
            prop_assert_eq!(queued.len() + flying.len() + ended.len(), next_id as usize);
        }
    }
}
