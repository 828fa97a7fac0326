//! The planning step of `Plan::Global`: LST-IMH for the on-time set, then a balanced
//! alternative that spreads it over the machines when that keeps every job on time.
//!
//! LST-IMH gives the latest-free machine its whole Moore-Hodgson subset first, so with
//! loose deadlines one machine takes the entire backlog and the others none (30/0/0). The
//! balanced plan list-schedules the jobs LST-IMH selected in earliest-deadline order
//! (equal deadlines: lower job index) onto the machine free earliest (equal free times:
//! the lower `rank`, the decode load of its device, then the lower machine index),
//! tracking each machine's running free time. Without the rank, idle machines (all free
//! "now") would always give the next job to the lowest index, piling every decode onto
//! one device at light load. It is used when every
//! job in it still ends by its deadline (`start + est <= deadline`); otherwise LST-IMH's
//! partition stands. Either way the same jobs are selected, so the plan never has fewer
//! on-time jobs than LST-IMH.
//!
//! The dispatcher then commits only a prefix of each machine's list (see
//! `dispatcher_tick.rs`); this file is pure and knows nothing of time or windows.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::lst_imh::lst_imh_on;
#[cfg(test)]
use super::lst_imh::lst_imh_trusted;
use super::speed::{Jobs, Machines};

/// Per machine (input order), the job indices it runs in execution order: LST-IMH's
/// selection, balanced when that keeps every job on time. Inputs must be validated
/// (finite, `>= +0.0`). (The dispatcher calls [`plan_on`], which is this on identical
/// machines.)
#[cfg(test)]
pub(crate) fn plan_global(
    proc: &[f64],
    deadline: &[f64],
    avail: &[f64],
    rank: &[f64],
    weight: Option<&[f64]>,
) -> Vec<Vec<usize>> {
    let lst = lst_imh_trusted(proc, deadline, avail, weight);
    balance(proc, deadline, avail, rank, lst)
}

/// [`plan_global`] on machines that may differ (speed.rs): LST-IMH with each machine's
/// own processing times, then the balanced list schedule where each job (earliest
/// deadline first) goes, among the machines that would finish it in time by their own
/// processing time, to the one free first (equal: lower rank, then lower index): the
/// spread of [`plan_global`] (idle machines share the work by decode load, not by which
/// one is a few ms faster), feasibility by each machine's own speed. With identical
/// machines that is exactly [`plan_global`]: when the machine free first is late, so is
/// every other.
pub(crate) fn plan_on(jobs: &Jobs<'_>, machines: &Machines<'_>, rank: &[f64]) -> Vec<Vec<usize>> {
    let lst = lst_imh_on(jobs, machines);
    if machines.rows.is_empty() {
        return balance(jobs.est, jobs.deadline, machines.avail, rank, lst);
    }
    balance_on(jobs, machines, rank, lst)
}

/// The balanced list schedule on machines that differ, or `lst` when some job would be
/// late in it (module docs). O(jobs x machines).
fn balance_on(jobs: &Jobs<'_>, machines: &Machines<'_>, rank: &[f64], lst: Vec<Vec<usize>>) -> Vec<Vec<usize>> {
    let chosen: Vec<usize> = lst.iter().flatten().copied().collect();
    list_schedule(jobs, machines, rank, &chosen).unwrap_or(lst)
}

/// `chosen` in earliest-deadline order, each onto the machine free first among those that
/// finish it in time; None when some job none finishes in time.
fn list_schedule(jobs: &Jobs<'_>, machines: &Machines<'_>, rank: &[f64], chosen: &[usize]) -> Option<Vec<Vec<usize>>> {
    let deadline = jobs.deadline;
    let mut order: Vec<u128> =
        chosen.iter().map(|&j| ((deadline[j].to_bits() as u128) << 32) | j as u128).collect();
    order.sort_unstable();
    let rank_of = |i: usize| rank.get(i).copied().filter(|r| *r >= 0.0).unwrap_or(0.0) + 0.0;
    let mut free: Vec<f64> = machines.avail.to_vec();
    let mut out: Vec<Vec<usize>> = vec![Vec::new(); machines.len()];
    for key in order {
        let j = key as u32 as usize;
        let mut best: Option<(f64, f64, usize, f64)> = None;
        for (i, &f) in free.iter().enumerate() {
            let done = f + jobs.p(machines.row(i), j);
            if done > deadline[j] {
                continue;
            }
            let cand = (f, rank_of(i), i, done);
            if best.is_none_or(|b| (cand.0, cand.1, cand.2) < (b.0, b.1, b.2)) {
                best = Some(cand);
            }
        }
        match best {
            Some((_, _, i, done)) => {
                free[i] = done;
                out[i].push(j);
            }
            None => return None,
        }
    }
    Some(out)
}

