//! How long a job takes on a machine, when machines are not identical.
//!
//! The paper's LST-IMH assumes one processing time `p_j` per job on every machine. The
//! dispatcher knows more: each instance (a model on a device group) has its own prefill
//! fit `a + b * tokens` (a slower device, a device shared with other models' work), and a
//! machine (a device group) runs only the jobs of the models it has a ready instance of.
//! So each machine has a `Row`: per job class (the job's model), a `Speed` or `None`
//! (the machine cannot run that class). `Speed::EST` is the identity: the job's own
//! estimate, as submitted (what every machine uses when no row is given, and an instance
//! with no fit yet).
//!
//! Everything downstream (Moore-Hodgson per machine, the balance step) reads processing
//! times only through `Speed::p`, so with identical rows the plans are exactly the
//! identical-machine plans of before.

/// `p = c + s * est + b * tokens`: `EST` is (0, 1, 0), a fit `a + b * tokens` is (a, 0, b).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Speed {
    c: f64,
    s: f64,
    b: f64,
}

impl Speed {
    /// The job's own estimate.
    pub(crate) const EST: Speed = Speed { c: 0.0, s: 1.0, b: 0.0 };

    /// A prefill fit `a + b * tokens` (both finite, `>= 0`).
    pub(crate) fn fit(a: f64, b: f64) -> Speed {
        Speed { c: a + 0.0, s: 0.0, b: b + 0.0 }
    }

    /// The job's processing time at this speed (`>= 0` for valid inputs).
    #[inline]
    pub(crate) fn p(&self, est: f64, tokens: f64) -> f64 {
        self.c + self.s * est + self.b * tokens
    }
}

/// A machine's speed per job class; `None`: it cannot run that class.
pub(crate) type Row = Vec<Option<Speed>>;

/// The jobs to plan, indexed alike: estimate, tokens, deadline, class (an index into each
/// machine's row), and value (`Objective::Tokens`; None: each job is worth one).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Jobs<'a> {
    pub(crate) est: &'a [f64],
    pub(crate) tokens: &'a [f64],
    pub(crate) deadline: &'a [f64],
    pub(crate) class: &'a [u32],
    pub(crate) weight: Option<&'a [f64]>,
}

impl<'a> Jobs<'a> {
    /// Jobs of one class with processing times `proc` (the identical-machine case).
    pub(crate) fn uniform(proc: &'a [f64], deadline: &'a [f64], weight: Option<&'a [f64]>) -> Self {
        Jobs { est: proc, tokens: proc, deadline, class: &[], weight }
    }

    pub(crate) fn len(&self) -> usize {
        self.deadline.len()
    }

    /// The class of job `j` (0 when no classes are given).
    #[inline]
    pub(crate) fn class_of(&self, j: usize) -> usize {
        self.class.get(j).map_or(0, |&c| c as usize)
    }

    /// Job `j`'s processing time on a machine with `row` (None: identical machines, the
    /// job's estimate); +inf when the machine cannot run it.
    #[inline]
    pub(crate) fn p(&self, row: Option<&Row>, j: usize) -> f64 {
        match row {
            None => self.est[j],
            Some(r) => match r.get(self.class_of(j)).copied().flatten() {
                Some(s) => s.p(self.est[j], self.tokens[j]),
                None => f64::INFINITY,
            },
        }
    }
}

/// The machines: free times and, when they differ, a row each (`rows` empty: identical
/// machines that run every job in its estimate).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Machines<'a> {
    pub(crate) avail: &'a [f64],
    pub(crate) rows: &'a [Row],
}

impl<'a> Machines<'a> {
    pub(crate) fn identical(avail: &'a [f64]) -> Self {
        Machines { avail, rows: &[] }
    }

    pub(crate) fn len(&self) -> usize {
        self.avail.len()
    }

    /// Machine `i`'s row (None: identical machines).
    #[inline]
    pub(crate) fn row(&self, i: usize) -> Option<&'a Row> {
        if self.rows.is_empty() {
            None
        } else {
            self.rows.get(i)
        }
    }

    /// The least time any machine could finish job `j` alone: a lower bound used to drop
    /// jobs no machine can take (exact: the minimum of `avail_i + p_ij`).
    pub(crate) fn earliest_alone(&self, jobs: &Jobs<'_>, j: usize) -> f64 {
        if self.rows.is_empty() {
            let earliest = self.avail.iter().copied().fold(f64::INFINITY, f64::min);
            return earliest + jobs.est[j];
        }
        (0..self.len())
            .map(|i| self.avail[i] + jobs.p(self.row(i), j))
            .fold(f64::INFINITY, f64::min)
    }
}
