//! Rebuilding a member of a parity level through a pipeline: a reader
//! thread per source member reading ahead, each step's contents solved
//! from the others, a writer thread for the member being built.

use super::parity::{parity_of, solve};
use crate::background::{windows, Process};
use crate::core::checked::is_mismatch;
use crate::core::{Disk, View};
use crate::engine::Array;
use crate::error::{Error, Result};
use crate::metadata::checksums::BLOCK;
use crate::recovery::{Job, Outcome};
use raidkit_member::MemberError;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// How a pipeline run ended.
enum Run {
    Finished,
    /// The members changed under it: run again from the cursor.
    Again,
    Stopped(String),
    /// A member to rebuild with it came (`Job::joiner`).
    Regroup(String),
}

impl Array {
    /// The other members a job reads from: every in-sync member but the
    /// one being built; when replacing, the member being replaced too.
    fn sources_for(&self, job: &Job, v: &View) -> Vec<Option<Arc<Disk>>> {
        (0..v.roles.len())
            .map(|r| {
                if job.targets().any(|t| t.role == r) && !job.replace {
                    return None;
                }
                let rv = &v.roles[r];
                match (&rv.disk, &rv.sync) {
                    (Some(d), None) => Some(d.clone()),
                    _ => None,
                }
            })
            .collect()
    }

    /// Parity levels: rebuild through a pipeline until done. Restarted
    /// (from the cursor) whenever the set of source members changes.
    pub(crate) fn parity_pipeline(
        &self,
        job: &Job,
        total: u64,
        process: &mut Process,
    ) -> Result<Outcome> {
        let chunk = self.core.geom().chunk;
        let stripes = total / chunk;
        // Steps of about 1 MiB per member, smaller under a low speed
        // limit (`paced_step`).
        let per_member = self
            .paced_step()
            .map_or(1 << 20, |b| b.clamp(64 << 10, 1 << 20));
        let step = (per_member / chunk).max(1);
        loop {
            if let Some(end) = self.interrupted(job, process)? {
                return Ok(end);
            }
            let from = job
                .targets()
                .map(|t| t.sync.cursor.load(Ordering::Acquire))
                .min()
                .unwrap_or(0)
                / chunk;
            let dirty = |x: u64| {
                job.sync
                    .dirty
                    .as_ref()
                    .is_none_or(|d| d.overlaps(x * chunk, (x + 1) * chunk))
            };
            let steps: Vec<(u64, u64)> = windows(from, stripes, step, dirty).collect();
            let sources = self.sources_for(job, &self.core.view.load());
            match self.run_pipeline(job, &sources, &steps, process)? {
                Run::Finished => {
                    for t in job.targets() {
                        t.sync.cursor.store(total, Ordering::Release);
                    }
                    return Ok(Outcome::Done);
                }
                Run::Again => continue,
                Run::Stopped(why) => {
                    self.checkpoint(job)?;
                    return Ok(Outcome::Stopped(why));
                }
                Run::Regroup(why) => {
                    self.checkpoint(job)?;
                    return Ok(Outcome::Regroup(why));
                }
            }
        }
    }

