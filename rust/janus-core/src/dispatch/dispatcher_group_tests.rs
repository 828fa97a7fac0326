//! Tests of device groups (one EPDT per group), fair model order, the global plan (its
//! commit inside the window and the wake-ups that commit the rest) and check_integrity.

use super::super::config::{Assignment, Plan, Policy, Requeue};
use super::tests::{disp, disp_plan};
use super::*;
use std::collections::{HashMap, HashSet};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn a_group_has_one_epdt_for_all_its_models() {
    for plan in [Plan::Global, Plan::Window] {
        // Instances 1 (model a) and 2 (model b) on one device: group 0.
        let mut d = disp_plan(Policy::LstImh, Requeue::Reject, 1.0, plan);
        d.add_instance(1, "a", 0).unwrap();
        d.add_instance(2, "b", 0).unwrap();
        d.submit(10, "a", 0.0, 10.0, 0.3).unwrap();
        d.submit(11, "a", 0.0, 10.0, 0.3).unwrap();
        assert_eq!(d.tick(0.0).unwrap(), vec![(10, 1), (11, 1)]);
        // Model a's work is model b's instance's EPDT too.
        assert!(close(d.epdt(2, 0.0).unwrap(), 0.6));
        // b's jobs are planned after a's: 20 would end at 0.7 > 0.65 and stays queued
        // (then is rejected past its latest start 0.55); 21 ends at 0.7 <= 0.75.
        d.submit(20, "b", 0.0, 0.65, 0.1).unwrap();
        d.submit(21, "b", 0.0, 0.75, 0.1).unwrap();
        assert_eq!(d.tick(0.0).unwrap(), vec![(21, 2)], "{plan:?}");
        assert!(close(d.epdt(1, 0.0).unwrap(), 0.7));
        assert_eq!(d.pending("b"), 1);
        d.check_integrity().unwrap();
        assert!(d.tick(0.56).unwrap().is_empty());
        assert_eq!(d.take_rejected(), vec![20]);
        // Job 10 finishes 0.1 early at 0.2: everything in the group moves up.
        d.complete(10, 0.2).unwrap();
        assert!(close(d.epdt(2, 0.2).unwrap(), 0.6));
        d.check_integrity().unwrap();
    }
    // Control: in groups of their own, b's job 20 is on time at once.
    let mut d = disp(Policy::LstImh, Requeue::Reject, 1.0);
    d.add_instance(1, "a", 1).unwrap();
    d.add_instance(2, "b", 2).unwrap();
    d.submit(10, "a", 0.0, 10.0, 0.3).unwrap();
    d.submit(11, "a", 0.0, 10.0, 0.3).unwrap();
    d.tick(0.0).unwrap();
    d.submit(20, "b", 0.0, 0.65, 0.1).unwrap();
    assert_eq!(d.tick(0.0).unwrap(), vec![(20, 2)]);
}

#[test]
fn remove_instance_takes_its_jobs_out_of_the_group_load() {
    let mut d = disp_plan(Policy::LstImh, Requeue::Reject, 1.0, Plan::Window);
    d.add_instance(1, "a", 5).unwrap();
    d.add_instance(2, "b", 5).unwrap();
    d.submit(10, "a", 0.0, 10.0, 0.3).unwrap();
    d.submit(20, "b", 0.0, 10.0, 0.2).unwrap();
    assert_eq!(d.tick(0.0).unwrap(), vec![(10, 1), (20, 2)]);
    assert!(close(d.epdt(2, 0.0).unwrap(), 0.5));
    assert_eq!(d.remove_instance(1).unwrap(), vec![10]);
    assert!(close(d.epdt(2, 0.0).unwrap(), 0.2));
    d.check_integrity().unwrap();
    // The group goes with its last instance; a newcomer to the same id starts idle.
    assert_eq!(d.remove_instance(2).unwrap(), vec![20]);
    d.add_instance(3, "a", 5).unwrap();
    assert_eq!(d.epdt(3, 0.0).unwrap(), 0.0);
    d.check_integrity().unwrap();
}

