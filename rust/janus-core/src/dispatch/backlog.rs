//! The deadline-sorted backlog that Moore-Hodgson scans, laid out for fast repeated scans.
//!
//! LST-IMH scans the unassigned jobs once per machine, so the scan is the hot loop. On an
//! overloaded backlog almost every job is late on the current machine and no shorter than
//! the longest job kept so far: it is skipped. So the lengths and deadlines live in two
//! plain arrays (deadline order) and the scan first tests eight jobs at a time for "all
//! skipped" with branch-free comparisons; only a block with a candidate goes through the
//! exact one-by-one step. A job taken by a machine gets length +inf, which every later
//! scan skips without a special case; the arrays are compacted when half is taken.
//!
//! Machines that differ (speed.rs: a row of speeds per job class) see the same jobs with
//! other lengths: `p` holds the lengths on the machine last scanned and is refilled from
//! each job's estimate and tokens when the next machine's row differs (a job that machine
//! cannot run gets +inf, as a taken one does; taken jobs keep an estimate of +inf).

use std::collections::BinaryHeap;

use super::speed::{Jobs, Machines, Row};

/// Heap key of a kept job, packed in one u128 so that ordering is one comparison: length
/// bits (bits 64..128), job index (32..64), position in the arrays (0..32). Lengths are
/// finite and `>= +0.0`, so their bit patterns order like their values; equal lengths
/// order by job index (the higher one is dropped first); positions never decide (job
/// indices are unique) and only say where to find the job afterwards.
type Key = u128;

fn key(p: f64, j: u32, at: usize) -> Key {
    ((p.to_bits() as u128) << 64) | ((j as u128) << 32) | at as u128
}

fn key_len(k: Key) -> f64 {
    f64::from_bits((k >> 64) as u64)
}

/// Jobs tested together for "all skipped" (one or two SIMD registers of f64).
const BLOCK: usize = 8;

pub(crate) struct Backlog {
    /// Length of the job at each position (earliest deadline first) on the machine whose
    /// row `row` is; +inf once taken or where that machine cannot run it.
    p: Vec<f64>,
    /// Estimate and tokens of the job at each position (`e` = +inf once taken), and its
    /// class: what `p` is refilled from for another machine's row.
    e: Vec<f64>,
    t: Vec<f64>,
    cls: Vec<u32>,
    /// The row `p` was filled for (None: the jobs' own estimates, identical machines).
    row: Option<Row>,
    d: Vec<f64>,
    /// Job index at each position.
    j: Vec<u32>,
    /// Value of the job at each position (`objective = tokens`: its expected output
    /// tokens); `None`: every job is worth one (the paper's count of on-time jobs).
    w: Option<Vec<f64>>,
    alive: usize,
    heap: BinaryHeap<Key>,
    /// Scratch: positions of the jobs a machine keeps.
    at: Vec<u32>,
}

impl Backlog {
    /// The jobs that could finish in time on a machine free at `earliest`, in (deadline,
    /// index) order. A job late even alone on the earliest machine can never be kept (it
    /// cannot be added, and replacing a longer job would leave it later still), so
    /// leaving it out changes no result. Inputs must be validated (finite, `>= +0.0`).
    /// `weight`, when given, is indexed like `proc` (finite, `>= 0`).
    pub(crate) fn new(proc: &[f64], deadline: &[f64], earliest: f64, weight: Option<&[f64]>) -> Self {
        let jobs = Jobs::uniform(proc, deadline, weight);
        let keep: Vec<usize> = (0..proc.len()).filter(|&j| earliest + proc[j] <= deadline[j]).collect();
        Self::from_kept(&jobs, keep)
    }

    /// The same for machines that differ: a job is left out when no machine could finish
    /// it in time even alone (`Machines::earliest_alone`).
    pub(crate) fn for_machines(jobs: &Jobs<'_>, machines: &Machines<'_>) -> Self {
        if machines.rows.is_empty() {
            let earliest = machines.avail.iter().copied().fold(f64::INFINITY, f64::min);
            return Self::new(jobs.est, jobs.deadline, earliest, jobs.weight);
        }
        let keep: Vec<usize> =
            (0..jobs.len()).filter(|&j| machines.earliest_alone(jobs, j) <= jobs.deadline[j]).collect();
        Self::from_kept(jobs, keep)
    }

