//! LST-IMH (Latest-Start-Time Iterative Moore-Hodgson), PAPER.md §6.
//!
//! Machines free at different times: visit them latest-free first (the most constrained),
//! run Moore-Hodgson on the jobs still unassigned with the machine's free time as start,
//! give the machine the whole selected subset and pass the rest on. At least half of the
//! optimum's on-time jobs for a finite backlog with exact processing times.
//!
//! Naively O(m n log n) with a sort per machine. Here the backlog is sorted by deadline
//! once (jobs late even on the earliest machine are dropped before the sort); each
//! machine scans the jobs still unassigned in that order and the ones it keeps are marked
//! taken, so a machine costs O(r log k) for r remaining jobs and a kept set of k, and
//! hopeless jobs are skipped eight at a time (see `backlog.rs`).

use super::backlog::Backlog;
use super::speed::{Jobs, Machines};
use super::{check_times, DispatchError};

/// Per machine (in input order), the indices of the jobs it runs, in execution order.
/// Jobs that no machine can take are absent. See the module docs for tie-breaking.
///
/// Errors: `proc` and `deadline` of unequal length, or any time NaN, infinite or negative.
///
/// Takes anything that converts into `Vec<f64>`: slices are copied, owned vectors are
/// validated in place (the binding hands over the vectors it just built).
pub fn lst_imh(
    proc: impl Into<Vec<f64>>,
    deadline: impl Into<Vec<f64>>,
    avail: impl Into<Vec<f64>>,
) -> Result<Vec<Vec<usize>>, DispatchError> {
    let (proc, deadline, avail) = (proc.into(), deadline.into(), avail.into());
    if proc.len() != deadline.len() {
        return Err(DispatchError::InvalidInput(format!(
            "proc and deadline must have the same length, got {} and {}",
            proc.len(),
            deadline.len()
        )));
    }
    if proc.len() > u32::MAX as usize || avail.len() > u32::MAX as usize {
        return Err(DispatchError::InvalidInput(
            "too many jobs or machines (more than 2^32 - 1)".into(),
        ));
    }
    let proc = check_times("proc", proc)?;
    let deadline = check_times("deadline", deadline)?;
    let avail = check_times("avail", avail)?;
    Ok(lst_imh_trusted(&proc, &deadline, &avail, None))
}

/// [`lst_imh`] on inputs already validated and normalised (finite, `>= +0.0`); with
/// `weight`, each machine keeps its subset by value (see `Backlog::keep_weighted`).
pub(crate) fn lst_imh_trusted(
    proc: &[f64],
    deadline: &[f64],
    avail: &[f64],
    weight: Option<&[f64]>,
) -> Vec<Vec<usize>> {
    lst_imh_on(&Jobs::uniform(proc, deadline, weight), &Machines::identical(avail))
}

