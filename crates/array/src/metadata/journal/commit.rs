//! Group commit: concurrent writers' records made durable together.

use super::Journal;
use raidkit_member::Locked;
use std::collections::HashMap;

/// A record (or several, contiguous in the log) waiting to be made durable.
#[derive(Debug)]
pub struct Pending {
    ticket: u64,
    /// Offset in the log.
    pub at: u64,
    pub rec: Vec<u8>,
    /// The stripe it belongs to, and its array data offset (for errors).
    pub stripe: u64,
    pub dev: u64,
    /// The writer waiting for it.
    waiter: std::thread::Thread,
}

/// Group commit: records queued by concurrent writers, written by whichever
/// of them finds no write in progress, all at once.
#[derive(Debug, Default)]
pub(super) struct Commits {
    queue: Vec<Pending>,
    /// A group commit is being written.
    leading: bool,
    next: u64,
    /// Outcomes of tickets written and not yet picked up by their writers.
    done: HashMap<u64, Result<(), String>>,
}

/// The writer leading a group commit: publishes the outcome to every writer
/// of its batch and steps down, also when the write panics (the others
/// would wait for ever).
struct Lead<'a> {
    journal: &'a Journal,
    tickets: Vec<u64>,
    waiters: Vec<std::thread::Thread>,
    outcome: Option<Result<(), String>>,
}

impl Drop for Lead<'_> {
    /// Only the writers of the batch are woken, and the first writer
    /// queued since, to lead the next one: a wake-up of every waiting
    /// writer at each commit cost several context switches per request
    /// (each went back to sleep until its own batch was written).
    fn drop(&mut self) {
        let outcome = self
            .outcome
            .take()
            .unwrap_or_else(|| Err("the journal write did not finish".into()));
        let mut c = self.journal.commits.locked();
        for t in &self.tickets {
            c.done.insert(*t, outcome.clone());
        }
        c.leading = false;
        let next = c.queue.first().map(|p| p.waiter.clone());
        drop(c);
        self.waiters.iter().chain(&next).for_each(|t| t.unpark());
    }
}

impl Journal {
    /// Make `rec` (at `at` in the log) durable, together with the records
    /// other writers queue meanwhile: on a disk each durable write is a
    /// cache flush or a FUA, which costs the same for one record as for
    /// thirty, so concurrent updates share one (group commit, as a file
    /// system's journal does). The first writer to find no write in
    /// progress takes every record queued and hands them to `write`; the
    /// others wait for its outcome.
    pub fn commit(
        &self,
        at: u64,
        stripe: u64,
        dev: u64,
        rec: Vec<u8>,
        write: impl FnOnce(&mut Vec<Pending>) -> Result<(), String>,
    ) -> Result<(), String> {
        let mut c = self.commits.locked();
        let ticket = c.next;
        c.next += 1;
        c.queue.push(Pending {
            ticket,
            at,
            rec,
            stripe,
            dev,
            waiter: std::thread::current(),
        });
        let mut write = Some(write);
        loop {
            if let Some(outcome) = c.done.remove(&ticket) {
                return outcome;
            }
            if !c.leading {
                // No write in progress, so ours is still queued (a leader
                // publishes every outcome before it steps down).
                c.leading = true;
                let mut batch = std::mem::take(&mut c.queue);
                drop(c);
                let me = std::thread::current().id();
                let mut lead = Lead {
                    journal: self,
                    tickets: batch.iter().map(|p| p.ticket).collect(),
                    waiters: batch
                        .iter()
                        .filter(|p| p.waiter.id() != me)
                        .map(|p| p.waiter.clone())
                        .collect(),
                    outcome: None,
                };
                let write = write.take().expect("a writer leads once");
                lead.outcome = Some(write(&mut batch));
                drop(lead);
                c = self.commits.locked();
                continue;
            }
            // Woken by the leader of the batch that holds our record, or
            // to lead the next one; a spurious wake-up goes round again.
            drop(c);
            std::thread::park();
            c = self.commits.locked();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Runs `f` on its own thread; panics if it has not returned within
    /// a minute (a writer never woken would wait for ever).
    fn within_a_minute<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(60))
            .expect("a writer was never woken")
    }

    #[test]
    fn group_commit_writes_every_record_once_and_wakes_every_writer() {
        use std::sync::Arc;
        let j = Arc::new(Journal::new(0, 64 << 20, 4, 0));
        let written = Arc::new(Mutex::new(Vec::new()));
        let batches = Arc::new(Mutex::new(Vec::new()));
        let (threads, each) = (16u64, 40u64);
        let (j2, w2, b2) = (j.clone(), written.clone(), batches.clone());
        let outcomes = within_a_minute(move || {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (j, w, b) = (j2.clone(), w2.clone(), b2.clone());
                    std::thread::spawn(move || {
                        (0..each)
                            .map(|i| {
                                let at = (t * each + i) * 4096;
                                j.commit(at, 0, 0, vec![t as u8; 16], |batch| {
                                    // A write that takes a while, as a
                                    // durable one does: others queue meanwhile.
                                    std::thread::sleep(std::time::Duration::from_micros(300));
                                    w.lock().unwrap().extend(batch.iter().map(|p| p.at));
                                    b.lock().unwrap().push(batch.len());
                                    Ok(())
                                })
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        assert_eq!(outcomes.len() as u64, threads * each);
        assert!(outcomes.iter().all(|o| o.is_ok()));
        let mut w = written.lock().unwrap().clone();
        w.sort_unstable();
        let want: Vec<u64> = (0..threads * each).map(|x| x * 4096).collect();
        assert_eq!(w, want, "every record written, once");
        let b = batches.lock().unwrap();
        assert!(
            b.iter().any(|&n| n > 1),
            "concurrent records share a write: {b:?}"
        );
    }

    #[test]
    fn a_commit_that_panics_fails_its_batch_and_the_next_goes_on() {
        use std::sync::Arc;
        let j = Arc::new(Journal::new(0, 64 << 20, 4, 0));
        let outcomes = within_a_minute(move || {
            let (go, wait) = std::sync::mpsc::channel::<()>();
            // The first writer leads and holds its write until the others
            // have queued behind it.
            let first = {
                let j = j.clone();
                std::thread::spawn(move || {
                    j.commit(0, 0, 0, vec![0; 16], move |_| {
                        wait.recv().unwrap();
                        Ok(())
                    })
                })
            };
            std::thread::sleep(std::time::Duration::from_millis(50));
            let others: Vec<_> = (1..4u64)
                .map(|i| {
                    let j = j.clone();
                    std::thread::spawn(move || {
                        j.commit(i * 4096, 0, 0, vec![0; 16], |_| -> Result<(), String> {
                            panic!("the write of batch two panics")
                        })
                    })
                })
                .collect();
            std::thread::sleep(std::time::Duration::from_millis(200));
            go.send(()).unwrap();
            let first = first.join().unwrap();
            let others: Vec<_> = others.into_iter().map(|h| h.join()).collect();
            // Afterwards the journal still commits.
            let after = j.commit(1 << 20, 0, 0, vec![0; 16], |_| Ok(()));
            (first, others, after)
        });
        let (first, others, after) = outcomes;
        assert_eq!(first, Ok(()));
        // Each of the others either led a write that panicked, or was in
        // such a batch and is told its record was not written.
        for o in &others {
            match o {
                Err(_) => {}
                Ok(r) => assert!(r.is_err(), "a record of a panicked write reported written"),
            }
        }
        assert!(
            others.iter().any(|o| o.is_err()),
            "some writer led and panicked"
        );
        assert_eq!(after, Ok(()));
    }
}