    /// One pipeline run over `steps` (stripe ranges): a reader thread per
    /// source member reading ahead, the contents solved on this thread, a
    /// writer thread for the member being built; every disk kept busy.
    /// Each step's stripes are locked from before its reads until its
    /// write is done, at most `DEPTH` steps at a time, so clients keep
    /// reading and writing everywhere else.
    fn run_pipeline(
        &self,
        job: &Job,
        sources: &[Option<Arc<Disk>>],
        steps: &[(u64, u64)],
        process: &mut Process,
    ) -> Result<Run> {
        const DEPTH: usize = 8;
        let chunk = self.core.geom().chunk;
        let targets: Vec<&Job> = job.targets().collect();
        // Where each member already is: a partner further on than the pass
        // keeps what it has below its position (rebuilt, and written by
        // clients since), and is written only from there.
        let starts: Vec<u64> = targets
            .iter()
            .map(|t| t.sync.cursor.load(Ordering::Acquire))
            .collect();
        let all_current = |v: &View| targets.iter().all(|t| t.current(v));
        let same_sources = |v: &View| {
            self.sources_for(job, v)
                .iter()
                .zip(sources)
                .all(|(a, b)| match (a, b) {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    (None, None) => true,
                    _ => false,
                })
        };
        let mut read_failed: Vec<(usize, String)> = Vec::new();
        let mut write_failed = None;
        let mut solve_failed = None;
        let mut run = Run::Finished;
        // A process at its thread limit defers the rebuild (the recovery
        // loop tries again) instead of panicking with stripes locked.
        let mut spawn_failed = None;
        std::thread::scope(|sc| {
            let mut cmds = Vec::new();
            let mut results = Vec::new();
            for src in sources {
                let Some(d) = src else {
                    cmds.push(None);
                    results.push(None);
                    continue;
                };
                let (ctx, crx) = std::sync::mpsc::sync_channel::<(u64, u64)>(DEPTH);
                let (rtx, rrx) = std::sync::mpsc::sync_channel(DEPTH);
                let spawned = std::thread::Builder::new().spawn_scoped(sc, move || {
                    // It reads only steps the rebuild has locked, and the
                    // rebuild waits for it: counted as holding them.
                    let me = [&self.core as *const crate::core::Core as usize];
                    crate::core::with_locks_held(&me, || {
                        for (a, b) in crx {
                            let mut buf = vec![0u8; ((b - a) * chunk) as usize];
                            let r = self
                                .read_source(d, &mut buf, a * chunk)
                                .map(|bad| (buf, bad))
                                .map_err(|e| e.to_string());
                            let failed = r.is_err();
                            if rtx.send(r).is_err() || failed {
                                return;
                            }
                        }
                    })
                });
                if let Err(e) = spawned {
                    spawn_failed = Some(e);
                    return;
                }
                cmds.push(Some(ctx));
                results.push(Some(rrx));
            }
            // A writer thread per member being built. Each answers every
            // step it is sent, in order (a step is done once every writer
            // has answered it); after a failed write it writes no more and
            // answers the rest as failed too.
            let (ack_tx, ack_rx) = std::sync::mpsc::channel();
            let mut wtxs = Vec::new();
            for (k, &tj) in targets.iter().enumerate() {
                let (wtx, wrx) =
                    std::sync::mpsc::sync_channel::<(usize, u64, Vec<u8>, Vec<u64>)>(2);
                let ack_tx = ack_tx.clone();
                let from = starts[k];
                let spawned = std::thread::Builder::new().spawn_scoped(sc, move || {
                    let t = &tj.target;
                    let mut failed = false;
                    for (i, a, out, lost) in wrx {
                        let dev = a * chunk;
                        let end = dev + out.len() as u64;
                        // A member failed meanwhile (a timeout, say) is
                        // written no more: each write to a stalled disk
                        // takes as long.
                        let r = if failed || !tj.current(&self.core.view.load()) {
                            Err(raidkit_member::MemberError::new(
                                t.name(),
                                raidkit_member::Op::Write,
                                dev,
                                out.len() as u64,
                                std::io::Error::other("left the array before this write"),
                            ))
                        } else if end <= from {
                            Ok(())
                        } else {
                            let skip = from.saturating_sub(dev);
                            let lost: Vec<u64> = lost
                                .into_iter()
                                .filter(|&o| o >= skip)
                                .map(|o| o - skip)
                                .collect();
                            self.core
                                .disk_write(t, &out[skip as usize..], dev + skip)
                                .and_then(|()| self.mark_lost(tj, dev + skip, &lost))
                        };
                        failed |= r.is_err();
                        if ack_tx.send((i, k, r)).is_err() {
                            return;
                        }
                    }
                });
                if let Err(e) = spawned {
                    spawn_failed = Some(e);
                    return;
                }
                wtxs.push(wtx);
            }
            drop(ack_tx);
            let mut answers: std::collections::VecDeque<usize> = std::collections::VecDeque::new();
            let mut guards = std::collections::VecDeque::new();
            let (mut issued, mut solved, mut sent, mut acked) = (0, 0, 0, 0);
            let mut halt = false;
            loop {
                // Throttled: rest with no step in flight, so with no
                // stripe locked; a client's degraded read of a stripe
                // waits for one step's reads and writes, never for a
                // sleep (it waited seconds when the pipeline slept on
                // what it had locked ahead).
                if !halt && issued == acked && issued < steps.len() && process.owes() {
                    process.settle();
                    if process.stopped() {
                        halt = true;
                        run = Run::Stopped("the array was stopped".into());
                    }
                }
                while !halt && issued < steps.len() && issued - acked < DEPTH && !process.owes() {
                    let (a, b) = steps[issued];
                    let g = self.core.lock_range(a, b);
                    let v = self.core.view.load();
                    if !all_current(&v) || !same_sources(&v) {
                        halt = true;
                        run = Run::Again;
                        break;
                    }
                    if let Some(d) = job.joiner(&v) {
                        // One pass for both from here: the rest of this
                        // member's rebuild is read together with the
                        // newcomer's, instead of a second pass after it.
                        halt = true;
                        run = Run::Regroup(format!("{} joins this rebuild", d.name()));
                        break;
                    }
                    guards.push_back(g);
                    for c in cmds.iter().flatten() {
                        let _ = c.send((a, b));
                    }
                    // Paced as it is started: the throttle decides what
                    // is locked and read, not only when progress is told.
                    process.owe((b - a) * chunk);
                    issued += 1;
                }
                if !halt && solved < issued {
                    let (a, b) = steps[solved];
                    let mut bufs = Vec::with_capacity(results.len());
                    let mut bads = vec![Vec::new(); results.len()];
                    for (r, rx) in results.iter().enumerate() {
                        match rx.as_ref().map(|rx| rx.recv()) {
                            None => bufs.push(None),
                            Some(Ok(Ok((buf, bad)))) => {
                                bufs.push(Some(buf));
                                bads[r] = bad;
                            }
                            Some(Ok(Err(e))) => read_failed.push((r, e)),
                            Some(Err(_)) => read_failed.push((r, "reader stopped".into())),
                        }
                    }
                    if !read_failed.is_empty() {
                        halt = true;
                        run = Run::Again;
                    } else {
                        match self.solve_step(job, &bufs, &bads, a, b) {
                            Ok((outs, lost)) => {
                                let all = wtxs
                                    .iter()
                                    .zip(outs)
                                    .all(|(w, out)| w.send((solved, a, out, lost.clone())).is_ok());
                                if all {
                                    sent += 1;
                                    answers.push_back(0);
                                } else {
                                    halt = true;
                                }
                            }
                            Err(e) => {
                                solve_failed = Some(e);
                                halt = true;
                            }
                        }
                        solved += 1;
                    }
                }
                // Halted: steps issued but not solved are abandoned; only
                // the writes already sent are waited for.
                let all_solved = halt || (solved == issued && issued == steps.len());
                if acked == sent && all_solved {
                    break;
                }
                // Take every finished write (waiting for one when there is
                // nothing else to do), so that reads are issued far ahead.
                let mut wait = all_solved || solved == issued;
                loop {
                    // Steps held back by the throttle alone are started
                    // as soon as it allows, even with others in flight:
                    // a member slower than the limit is kept busy.
                    let held_back = !halt && issued < steps.len() && issued - acked < DEPTH;
                    let owed = process.owed().filter(|_| held_back && wait);
                    // Err(true): the writers have stopped (a write
                    // failed): what they had not taken is never written,
                    // and no answer comes for it. Err(false): nothing
                    // more for now, or the throttle lets more steps start.
                    let got = if let Some(owed) = owed {
                        ack_rx
                            .recv_timeout(owed)
                            .map_err(|e| e == std::sync::mpsc::RecvTimeoutError::Disconnected)
                    } else if wait {
                        ack_rx.recv().map_err(|_| true)
                    } else {
                        ack_rx.try_recv().map_err(|_| false)
                    };
                    let ack = match got {
                        Ok(x) => x,
                        Err(gone) => {
                            if gone {
                                halt = true;
                                sent = acked;
                            }
                            break;
                        }
                    };
                    wait = false;
                    let (i, k, r) = ack;
                    if let Err(e) = r {
                        if write_failed.is_none() {
                            write_failed = Some((k, e));
                        }
                        halt = true;
                    }
                    // (A step not every writer took, as its thread had
                    // ended, was never counted as sent: its answers are
                    // left aside.)
                    if let Some(n) = answers.get_mut(i - acked) {
                        *n += 1;
                    }
                    // Steps end in order: each writer answers in order.
                    if answers.front().is_none_or(|&n| n < targets.len()) {
                        continue;
                    }
                    answers.pop_front();
                    acked += 1;
                    guards.pop_front();
                    if write_failed.is_some() {
                        continue;
                    }
                    let (a, b) = steps[i];
                    for t in &targets {
                        t.sync.cursor.fetch_max(b * chunk, Ordering::AcqRel);
                    }
                    let bytes = (b - a) * chunk;
                    if process.checkpoint_due() {
                        if let Err(e) = self.checkpoint(job) {
                            solve_failed = Some(e);
                            halt = true;
                        }
                    }
                    process.progress(bytes);
                    if !halt && process.stopped() {
                        halt = true;
                        run = Run::Stopped("the array was stopped".into());
                    }
                }
                if halt && acked == sent && solved == issued {
                    break;
                }
            }
            drop(cmds);
            drop(results);
            drop(wtxs);
            drop(guards);
        });
        if let Some(e) = spawn_failed {
            return Err(Error::Invalid(format!(
                "cannot start the rebuild's threads ({e}); trying again later"
            )));
        }
        if let Some(e) = solve_failed {
            return Err(e);
        }
        if let Some((k, e)) = write_failed {
            self.core
                .fail_disk_by_ptr(&targets[k].target, &e.to_string());
            return Ok(Run::Again);
        }
        if !read_failed.is_empty() {
            for (r, e) in read_failed {
                if let Some(d) = &sources[r] {
                    self.core.fail_disk_by_ptr(d, &e);
                }
            }
            self.core.ensure_alive(0)?;
            return Ok(Run::Again);
        }
        Ok(run)
    }