/// LST-IMH on machines that may differ (speed.rs): the same visit order (latest free
/// first), each machine's Moore-Hodgson with its own processing times, over the jobs it
/// can run. With identical machines this is [`lst_imh_trusted`].
pub(crate) fn lst_imh_on(jobs: &Jobs<'_>, machines: &Machines<'_>) -> Vec<Vec<usize>> {
    let m = machines.len();
    let mut out: Vec<Vec<usize>> = vec![Vec::new(); m];
    if m == 0 {
        return out;
    }
    let avail = machines.avail;
    let mut backlog = Backlog::for_machines(jobs, machines);
    let mut order: Vec<u32> = (0..m as u32).collect();
    order.sort_unstable_by_key(|&i| (std::cmp::Reverse(avail[i as usize].to_bits()), i));
    for &i in &order {
        if backlog.is_empty() {
            break;
        }
        out[i as usize] = backlog.take_on(avail[i as usize], machines.row(i as usize));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::moore_hodgson;
    use super::super::moore_hodgson::tests::feasible;
    use super::*;
    use proptest::prelude::*;

    /// The multi-machine optimum: each job to one machine or none, a machine's set
    /// feasible in EDD order. Dynamic programme over (machine, unassigned subset).
    fn brute_force(proc: &[f64], deadline: &[f64], avail: &[f64]) -> usize {
        let n = proc.len();
        let order: Vec<usize> = super::super::edd_order(deadline)
            .iter()
            .map(|&j| j as usize)
            .collect();
        let full = (1usize << n) - 1;
        let ok: Vec<Vec<bool>> = avail
            .iter()
            .map(|&a| {
                (0..=full)
                    .map(|mask| {
                        let seq: Vec<usize> = order
                            .iter()
                            .copied()
                            .filter(|&j| mask & (1 << j) != 0)
                            .collect();
                        feasible(&seq, proc, deadline, a)
                    })
                    .collect()
            })
            .collect();
        fn best(k: usize, mask: usize, ok: &[Vec<bool>]) -> usize {
            if k == ok.len() {
                return 0;
            }
            let mut top = best(k + 1, mask, ok);
            let mut sub = mask;
            while sub > 0 {
                if ok[k][sub] {
                    top = top.max(sub.count_ones() as usize + best(k + 1, mask & !sub, ok));
                }
                sub = (sub - 1) & mask;
            }
            top
        }
        best(0, full, &ok)
    }

    #[test]
    fn worked_example_from_the_paper() {
        // A (4, 5), B (2, 6), C (2, 7); T1 = 3, T2 = 0.
        let got = lst_imh([4.0, 2.0, 2.0], [5.0, 6.0, 7.0], [3.0, 0.0]).unwrap();
        assert_eq!(got, vec![vec![1, 2], vec![0]]);
    }

    #[test]
    fn equal_free_times_go_to_the_lower_index_first() {
        let got = lst_imh([1.0, 1.0, 1.0], [1.0, 1.0, 2.0], [0.0, 0.0]).unwrap();
        assert_eq!(got, vec![vec![0, 2], vec![1]]);
    }

    #[test]
    fn no_machines_or_no_jobs() {
        assert_eq!(lst_imh([1.0], [2.0], []).unwrap(), Vec::<Vec<usize>>::new());
        assert_eq!(
            lst_imh([], [], [0.0, 1.0]).unwrap(),
            vec![Vec::<usize>::new(); 2]
        );
    }

    #[test]
    fn rejects_bad_input() {
        assert!(lst_imh([1.0], [1.0, 2.0], [0.0]).is_err());
        assert!(lst_imh([1.0], [1.0], [f64::NAN]).is_err());
        assert!(lst_imh([1.0], [1.0], [-1.0]).is_err());
        assert!(lst_imh([f64::INFINITY], [1.0], [0.0]).is_err());
    }

    /// LST-IMH as the paper writes it: per machine (latest free first) sort what is left
    /// by deadline, add jobs in order, and whenever the last one is late drop the longest.
    fn textbook(proc: &[f64], deadline: &[f64], avail: &[f64]) -> Vec<Vec<usize>> {
        let mut left: Vec<usize> = (0..proc.len()).collect();
        let mut machines: Vec<usize> = (0..avail.len()).collect();
        machines.sort_by(|&a, &b| avail[b].total_cmp(&avail[a]).then(a.cmp(&b)));
        let mut out = vec![Vec::new(); avail.len()];
        for i in machines {
            left.sort_by(|&a, &b| deadline[a].total_cmp(&deadline[b]).then(a.cmp(&b)));
            let (mut kept, mut t) = (Vec::new(), avail[i]);
            for &j in &left {
                kept.push(j);
                t += proc[j];
                if t > deadline[j] {
                    let (pos, _) = kept
                        .iter()
                        .enumerate()
                        .max_by(|a, b| proc[*a.1].total_cmp(&proc[*b.1]).then(a.1.cmp(b.1)))
                        .unwrap();
                    t -= proc[kept.remove(pos)];
                }
            }
            left.retain(|j| !kept.contains(j));
            out[i] = kept;
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        /// Integer times keep the arithmetic exact, so the fast scan (pruning, blocks of
        /// eight, compaction) must give exactly the textbook plan, ties included.
        #[test]
        fn equals_the_textbook_algorithm(
            jobs in prop::collection::vec((0u32..20, 0u32..300), 0..250),
            avail in prop::collection::vec(0u32..40, 0..10),
        ) {
            let proc: Vec<f64> = jobs.iter().map(|j| j.0 as f64).collect();
            let deadline: Vec<f64> = jobs.iter().map(|j| j.1 as f64).collect();
            let avail: Vec<f64> = avail.iter().map(|&a| a as f64).collect();
            let got = lst_imh(&proc[..], &deadline[..], &avail[..]).unwrap();
            prop_assert_eq!(got, textbook(&proc, &deadline, &avail));
        }
    }

    proptest! {
        #[test]
        fn at_least_half_of_the_optimum(
            jobs in prop::collection::vec((0u32..8, 0u32..25), 0..=7),
            avail in prop::collection::vec(0u32..10, 1..=3),
        ) {
            let proc: Vec<f64> = jobs.iter().map(|j| j.0 as f64).collect();
            let deadline: Vec<f64> = jobs.iter().map(|j| j.1 as f64).collect();
            let avail: Vec<f64> = avail.iter().map(|&a| a as f64).collect();
            let got = lst_imh(&proc[..], &deadline[..], &avail[..]).unwrap();
            let mut seen = vec![false; proc.len()];
            for (i, seq) in got.iter().enumerate() {
                prop_assert!(feasible(seq, &proc, &deadline, avail[i]));
                for &j in seq {
                    prop_assert!(!seen[j], "job {} assigned twice", j);
                    seen[j] = true;
                }
            }
            let taken: usize = got.iter().map(Vec::len).sum();
            prop_assert!(2 * taken >= brute_force(&proc, &deadline, &avail));
        }

        #[test]
        fn one_machine_is_moore_hodgson(
            jobs in prop::collection::vec((0.0f64..1.0, 0.0f64..5.0), 0..100),
            start in 0.0f64..2.0,
        ) {
            let proc: Vec<f64> = jobs.iter().map(|j| j.0).collect();
            let deadline: Vec<f64> = jobs.iter().map(|j| j.1).collect();
            let got = lst_imh(&proc[..], &deadline[..], [start]).unwrap();
            prop_assert_eq!(&got[0], &moore_hodgson(&proc[..], &deadline[..], start).unwrap());
        }
    }
}
