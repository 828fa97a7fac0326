//! A simulated device's step history as segments of equal steps, and the exact per-token
//! SLO count of a request that lived through them (python/janusd/sim/worker.py).
//!
//! Segment j covers device steps `start[j] .. start[j+1]` (the last: open), each `dt[j]`
//! seconds long, from time `t0[j]`: step s ends at `t0[j] + (s - start[j] + 1) * dt[j]`.
//! A request whose first token is step `first` gets token k (1-based) at the end of step
//! `first + k - 1`, and token k is on time iff its time <= arrival + TTFT + (k - 1) TPOT
//! (+ 1 ns, trace/slo.py's EPS_S). Within one segment the token time is linear in k, so
//! the on-time tokens of a segment are counted in closed form.
//!
//! The arithmetic is the Python worker's, operation for operation (same IEEE double
//! operations in the same order, no fused multiply-add), so a run gives the same figures
//! with either.

/// trace/slo.py's EPS_S.
pub const EPS_S: f64 = 1e-9;

/// On-time count and the first and last token times (seconds after arrival).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tally {
    pub on_time: i64,
    pub first_s: f64,
    pub last_s: f64,
}

/// The segments of one device, oldest first.
#[derive(Clone, Debug, Default)]
pub struct SegmentLog {
    start: Vec<i64>,
    t0: Vec<f64>,
    dt: Vec<f64>,
}