#[test]
fn two_instances_of_one_model_in_one_group_are_one_machine() {
    for plan in [Plan::Global, Plan::Window] {
        let mut d = disp_plan(Policy::LstImh, Requeue::Reject, 1.0, plan);
        d.add_instance(1, "a", 0).unwrap();
        d.add_instance(2, "a", 0).unwrap();
        // Two 0.4 s jobs due at 0.5: only one fits on the one device.
        d.submit(10, "a", 0.0, 0.5, 0.4).unwrap();
        d.submit(11, "a", 0.0, 0.5, 0.4).unwrap();
        assert_eq!(d.tick(0.0).unwrap(), vec![(10, 1)], "{plan:?}");
        d.check_integrity().unwrap();
    }
}

#[test]
fn models_are_served_by_their_earliest_deadline() {
    for plan in [Plan::Global, Plan::Window] {
        // Model a (index 0) and model b (index 1) share group 0; b's job is more urgent.
        let mut d = disp_plan(Policy::LstImh, Requeue::Reject, 0.02, plan);
        d.add_instance(1, "a", 0).unwrap();
        d.add_instance(2, "b", 0).unwrap();
        d.submit(10, "a", 0.0, 1.0, 0.1).unwrap();
        d.submit(20, "b", 0.0, 0.5, 0.1).unwrap();
        // Model 0 first would give the group to job 10 and leave job 20 outside the window.
        // The two models are planned together: with plan = window the group takes its
        // whole selection at once, most urgent first.
        if plan == Plan::Window {
            assert_eq!(d.tick(0.0).unwrap(), vec![(20, 2), (10, 1)]);
            d.check_integrity().unwrap();
            continue;
        }
        assert_eq!(d.tick(0.0).unwrap(), vec![(20, 2)], "{plan:?}");
        let wake = d.next_wakeup(0.0).unwrap().unwrap();
        assert!(close(wake, 0.08));
        assert_eq!(d.tick(wake).unwrap(), vec![(10, 1)]);
        d.check_integrity().unwrap();
    }
    // Equal deadlines: LST-IMH plans the models together, so the job submitted first goes
    // first, whatever the model; the one-job-per-tick baselines serve the lower model
    // index (first seen) first.
    for (policy, first) in [(Policy::LstImh, (10, 1)), (Policy::RoundRobin, (20, 2))] {
        let mut d = disp(policy, Requeue::Reject, 0.02);
        d.add_instance(2, "b", 0).unwrap(); // "b" is model 0
        d.add_instance(1, "a", 0).unwrap();
        d.submit(10, "a", 0.0, 1.0, 0.1).unwrap();
        d.submit(20, "b", 0.0, 1.0, 0.1).unwrap();
        assert_eq!(d.tick(0.0).unwrap(), vec![first], "{policy:?}");
    }
}

/// Submits `n` jobs of `est` due at `deadline` to model "m" served by instances 1..=k.
fn backlog(plan: Plan, k: i64, n: i64, est: f64, deadline: f64) -> Dispatcher {
    let mut d = disp_plan(Policy::LstImh, Requeue::Reject, 0.02, plan);
    for i in 1..=k {
        d.add_instance(i, "m", i).unwrap();
    }
    for r in 0..n {
        d.submit(r, "m", 0.0, deadline, est).unwrap();
    }
    d
}

fn per_instance(got: &[Assignment]) -> HashMap<i64, usize> {
    let mut n = HashMap::new();
    for &(_, i) in got {
        *n.entry(i).or_default() += 1;
    }
    n
}

