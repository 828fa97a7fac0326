//! Tests of the online dispatcher: EPDT numbers, pre-pull, requeue, conservation.

use super::super::config::{Assignment, Objective, Plan, Policy, Requeue};
use super::super::next_up;
use super::*;
use proptest::prelude::*;

/// A dispatcher with the default plan (`Plan::Global`).
pub(super) fn disp(policy: Policy, requeue: Requeue, window: f64) -> Dispatcher {
    disp_plan(policy, requeue, window, Plan::Global)
}

pub(super) fn disp_plan(policy: Policy, requeue: Requeue, window: f64, plan: Plan) -> Dispatcher {
    Dispatcher::new(DispatcherConfig {
        policy,
        prepull_window_s: window,
        requeue,
        relax_factor: 1.5,
        max_relax: 2,
        plan,
        objective: Objective::Requests,
    })
    .unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn epdt_tracks_work_given_minus_work_done() {
    // plan = window: both jobs are given at once (the global plan would commit only the
    // first, whose start is inside the window; see dispatcher_group_tests.rs).
    let mut d = disp_plan(Policy::LstImh, Requeue::Reject, 0.02, Plan::Window);
    d.add_instance(7, "m", 7).unwrap();
    d.submit(1, "m", 0.0, 1.0, 0.1).unwrap();
    d.submit(2, "m", 0.0, 1.0, 0.2).unwrap();
    let got = d.tick(0.0).unwrap();
    assert_eq!(got, vec![(1, 7), (2, 7)]);
    assert!(close(d.epdt(7, 0.0).unwrap(), 0.3));
    assert!(close(d.epdt(7, 0.1).unwrap(), 0.3));
    d.complete(1, 0.05).unwrap(); // 0.05 early
    assert!(close(d.epdt(7, 0.05).unwrap(), 0.25));
    d.complete(2, 0.4).unwrap(); // late
    assert_eq!(d.epdt(7, 0.4).unwrap(), 0.4);
    let s = d.stats();
    assert_eq!(
        (s.submitted, s.assigned, s.completed, s.pending, s.in_flight),
        (2, 2, 2, 0, 0)
    );
}

#[test]
fn min_epdt_is_the_least_epdt_of_the_instances() {
    let mut d = disp_plan(Policy::LstImh, Requeue::Reject, 0.02, Plan::Window);
    d.add_instance(7, "m", 7).unwrap();
    d.add_instance(8, "m", 8).unwrap();
    d.add_instance(9, "m", 7).unwrap(); // shares 7's group, so its EPDT
    d.submit(1, "m", 0.0, 1.0, 0.1).unwrap();
    d.submit(2, "m", 0.0, 1.0, 0.2).unwrap();
    d.tick(0.0).unwrap();
    let each: Vec<f64> = [7, 8, 9].iter().map(|&i| d.epdt(i, 0.0).unwrap()).collect();
    let least = each.iter().cloned().fold(f64::INFINITY, f64::min);
    assert_eq!(d.min_epdt(&[7, 8, 9], 0.0).unwrap(), Some(least));
    assert_eq!(d.min_epdt(&[7, 9], 0.0).unwrap(), Some(each[0].min(each[2])));
    assert_eq!(d.min_epdt(&[], 0.0).unwrap(), None);
    assert!(d.min_epdt(&[7, 42], 0.0).is_err()); // an unknown instance, as epdt says
    assert!(d.min_epdt(&[7], f64::NAN).is_err());
}

/// Instance 1 busy until 3, instance 2 idle at 0, a window wide enough for both; then
/// A (4, 5), B (2, 6), C (2, 7) arrive.
fn worked_example(plan: Plan) -> Vec<Assignment> {
    let mut d = disp_plan(Policy::LstImh, Requeue::Reject, 5.0, plan);
    d.add_instance(1, "m", 1).unwrap();
    d.add_instance(2, "m", 2).unwrap();
    d.submit(100, "m", 0.0, 10.0, 3.0).unwrap();
    d.set_instance_ready(2, false).unwrap();
    assert_eq!(d.tick(0.0).unwrap(), vec![(100, 1)]);
    d.set_instance_ready(2, true).unwrap();
    d.submit(10, "m", 0.0, 5.0, 4.0).unwrap(); // A
    d.submit(11, "m", 0.0, 6.0, 2.0).unwrap(); // B
    d.submit(12, "m", 0.0, 7.0, 2.0).unwrap(); // C
    let got = d.tick(0.0).unwrap();
    d.check_integrity().unwrap();
    got
}

#[test]
fn worked_example_through_the_dispatcher() {
    // plan = window: LST-IMH's partition, instance 1 (free at 3) takes B and C.
    assert_eq!(
        worked_example(Plan::Window),
        vec![(11, 1), (12, 1), (10, 2)]
    );
    // plan = global: the balanced plan keeps all three on time (A on 2 ends 4, B on 1
    // ends 5, C on 2 ends 6) and every start is inside the 5 s window.
    assert_eq!(
        worked_example(Plan::Global),
        vec![(11, 1), (10, 2), (12, 2)]
    );
}

#[test]
fn prepull_window_gates_candidates() {
    let mut d = disp(Policy::LstImh, Requeue::Reject, 0.020);
    d.add_instance(1, "m", 1).unwrap();
    d.submit(1, "m", 0.0, 10.0, 0.030).unwrap();
    assert_eq!(d.tick(0.0).unwrap(), vec![(1, 1)]);
    d.submit(2, "m", 0.0, 10.0, 0.010).unwrap();
    // EPDT 30 ms away: outside the 20 ms window.
    assert!(d.tick(0.0).unwrap().is_empty());
    let wake = d.next_wakeup(0.0).unwrap().unwrap();
    assert!(close(wake, 0.010));
    // 15 ms away: inside.
    assert_eq!(d.tick(0.015).unwrap(), vec![(2, 1)]);
    assert!(close(d.epdt(1, 0.015).unwrap(), 0.040));
}

/// The tick at `next_wakeup`'s pre-pull instant must find the instance inside the window
/// for any busy time and window, not only where `busy - window` happens to round up.
fn wakeup_finds_the_instance_in_its_window(busy: f64, window: f64) {
    for plan in [Plan::Global, Plan::Window] {
        wakeup_finds_the_instance_in_its_window_with(busy, window, plan);
    }
}

fn wakeup_finds_the_instance_in_its_window_with(busy: f64, window: f64, plan: Plan) {
    let mut d = disp_plan(Policy::LstImh, Requeue::Reject, window, plan);
    d.add_instance(1, "m", 1).unwrap();
    d.submit(1, "m", 0.0, 1e6, busy).unwrap();
    assert_eq!(d.tick(0.0).unwrap(), vec![(1, 1)]);
    d.submit(2, "m", 0.0, 1e6, 0.001).unwrap();
    assert!(d.tick(0.0).unwrap().is_empty());
    let wake = d.next_wakeup(0.0).unwrap().unwrap();
    assert_eq!(wake, busy - window);
    assert_eq!(
        d.tick(wake).unwrap(),
        vec![(2, 1)],
        "busy {busy}, window {window}, plan {plan:?}"
    );
    d.check_integrity().unwrap();
}

#[test]
fn wakeup_at_the_window_edge_is_not_missed() {
    // 38.04812224562878 - (38.04812224562878 - 0.03) > 0.03 in floats: the old test
    // `epdt - now <= window` said "outside" at the wake-up instant, and the next
    // wake-up was the job's latest start, ~1e6 s later.
    wakeup_finds_the_instance_in_its_window(38.04812224562878, 0.03);
}

proptest! {
    #[test]
    fn wakeup_at_the_window_edge_is_never_missed(busy in 0.05f64..100.0, w in 0usize..4) {
        wakeup_finds_the_instance_in_its_window(busy, [0.0, 0.005, 0.02, 0.03][w]);
    }
}

#[test]
fn reject_drops_jobs_past_their_latest_start() {
    let mut d = disp(Policy::LstImh, Requeue::Reject, 0.02);
    d.submit(1, "nobody", 0.0, 0.5, 0.2).unwrap();
    d.submit(2, "nobody", 0.0, 5.0, 0.2).unwrap();
    assert!(d.tick(0.3).unwrap().is_empty());
    assert_eq!(d.take_rejected(), Vec::<i64>::new());
    // Latest start of job 1 is 0.3: the wakeup is just after it.
    assert_eq!(d.next_wakeup(0.3).unwrap(), Some(next_up(0.5 - 0.2)));
    assert!(d.tick(0.31).unwrap().is_empty());
    assert_eq!(d.take_rejected(), vec![1]);
    assert_eq!(d.take_rejected(), Vec::<i64>::new());
    assert_eq!(d.pending("nobody"), 1);
    assert_eq!(d.stats().rejected, 1);
}

#[test]
fn relax_extends_then_rejects() {
    let mut d = disp(Policy::LstImh, Requeue::Relax, 0.02);
    // Budget 1.0 s, est 0.2: latest start 0.8.
    d.submit(1, "nobody", 0.0, 1.0, 0.2).unwrap();
    d.tick(0.9).unwrap();
    assert_eq!(d.stats().relaxed, 1); // deadline 0.9 + 1.5 = 2.4
    d.tick(2.3).unwrap();
    assert_eq!(d.stats().relaxed, 2); // deadline 2.3 + 2.25 = 4.55
    assert_eq!(d.pending("nobody"), 1);
    d.tick(4.4).unwrap();
    assert_eq!((d.stats().relaxed, d.stats().rejected), (2, 1));
    assert_eq!(d.take_rejected(), vec![1]);
    // A job longer than any relaxed budget burns every relaxation in one tick.
    d.submit(2, "nobody", 0.0, 0.1, 5.0).unwrap();
    d.tick(0.0).unwrap();
    assert_eq!((d.stats().relaxed, d.stats().rejected), (4, 2));
}

#[test]
fn not_ready_instances_get_nothing() {
    let mut d = disp(Policy::RoundRobin, Requeue::Reject, 0.02);
    d.add_instance(1, "m", 1).unwrap();
    d.set_instance_ready(1, false).unwrap();
    d.submit(1, "m", 0.0, 10.0, 0.1).unwrap();
    assert!(d.tick(0.0).unwrap().is_empty());
    d.set_instance_ready(1, true).unwrap();
    assert_eq!(d.tick(0.0).unwrap(), vec![(1, 1)]);
}

#[test]
fn round_robin_rotates_and_least_load_prefers_the_idle() {
    let mut d = disp(Policy::RoundRobin, Requeue::Reject, 1.0);
    for i in [1, 2, 3] {
        d.add_instance(i, "m", i).unwrap();
    }
    for r in 0..5 {
        d.submit(r, "m", 0.0, 100.0, 0.1).unwrap();
    }
    assert_eq!(d.tick(0.0).unwrap(), vec![(0, 1), (1, 2), (2, 3)]);
    assert_eq!(d.tick(0.0).unwrap(), vec![(3, 1), (4, 2)]);

    let mut d = disp(Policy::LeastLoad, Requeue::Reject, 1.0);
    d.add_instance(1, "m", 1).unwrap();
    d.add_instance(2, "m", 2).unwrap();
    d.submit(0, "m", 0.0, 100.0, 0.5).unwrap();
    d.tick(0.0).unwrap();
    d.submit(1, "m", 0.0, 100.0, 0.1).unwrap();
    assert_eq!(d.tick(0.0).unwrap(), vec![(1, 2)]);
}

#[test]
fn remove_instance_hands_back_in_flight_work() {
    // plan = window: all three jobs are given at the first tick.
    let mut d = disp_plan(Policy::LstImh, Requeue::Reject, 0.02, Plan::Window);
    d.add_instance(1, "m", 1).unwrap();
    for r in [5, 3, 9] {
        d.submit(r, "m", 0.0, 100.0, 0.1).unwrap();
    }
    d.tick(0.0).unwrap();
    d.complete(3, 0.1).unwrap();
    d.submit(4, "m", 0.0, 100.0, 0.1).unwrap();
    assert_eq!(d.remove_instance(1).unwrap(), vec![5, 9]);
    assert_eq!(d.pending("m"), 1);
    assert!(d.complete(5, 0.2).is_err());
    d.submit(5, "m", 0.0, 100.0, 0.1).unwrap(); // the caller resubmits
    assert!(d.remove_instance(1).is_err());
    let s = d.stats();
    assert_eq!((s.orphaned, s.in_flight, s.pending), (2, 0, 2));
}

#[test]
fn cancel_at_charges_the_time_the_job_ran() {
    // Jobs 1 and 2 (1 s each) given at 0; job 1 is cancelled at 0.5 after running half.
    // Job 2 starts at 0.5 and is done at 1.5; `cancel` without a time would take all of
    // job 1's estimate away and say 1.0. (plan = window: both are given at once.)
    let mut d = disp_plan(Policy::LstImh, Requeue::Reject, 0.02, Plan::Window);
    d.add_instance(1, "m", 1).unwrap();
    d.submit(1, "m", 0.0, 10.0, 1.0).unwrap();
    d.submit(2, "m", 0.0, 10.0, 1.0).unwrap();
    assert_eq!(d.tick(0.0).unwrap(), vec![(1, 1), (2, 1)]);
    assert_eq!(d.cancel_at(1, 0.5), Ok(true));
    assert!(close(d.epdt(1, 0.5).unwrap(), 1.5));
    assert_eq!(d.cancel_at(1, 0.5), Ok(false));
    assert!(d.cancel_at(2, f64::NAN).is_err());
    assert_eq!(d.stats().in_flight, 1);
}

#[test]
fn bad_input_is_an_error() {
    let mut d = disp(Policy::LstImh, Requeue::Reject, 0.02);
    assert!(d.submit(1, "m", f64::NAN, 1.0, 0.1).is_err());
    assert!(d.submit(1, "m", 0.0, f64::INFINITY, 0.1).is_err());
    assert!(d.submit(1, "m", 0.0, 1.0, -0.1).is_err());
    d.submit(1, "m", 0.0, 1.0, 0.1).unwrap();
    assert!(d.submit(1, "m", 0.0, 1.0, 0.1).is_err());
    assert!(d.complete(1, 0.0).is_err()); // queued
    assert!(d.complete(2, 0.0).is_err()); // unknown
    assert!(d.tick(f64::NAN).is_err());
    assert!(d.epdt(3, 0.0).is_err());
    assert!(d.set_instance_ready(3, true).is_err());
    d.add_instance(3, "m", 3).unwrap();
    assert!(d.add_instance(3, "other", 3).is_err());
    assert!(!d.cancel(42));
    assert!(Dispatcher::new(DispatcherConfig {
        relax_factor: f64::NAN,
        ..Default::default()
    })
    .is_err());
    assert!(Dispatcher::new(DispatcherConfig {
        prepull_window_s: -1.0,
        ..Default::default()
    })
    .is_err());
}

/// Three short jobs worth 1 token each and a long one worth 100, all due at 10, on one
/// instance: the first goes at once; when it is done (t = 1), objective `requests` keeps
/// the two short ones (the long one would end at 12), objective `tokens` the long one
/// (ends at 10, on time), and the jobs left out are rejected once their latest start passes.
#[test]
fn objective_tokens_keeps_the_valuable_job_the_count_plan_drops() {
    for (objective, served, rejected) in [
        (Objective::Requests, vec![2, 3], vec![4]),
        (Objective::Tokens, vec![4], vec![2, 3]),
    ] {
        let mut d = Dispatcher::new(DispatcherConfig { objective, ..DispatcherConfig::default() }).unwrap();
        d.add_instance(7, "m", 7).unwrap();
        for (id, est, w) in [(1, 1.0, 1.0), (2, 1.0, 1.0), (3, 1.0, 1.0), (4, 9.0, 100.0)] {
            d.submit_weighted(id, "m", 0.0, 10.0, est, w).unwrap();
        }
        assert_eq!(d.tick(0.0).unwrap(), vec![(1, 7)]);
        d.complete(1, 1.0).unwrap();
        let est = |id: i64| if id == 4 { 9.0 } else { 1.0 };
        let (mut got, mut running): (Vec<i64>, Option<(i64, f64)>) = (Vec::new(), None);
        let mut now = 1.0;
        while now < 11.0 {
            if let Some((id, end)) = running.filter(|r| r.1 <= now) {
                d.complete(id, end).unwrap();
                running = None;
            }
            for (id, _) in d.tick(now).unwrap() {
                assert!(running.is_none(), "one instance runs one job at a time here");
                running = Some((id, now + est(id)));
                got.push(id);
            }
            d.check_integrity().unwrap();
            now += 0.5;
        }
        assert_eq!(got, served, "{objective:?}");
        let mut rej = d.take_rejected();
        rej.sort_unstable();
        assert_eq!(rej, rejected, "{objective:?}");
    }
}

#[test]
fn keep_serves_late_jobs_and_never_spins() {
    // One instance, three jobs of 0.4 s, all due at 0.5: only the first can start in time.
    let mut d = disp(Policy::RoundRobin, Requeue::Keep, 0.02);
    d.add_instance(1, "m", 1).unwrap();
    for r in 0..3 {
        d.submit(r, "m", 0.0, 0.5, 0.4).unwrap();
    }
    assert_eq!(d.tick(0.0).unwrap(), vec![(0, 1)]);
    // Latest starts (0.1) pass while the instance is busy: the next wake-up is its window
    // (0.4 - 0.02), not "now" again and again for the passed starts.
    assert!(close(d.next_wakeup(0.2).unwrap().unwrap(), 0.38));
    assert!(d.tick(0.2).unwrap().is_empty());
    d.complete(0, 0.4).unwrap();
    assert_eq!(d.tick(0.4).unwrap(), vec![(1, 1)]);
    d.complete(1, 0.8).unwrap();
    assert_eq!(d.tick(0.8).unwrap(), vec![(2, 1)]);
    assert_eq!((d.stats().rejected, d.stats().assigned), (0, 3));
    assert!(d.take_rejected().is_empty());
    // The same jobs under reject: the two late ones are dropped.
    let mut d = disp(Policy::RoundRobin, Requeue::Reject, 0.02);
    d.add_instance(1, "m", 1).unwrap();
    for r in 0..3 {
        d.submit(r, "m", 0.0, 0.5, 0.4).unwrap();
    }
    d.tick(0.0).unwrap();
    d.tick(0.2).unwrap();
    assert_eq!(d.take_rejected(), vec![1, 2]);
}

#[test]
fn keep_is_refused_for_lst_imh() {
    let cfg = DispatcherConfig { requeue: Requeue::Keep, ..DispatcherConfig::default() };
    let err = Dispatcher::new(cfg).err().expect("lst_imh + keep must be refused");
    assert!(format!("{err:?}").contains("keep"), "{err:?}");
    for policy in [Policy::RoundRobin, Policy::LeastLoad] {
        let cfg = DispatcherConfig { policy, requeue: Requeue::Keep, ..DispatcherConfig::default() };
        assert!(Dispatcher::new(cfg).is_ok());
    }
}
