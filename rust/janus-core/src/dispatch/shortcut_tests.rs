//! The LST-IMH fast path against a plain version of the same algorithm, on floats.
//!
//! `backlog.rs` prunes jobs late even alone on the earliest machine, sorts once, skips
//! eight late jobs at a time and compacts taken jobs away. `equals_the_textbook_algorithm`
//! (lst_imh.rs) checks the plan on integer times, where every sum is exact. These tests
//! check that the shortcuts change nothing where rounding does happen: tiny, huge and
//! subnormal lengths, deadlines equal to completion times, many ties. The reference
//! below makes the same float operations per job (keep if `t + p <= d`, else replace the
//! longest kept job with `t = (t + p) - p_top`, else skip), with none of the shortcuts.

use super::lst_imh;
use proptest::prelude::*;

/// LST-IMH with no pruning, a fresh sort per machine, one job at a time, a linear search
/// for the longest kept job.
fn plain(proc: &[f64], deadline: &[f64], avail: &[f64]) -> Vec<Vec<usize>> {
    let mut left: Vec<usize> = (0..proc.len()).collect();
    let mut machines: Vec<usize> = (0..avail.len()).collect();
    machines.sort_by(|&a, &b| avail[b].total_cmp(&avail[a]).then(a.cmp(&b)));
    let mut out = vec![Vec::new(); avail.len()];
    for i in machines {
        left.sort_by(|&a, &b| deadline[a].total_cmp(&deadline[b]).then(a.cmp(&b)));
        let (mut kept, mut t): (Vec<usize>, f64) = (Vec::new(), avail[i]);
        for &j in &left {
            let done = t + proc[j];
            if done <= deadline[j] {
                kept.push(j);
                t = done;
                continue;
            }
            let longest = kept
                .iter()
                .enumerate()
                .max_by(|a, b| proc[*a.1].total_cmp(&proc[*b.1]).then(a.1.cmp(b.1)));
            if let Some((pos, &k)) = longest {
                if (proc[k], k) > (proc[j], j) {
                    t = done - proc[k];
                    kept.remove(pos);
                    let at = kept.partition_point(|&x| (deadline[x], x) < (deadline[j], j));
                    kept.insert(at, j);
                }
            }
        }
        left.retain(|j| !kept.contains(j));
        out[i] = kept;
    }
    out
}

/// Times where float sums round: subnormals, 1e-16 next to 1, 2^53, huge values, and
/// `f64::MAX`, whose sums overflow to +inf (still the same plan: the reference makes the
/// same additions).
const VALUES: [f64; 15] = [
    0.0,
    5e-324,
    1e-310,
    1e-300,
    1e-16,
    1.1102230246251565e-16,
    0.1,
    0.2,
    0.3,
    1.0,
    1.0000000000000002,
    9007199254740992.0,
    1e16,
    1e300,
    f64::MAX,
];

fn time() -> impl Strategy<Value = f64> {
    prop_oneof![
        3 => prop::sample::select(&VALUES[..]),
        1 => (0u32..20).prop_map(|x| x as f64 * 0.1),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn fast_path_equals_plain_on_floats(
        jobs in prop::collection::vec((time(), time(), prop::option::of(0usize..200)), 0..200),
        avail in prop::collection::vec(time(), 0..8),
    ) {
        let proc: Vec<f64> = jobs.iter().map(|j| j.0).collect();
        // Some deadlines are an exact completion time: a machine's start plus a prefix sum
        // of lengths (so `completion <= deadline` is decided by equality).
        let mut deadline: Vec<f64> = jobs.iter().map(|j| j.1).collect();
        for (k, job) in jobs.iter().enumerate() {
            if let (Some(r), Some(&a)) = (job.2, avail.first()) {
                let sum = proc[..=(r % (k + 1))].iter().fold(a, |t, p| t + p);
                deadline[k] = sum.min(f64::MAX);
            }
        }
        let got = lst_imh(&proc[..], &deadline[..], &avail[..]).unwrap();
        prop_assert_eq!(got, plain(&proc, &deadline, &avail));
    }
}

#[test]
fn negative_zero_and_subnormal_inputs() {
    // -0.0 is the same time as 0.0 (normalised on entry), a subnormal length still counts.
    let got = lst_imh([-0.0, 5e-324, 0.0], [0.0, 5e-324, -0.0], [-0.0]).unwrap();
    assert_eq!(got, vec![vec![0, 2, 1]]);
    let got = lst_imh([5e-324, 5e-324], [5e-324, 5e-324], [0.0]).unwrap();
    assert_eq!(got, vec![vec![0]]);
}

#[test]
fn on_time_means_completion_at_most_the_deadline_as_computed() {
    // 0.1 + 0.2 = 0.30000000000000004: on time for that deadline, late for 0.3.
    let got = lst_imh([0.1, 0.2], [0.1, 0.1 + 0.2], [0.0]).unwrap();
    assert_eq!(got, vec![vec![0, 1]]);
    let got = lst_imh([0.1, 0.2], [0.1, 0.3], [0.0]).unwrap();
    assert_eq!(got, vec![vec![0]]);
}
