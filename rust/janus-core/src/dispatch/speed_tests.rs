//! Machines that differ (speed.rs): each machine's own processing times and the classes
//! it can run. Checked against brute force as the identical-machine tests are:
//! - each machine's subset is a largest feasible subset of the jobs still unassigned at
//!   its turn, by that machine's own times (Moore-Hodgson stays optimal per machine);
//! - the plan (LST-IMH, balanced when that keeps all on time) selects the same jobs as
//!   LST-IMH and has at least its on-time jobs, every job on a machine that can run it;
//! - identical rows give exactly the identical-machine plans of before.

use super::lst_imh::{lst_imh_on, lst_imh_trusted};
use super::moore_hodgson::tests::feasible;
use super::plan::{plan_global, plan_on};
use super::speed::{Jobs, Machines, Row, Speed};
use proptest::prelude::*;

/// Processing times of every job on machine `i`, +inf where it cannot run the job.
fn times(jobs: &Jobs<'_>, machines: &Machines<'_>, i: usize) -> Vec<f64> {
    (0..jobs.len()).map(|j| jobs.p(machines.row(i), j)).collect()
}

/// The largest subset of `left` feasible on one machine free at `start` (EDD order).
fn best_count(left: &[usize], p: &[f64], deadline: &[f64], start: f64) -> usize {
    let mut order = left.to_vec();
    order.sort_by(|&a, &b| deadline[a].total_cmp(&deadline[b]).then(a.cmp(&b)));
    let n = order.len();
    (0u32..1 << n)
        .filter(|mask| {
            let seq: Vec<usize> = (0..n).filter(|k| mask & (1 << k) != 0).map(|k| order[k]).collect();
            feasible(&seq, p, deadline, start)
        })
        .map(|mask| mask.count_ones() as usize)
        .max()
        .unwrap_or(0)
}

/// Jobs (est, tokens, deadline, class) and machines (avail, per class: None or (a, b)).
type Raw = (Vec<(u32, u32, u32, u32)>, Vec<(u32, Vec<Option<(u32, u32)>>)>);
/// est, tokens, deadline, class, avail, rows.
type Built = (Vec<f64>, Vec<f64>, Vec<f64>, Vec<u32>, Vec<f64>, Vec<Row>);

/// (jobs: est, tokens, deadline, class) and (machines: avail, rows) on integer values, so
/// every sum is exact. Rows: per class None (cannot run it), the estimate, or a fit.
fn instance() -> impl Strategy<Value = Raw> {
    let job = (0u32..12, 0u32..6, 0u32..40, 0u32..2);
    let speed = prop::option::weighted(0.8, (0u32..4, 0u32..3));
    let machine = (0u32..10, prop::collection::vec(speed, 2));
    (prop::collection::vec(job, 0..=8), prop::collection::vec(machine, 1..=3))
}