/// Runs the dispatcher to the end: ticks only when `next_wakeup` says so, each job
/// completes at its estimated finish (its group runs jobs back to back in the order
/// given). Returns every assignment with its time and the job's finish.
fn simulate(d: &mut Dispatcher, est: f64) -> Vec<(f64, i64, i64, f64)> {
    let mut now = 0.0f64;
    let mut busy: HashMap<i64, f64> = HashMap::new();
    let mut running: Vec<(f64, i64)> = Vec::new();
    let mut log = Vec::new();
    for _ in 0..10_000 {
        if d.next_wakeup(now).unwrap().is_some_and(|w| w <= now) {
            for (r, i) in d.tick(now).unwrap() {
                let f = busy.get(&i).copied().unwrap_or(0.0).max(now) + est;
                busy.insert(i, f);
                running.push((f, r));
                log.push((now, r, i, f));
            }
            d.check_integrity().unwrap();
        }
        let wake = d.next_wakeup(now).unwrap();
        let done = running.iter().map(|x| x.0).fold(f64::INFINITY, f64::min);
        let next = wake.unwrap_or(f64::INFINITY).min(done);
        if !next.is_finite() {
            return log;
        }
        assert!(next > now || wake.is_some_and(|w| w <= now) && next == now);
        now = now.max(next);
        running.sort_by(|a, b| a.0.total_cmp(&b.0));
        while running.first().is_some_and(|x| x.0 <= now) {
            let (_, r) = running.remove(0);
            d.complete(r, now).unwrap();
        }
        d.check_integrity().unwrap();
    }
    panic!("no end after 10,000 steps");
}

#[test]
fn global_plan_spreads_a_loose_backlog_over_idle_instances() {
    // 30 jobs of 10 ms due in 1 s, three idle instances, a 20 ms window; ticks only at
    // next_wakeup, completions at the estimated finish times.
    let mut d = backlog(Plan::Global, 3, 30, 0.01, 1.0);
    let log = simulate(&mut d, 0.01);
    // The first tick commits to all three (LST-IMH alone: 30/0/0), as much as starts
    // inside the window: 0, 10 and 20 ms.
    let first: Vec<Assignment> = log
        .iter()
        .filter(|x| x.0 == 0.0)
        .map(|x| (x.1, x.2))
        .collect();
    let n = per_instance(&first);
    assert_eq!((n[&1], n[&2], n[&3]), (3, 3, 3), "{first:?}");
    // Every job is eventually assigned, once, 10 +- 1 per instance, all on time.
    let all: Vec<Assignment> = log.iter().map(|x| (x.1, x.2)).collect();
    assert_eq!(all.len(), 30);
    assert_eq!(all.iter().map(|x| x.0).collect::<HashSet<_>>().len(), 30);
    let n = per_instance(&all);
    for i in 1..=3 {
        assert!((9..=11).contains(&n[&i]), "{n:?}");
    }
    assert!(log.iter().all(|x| x.3 <= 1.0 + 1e-9));
    // Late-bound: each job starts within the window of the tick that assigned it.
    for &(t, _, _, f) in &log {
        assert!(
            f - 0.01 - 0.02 <= t + 1e-12,
            "assigned at {t}, starts at {}",
            f - 0.01
        );
    }
    let s = d.stats();
    assert_eq!(
        (s.completed, s.pending, s.in_flight, s.rejected),
        (30, 0, 0, 0)
    );
    assert!(s.ticks > 1);
}

#[test]
fn window_plan_gives_a_loose_backlog_to_one_instance() {
    // Regression test of the option: today's behaviour, 30/0/0 at the first tick.
    let mut d = backlog(Plan::Window, 3, 30, 0.01, 1.0);
    let first = d.tick(0.0).unwrap();
    assert_eq!(first.len(), 30);
    assert!(first.iter().all(|x| x.1 == 1));
    assert_eq!(d.pending("m"), 0);
    d.check_integrity().unwrap();
}

