//! Background recovery: rebuilding a member from the others (onto a spare,
//! an added member, or a replacement), or resyncing only the regions a
//! returning member missed. One job at a time, in batches of stripes that
//! are locked while they are rebuilt, so that clients keep reading and
//! writing; throttled in the spirit of md's speed_limit_min/max; with a
//! checkpoint in the member's superblock so that a restarted server resumes
//! where it was.

use crate::engine::{parity_of, solve, Array, Disk, SyncState, View};
use crate::error::{Error, Result};
use crate::superblock::RoleState;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Default speed while clients are busy (bytes/s): md's idea of a floor.
pub const DEFAULT_MIN_RATE: u64 = 16 << 20;
/// How often a running rebuild records its checkpoint.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// A recovery in progress.
#[derive(Debug, Clone, Serialize)]
pub struct RecoveryStatus {
    /// rebuild, resync or replace.
    pub kind: &'static str,
    pub role: usize,
    pub member: String,
    /// From 0 to 1.
    pub progress: f64,
    pub bytes_done: u64,
    pub bytes_total: u64,
    /// The checkpoint this run started from (0: the beginning).
    pub resumed_from: u64,
    pub seconds: f64,
}

/// The last recovery that ended.
#[derive(Debug, Clone, Serialize)]
pub struct LastRecovery {
    pub kind: &'static str,
    pub role: usize,
    pub member: String,
    /// Bytes rebuilt onto the member in this run.
    pub bytes: u64,
    pub seconds: f64,
    pub resumed_from: u64,
    /// done, or why it stopped.
    pub result: String,
}

#[derive(Debug, Default)]
struct State {
    stop: bool,
    work: bool,
    running: Option<RecoveryStatus>,
    last: Option<LastRecovery>,
    notes: Vec<String>,
}

/// The recovery state shared with the status reporter.
#[derive(Debug)]
pub(crate) struct Recovery {
    state: Mutex<State>,
    cv: Condvar,
    /// Bytes/s while clients are busy; 0: no limit.
    min_rate: AtomicU64,
    /// Bytes/s when idle; 0: no limit.
    max_rate: AtomicU64,
    done: AtomicU64,
}

impl Default for Recovery {
    fn default() -> Self {
        Recovery {
            state: Mutex::default(),
            cv: Condvar::new(),
            min_rate: AtomicU64::new(DEFAULT_MIN_RATE),
            max_rate: AtomicU64::new(0),
            done: AtomicU64::new(0),
        }
    }
}

impl Recovery {
    /// Something may need recovering: wake the recovery loop.
    pub fn kick(&self) {
        self.state.lock().expect("recovery").work = true;
        self.cv.notify_all();
    }

    pub fn stop(&self) {
        self.state.lock().expect("recovery").stop = true;
        self.cv.notify_all();
    }

    fn stopped(&self) -> bool {
        self.state.lock().expect("recovery").stop
    }

    pub fn note(&self, notes: Vec<String>) {
        self.state.lock().expect("recovery").notes.extend(notes);
    }
}

/// One member to bring in sync.
struct Job {
    role: usize,
    target: Arc<Disk>,
    sync: Arc<SyncState>,
    replace: bool,
}

impl Job {
    fn kind(&self) -> &'static str {
        if self.replace {
            "replace"
        } else if self.sync.dirty.is_some() {
            "resync"
        } else {
            "rebuild"
        }
    }

    /// Whether the job's member is still where the job expects it.
    fn current(&self, v: &View) -> bool {
        let rv = &v.roles[self.role];
        if self.replace {
            rv.replacement
                .as_ref()
                .is_some_and(|(d, _)| Arc::ptr_eq(d, &self.target))
        } else {
            rv.disk
                .as_ref()
                .is_some_and(|d| Arc::ptr_eq(d, &self.target))
                && rv.sync.is_some()
        }
    }
}

enum Outcome {
    Done,
    Stopped(String),
}

impl Array {
    /// Rebuild speed limits in bytes/s (0: unlimited): `min` while clients
    /// are busy, `max` when they are idle.
    pub fn set_rebuild_speed(&self, min: Option<u64>, max: Option<u64>) {
        if let Some(m) = min {
            self.recovery.min_rate.store(m, Ordering::Relaxed);
        }
        if let Some(m) = max {
            self.recovery.max_rate.store(m, Ordering::Relaxed);
        }
    }

