//! A few persistent threads that help with one product: a product of a decode step takes
//! 20-200 us, so spawning threads per call (tens of us each) would eat the gain.
//!
//! One job at a time, and no worker is ever waited for before it has joined: the caller
//! publishes the job (a generation bump), works on it itself, then closes it; a worker that
//! wakes up after the close skips it. The work inside a job is shared dynamically (the
//! product hands out row chunks from an atomic counter, `for_chunks`), so on a shared
//! machine where a worker's core is taken by another process the product costs at most
//! one thread's time plus one chunk, not a stall until the worker is scheduled again (with
//! fixed halves, 2 threads ran 120 products in ~64 ms against ~10 ms on 1 under load).
//! Idle workers spin briefly (the next product of a step follows within microseconds) and
//! then sleep on a condition variable, so an idle engine costs no cpu. A caller that finds
//! the pool busy (another thread's product), or that runs in a forked child of the process
//! that started the workers, does all the work itself.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub const MAX_THREADS: usize = 16;
const SPIN: Duration = Duration::from_micros(200);
// `state`: the job's generation above bit 16, CLOSED, and how many workers are inside it
const CLOSED: u64 = 1 << 15;
const INSIDE: u64 = CLOSED - 1;

type Job<'a> = dyn Fn() + Sync + 'a;

struct Shared {
    generation: AtomicU64,
    state: AtomicU64,
    // the current job as a raw fat pointer, its generation and how many workers may join;
    // dereferenced only by a worker that joined (state) before the caller closed the job
    job: Mutex<(usize, usize, u64, usize)>,
    wake: Condvar,
    busy: Mutex<()>,
    spawned: AtomicUsize, // workers started (lazily: as many as the largest job asked for)
    pid: u32,             // the process that started them: a fork's child has none of them
}

static POOL: OnceLock<&'static Shared> = OnceLock::new();

fn pool() -> &'static Shared {
    POOL.get_or_init(|| {
        let s: &'static Shared = Box::leak(Box::new(Shared {
            generation: AtomicU64::new(0),
            state: AtomicU64::new(CLOSED),
            job: Mutex::new((0, 0, 0, 0)),
            wake: Condvar::new(),
            busy: Mutex::new(()),
            spawned: AtomicUsize::new(0),
            pid: std::process::id(),
        }));
        s
    })
}

/// Workers 1 .. parts - 1 exist (called holding `busy`); false when one could not start.
fn ensure_workers(s: &'static Shared, parts: usize) -> bool {
    while s.spawned.load(Ordering::Acquire) + 1 < parts {
        let idx = s.spawned.load(Ordering::Acquire) + 1;
        let ok = std::thread::Builder::new().name(format!("janus-quant-{idx}")).spawn(move || worker(s, idx));
        if ok.is_err() {
            return false;
        }
        s.spawned.fetch_add(1, Ordering::AcqRel);
    }
    true
}

/// Enters job `gen` unless the caller closed it (or a newer one replaced it).
fn join(s: &Shared, gen: u64) -> bool {
    let mut st = s.state.load(Ordering::Acquire);
    loop {
        if st >> 16 != gen || st & CLOSED != 0 {
            return false;
        }
        match s.state.compare_exchange_weak(st, st + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(now) => st = now,
        }
    }
}

fn worker(s: &'static Shared, idx: usize) {
    let mut seen = 0u64;
    loop {
        let start = Instant::now();
        while s.generation.load(Ordering::Acquire) == seen && start.elapsed() < SPIN {
            std::hint::spin_loop();
        }
        let mut g = s.job.lock().unwrap_or_else(|e| e.into_inner());
        while s.generation.load(Ordering::Acquire) == seen {
            g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        let (lo, hi, gen, parts) = *g;
        drop(g);
        seen = gen;
        if idx < parts && join(s, gen) {
            // SAFETY: the caller of run() keeps the job alive until every joined worker left
            let job: &Job<'_> = unsafe { std::mem::transmute::<(usize, usize), &Job<'_>>((lo, hi)) };
            job();
            s.state.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Runs `job` on the calling thread and on up to `parts - 1` workers that wake up in time
/// (each call of `job` takes work from a shared counter until none is left); returns when
/// the caller's call and every worker's that joined are done.
pub(super) fn run(parts: usize, job: &Job<'_>) {
    let parts = parts.min(MAX_THREADS);
    let s = pool();
    let Ok(_guard) = s.busy.try_lock() else {
        return job();
    };
    // a forked child: the workers counted in `spawned` exist only in the parent
    if parts < 2 || s.pid != std::process::id() || !ensure_workers(s, parts) {
        return job();
    }
    // SAFETY: a fat reference is two words; it is read back only by workers that joined
    // before the close below, and this call waits for them
    let (lo, hi) = unsafe { std::mem::transmute::<&Job<'_>, (usize, usize)>(job) };
    let gen = s.generation.load(Ordering::Acquire) + 1;
    {
        let mut g = s.job.lock().unwrap_or_else(|e| e.into_inner());
        *g = (lo, hi, gen, parts);
        s.state.store(gen << 16, Ordering::Release);
        s.generation.store(gen, Ordering::Release);
    }
    s.wake.notify_all();
    job();
    s.state.fetch_or(CLOSED, Ordering::AcqRel);
    let start = Instant::now();
    while s.state.load(Ordering::Acquire) & INSIDE != 0 {
        if start.elapsed() < SPIN {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// Rows [0, n) in chunks of `chunk`, handed out one at a time to the caller and the
/// workers that join (`run`): body(r0, r1) once per chunk.
pub(super) fn for_chunks(threads: usize, n: usize, chunk: usize, body: &(dyn Fn(usize, usize) + Sync)) {
    let chunk = chunk.max(1);
    let parts = threads.clamp(1, MAX_THREADS).min(n.div_ceil(chunk)).max(1);
    let next = AtomicUsize::new(0);
    let job = || loop {
        let r0 = next.fetch_add(1, Ordering::Relaxed) * chunk;
        if r0 >= n {
            return;
        }
        body(r0, (r0 + chunk).min(n));
    };
    if parts == 1 {
        return body(0, n);
    }
    run(parts, &job);
}