#[test]
fn deferred_jobs_are_committed_at_next_wakeup() {
    // One instance, five 10 ms jobs, a 20 ms window, no completion reported: the jobs
    // whose start is inside the window go at once, each later one at its window edge.
    let mut d = backlog(Plan::Global, 1, 5, 0.01, 1.0);
    assert_eq!(d.tick(0.0).unwrap(), vec![(0, 1), (1, 1), (2, 1)]);
    let mut got = Vec::new();
    let mut now = 0.0;
    while let Some(w) = d.next_wakeup(now).unwrap() {
        assert!(w > now, "wake-up {w} not after {now}");
        now = w;
        let t = d.tick(now).unwrap();
        assert_eq!(t.len(), 1, "at {now}: {t:?}");
        got.push((now, t[0].0));
        d.check_integrity().unwrap();
    }
    assert_eq!(got.len(), 2);
    assert!(close(got[0].0, 0.01) && got[0].1 == 3);
    assert!(close(got[1].0, 0.02) && got[1].1 == 4);
    assert!(close(d.epdt(1, now).unwrap(), 0.05));
}

#[test]
fn an_early_completion_pulls_a_deferred_job_forward() {
    let mut d = backlog(Plan::Global, 1, 2, 1.0, 10.0);
    assert_eq!(d.tick(0.0).unwrap(), vec![(0, 1)]);
    assert!(close(d.next_wakeup(0.0).unwrap().unwrap(), 0.98));
    d.complete(0, 0.3).unwrap();
    assert_eq!(d.next_wakeup(0.3).unwrap(), Some(0.3));
    assert_eq!(d.tick(0.3).unwrap(), vec![(1, 1)]);
    d.check_integrity().unwrap();
}

#[test]
fn a_deferred_job_goes_to_whichever_instance_frees_first() {
    // Instance 1 busy until 1.0, instance 2 until 0.5; a job due at 5 waits, is planned
    // on the earlier one and committed at its window edge.
    let mut d = disp(Policy::LstImh, Requeue::Reject, 0.02);
    d.add_instance(1, "m", 1).unwrap();
    d.add_instance(2, "m", 2).unwrap();
    d.submit(100, "m", 0.0, 10.0, 1.0).unwrap();
    d.submit(101, "m", 0.0, 10.0, 0.5).unwrap();
    assert_eq!(d.tick(0.0).unwrap(), vec![(100, 1), (101, 2)]);
    d.submit(1, "m", 0.0, 5.0, 0.1).unwrap();
    assert!(d.tick(0.0).unwrap().is_empty());
    let w = d.next_wakeup(0.0).unwrap().unwrap();
    assert!(close(w, 0.48));
    assert_eq!(d.tick(w).unwrap(), vec![(1, 2)]);
}

#[test]
fn check_integrity_reports_a_broken_state() {
    let fresh = || {
        let mut d = disp(Policy::LstImh, Requeue::Reject, 0.02);
        d.add_instance(1, "m", 0).unwrap();
        d.submit(1, "m", 0.0, 10.0, 0.1).unwrap();
        d.submit(2, "m", 0.0, 10.0, 0.1).unwrap();
        d.submit(3, "m", 0.0, 10.0, 0.1).unwrap();
        assert_eq!(d.tick(0.0).unwrap(), vec![(1, 1)]);
        d.check_integrity().unwrap();
        d
    };
    let mut d = fresh();
    d.stats.pending += 1;
    assert!(d.check_integrity().unwrap_err().contains("stats.pending"));
    let mut d = fresh();
    let entry = d.models[0].queue[0];
    d.models[0].queue.push(entry);
    assert!(d.check_integrity().is_err());
    let mut d = fresh();
    d.instances.get_mut(&1).unwrap().assigned.clear();
    assert!(d.check_integrity().is_err());
    let mut d = fresh();
    d.groups.get_mut(&0).unwrap().load.assign(2, 0.1, 0.0);
    assert!(d
        .check_integrity()
        .unwrap_err()
        .contains("load holds job 2"));
    let mut d = fresh();
    d.requests.get_mut(&2).unwrap().place = Place::Assigned(1);
    assert!(d.check_integrity().is_err());
}
