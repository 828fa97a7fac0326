//! EPDT bookkeeping of one device group: the estimated time its given prefill work is done.
//!
//! A group is the instances one worker steps one after another (co-located models on one
//! device); the dispatcher keeps one `Load` per group and charges it every job given to
//! any of the group's instances, so they all share one EPDT.
//!
//! Model: the group works through its jobs one after another in the order they were
//! given, at the estimated speed. Assigning a job of estimate `p` at `now` makes the
//! group busy until `max(now, busy_until) + p`; `complete` takes that job's work that
//! is still ahead of `now` out again (a job that finishes early pulls everything behind
//! it forward; one that overruns its estimate has nothing left to remove). So
//! `EPDT(now) = max(now, clock + outstanding)`: work given minus work done, where time
//! spent counts as work done in assignment order.
//!
//! Only the jobs whose estimate is not used up yet are kept, so time passing and the
//! usual in-order completion are O(1) amortised.

use std::collections::VecDeque;

#[derive(Debug, Clone, Default)]
pub(crate) struct Load {
    /// Time up to which elapsed time has been charged to the jobs.
    clock: f64,
    /// (request id, estimated work not yet elapsed), in assignment order, all `> 0`
    /// except possibly for zero-length jobs added since the last `advance`.
    ahead: VecDeque<(i64, f64)>,
    /// Sum of the `ahead` work.
    outstanding: f64,
}

impl Load {
    /// A group with nothing given yet.
    pub(crate) const IDLE: Load = Load {
        clock: 0.0,
        ahead: VecDeque::new(),
        outstanding: 0.0,
    };

    /// Estimated prefill done time of the work given so far, never before `now`.
    pub(crate) fn epdt(&self, now: f64) -> f64 {
        now.max(self.clock + self.outstanding)
    }

    /// When the given work is estimated done if nothing else changes; unlike [`epdt`]
    /// this does not move with time once the group is idle.
    ///
    /// [`epdt`]: Load::epdt
    pub(crate) fn busy_until(&self) -> f64 {
        self.clock + self.outstanding
    }

    /// Charges the time since the last event to the jobs, first given first. A `now`
    /// earlier than the clock (an out-of-order caller) changes nothing.
    fn advance(&mut self, now: f64) {
        if now <= self.clock {
            return;
        }
        let mut dt = now - self.clock;
        self.clock = now;
        while let Some(front) = self.ahead.front_mut() {
            if front.1 <= dt {
                dt -= front.1;
                self.ahead.pop_front();
            } else {
                front.1 -= dt;
                break;
            }
        }
        self.resum();
    }

    /// Recomputes the sum when the queue is short or empty, so float drift cannot build up.
    fn resum(&mut self) {
        if self.ahead.len() <= 64 {
            self.outstanding = self.ahead.iter().map(|j| j.1).sum();
        }
    }

    /// Ids of the jobs whose estimated work is not used up yet (assignment order).
    pub(crate) fn ids(&self) -> impl Iterator<Item = i64> + '_ {
        self.ahead.iter().map(|j| j.0)
    }

    /// Gives job `id` with estimated work `p` to the group at `now`.
    pub(crate) fn assign(&mut self, id: i64, p: f64, now: f64) {
        self.advance(now);
        if p > 0.0 {
            self.ahead.push_back((id, p));
            self.outstanding += p;
        }
    }

    /// Removes job `id`'s work still ahead (as of `now`, or of the last event when `now`
    /// is `None`, e.g. on cancel). Unknown ids (already elapsed) remove nothing.
    pub(crate) fn remove(&mut self, id: i64, now: Option<f64>) {
        if let Some(now) = now {
            self.advance(now);
        }
        if let Some(pos) = self.ahead.iter().position(|j| j.0 == id) {
            let (_, left) = self.ahead.remove(pos).unwrap_or((id, 0.0));
            self.outstanding = (self.outstanding - left).max(0.0);
            self.resum();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_given_minus_work_done() {
        let mut l = Load::default();
        assert_eq!(l.epdt(5.0), 5.0);
        l.assign(1, 0.1, 0.0);
        l.assign(2, 0.1, 0.0);
        assert!((l.epdt(0.0) - 0.2).abs() < 1e-12);
        assert!((l.epdt(0.05) - 0.2).abs() < 1e-12);
        // Job 1 finishes early: job 2 moves up by the 0.05 job 1 did not need.
        l.remove(1, Some(0.05));
        assert!((l.epdt(0.05) - 0.15).abs() < 1e-12);
        // Job 2 overruns: past its estimate EPDT is `now`, removing it changes nothing.
        assert_eq!(l.epdt(0.3), 0.3);
        l.remove(2, Some(0.3));
        assert_eq!(l.epdt(0.3), 0.3);
        // Assigning to an idle instance starts from `now`.
        l.assign(3, 0.5, 1.0);
        assert!((l.epdt(1.0) - 1.5).abs() < 1e-12);
    }

    #[test]
    fn completion_in_estimated_time_keeps_the_rest() {
        let mut l = Load::default();
        l.assign(1, 0.1, 0.0);
        l.assign(2, 0.1, 0.0);
        l.remove(1, Some(0.1));
        assert!((l.epdt(0.1) - 0.2).abs() < 1e-12);
        l.remove(2, None);
        assert_eq!(l.epdt(0.1), 0.1);
    }
}
