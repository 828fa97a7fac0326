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
    let (proc, deadline) = jobs(proc.into(), deadline.into(), None)?;
    let start = check_time("start", start)?;
    Ok(Backlog::new(&proc, &deadline, start, None).take(start))
}

/// Validated (proc, deadline), with `weight`'s length checked alongside when given.
fn jobs(
    proc: Vec<f64>,
    deadline: Vec<f64>,
    weight: Option<&[f64]>,
) -> Result<(Vec<f64>, Vec<f64>), DispatchError> {
    let n_weight = weight.map_or(proc.len(), <[f64]>::len);
    if proc.len() != deadline.len() || proc.len() != n_weight {
        return Err(DispatchError::InvalidInput(format!(
            "proc, deadline{} must have the same length, got {}, {}{}",
            if weight.is_some() { " and weight" } else { "" },
            proc.len(),
            deadline.len(),
            weight.map_or(String::new(), |w| format!(" and {}", w.len()))
        )));
    }
    if proc.len() > u32::MAX as usize {
        return Err(DispatchError::InvalidInput(
            "too many jobs (more than 2^32 - 1)".into(),
        ));
    }
    Ok((check_times("proc", proc)?, check_times("deadline", deadline)?))
}

/// Moore-Hodgson for the most *value* on time (`objective = tokens`): the indices of a
/// feasible set in execution order, chosen by the weighted rule of
/// `Backlog::keep_weighted` (exactly Moore-Hodgson when all weights are equal; a
/// heuristic otherwise, the exact problem being NP-hard).
///
/// Errors: lists of unequal length, a time NaN, infinite or negative, or a weight NaN,
/// infinite or negative.
pub fn moore_hodgson_weighted(
    proc: impl Into<Vec<f64>>,
    deadline: impl Into<Vec<f64>>,
    weight: impl Into<Vec<f64>>,
    start: f64,
) -> Result<Vec<usize>, DispatchError> {
    let weight = weight.into();
    let (proc, deadline) = jobs(proc.into(), deadline.into(), Some(&weight))?;
    let weight = check_times("weight", weight)?;
    let start = check_time("start", start)?;
    Ok(Backlog::new(&proc, &deadline, start, Some(&weight)).take(start))
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

        #[test]
        fn weighted_with_equal_weights_is_moore_hodgson(
            jobs in prop::collection::vec((0u32..12, 0u32..40), 0..=30),
            start in 0u32..10,
            w in 1u32..5,
        ) {
            // integer times: both running sums are exact, so the sets must be identical
            let proc: Vec<f64> = jobs.iter().map(|j| j.0 as f64).collect();
            let deadline: Vec<f64> = jobs.iter().map(|j| j.1 as f64).collect();
            let weight = vec![w as f64; jobs.len()];
            let plain = moore_hodgson(&proc[..], &deadline[..], start as f64).unwrap();
            let weighted = moore_hodgson_weighted(&proc[..], &deadline[..], &weight[..], start as f64).unwrap();
            prop_assert_eq!(weighted, plain);
        }

        #[test]
        fn weighted_is_feasible_and_never_below_the_count_plan_by_value(
            jobs in prop::collection::vec((0u32..12, 0u32..40, 0u32..100), 0..=8),
            start in 0u32..10,
        ) {
            let proc: Vec<f64> = jobs.iter().map(|j| j.0 as f64).collect();
            let deadline: Vec<f64> = jobs.iter().map(|j| j.1 as f64).collect();
            let weight: Vec<f64> = jobs.iter().map(|j| j.2 as f64).collect();
            let got = moore_hodgson_weighted(&proc[..], &deadline[..], &weight[..], start as f64).unwrap();
            prop_assert!(feasible(&got, &proc, &deadline, start as f64));
            for w in got.windows(2) {
                prop_assert!((deadline[w[0]], w[0]) < (deadline[w[1]], w[1]));
            }
            let best = brute_force_value(&proc, &deadline, &weight, start as f64);
            let value: f64 = got.iter().map(|&j| weight[j]).sum();
            prop_assert!(value <= best + 1e-9);
        }
    }

    /// The most value any feasible subset reaches (EDD order is optimal for a fixed set).
    fn brute_force_value(proc: &[f64], deadline: &[f64], weight: &[f64], start: f64) -> f64 {
        let n = proc.len();
        let order: Vec<usize> = edd_order(deadline).iter().map(|&j| j as usize).collect();
        (0u32..1 << n)
            .filter_map(|mask| {
                let seq: Vec<usize> = order.iter().copied().filter(|&j| mask & (1 << j) != 0).collect();
                feasible(&seq, proc, deadline, start).then(|| seq.iter().map(|&j| weight[j]).sum::<f64>())
            })
            .fold(0.0, f64::max)
    }

    #[test]
    fn weighted_keeps_one_valuable_long_job_over_cheap_short_ones() {
        // Three short jobs worth 1 each, then one of length 9 worth 100, all due at 10:
        // the count plan keeps the three (3 jobs), the weighted plan the long one.
        let (p, d, w) = ([1.0, 1.0, 1.0, 9.0], [10.0; 4], [1.0, 1.0, 1.0, 100.0]);
        assert_eq!(moore_hodgson(p, d, 0.0).unwrap(), vec![0, 1, 2]);
        assert_eq!(moore_hodgson_weighted(p, d, w, 0.0).unwrap(), vec![0, 3]);
        // Rejects a bad weight.
        assert!(moore_hodgson_weighted([1.0], [1.0], [f64::NAN], 0.0).is_err());
        assert!(moore_hodgson_weighted([1.0], [1.0], [1.0, 2.0], 0.0).is_err());
    }

    /// Over many random instances the weighted plan's value is close to the optimum
    /// (the exact problem is NP-hard; this is the heuristic's measured quality) and
    /// above the count plan's value.
    #[test]
    fn weighted_value_against_the_optimum_over_random_instances() {
        let mut rng = 0x9e3779b97f4a7c15u64;
        let mut next = move |k: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % k
        };
        let (mut ratio_sum, mut worst, mut count_ratio_sum) = (0.0, 1.0f64, 0.0);
        let n_inst = 2000;
        for _ in 0..n_inst {
            let n = 1 + next(10) as usize;
            let proc: Vec<f64> = (0..n).map(|_| 1.0 + next(10) as f64).collect();
            let deadline: Vec<f64> = (0..n).map(|_| 1.0 + next(30) as f64).collect();
            let weight: Vec<f64> = (0..n).map(|_| 1.0 + next(100) as f64).collect();
            let best = brute_force_value(&proc, &deadline, &weight, 0.0);
            if best == 0.0 {
                continue;
            }
            let got = moore_hodgson_weighted(&proc[..], &deadline[..], &weight[..], 0.0).unwrap();
            let cnt = moore_hodgson(&proc[..], &deadline[..], 0.0).unwrap();
            let v: f64 = got.iter().map(|&j| weight[j]).sum();
            let c: f64 = cnt.iter().map(|&j| weight[j]).sum();
            ratio_sum += v / best;
            count_ratio_sum += c / best;
            worst = worst.min(v / best);
        }
        let (mean, count_mean) = (ratio_sum / n_inst as f64, count_ratio_sum / n_inst as f64);
        eprintln!("weighted/optimum mean {mean:.4} worst {worst:.4}; count plan/optimum mean {count_mean:.4}");
        assert!(mean >= 0.95, "mean {mean}");
        assert!(mean > count_mean + 0.02, "weighted {mean} vs count {count_mean}");
    }
}