    /// Read a source's range for the pipeline. A block that disagrees
    /// with its checksum is a bad block, not a bad member: the range is
    /// read again block by block and the offsets (in `buf`) of the bad
    /// ones returned, to be rebuilt around.
    fn read_source(
        &self,
        d: &Disk,
        buf: &mut [u8],
        dev: u64,
    ) -> std::result::Result<Vec<u64>, MemberError> {
        match self.core.disk_read(d, buf, dev) {
            Err(e) if is_mismatch(&e) => {}
            r => return r.map(|()| Vec::new()),
        }
        let mut bad = Vec::new();
        for (k, blk) in buf.chunks_mut(BLOCK as usize).enumerate() {
            let at = k as u64 * BLOCK;
            match self.core.disk_read(d, blk, dev + at) {
                Ok(()) => {}
                Err(e) if is_mismatch(&e) => bad.push(at),
                Err(e) => return Err(e),
            }
        }
        Ok(bad)
    }

    /// The contents of the members the job builds (one buffer each, in
    /// `job.targets()` order) for stripes `[s0, s1)` from the sources'
    /// data (`bads`: the offsets of each source's bad blocks in its
    /// buffer), and the offsets of the blocks that could not be rebuilt.
    fn solve_step(
        &self,
        job: &Job,
        bufs: &[Option<Vec<u8>>],
        bads: &[Vec<u64>],
        s0: u64,
        s1: u64,
    ) -> Result<(Vec<Vec<u8>>, Vec<u64>)> {
        let chunk = self.core.geom().chunk;
        let len = ((s1 - s0) * chunk) as usize;
        let mut outs = vec![vec![0u8; len]; job.targets().count()];
        let mut lost = Vec::new();
        let cl = chunk as usize;
        let whole: Vec<Option<&[u8]>> = bufs.iter().map(|b| b.as_deref()).collect();
        for s in s0..s1 {
            let at = ((s - s0) * chunk) as usize;
            let touched = |r: usize, lo: usize, n: usize| {
                bads[r]
                    .iter()
                    .any(|&b| (lo..lo + n).contains(&(b as usize)))
            };
            if !(0..bufs.len()).any(|r| touched(r, at, cl)) {
                self.solve_piece(job, s, &whole, at, cl, &mut outs)?;
                continue;
            }
            // Bad blocks in this stripe: block by block, each source's bad
            // block one more thing missing.
            let b = BLOCK as usize;
            for col in (0..cl).step_by(b) {
                let from = at + col;
                let usable: Vec<Option<&[u8]>> = whole
                    .iter()
                    .enumerate()
                    .map(|(r, x)| x.filter(|_| !touched(r, from, b)))
                    .collect();
                if self
                    .solve_piece(job, s, &usable, from, b, &mut outs)
                    .is_err()
                {
                    for out in &mut outs {
                        out[from..from + b].fill(0);
                    }
                    lost.push(from as u64);
                }
            }
        }
        Ok((outs, lost))
    }

