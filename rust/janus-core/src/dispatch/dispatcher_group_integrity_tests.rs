//! check_integrity under random events with device groups, by property: instances of up
//! to three models sharing up to three groups join, leave and change readiness while
//! requests arrive, tick, complete and are cancelled.

use super::super::config::{Plan, Policy, Requeue};
use super::tests::disp_plan;
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

#[derive(Debug, Clone, Copy)]
enum Op {
    Add(i64, u8, i64),
    Remove(i64),
    Ready(i64, bool),
    Submit(u8, f64, f64),
    Tick(f64, bool),
    Complete(usize),
    Cancel(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0i64..5, 0u8..3, 0i64..3).prop_map(|(i, m, g)| Op::Add(i, m, g)),
        1 => (0i64..5).prop_map(Op::Remove),
        1 => (0i64..5, any::<bool>()).prop_map(|(i, r)| Op::Ready(i, r)),
        5 => (0u8..3, 0.0f64..0.5, 0.0f64..0.1).prop_map(|(m, s, p)| Op::Submit(m, s, p)),
        4 => (0.0f64..0.05, any::<bool>()).prop_map(|(dt, w)| Op::Tick(dt, w)),
        2 => (0usize..64).prop_map(Op::Complete),
        1 => (0usize..64).prop_map(Op::Cancel),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(384))]
    /// Random events with instances of up to three models sharing up to three groups:
    /// check_integrity holds after every step, nothing is assigned twice, and an LST-IMH
    /// assignment (reject) is on time under its group's EPDT and made inside the window.
    #[test]
    fn integrity_holds_with_shared_groups(
        ops in prop::collection::vec(op(), 1..120),
        policy in prop_oneof![Just(Policy::LstImh), Just(Policy::RoundRobin), Just(Policy::LeastLoad)],
        relax in any::<bool>(),
        plan in prop_oneof![Just(Plan::Global), Just(Plan::Window)],
    ) {
        let requeue = if relax { Requeue::Relax } else { Requeue::Reject };
        let mut d = disp_plan(policy, requeue, 0.02, plan);
        let models = ["a", "b", "c"];
        let mut now = 0.0f64;
        let mut next_id = 0i64;
        let mut queued: HashSet<i64> = HashSet::new();
        let mut flying: Vec<i64> = Vec::new();
        let mut info: HashMap<i64, (usize, f64, f64)> = HashMap::new();
        let mut inst: HashMap<i64, (usize, i64)> = HashMap::new();
        for o in ops {
            match o {
                Op::Add(i, m, g) => {
                    let ok = d.add_instance(i, models[m as usize], g).is_ok();
                    prop_assert_eq!(ok, !inst.contains_key(&i));
                    if ok { inst.insert(i, (m as usize, g)); }
                }
                Op::Remove(i) => {
                    if let Ok(back) = d.remove_instance(i) {
                        for r in back {
                            let pos = flying.iter().position(|&x| x == r);
                            prop_assert!(pos.is_some());
                            flying.remove(pos.unwrap());
                        }
                        inst.remove(&i);
                    }
                }
                Op::Ready(i, r) => {
                    prop_assert_eq!(d.set_instance_ready(i, r).is_ok(), inst.contains_key(&i));
                }
                Op::Submit(m, slack, p) => {
                    d.submit(next_id, models[m as usize], now, now + slack, p).unwrap();
                    queued.insert(next_id);
                    info.insert(next_id, (m as usize, now + slack, p));
                    next_id += 1;
                }
                Op::Tick(dt, use_wakeup) => {
                    match d.next_wakeup(now).unwrap() {
                        Some(w) if use_wakeup => now = now.max(w.min(now + 1.0)),
                        _ => now += dt,
                    }
                    // One EPDT per group, seen through any of its instances.
                    let mut finish: HashMap<i64, f64> = HashMap::new();
                    for (&i, &(_, g)) in &inst {
                        finish.insert(g, d.epdt(i, now).unwrap());
                    }
                    let before = finish.clone();
                    for (r, i) in d.tick(now).unwrap() {
                        prop_assert!(queued.remove(&r), "request {} assigned twice or never queued", r);
                        let (m, g) = inst[&i];
                        prop_assert_eq!(m, info[&r].0);
                        prop_assert!(before[&g] - 0.02 <= now + 1e-12);
                        let f = finish.get_mut(&g).unwrap();
                        *f += info[&r].2;
                        if policy == Policy::LstImh && !relax {
                            prop_assert!(*f <= info[&r].1 + 1e-9, "request {} late: {} > {}", r, *f, info[&r].1);
                        }
                        flying.push(r);
                    }
                    for r in d.take_rejected() {
                        prop_assert!(queued.remove(&r));
                    }
                }
                Op::Complete(k) => {
                    if !flying.is_empty() {
                        let r = flying.remove(k % flying.len());
                        d.complete(r, now).unwrap();
                    }
                }
                Op::Cancel(k) => {
                    let target = k as i64 % (next_id + 1);
                    let known = queued.remove(&target) || flying.contains(&target);
                    flying.retain(|&x| x != target);
                    let got = if k % 2 == 0 { d.cancel(target) } else { d.cancel_at(target, now).unwrap() };
                    prop_assert_eq!(got, known);
                }
            }
            if let Err(e) = d.check_integrity() {
                prop_assert!(false, "integrity after {:?}: {}", o, e);
            }
            let s = d.stats();
            prop_assert_eq!(s.pending as usize, queued.len());
            prop_assert_eq!(s.in_flight as usize, flying.len());
        }
    }
}