fn build(raw: &Raw) -> Built {
    let (jobs, machines) = raw;
    let est = jobs.iter().map(|j| j.0 as f64).collect();
    let tokens = jobs.iter().map(|j| j.1 as f64).collect();
    let deadline = jobs.iter().map(|j| j.2 as f64).collect();
    let class = jobs.iter().map(|j| j.3).collect();
    let avail = machines.iter().map(|m| m.0 as f64).collect();
    let rows = machines
        .iter()
        .map(|m| {
            m.1.iter()
                .enumerate()
                // class 0 by the submitted estimate, class 1 by a fit a + b * tokens
                .map(|(c, s)| s.map(|(a, b)| if c == 0 { Speed::EST } else { Speed::fit(a as f64, b as f64) }))
                .collect()
        })
        .collect();
    (est, tokens, deadline, class, avail, rows)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(384))]
    #[test]
    fn each_machine_takes_a_largest_feasible_subset_of_what_is_left(raw in instance()) {
        let (est, tokens, deadline, class, avail, rows) = build(&raw);
        let jobs = Jobs { est: &est, tokens: &tokens, deadline: &deadline, class: &class, weight: None };
        let machines = Machines { avail: &avail, rows: &rows };
        let got = lst_imh_on(&jobs, &machines);
        prop_assert_eq!(got.len(), avail.len());
        // replay LST-IMH's visit order: latest free first, equal: lower index
        let mut order: Vec<usize> = (0..avail.len()).collect();
        order.sort_by(|&a, &b| avail[b].total_cmp(&avail[a]).then(a.cmp(&b)));
        let mut left: Vec<usize> = (0..est.len()).collect();
        for i in order {
            let p = times(&jobs, &machines, i);
            let mine = &got[i];
            prop_assert!(feasible(mine, &p, &deadline, avail[i]), "machine {} late: {:?}", i, mine);
            for w in mine.windows(2) {
                prop_assert!((deadline[w[0]], w[0]) < (deadline[w[1]], w[1]));
            }
            for &j in mine {
                prop_assert!(left.contains(&j), "job {} twice or not left", j);
                prop_assert!(p[j].is_finite(), "job {} on machine {} that cannot run it", j, i);
            }
            prop_assert_eq!(mine.len(), best_count(&left, &p, &deadline, avail[i]));
            left.retain(|j| !mine.contains(j));
        }
    }

    #[test]
    fn the_plan_selects_lst_imhs_jobs_and_keeps_them_on_time(raw in instance(), rank in prop::collection::vec(0u32..3, 3)) {
        let (est, tokens, deadline, class, avail, rows) = build(&raw);
        let jobs = Jobs { est: &est, tokens: &tokens, deadline: &deadline, class: &class, weight: None };
        let machines = Machines { avail: &avail, rows: &rows };
        let rank: Vec<f64> = rank.iter().map(|&r| r as f64).collect();
        let lst = lst_imh_on(&jobs, &machines);
        let got = plan_on(&jobs, &machines, &rank);
        let mut a: Vec<usize> = lst.iter().flatten().copied().collect();
        let mut b: Vec<usize> = got.iter().flatten().copied().collect();
        a.sort_unstable();
        b.sort_unstable();
        prop_assert_eq!(&a, &b);
        let on_time = |plan: &[Vec<usize>]| -> usize {
            plan.iter().enumerate().map(|(i, seq)| {
                let p = times(&jobs, &machines, i);
                let mut t = avail[i];
                seq.iter().filter(|&&j| { t += p[j]; t <= deadline[j] }).count()
            }).sum()
        };
        let n = on_time(&got);
        prop_assert!(n >= on_time(&lst));
        if got != lst {
            prop_assert_eq!(n, b.len());
        }
    }

    /// Every machine with the same row of plain estimates: the rows path and the identical
    /// machine path are one plan, so the dispatcher may take either.
    #[test]
    fn identical_rows_are_the_identical_machine_plan(
        jobs in prop::collection::vec((0u32..20, 0u32..120), 0..60),
        avail in prop::collection::vec(0u32..40, 1..6),
    ) {
        let proc: Vec<f64> = jobs.iter().map(|j| j.0 as f64).collect();
        let deadline: Vec<f64> = jobs.iter().map(|j| j.1 as f64).collect();
        let avail: Vec<f64> = avail.iter().map(|&a| a as f64).collect();
        let class = vec![0u32; proc.len()];
        // a fit a = 0, b = 1 on tokens = the estimate: the same times through the refill
        let rows: Vec<Row> = vec![vec![Some(Speed::fit(0.0, 1.0))]; avail.len()];
        let jobs = Jobs { est: &proc, tokens: &proc, deadline: &deadline, class: &class, weight: None };
        let machines = Machines { avail: &avail, rows: &rows };
        prop_assert_eq!(lst_imh_on(&jobs, &machines), lst_imh_trusted(&proc, &deadline, &avail, None));
        prop_assert_eq!(plan_on(&jobs, &machines, &[]), plan_global(&proc, &deadline, &avail, &[], None));
    }
}

#[test]
fn a_job_goes_where_its_model_runs_and_a_slow_machine_is_judged_by_its_own_speed() {
    // Two classes; machine 0 runs class 0 only, machine 1 runs both but class 1 at 3x.
    // Job 0 (class 1, 4 tokens, due 10) fits on machine 1 only (12 > 10: not at all).
    // Job 1 (class 1, 3 tokens, due 10): 9 on machine 1. Job 2 (class 0, est 5, due 6).
    let (est, tokens, deadline, class) = ([0.0, 0.0, 5.0], [4.0, 3.0, 0.0], [10.0, 10.0, 6.0], [1u32, 1, 0]);
    let avail = [0.0, 0.0];
    let rows: Vec<Row> = vec![vec![Some(Speed::EST), None], vec![Some(Speed::EST), Some(Speed::fit(0.0, 3.0))]];
    let jobs = Jobs { est: &est, tokens: &tokens, deadline: &deadline, class: &class, weight: None };
    let machines = Machines { avail: &avail, rows: &rows };
    let plan = plan_on(&jobs, &machines, &[]);
    assert_eq!(plan, vec![vec![2], vec![1]]);
}