impl SegmentLog {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.start.len()
    }

    pub fn is_empty(&self) -> bool {
        self.start.is_empty()
    }

    /// A new segment from step `start` at time `t0`, steps of `dt` seconds. Steps must not
    /// go backwards (a caller mistake: Err).
    pub fn push(&mut self, start: i64, t0: f64, dt: f64) -> Result<(), String> {
        if let Some(&last) = self.start.last() {
            if start < last {
                return Err(format!("segment start {start} before the last one's {last}"));
            }
        }
        self.start.push(start);
        self.t0.push(t0);
        self.dt.push(dt);
        Ok(())
    }

    /// Forget the segments wholly before `oldest` (the first step of the oldest request
    /// still running): keeps the segment that contains it.
    pub fn trim(&mut self, oldest: i64) {
        let i = self.start.partition_point(|&s| s <= oldest).saturating_sub(1);
        self.start.drain(..i);
        self.t0.drain(..i);
        self.dt.drain(..i);
    }

    /// The segment index holding step `s` (the last one starting at or before it).
    fn find(&self, s: i64, lo: usize) -> Result<usize, String> {
        let p = lo + self.start[lo..].partition_point(|&x| x <= s);
        if p == 0 {
            return Err(format!("step {s} is before the kept history"));
        }
        Ok(p - 1)
    }

    /// The tally of a request with tokens at steps first .. first + n_out - 1, or (with
    /// `times`) also every token's time after arrival.
    pub fn tally(&self, first: i64, n_out: i64, arrival: f64, ttft: f64, tpot: f64,
                 mut times: Option<&mut Vec<f64>>) -> Result<Tally, String> {
        if n_out < 1 {
            return Err(format!("a request has at least one token, got {n_out}"));
        }
        if self.is_empty() {
            return Err("no segments".into());
        }
        let last = first + n_out - 1;
        let j0 = self.find(first, 0)?;
        let j1 = self.find(last, j0)?;
        let d0 = arrival + ttft - tpot + EPS_S; // deadline of token k: d0 + k * tpot
        let mut on_time: i64 = 0;
        let (mut t_first, mut t_last) = (0.0_f64, 0.0_f64);
        for j in j0..=j1 {
            let a = if j == j0 { first } else { self.start[j] };
            let b = if j == j1 { last } else { self.start[j + 1] - 1 };
            if a > b {
                continue;
            }
            let dt = self.dt[j];
            let c = self.t0[j] + ((first - self.start[j]) as f64) * dt; // token k at c + k dt
            let (ka, kb) = (a - first + 1, b - first + 1);
            if ka == 1 {
                t_first = c + dt;
            }
            t_last = c + (kb as f64) * dt;
            let slope = dt - tpot;
            let room = d0 - c; // on time iff k * slope <= room
            let n = if slope > 0.0 {
                (kb as f64).min((room / slope).floor()) - ka as f64 + 1.0
            } else if slope < 0.0 {
                kb as f64 - (ka as f64).max((room / slope).ceil()) + 1.0
            } else if room >= 0.0 {
                (kb - ka + 1) as f64
            } else {
                0.0
            };
            if n > 0.0 {
                on_time += n as i64;
            }
            if let Some(v) = times.as_deref_mut() {
                v.extend((ka..=kb).map(|k| c + (k as f64) * dt - arrival));
            }
        }
        Ok(Tally { on_time, first_s: t_first - arrival, last_s: t_last - arrival })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Token by token, the definition (module doc).
    fn brute(log: &SegmentLog, first: i64, n_out: i64, arrival: f64, ttft: f64, tpot: f64) -> (i64, Vec<f64>) {
        let mut on = 0;
        let mut times = Vec::new();
        for k in 1..=n_out {
            let s = first + k - 1;
            let j = log.find(s, 0).unwrap();
            let c = log.t0[j] + ((first - log.start[j]) as f64) * log.dt[j];
            let t = c + (k as f64) * log.dt[j];
            times.push(t - arrival);
            if t <= arrival + ttft - tpot + EPS_S + (k as f64) * tpot {
                on += 1;
            }
        }
        (on, times)
    }

    fn log_of(segs: &[(i64, f64)]) -> SegmentLog {
        let mut log = SegmentLog::new();
        let (mut s, mut t) = (0_i64, 0.0_f64);
        for &(steps, dt) in segs {
            log.push(s, t, dt).unwrap();
            s += steps;
            t += steps as f64 * dt;
        }
        log
    }

    #[test]
    fn counts_like_the_definition() {
        let log = log_of(&[(3, 0.02), (5, 0.05), (1, 0.2), (10, 0.01), (4, 0.06), (100, 0.03)]);
        for first in 0..20 {
            for n_out in 1..40 {
                for &(ttft, tpot) in &[(0.05, 0.03), (0.3, 0.02), (0.01, 0.05), (1.0, 0.01), (0.2, 0.04)] {
                    let mut times = Vec::new();
                    let got = log.tally(first, n_out, 0.0, ttft, tpot, Some(&mut times)).unwrap();
                    let (on, want) = brute(&log, first, n_out, 0.0, ttft, tpot);
                    // the closed form may differ from the brute test only on a token
                    // within float rounding of its deadline; these cases have none
                    assert_eq!(got.on_time, on, "first {first} n {n_out} ttft {ttft} tpot {tpot}");
                    assert_eq!(times, want);
                    assert_eq!(got.first_s, want[0]);
                    assert_eq!(got.last_s, *want.last().unwrap());
                }
            }
        }
    }

    #[test]
    fn trim_keeps_the_segment_holding_the_oldest_step() {
        let mut log = log_of(&[(3, 0.02), (5, 0.05), (1, 0.2), (10, 0.01)]);
        let before = log.tally(4, 6, 0.0, 0.3, 0.05, None).unwrap();
        log.trim(4);
        assert_eq!(log.len(), 3);
        assert_eq!(log.tally(4, 6, 0.0, 0.3, 0.05, None).unwrap(), before);
        assert!(log.tally(1, 2, 0.0, 0.3, 0.05, None).is_err());
    }

    #[test]
    fn bad_input_is_an_error() {
        let mut log = SegmentLog::new();
        assert!(log.tally(0, 1, 0.0, 1.0, 1.0, None).is_err());
        log.push(5, 1.0, 0.1).unwrap();
        assert!(log.push(4, 2.0, 0.1).is_err());
        assert!(log.tally(5, 0, 0.0, 1.0, 1.0, None).is_err());
    }
}
