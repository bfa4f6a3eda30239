//! Threads for member I/O that blocks, and running a request's member
//! calls on them at once.
//!
//! Written here rather than taken from rayon (used before): rayon's idle
//! workers look for work with `sched_yield` in a loop before they sleep,
//! which suits computation. For hand-offs of blocking device I/O it did
//! not: at 32 requests in flight on two cores (RAID-5 with a journal, 4 KiB
//! random writes on direct-I/O loop devices) two thirds of the server's
//! context switches were those yields (`perf record -e context-switches`).
//! These workers sleep on a condition variable as soon as the queue is
//! empty. No crate we use offers a scoped pool of blocking workers.

use raidkit_member::Locked;
use std::any::Any;
use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A fixed set of worker threads taking jobs from one queue.
pub(crate) struct Pool {
    queue: Mutex<VecDeque<Job>>,
    ready: Condvar,
}

thread_local! {
    /// Set on a pool's worker threads: a job never waits for other jobs (a
    /// nested array's member calls run inline there), so the workers can
    /// never all be waiting for jobs queued behind them.
    static WORKER: Cell<bool> = const { Cell::new(false) };
}

/// The jobs of one `run` not yet finished, and the first panic among them.
struct Latch {
    left: Mutex<(usize, Option<Box<dyn Any + Send>>)>,
    done: Condvar,
}

impl Latch {
    fn finish(&self, panic: Option<Box<dyn Any + Send>>) {
        let mut l = self.left.locked();
        l.0 -= 1;
        if l.1.is_none() {
            l.1 = panic;
        }
        if l.0 == 0 {
            self.done.notify_all();
        }
    }

    fn wait(&self) -> Option<Box<dyn Any + Send>> {
        let mut l = self.left.locked();
        while l.0 > 0 {
            l = self
                .done
                .wait(l)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        l.1.take()
    }
}

/// Waits for a run's jobs when dropped, also while the caller unwinds: the
/// jobs borrow from the caller's frame.
struct WaitAll<'a>(&'a Latch);

impl Drop for WaitAll<'_> {
    fn drop(&mut self) {
        let panic = self.0.wait();
        if let Some(p) = panic {
            if !std::thread::panicking() {
                std::panic::resume_unwind(p);
            }
        }
    }
}

impl Pool {
    /// A pool of up to `threads` workers named `name-N`, started now (a
    /// process at its thread limit gets fewer, or None: its member calls
    /// then run one at a time on the caller).
    pub(crate) fn start(name: &str, threads: usize) -> Option<&'static Pool> {
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            queue: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
        }));
        let mut started = 0;
        for i in 0..threads {
            let spawned = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || pool.work());
            match spawned {
                Ok(_) => started += 1,
                Err(e) => {
                    tracing::warn!("{name}: {started} of {threads} threads started ({e})");
                    break;
                }
            }
        }
        (started > 0).then_some(pool)
    }

    fn work(&self) {
        WORKER.with(|w| w.set(true));
        loop {
            let job = {
                let mut q = self.queue.locked();
                loop {
                    if let Some(j) = q.pop_front() {
                        break j;
                    }
                    q = self
                        .ready
                        .wait(q)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
            };
            job();
        }
    }

    /// Whether the calling thread is one of a pool's workers.
    pub(crate) fn on_worker() -> bool {
        WORKER.with(Cell::get)
    }

    /// `f` on every item of `items` on the workers and on `last` on the
    /// calling thread, all at once; returns when every call has returned.
    /// A panic in any of them is raised again here, after all are done.
    pub(crate) fn run<T: Send>(&self, items: Vec<T>, last: T, f: &(dyn Fn(T) + Sync)) {
        let latch = Latch {
            left: Mutex::new((items.len(), None)),
            done: Condvar::new(),
        };
        let wait = WaitAll(&latch);
        // The caller waits for the jobs: they count as holding its stripe
        // locks (see `Core::holds_locks`).
        let held = &crate::core::locks_held();
        {
            let mut q = self.queue.locked();
            for item in items {
                let latch = &latch;
                let job: Box<dyn FnOnce() + Send + '_> = Box::new(move || {
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        crate::core::with_locks_held(held, || f(item))
                    }));
                    latch.finish(r.err());
                });
                // SAFETY: the job borrows `f`, `latch` and what the items
                // borrow, all of which outlive this call: `wait` does not
                // let it return (or unwind) before every job has finished
                // with them (`Latch::finish` is a job's last access).
                let job: Job = unsafe { std::mem::transmute(job) };
                q.push_back(job);
                self.ready.notify_one();
            }
        }
        f(last);
        drop(wait);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn every_item_runs_once_before_run_returns() {
        let pool = Pool::start("test-pool", 3).expect("threads");
        let seen: Vec<AtomicUsize> = (0..50).map(|_| AtomicUsize::new(0)).collect();
        let f = |i: usize| {
            std::thread::sleep(std::time::Duration::from_micros(200));
            seen[i].fetch_add(1, Ordering::Relaxed);
        };
        pool.run((0..49).collect(), 49, &f);
        assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn a_panicking_job_is_raised_in_the_caller_after_the_others_finish() {
        let pool = Pool::start("test-pool", 2).expect("threads");
        let finished = AtomicUsize::new(0);
        let f = |i: usize| {
            if i == 0 {
                panic!("job 0");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            finished.fetch_add(1, Ordering::Relaxed);
        };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(vec![0, 1, 2], 3, &f)
        }));
        assert!(r.is_err());
        assert_eq!(finished.load(Ordering::Relaxed), 3);
        // The workers survived it.
        let again = AtomicUsize::new(0);
        pool.run(vec![1, 2], 3, &|_| {
            again.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(again.load(Ordering::Relaxed), 3);
    }
}
