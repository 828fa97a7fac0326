//! Moore-Hodgson: the most jobs one machine can finish by their deadlines.
//!
//! Walk the jobs in earliest-deadline order keeping a feasible set; when the next job
//! would finish late, the longest job of the set plus that one goes. Keeping the set in a
//! max-heap by length makes it O(n log n). Optimal for one machine (Moore 1968).
//!
//! The scan itself lives in [`Backlog::take`], shared with LST-IMH.

use super::backlog::Backlog;
use super::{check_time, check_times, DispatchError};

/// Indices of a maximum-cardinality set of jobs that all finish by their deadlines on one
/// machine free at `start`, in execution (earliest-deadline-first) order.
///
/// Errors: lists of unequal length, or any time NaN, infinite or negative.
/// Takes anything that converts into `Vec<f64>` (slices are copied, vectors moved).
pub fn moore_hodgson(
    proc: impl Into<Vec<f64>>,
    deadline: impl Into<Vec<f64>>,
    start: f64,
) -> Result<Vec<usize>, DispatchError> {
    let (proc, deadline) = (proc.into(), deadline.into());
    if proc.len() != deadline.len() {
        return Err(DispatchError::InvalidInput(format!(
            "proc and deadline must have the same length, got {} and {}",
            proc.len(),
            deadline.len()
        )));
    }
    if proc.len() > u32::MAX as usize {
        return Err(DispatchError::InvalidInput(
            "too many jobs (more than 2^32 - 1)".into(),
        ));
    }
    let proc = check_times("proc", proc)?;
    let deadline = check_times("deadline", deadline)?;
    let start = check_time("start", start)?;
    Ok(Backlog::new(&proc, &deadline, start).take(start))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::edd_order;
    use super::*;
    use proptest::prelude::*;

    /// Completion times of `seq` run back to back from `start`, recomputed from scratch.
    pub(crate) fn feasible(seq: &[usize], proc: &[f64], deadline: &[f64], start: f64) -> bool {
        let mut t = start;
        seq.iter().all(|&j| {
            t += proc[j];
            t <= deadline[j]
        })
    }

    /// The largest subset that is feasible in EDD order (EDD is optimal for a fixed set).
    pub(crate) fn brute_force(proc: &[f64], deadline: &[f64], start: f64) -> usize {
        let n = proc.len();
        let order: Vec<usize> = edd_order(deadline).iter().map(|&j| j as usize).collect();
        (0u32..1 << n)
            .filter(|mask| {
                let seq: Vec<usize> = order
                    .iter()
                    .copied()
                    .filter(|&j| mask & (1 << j) != 0)
                    .collect();
                feasible(&seq, proc, deadline, start)
            })
            .map(|mask| mask.count_ones() as usize)
            .max()
            .unwrap_or(0)
    }

    #[test]
    fn drops_the_longest_job() {
        // EDD: 0 (p4,d5), 1 (p2,d6), 2 (p2,d7) from t=3: 0 is late alone, 1 and 2 fit.
        let got = moore_hodgson([4.0, 2.0, 2.0], [5.0, 6.0, 7.0], 3.0).unwrap();
        assert_eq!(got, vec![1, 2]);
        // From t=0, 0 and 1 fit; 2 would end at 8 > 7, so the longest (0) makes way.
        let got = moore_hodgson([4.0, 2.0, 2.0], [5.0, 6.0, 7.0], 0.0).unwrap();
        assert_eq!(got, vec![1, 2]);
    }

    #[test]
    fn ties_are_deterministic() {
        // Equal deadlines run in index order; equal lengths drop the higher index.
        let got = moore_hodgson([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], 0.0).unwrap();
        assert_eq!(got, vec![0, 1]);
        // EDD order is 1 (d=1), 2 (d=2), 0 (d=2.5); job 0 is late after 1 and 2, and of
        // the equal-length jobs the highest index (2) is the one dropped.
        let got = moore_hodgson([1.0, 1.0, 1.0], [2.5, 1.0, 2.0], 0.0).unwrap();
        assert_eq!(got, vec![1, 0]);
    }

    #[test]
    fn empty_and_zero_length() {
        assert_eq!(moore_hodgson([], [], 0.0).unwrap(), Vec::<usize>::new());
        assert_eq!(
            moore_hodgson([0.0, -0.0], [0.0, 0.0], 0.0).unwrap(),
            vec![0, 1]
        );
    }

    #[test]
    fn rejects_bad_input() {
        for (p, d, s) in [
            (vec![f64::NAN], vec![1.0], 0.0),
            (vec![1.0], vec![f64::INFINITY], 0.0),
            (vec![-1.0], vec![1.0], 0.0),
            (vec![1.0], vec![1.0], -0.5),
            (vec![1.0, 2.0], vec![1.0], 0.0),
        ] {
            assert!(matches!(
                moore_hodgson(p, d, s),
                Err(DispatchError::InvalidInput(_))
            ));
        }
    }

    proptest! {
        #[test]
        fn count_equals_brute_force(
            jobs in prop::collection::vec((0u32..12, 0u32..40), 0..=8),
            start in 0u32..10,
        ) {
            let proc: Vec<f64> = jobs.iter().map(|j| j.0 as f64).collect();
            let deadline: Vec<f64> = jobs.iter().map(|j| j.1 as f64).collect();
            let got = moore_hodgson(&proc[..], &deadline[..], start as f64).unwrap();
            prop_assert!(feasible(&got, &proc, &deadline, start as f64));
            prop_assert_eq!(got.len(), brute_force(&proc, &deadline, start as f64));
        }

        #[test]
        fn result_is_edd_ordered_and_unique(
            jobs in prop::collection::vec((0.0f64..1.0, 0.0f64..5.0), 0..200),
            start in 0.0f64..1.0,
        ) {
            let proc: Vec<f64> = jobs.iter().map(|j| j.0).collect();
            let deadline: Vec<f64> = jobs.iter().map(|j| j.1).collect();
            let got = moore_hodgson(&proc[..], &deadline[..], start).unwrap();
            for w in got.windows(2) {
                prop_assert!((deadline[w[0]], w[0]) < (deadline[w[1]], w[1]));
            }
            // Feasible up to rounding of the running sum (a few ulps of the largest time).
            let mut t = start;
            for &j in &got {
                t += proc[j];
                prop_assert!(t <= deadline[j] + 1e-9);
            }
        }
    }
}