    fn from_kept(jobs: &Jobs<'_>, keep: Vec<usize>) -> Self {
        let deadline = jobs.deadline;
        // (deadline bits, index) packed in one u128 sorts faster than a key closure.
        let mut keys: Vec<u128> =
            keep.into_iter().map(|j| ((deadline[j].to_bits() as u128) << 32) | j as u128).collect();
        keys.sort_unstable();
        let j: Vec<u32> = keys.into_iter().map(|k| k as u32).collect();
        let e: Vec<f64> = j.iter().map(|&x| jobs.est[x as usize]).collect();
        Backlog {
            p: e.clone(),
            t: j.iter().map(|&x| jobs.tokens[x as usize]).collect(),
            cls: j.iter().map(|&x| jobs.class_of(x as usize) as u32).collect(),
            e,
            row: None,
            d: j.iter().map(|&x| deadline[x as usize]).collect(),
            w: jobs.weight.map(|w| j.iter().map(|&x| w[x as usize]).collect()),
            alive: j.len(),
            j,
            heap: BinaryHeap::new(),
            at: Vec::new(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.alive == 0
    }

    /// Moore-Hodgson on the remaining jobs for a machine free at `start`: removes the
    /// jobs it keeps and returns their indices in execution (deadline) order.
    ///
    /// Per job: on time after the kept ones -> keep it; else if the longest kept job is
    /// longer (equal: higher index) -> it makes way for this one, which still ends in
    /// time (t - p_top + p <= t <= the last kept deadline <= d); else skip it. The same
    /// set as the textbook add-then-drop-the-longest, without the `t + p - p` rounding.
    pub(crate) fn take(&mut self, start: f64) -> Vec<usize> {
        self.take_on(start, None)
    }

    /// [`Backlog::take`] for a machine with `row` (None: the jobs' own estimates).
    pub(crate) fn take_on(&mut self, start: f64, row: Option<&Row>) -> Vec<usize> {
        if row != self.row.as_ref() {
            self.refill(row);
        }
        if self.w.is_some() {
            let at = self.keep_weighted(start);
            return self.finish(at);
        }
        self.heap.clear();
        let mut t = start;
        let mut top: Option<Key> = None;
        // Length of `top`; -1 while nothing is kept (then no job can replace one).
        let mut p_top = -1.0f64;
        let n = self.p.len();
        let mut k = 0;
        while k < n {
            let end = (k + BLOCK).min(n);
            if end - k == BLOCK {
                let (ps, ds) = (&self.p[k..end], &self.d[k..end]);
                let mut skip = true;
                for l in 0..BLOCK {
                    // Late here and strictly longer than the longest kept job.
                    skip &= (t + ps[l] > ds[l]) & (ps[l] > p_top);
                }
                if skip {
                    k = end;
                    continue;
                }
            }
            for i in k..end {
                let p = self.p[i];
                let key = key(p, self.j[i], i);
                let done = t + p;
                if done <= self.d[i] {
                    self.heap.push(key);
                    t = done;
                    if top.is_none_or(|x| key > x) {
                        top = Some(key);
                        p_top = p;
                    }
                } else if top.is_some_and(|x| x > key) {
                    if let Some(mut head) = self.heap.peek_mut() {
                        t = done - key_len(*head);
                        *head = key;
                    }
                    top = self.heap.peek().copied();
                    p_top = top.map_or(-1.0, key_len);
                }
            }
            k = end;
        }
        let mut at = std::mem::take(&mut self.at);
        at.clear();
        at.extend(self.heap.drain().map(|x| x as u32));
        self.finish(at)
    }

    /// Weighted variant of the scan (`objective = tokens`): the positions of the kept
    /// jobs. Per job, in deadline order: keep it; when the last kept job then ends late by
    /// `excess`, the cheaper of two ways out is taken: (a) the single kept job of least
    /// value among those at least `excess` long (each alone restores the schedule; ties:
    /// the longest, then the higher index), or (b) the kept jobs of least value per second,
    /// taken in that order until their lengths cover `excess`; (a) wins ties. With equal
    /// values (a) removes the longest kept job (the new job, at least `excess` long, is a
    /// candidate), which is Moore-Hodgson's step, so the count stays optimal. With unequal
    /// values it is a heuristic (the exact problem is NP-hard; the tests measure it
    /// against the optimum): (b) keeps one long valuable job over many short cheap ones.
    fn keep_weighted(&mut self, start: f64) -> Vec<u32> {
        let w = self.w.take().unwrap_or_default();
        let mut kept: Vec<u32> = Vec::new();
        let mut t = start;
        for i in 0..self.p.len() {
            let p = self.p[i];
            if p == f64::INFINITY {
                continue;
            }
            kept.push(i as u32);
            t += p;
            if t > self.d[i] {
                let out = self.victims(&kept, t - self.d[i], &w);
                kept.retain(|&at| {
                    let drop = out.binary_search(&at).is_ok();
                    if drop {
                        t -= self.p[at as usize];
                    }
                    !drop
                });
                if kept.is_empty() {
                    t = start;
                }
            }
        }
        self.w = Some(w);
        kept
    }

    /// Sorted positions of the kept jobs that make way (see `keep_weighted`).
    fn victims(&self, kept: &[u32], excess: f64, w: &[f64]) -> Vec<u32> {
        let job = |at: u32| (self.p[at as usize], w[at as usize], self.j[at as usize]);
        // (a): least value, then longest, then higher index
        let single = kept.iter().copied().filter(|&at| job(at).0 >= excess).min_by(|&a, &b| {
            let ((pa, wa, ja), (pb, wb, jb)) = (job(a), job(b));
            wa.total_cmp(&wb).then(pb.total_cmp(&pa)).then(jb.cmp(&ja))
        });
        // (b): least value per second first (zero length: infinitely dense, last)
        let density = |at: u32| {
            let (p, w, _) = job(at);
            if p > 0.0 { w / p } else { f64::INFINITY }
        };
        let mut by_density: Vec<u32> = kept.to_vec();
        by_density.sort_by(|&a, &b| {
            density(a).total_cmp(&density(b)).then(job(b).0.total_cmp(&job(a).0)).then(job(b).2.cmp(&job(a).2))
        });
        let (mut covered, mut cost) = (0.0, 0.0);
        let mut several = Vec::new();
        for at in by_density {
            if covered >= excess {
                break;
            }
            covered += job(at).0;
            cost += job(at).1;
            several.push(at);
        }
        let mut out = match single {
            Some(at) if covered < excess || job(at).1 <= cost => vec![at],
            _ => several,
        };
        out.sort_unstable();
        out
    }

    /// Lengths for a machine with `row` (None: the estimates); taken jobs stay +inf.
    fn refill(&mut self, row: Option<&Row>) {
        for k in 0..self.p.len() {
            let e = self.e[k];
            self.p[k] = if e == f64::INFINITY {
                f64::INFINITY
            } else {
                match row {
                    None => e,
                    Some(r) => r
                        .get(self.cls[k] as usize)
                        .copied()
                        .flatten()
                        .map_or(f64::INFINITY, |s| s.p(e, self.t[k])),
                }
            };
        }
        self.row = row.cloned();
    }

    /// Marks the jobs at positions `at` taken; their indices in deadline order.
    fn finish(&mut self, mut at: Vec<u32>) -> Vec<usize> {
        at.sort_unstable();
        let kept: Vec<usize> = at.iter().map(|&i| self.j[i as usize] as usize).collect();
        for &i in &at {
            self.p[i as usize] = f64::INFINITY;
            self.e[i as usize] = f64::INFINITY;
        }
        self.alive -= at.len();
        self.at = at;
        if self.alive * 2 < self.p.len() {
            self.compact();
        }
        kept
    }

    /// Drops the taken jobs from the arrays, keeping the order.
    fn compact(&mut self) {
        let mut w = 0;
        for r in 0..self.p.len() {
            if self.e[r] != f64::INFINITY {
                self.p[w] = self.p[r];
                self.e[w] = self.e[r];
                self.t[w] = self.t[r];
                self.cls[w] = self.cls[r];
                self.d[w] = self.d[r];
                self.j[w] = self.j[r];
                if let Some(v) = self.w.as_mut() {
                    v[w] = v[r];
                }
                w += 1;
            }
        }
        self.p.truncate(w);
        self.e.truncate(w);
        self.t.truncate(w);
        self.cls.truncate(w);
        self.d.truncate(w);
        self.j.truncate(w);
        if let Some(v) = self.w.as_mut() {
            v.truncate(w);
        }
    }
}
