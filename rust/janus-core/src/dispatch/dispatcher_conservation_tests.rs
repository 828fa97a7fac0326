//! The dispatcher's conservation law, by property: whatever the sequence of instances
//! joining, leaving and changing readiness, submissions, ticks, completions and
//! cancellations, no request is lost or assigned twice.

use super::super::config::{Plan, Policy, Requeue};
use super::tests::disp_plan;
use super::*;
use proptest::prelude::*;
use std::collections::HashSet;

#[derive(Debug, Clone)]
enum Op {
    Add(i64, u8),
    Remove(i64),
    Ready(i64, bool),
    Submit(u8, f64, f64),
    Tick(f64),
    Complete(usize),
    Cancel(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0i64..4, 0u8..2).prop_map(|(i, m)| Op::Add(i, m)),
        1 => (0i64..4).prop_map(Op::Remove),
        1 => (0i64..4, any::<bool>()).prop_map(|(i, r)| Op::Ready(i, r)),
        4 => (0u8..2, 0.0f64..0.5, 0.0f64..0.1).prop_map(|(m, s, p)| Op::Submit(m, s, p)),
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
        let mut info: HashMap<i64, (usize, f64, f64)> = HashMap::new();
        let mut inst_model: HashMap<i64, usize> = HashMap::new();
        let mut ready: HashMap<i64, bool> = HashMap::new();
        for o in ops {
            match o {
                Op::Add(i, m) => {
                    let ok = d.add_instance(i, models[m as usize], i).is_ok();
                    prop_assert_eq!(ok, !inst_model.contains_key(&i));
                    if ok { inst_model.insert(i, m as usize); ready.insert(i, true); }
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
                    }
                    Err(_) => prop_assert!(!inst_model.contains_key(&i)),
                },
                Op::Ready(i, r) => {
                    prop_assert_eq!(d.set_instance_ready(i, r).is_ok(), inst_model.contains_key(&i));
                    if inst_model.contains_key(&i) { ready.insert(i, r); }
                }
                Op::Submit(m, slack, p) => {
                    d.submit(next_id, models[m as usize], now, now + slack, p).unwrap();
                    queued.insert(next_id);
                    info.insert(next_id, (m as usize, now + slack, p));
                    next_id += 1;
                }
                Op::Tick(dt) => {
                    // Reject/relax never comes due before the time next_wakeup named.
                    let wake = d.next_wakeup(now).unwrap().unwrap_or(f64::INFINITY);
                    let relaxed = d.stats().relaxed;
                    now += dt;
                    let early = now < wake;
                    let before: HashMap<i64, f64> =
                        inst_model.keys().map(|&i| (i, d.epdt(i, now).unwrap())).collect();
                    let mut finish = before.clone();
                    for (r, i) in d.tick(now).unwrap() {
                        prop_assert!(queued.remove(&r), "request {} assigned but not queued", r);
                        prop_assert_eq!(inst_model[&i], info[&r].0);
                        prop_assert!(ready[&i]);
                        prop_assert!(before[&i] - 0.02 <= now);
                        let f = finish.get_mut(&i).unwrap();
                        *f += info[&r].2;
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