/// The balanced list schedule of the jobs in `lst` (see module docs), or `lst` itself
/// when some job would be late in it.
pub(crate) fn balance(
    proc: &[f64],
    deadline: &[f64],
    avail: &[f64],
    rank: &[f64],
    lst: Vec<Vec<usize>>,
) -> Vec<Vec<usize>> {
    // (deadline bits, index) packed in one u128: earliest deadline first, then index.
    let mut jobs: Vec<u128> = lst
        .iter()
        .flatten()
        .map(|&j| ((deadline[j].to_bits() as u128) << 32) | j as u128)
        .collect();
    if jobs.is_empty() {
        return lst;
    }
    jobs.sort_unstable();
    // Min-heap of (free time bits, rank bits, machine index): free times and ranks are
    // `>= +0.0` (or +inf after an overflow), so their bit patterns order like their values.
    let rank_of = |i: usize| rank.get(i).copied().filter(|r| *r >= 0.0).unwrap_or(0.0) + 0.0;
    let mut free: BinaryHeap<Reverse<(u64, u64, usize)>> = avail
        .iter()
        .enumerate()
        .map(|(i, a)| Reverse((a.to_bits(), rank_of(i).to_bits(), i)))
        .collect();
    let mut out: Vec<Vec<usize>> = vec![Vec::new(); avail.len()];
    for key in jobs {
        let j = key as u32 as usize;
        let Some(mut head) = free.peek_mut() else {
            return lst;
        };
        let Reverse((bits, r, i)) = *head;
        let done = f64::from_bits(bits) + proc[j];
        if done > deadline[j] {
            return lst;
        }
        *head = Reverse((done.to_bits(), r, i));
        drop(head);
        out[i].push(j);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn equal_free_times_go_to_the_machine_with_less_decode_load() {
        // Two idle machines, machine 0 decoding 5 sequences, machine 1 none: one job goes
        // to machine 1; two jobs split one each (the second machine is then free first).
        assert_eq!(plan_global(&[1.0], &[10.0], &[0.0, 0.0], &[5.0, 0.0], None), vec![vec![], vec![0]]);
        assert_eq!(
            plan_global(&[1.0, 1.0], &[10.0, 10.0], &[0.0, 0.0], &[5.0, 0.0], None),
            vec![vec![1], vec![0]]
        );
        // Without ranks the lower index wins the tie.
        assert_eq!(plan_global(&[1.0], &[10.0], &[0.0, 0.0], &[], None), vec![vec![0], vec![]]);
    }

    /// Jobs on time when each machine runs its list back to back from its free time.
    fn on_time(plan: &[Vec<usize>], proc: &[f64], deadline: &[f64], avail: &[f64]) -> usize {
        let mut n = 0;
        for (i, seq) in plan.iter().enumerate() {
            let mut t = avail[i];
            for &j in seq {
                t += proc[j];
                n += usize::from(t <= deadline[j]);
            }
        }
        n
    }

    #[test]
    fn loose_deadlines_are_spread_over_equal_machines() {
        let proc = [0.01; 6];
        let deadline = [1.0; 6];
        let avail = [0.0; 3];
        assert_eq!(
            lst_imh_trusted(&proc, &deadline, &avail, None),
            vec![vec![0, 1, 2, 3, 4, 5], vec![], vec![]]
        );
        assert_eq!(
            plan_global(&proc, &deadline, &avail, &[], None),
            vec![vec![0, 3], vec![1, 4], vec![2, 5]]
        );
    }

    #[test]
    fn the_earliest_free_machine_takes_the_next_job() {
        // A (4, 5), B (2, 6), C (2, 7); machines free at 3 and 0. LST-IMH: [B, C], [A].
        // Balanced: A -> machine 1 (ends 4), B -> machine 0 (free 3 < 4, ends 5),
        // C -> machine 1 (free 4 < 5, ends 6).
        let got = plan_global(&[4.0, 2.0, 2.0], &[5.0, 6.0, 7.0], &[3.0, 0.0], &[], None);
        assert_eq!(got, vec![vec![1], vec![0, 2]]);
    }

    #[test]
    fn keeps_lst_imh_when_balancing_would_make_a_job_late() {
        // A (4, 6), B (1, 5); machines free at 2 and 4. LST-IMH: machine 1 (free 4) takes
        // B (ends 5), machine 0 takes A (ends 6). Balanced: B (earlier deadline) -> machine
        // 0 (ends 3), A -> machine 0 (free 3 < 4, ends 7 > 6): late, so LST-IMH stands.
        let (proc, deadline, avail) = ([4.0, 1.0], [6.0, 5.0], [2.0, 4.0]);
        let lst = lst_imh_trusted(&proc, &deadline, &avail, None);
        assert_eq!(lst, vec![vec![0], vec![1]]);
        assert_eq!(plan_global(&proc, &deadline, &avail, &[], None), lst);
        assert_eq!(on_time(&lst, &proc, &deadline, &avail), 2);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// The full plan (what would be committed now and what is deferred) has at least
        /// LST-IMH's on-time jobs, every job in it on time, and no job twice.
        #[test]
        fn never_fewer_on_time_jobs_than_lst_imh(
            jobs in prop::collection::vec((0u32..20, 0u32..120), 0..60),
            avail in prop::collection::vec(0u32..40, 0..6),
            scale in prop_oneof![Just(1.0f64), Just(0.001), Just(0.1)],
        ) {
            let proc: Vec<f64> = jobs.iter().map(|j| j.0 as f64 * scale).collect();
            let deadline: Vec<f64> = jobs.iter().map(|j| j.1 as f64 * scale).collect();
            let avail: Vec<f64> = avail.iter().map(|&a| a as f64 * scale).collect();
            let lst = lst_imh_trusted(&proc, &deadline, &avail, None);
            let got = plan_global(&proc, &deadline, &avail, &[], None);
            prop_assert_eq!(got.len(), avail.len());
            let mut seen = vec![false; proc.len()];
            for &j in got.iter().flatten() {
                prop_assert!(!seen[j], "job {} planned twice", j);
                seen[j] = true;
            }
            let mut lst_set: Vec<usize> = lst.iter().flatten().copied().collect();
            let mut got_set: Vec<usize> = got.iter().flatten().copied().collect();
            lst_set.sort_unstable();
            got_set.sort_unstable();
            prop_assert_eq!(&got_set, &lst_set);
            let n = on_time(&got, &proc, &deadline, &avail);
            prop_assert!(n >= on_time(&lst, &proc, &deadline, &avail));
            if got != lst {
                // Balanced: every job in it on time, as computed by the same sums.
                prop_assert_eq!(n, got_set.len());
            }
        }
    }
}