    /// The bitmap's region size and how many regions are dirty now.
    pub fn bitmap_status(&self) -> Option<(u64, u64)> {
        self.bitmap
            .as_ref()
            .map(|b| (b.region(), b.snapshot().count()))
    }

    /// Stop the recovery loop (at its next batch, after a checkpoint).
    pub fn stop_background(&self) {
        self.recovery.stop();
    }

    pub fn rebuild_speed(&self) -> (u64, u64) {
        (
            self.recovery.min_rate.load(Ordering::Relaxed),
            self.recovery.max_rate.load(Ordering::Relaxed),
        )
    }

    pub fn recovery_status(&self) -> Option<RecoveryStatus> {
        let st = self.recovery.state.lock().expect("recovery");
        st.running.clone().map(|mut r| {
            r.bytes_done = self.recovery.done.load(Ordering::Relaxed);
            r.progress = if r.bytes_total == 0 {
                1.0
            } else {
                (r.bytes_done as f64 / r.bytes_total as f64).min(1.0)
            };
            r
        })
    }

    pub fn last_recovery(&self) -> Option<LastRecovery> {
        self.recovery.state.lock().expect("recovery").last.clone()
    }

    /// Messages about members taken back in at start-up.
    pub fn notes(&self) -> Vec<String> {
        self.recovery.state.lock().expect("recovery").notes.clone()
    }

    /// Whether some member still needs rebuilding.
    pub fn needs_recovery(&self) -> bool {
        self.next_job().is_some()
    }

    fn next_job(&self) -> Option<Job> {
        if !self.alive.load(Ordering::Acquire) || self.read_only {
            return None;
        }
        let v = self.view.load();
        for (role, rv) in v.roles.iter().enumerate() {
            if let Some((d, s)) = &rv.replacement {
                return Some(Job {
                    role,
                    target: d.clone(),
                    sync: s.clone(),
                    replace: true,
                });
            }
            if let (Some(d), Some(s)) = (&rv.disk, &rv.sync) {
                return Some(Job {
                    role,
                    target: d.clone(),
                    sync: s.clone(),
                    replace: false,
                });
            }
        }
        None
    }

    /// Run recoveries until none is needed (or the array is closed).
    pub fn recover_all(&self) -> Result<()> {
        while let Some(job) = self.next_job() {
            if self.recovery.stopped() {
                break;
            }
            if let Outcome::Stopped(why) = self.run_job(job)? {
                if self.recovery.stopped() {
                    break;
                }
                tracing::warn!("recovery stopped: {why}");
                if !self.alive.load(Ordering::Acquire) {
                    break;
                }
            }
        }
        Ok(())
    }

    /// The background recovery loop: waits for work, runs it, until the
    /// array is closed. Errors are logged and recorded in `last_recovery`.
    pub fn recovery_loop(&self) {
        loop {
            {
                let mut st = self.recovery.state.lock().expect("recovery");
                while !st.stop && !st.work {
                    st = self
                        .recovery
                        .cv
                        .wait_timeout(st, Duration::from_secs(1))
                        .expect("recovery")
                        .0;
                    if !st.work && self.next_job().is_some() {
                        st.work = true;
                    }
                }
                if st.stop {
                    return;
                }
                st.work = false;
            }
            if let Err(e) = self.recover_all() {
                tracing::error!("recovery failed: {e}");
            }
        }
    }