    /// One piece (`len` bytes at `at` of the step's buffers) of the
    /// contents in stripe `stripe` of each member the job builds, written
    /// at `at` of its buffer in `outs`.
    fn solve_piece(
        &self,
        job: &Job,
        stripe: u64,
        bufs: &[Option<&[u8]>],
        at: usize,
        len: usize,
        outs: &mut [Vec<u8>],
    ) -> Result<()> {
        let piece = |r: usize| bufs[r].map(|b| &b[at..at + len]);
        if let Some(src) = piece(job.role) {
            // replacing: copy the member in service
            outs[0][at..at + len].copy_from_slice(src);
            return Ok(());
        }
        let sm = &self.core.geom().stripe_map(stripe);
        let data: Vec<Option<Vec<u8>>> = sm
            .data
            .iter()
            .map(|&r| piece(r).map(<[u8]>::to_vec))
            .collect();
        let rows = solve(sm, data, piece(sm.p), sm.q.and_then(piece), len).map_err(|gone| {
            Error::Unavailable {
                offset: self.core.geom().stripe_data_offset(stripe, 0),
                detail: format!(
                    "cannot rebuild role {} of stripe {stripe}: roles {gone:?} are missing too",
                    job.role
                ),
            }
        })?;
        let mut parity = None;
        for (t, out) in job.targets().zip(outs) {
            let dst = &mut out[at..at + len];
            if let Some(dd) = sm.data.iter().position(|&r| r == t.role) {
                dst.copy_from_slice(&rows[dd]);
            } else {
                let (p, q) = parity.get_or_insert_with(|| parity_of(sm, &rows, len));
                dst.copy_from_slice(if t.role == sm.p { p } else { q });
            }
        }
        Ok(())
    }
}