    /// Bring one member in sync.
    fn run_job(&self, job: Job) -> Result<Outcome> {
        let chunk = self.geom.chunk;
        let stripes = self.geom.stripes();
        let total = stripes * chunk;
        let start = job.sync.cursor.load(Ordering::Acquire);
        let bytes_total = match &job.sync.dirty {
            Some(d) => {
                (0..stripes)
                    .map(|s| s * chunk)
                    .filter(|&dev| dev >= start && d.overlaps(dev, dev + chunk))
                    .count() as u64
                    * chunk
            }
            None => total - start.min(total),
        };
        let began = Instant::now();
        self.recovery.done.store(0, Ordering::Relaxed);
        {
            let mut st = self.recovery.state.lock().expect("recovery");
            st.running = Some(RecoveryStatus {
                kind: job.kind(),
                role: job.role,
                member: job.target.name().to_string(),
                progress: 0.0,
                bytes_done: 0,
                bytes_total,
                resumed_from: start,
                seconds: 0.0,
            });
        }
        tracing::info!(
            kind = job.kind(),
            role = job.role,
            member = job.target.name(),
            from = start,
            "recovery started"
        );
        // Record that the role is being rebuilt (and where) before the
        // first byte is written to the member.
        if !job.replace {
            let mut meta = self.meta.lock().expect("meta lock");
            meta.sb.roles[job.role].state = RoleState::Rebuilding;
            job.target.sb.lock().expect("member sb").recovery_offset = Some(start);
            self.write_superblocks(&mut meta)?;
        }
        let outcome = self.copy_loop(&job, total);
        let outcome = match outcome {
            Ok(Outcome::Done) => self.finish(&job).map(|()| Outcome::Done),
            other => other,
        };
        let result = match &outcome {
            Ok(Outcome::Done) => "done".to_string(),
            Ok(Outcome::Stopped(why)) => why.clone(),
            Err(e) => e.to_string(),
        };
        let bytes = self.recovery.done.load(Ordering::Relaxed);
        let seconds = began.elapsed().as_secs_f64();
        tracing::info!(
            kind = job.kind(),
            role = job.role,
            bytes,
            seconds,
            result = result.as_str(),
            "recovery ended"
        );
        let mut st = self.recovery.state.lock().expect("recovery");
        st.running = None;
        st.last = Some(LastRecovery {
            kind: job.kind(),
            role: job.role,
            member: job.target.name().to_string(),
            bytes,
            seconds,
            resumed_from: start,
            result,
        });
        outcome
    }

    fn copy_loop(&self, job: &Job, total: u64) -> Result<Outcome> {
        let chunk = self.geom.chunk;
        let n = self.geom.members() as u64;
        // Up to 4 MiB per member per batch, and at most 64 MiB in all.
        let per_member = (4u64 << 20).min((64u64 << 20) / n).max(chunk);
        let batch = (per_member / chunk).max(1);
        let mut last_checkpoint = Instant::now();
        let mut last_fg = self.fg_ops.load(Ordering::Relaxed);
        loop {
            if self.recovery.stopped() {
                self.checkpoint(job)?;
                return Ok(Outcome::Stopped("the array was stopped".into()));
            }
            if !job.current(&self.view.load()) {
                return Ok(Outcome::Stopped(format!(
                    "{} left the array",
                    job.target.name()
                )));
            }
            let cursor = job.sync.cursor.load(Ordering::Acquire);
            if cursor >= total {
                return Ok(Outcome::Done);
            }
            let mut s0 = cursor / chunk;
            let mut s1 = (s0 + batch).min(total / chunk);
            if let Some(d) = &job.sync.dirty {
                // Skip to the next dirty stripe; stop the batch at a clean one.
                while s0 < s1 && !d.overlaps(s0 * chunk, (s0 + 1) * chunk) {
                    s0 += 1;
                }
                if s0 == s1 {
                    job.sync.cursor.store(s1 * chunk, Ordering::Release);
                    continue;
                }
                let mut e = s0 + 1;
                while e < s1 && d.overlaps(e * chunk, (e + 1) * chunk) {
                    e += 1;
                }
                s1 = e;
            }
            let t = Instant::now();
            let bytes = if self.geom.level.is_parity() {
                self.rebuild_parity_batch(job, s0, s1)?
            } else {
                self.rebuild_mirror_batch(job, s0, s1)?
            };
            let Some(bytes) = bytes else { continue };
            self.recovery.done.fetch_add(bytes, Ordering::Relaxed);
            if last_checkpoint.elapsed() >= CHECKPOINT_EVERY {
                self.checkpoint(job)?;
                last_checkpoint = Instant::now();
            }
            // Throttle: the busy rate while clients issued requests during
            // the batch, the idle rate otherwise (0: unlimited).
            let fg = self.fg_ops.load(Ordering::Relaxed);
            let (min, max) = self.rebuild_speed();
            let rate = if fg != last_fg { min } else { max };
            last_fg = fg;
            if rate > 0 {
                let want = Duration::from_secs_f64(bytes as f64 / rate as f64);
                while t.elapsed() < want && !self.recovery.stopped() {
                    std::thread::sleep((want - t.elapsed()).min(Duration::from_millis(100)));
                }
            }
        }
    }

    /// Record how far the rebuild got, once the member holds it durably.
    fn checkpoint(&self, job: &Job) -> Result<()> {
        if job.replace {
            return Ok(()); // a replacement restarts from scratch (it is a spare on disk)
        }
        let at = job.sync.cursor.load(Ordering::Acquire);
        if job.target.member.flush().is_err() {
            return Ok(()); // its next write fails it
        }
        let mut meta = self.meta.lock().expect("meta lock");
        if !job.current(&self.view.load()) {
            return Ok(());
        }
        job.target.sb.lock().expect("member sb").recovery_offset = Some(at);
        self.write_superblocks(&mut meta)
    }

    /// Rebuild stripes `[s0, s1)` onto the job's member. None: a source
    /// member failed on the way (it has been failed; try again).
    fn rebuild_parity_batch(&self, job: &Job, s0: u64, s1: u64) -> Result<Option<u64>> {
        let chunk = self.geom.chunk;
        let n = self.geom.members();
        let d0 = s0 * chunk;
        let len = ((s1 - s0) * chunk) as usize;
        let _locks = self.lock_range(s0, s1);
        let v = self.view.load_full();
        if !job.current(&v) {
            return Ok(Some(0));
        }
        // Sources: every other member that can serve the range; when
        // replacing, the member being replaced too.
        let sources: Vec<Option<Arc<Disk>>> = (0..n)
            .map(|r| {
                if r == job.role && !job.replace {
                    return None;
                }
                let rv = &v.roles[r];
                match (&rv.disk, &rv.sync) {
                    (Some(d), None) => Some(d.clone()),
                    _ => None,
                }
            })
            .collect();
        let results: Vec<Option<std::result::Result<Vec<u8>, String>>> =
            std::thread::scope(|scope| {
                let handles: Vec<_> = sources
                    .iter()
                    .map(|src| {
                        src.as_ref().map(|d| {
                            scope.spawn(move || {
                                let mut b = vec![0u8; len];
                                self.timed(d, || d.member.read_at(&mut b, d.data_offset + d0))
                                    .map(|()| b)
                                    .map_err(|e| e.to_string())
                            })
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.map(|h| h.join().expect("reader thread")))
                    .collect()
            });
        let mut bufs: Vec<Option<Vec<u8>>> = Vec::with_capacity(n);
        let mut failed = Vec::new();
        for (r, res) in results.into_iter().enumerate() {
            match res {
                Some(Ok(b)) => bufs.push(Some(b)),
                Some(Err(e)) => {
                    failed.push((r, e));
                    bufs.push(None);
                }
                None => bufs.push(None),
            }
        }
        if !failed.is_empty() {
            drop(_locks);
            for (r, e) in failed {
                if let Some(d) = &sources[r] {
                    self.fail_disk_by_ptr(d, &e);
                }
            }
            self.ensure_alive(d0)?;
            return Ok(None);
        }
        let mut out = vec![0u8; len];
        for s in s0..s1 {
            let at = ((s - s0) * chunk) as usize;
            let cl = chunk as usize;
            let piece = |r: usize| bufs[r].as_ref().map(|b| &b[at..at + cl]);
            let dst = &mut out[at..at + cl];
            if let Some(src) = piece(job.role) {
                dst.copy_from_slice(src); // replacing: copy the member in service
                continue;
            }
            let sm = self.geom.stripe_map(s);
            let data: Vec<Option<Vec<u8>>> = sm
                .data
                .iter()
                .map(|&r| piece(r).map(<[u8]>::to_vec))
                .collect();
            let rows = solve(&sm, data, piece(sm.p), sm.q.and_then(piece), cl).map_err(|gone| {
                Error::Unavailable {
                    offset: self.geom.stripe_data_offset(s, 0),
                    detail: format!(
                        "cannot rebuild role {} of stripe {s}: roles {gone:?} are missing too",
                        job.role
                    ),
                }
            })?;
            if let Some(dd) = sm.data.iter().position(|&r| r == job.role) {
                dst.copy_from_slice(&rows[dd]);
            } else {
                let (p, q) = parity_of(&sm, &rows, cl);
                dst.copy_from_slice(if job.role == sm.p { &p } else { &q });
            }
        }
        let t = &job.target;
        if let Err(e) = self.timed(t, || t.member.write_at(&out, t.data_offset + d0)) {
            drop(_locks);
            self.fail_disk_by_ptr(t, &e.to_string());
            return Ok(Some(0));
        }
        job.sync.cursor.store(d0 + len as u64, Ordering::Release);
        Ok(Some(len as u64))
    }

    /// Rebuild chunk rows `[s0, s1)` of a mirror member from another copy.
    fn rebuild_mirror_batch(&self, job: &Job, s0: u64, s1: u64) -> Result<Option<u64>> {
        let chunk = self.geom.chunk;
        let mut done = 0;
        let mut buf = vec![0u8; chunk as usize];
        for row in s0..s1 {
            let dev = row * chunk;
            let Some(c) = self.geom.mirror_chunk_at(job.role, row) else {
                job.sync.cursor.store(dev + chunk, Ordering::Release);
                continue;
            };
            let _g = self.lock(c);
            let v = self.view.load_full();
            if !job.current(&v) {
                return Ok(Some(done));
            }
            let p = &self.geom.pieces(c * chunk, chunk)[0];
            let src = p.copies.iter().find_map(|&(r, d)| {
                let rv = &v.roles[r];
                if r == job.role && !job.replace {
                    return None;
                }
                match (&rv.disk, &rv.sync) {
                    (Some(disk), None) => Some((disk.clone(), d)),
                    _ => None,
                }
            });
            let Some((sd, sdev)) = src else {
                return Err(Error::Unavailable {
                    offset: c * chunk,
                    detail: format!("no in-sync copy to rebuild role {} from", job.role),
                });
            };
            if let Err(e) = self.timed(&sd, || sd.member.read_at(&mut buf, sd.data_offset + sdev)) {
                drop(_g);
                self.fail_disk_by_ptr(&sd, &e.to_string());
                self.ensure_alive(c * chunk)?;
                return Ok(None);
            }
            let t = &job.target;
            if let Err(e) = self.timed(t, || t.member.write_at(&buf, t.data_offset + dev)) {
                drop(_g);
                self.fail_disk_by_ptr(t, &e.to_string());
                return Ok(Some(done));
            }
            job.sync.cursor.store(dev + chunk, Ordering::Release);
            done += chunk;
        }
        Ok(Some(done))
    }

    /// The member is in sync: record it, and for a replacement retire the
    /// member it replaces.
    fn finish(&self, job: &Job) -> Result<()> {
        job.target.member.flush()?;
        let mut meta = self.meta.lock().expect("meta lock");
        let mut v = View::clone(&self.view.load());
        if !job.current(&v) {
            return Ok(());
        }
        let rv = &mut v.roles[job.role];
        if job.replace {
            let (rep, _) = rv.replacement.take().expect("replacement");
            if let Some(old) = rv.disk.replace(rep.clone()) {
                v.failed
                    .push((old, None, format!("replaced by {}", rep.name())));
            }
            meta.sb.roles[job.role].member_uuid = rep.uuid;
        } else {
            rv.sync = None;
        }
        job.target.sb.lock().expect("member sb").recovery_offset = None;
        meta.sb.roles[job.role].state = RoleState::Active;
        meta.sb.events += 1;
        self.view.store(Arc::new(v));
        self.write_superblocks(&mut meta)?;
        if let Some(b) = &self.bitmap {
            b.write_to(job.target.member.as_ref())?;
        }
        Ok(())
    }

    /// Periodic upkeep: clear the bitmap bits of idle regions when every
    /// member is in sync, and fail members that stall. Returns how many
    /// bits were cleared.
    pub fn housekeeping(&self) -> u64 {
        self.check_stalls();
        let Some(b) = &self.bitmap else { return 0 };
        if self.read_only || !self.alive.load(Ordering::Acquire) {
            return 0;
        }
        let v = self.view.load_full();
        if !v.degraded_roles().is_empty() || v.roles.iter().any(|r| r.replacement.is_some()) {
            return 0; // bits must stay until every member has the writes
        }
        let members: Vec<_> = v.writable().iter().map(|d| d.member.clone()).collect();
        // Lock order: meta before the bitmap's own lock, as everywhere.
        let (n, failed) = {
            let mut meta = self.meta.lock().expect("meta lock");
            b.clear_idle(&members, || {
                meta.sb.bitmap[2] = meta.sb.events;
                let _ = self.write_superblocks(&mut meta);
            })
        };
        let ws = v.writable();
        for (i, e) in failed {
            self.fail_disk_by_ptr(&ws[i], &format!("writing the bitmap: {e}"));
        }
        n
    }
}
