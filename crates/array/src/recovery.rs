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
use raidkit_member::Locked;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Default speed while clients are busy (bytes/s): md's idea of a floor.
pub const DEFAULT_MIN_RATE: u64 = 16 << 20;
/// How often a running rebuild records its checkpoint.
pub(crate) const CHECKPOINT_EVERY: Duration = Duration::from_secs(2);

/// A recovery in progress.
#[derive(Debug, Clone, Serialize)]
pub struct RecoveryStatus {
    /// rebuild, resync, replace, or parity-resync (after an unclean
    /// shutdown: parity recomputed where writes may have been torn).
    pub kind: &'static str,
    /// The member's role (none for a parity resync).
    pub role: Option<usize>,
    pub member: String,
    /// From 0 to 1, across the whole process: what runs before this one
    /// did counts (as /proc/mdstat shows a resumed resync).
    pub progress: f64,
    /// Bytes done and to do in this run.
    pub bytes_done: u64,
    pub bytes_total: u64,
    /// Bytes of the same process done by earlier runs (it resumed from a
    /// checkpoint): `progress` is `(bytes_before + bytes_done) /
    /// (bytes_before + bytes_total)`.
    pub bytes_before: u64,
    /// The checkpoint this run started from (0: the beginning).
    pub resumed_from: u64,
    /// Seconds this run has been going.
    pub seconds: f64,
    /// Bytes per second in this run so far.
    pub rate: f64,
    #[serde(skip)]
    pub(crate) began: Option<Instant>,
}

/// The last recovery that ended.
#[derive(Debug, Clone, Serialize)]
pub struct LastRecovery {
    pub kind: &'static str,
    pub role: Option<usize>,
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

/// What a parity resync covers: redundancy recomputed from the data.
#[derive(Debug, Clone, Default)]
pub(crate) struct ParityResync {
    /// Every unit (stripe of a parity level, chunk of a mirror) from this
    /// one on: an initial sync, or a full resync, that records its position
    /// in the superblocks as it goes (`Superblock::resync`).
    pub from: Option<u64>,
    /// Regions of the members' data areas being written at a crash (the
    /// write-intent bitmap's), wherever they are.
    pub marked: Option<crate::bitmap::RegionSet>,
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
    /// A parity resync waiting to run (after an unclean shutdown).
    pub(crate) pending_parity: Mutex<Option<ParityResync>>,
    /// A parity resync has not finished: the array must stay marked dirty.
    pub(crate) parity_unfinished: std::sync::atomic::AtomicBool,
}

impl Default for Recovery {
    fn default() -> Self {
        Recovery {
            state: Mutex::default(),
            cv: Condvar::new(),
            min_rate: AtomicU64::new(DEFAULT_MIN_RATE),
            max_rate: AtomicU64::new(0),
            done: AtomicU64::new(0),
            pending_parity: Mutex::new(None),
            parity_unfinished: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl Recovery {
    /// Something may need recovering: wake the recovery loop.
    pub fn kick(&self) {
        self.state.locked().work = true;
        self.cv.notify_all();
    }

    pub fn stop(&self) {
        self.state.locked().stop = true;
        self.cv.notify_all();
    }

    fn stopped(&self) -> bool {
        self.state.locked().stop
    }

    pub fn note(&self, notes: Vec<String>) {
        self.state.locked().notes.extend(notes);
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

/// How a pipeline run ended.
enum Run {
    Finished,
    /// The members changed under it: run again from the cursor.
    Again,
    Stopped(String),
}

/// The rebuild throttle: the busy rate (md's speed_limit_min) while
/// clients issue requests, the idle rate (speed_limit_max) otherwise; 0
/// means no limit.
pub(crate) struct Pacer<'a> {
    array: &'a Array,
    since: Instant,
    bytes: u64,
    last_fg: u64,
    last_rate: u64,
}

impl<'a> Pacer<'a> {
    fn new(array: &'a Array) -> Pacer<'a> {
        Pacer {
            array,
            since: Instant::now(),
            bytes: 0,
            last_fg: array.fg_ops.load(Ordering::Relaxed),
            last_rate: u64::MAX,
        }
    }

    fn pace(&mut self, bytes: u64) {
        let fg = self.array.fg_ops.load(Ordering::Relaxed);
        let (min, max) = self.array.rebuild_speed();
        let rate = if fg != self.last_fg { min } else { max };
        self.last_fg = fg;
        if rate != self.last_rate || self.since.elapsed() > Duration::from_secs(2) {
            self.since = Instant::now();
            self.bytes = 0;
            self.last_rate = rate;
        }
        self.bytes += bytes;
        if rate == 0 {
            return;
        }
        let want = Duration::from_secs_f64(self.bytes as f64 / rate as f64);
        while self.since.elapsed() < want && !self.array.recovery.stopped() {
            std::thread::sleep((want - self.since.elapsed()).min(Duration::from_millis(100)));
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
        let st = self.recovery.state.locked();
        st.running.clone().map(|mut r| {
            r.bytes_done = self.recovery.done.load(Ordering::Relaxed);
            let whole = r.bytes_before + r.bytes_total;
            r.progress = if whole == 0 {
                1.0
            } else {
                ((r.bytes_before + r.bytes_done) as f64 / whole as f64).min(1.0)
            };
            r.seconds = r.began.map_or(0.0, |b| b.elapsed().as_secs_f64());
            r.rate = if r.seconds > 0.0 {
                r.bytes_done as f64 / r.seconds
            } else {
                0.0
            };
            r
        })
    }

    pub fn last_recovery(&self) -> Option<LastRecovery> {
        self.recovery.state.locked().last.clone()
    }

    /// Messages about members taken back in at start-up.
    pub fn notes(&self) -> Vec<String> {
        self.recovery.state.locked().notes.clone()
    }

    /// The array's state for reports: failed, rebuilding (a member is being
    /// rebuilt or waits to be), degraded or optimal.
    pub fn state_name(&self) -> &'static str {
        match self.health() {
            crate::Health::Failed => "failed",
            _ if self.recovery_status().is_some() || self.needs_recovery() => "rebuilding",
            h => h.name(),
        }
    }

    /// Whether some member still needs rebuilding.
    pub fn needs_recovery(&self) -> bool {
        self.next_job().is_some() || self.recovery.pending_parity.locked().is_some()
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
        let parity = self.recovery.pending_parity.locked().take();
        if let Some(plan) = parity {
            self.run_parity_resync(plan, &mut |_, _| {})?;
        }
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
                let mut st = self.recovery.state.locked();
                while !st.stop && !st.work {
                    st = self
                        .recovery
                        .cv
                        .wait_timeout(st, Duration::from_secs(1))
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
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

    /// Record that a recovery started (for status).
    pub(crate) fn recovery_started(&self, status: RecoveryStatus) {
        self.recovery.done.store(0, Ordering::Relaxed);
        self.recovery.state.locked().running = Some(RecoveryStatus {
            began: Some(Instant::now()),
            ..status
        });
    }

    /// Count bytes done by the running recovery.
    pub(crate) fn recovery_progress(&self, bytes: u64) {
        self.recovery.done.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Record that the running recovery ended.
    pub(crate) fn recovery_ended(&self, last: LastRecovery) {
        let mut st = self.recovery.state.locked();
        st.running = None;
        st.last = Some(last);
    }

    pub(crate) fn pace_recovery(&self, pacer: &mut Pacer, bytes: u64) {
        pacer.pace(bytes);
    }

    pub(crate) fn new_pacer(&self) -> Pacer<'_> {
        Pacer::new(self)
    }

    pub(crate) fn recovery_stopped(&self) -> bool {
        self.recovery.stopped()
    }

    /// Bring one member in sync.
    fn run_job(&self, job: Job) -> Result<Outcome> {
        let chunk = self.geom.chunk;
        let stripes = self.geom.stripes();
        let total = stripes * chunk;
        let start = job.sync.cursor.load(Ordering::Acquire);
        // This run's work, and what runs before it did of the same job.
        let (bytes_before, bytes_total) = match &job.sync.dirty {
            Some(d) => (0..stripes)
                .map(|s| s * chunk)
                .filter(|&dev| d.overlaps(dev, dev + chunk))
                .fold((0, 0), |(below, above), dev| {
                    if dev < start {
                        (below + chunk, above)
                    } else {
                        (below, above + chunk)
                    }
                }),
            None => (start.min(total), total - start.min(total)),
        };
        let began = Instant::now();
        self.recovery_started(RecoveryStatus {
            kind: job.kind(),
            role: Some(job.role),
            member: job.target.name().to_string(),
            progress: 0.0,
            bytes_done: 0,
            bytes_total,
            bytes_before,
            resumed_from: start,
            seconds: 0.0,
            rate: 0.0,
            began: None,
        });
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
            let mut meta = self.meta.locked();
            meta.sb.roles[job.role].state = RoleState::Rebuilding;
            job.target.sb.locked().recovery_offset = Some(start);
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
        let mut st = self.recovery.state.locked();
        st.running = None;
        st.last = Some(LastRecovery {
            kind: job.kind(),
            role: Some(job.role),
            member: job.target.name().to_string(),
            bytes,
            seconds,
            resumed_from: start,
            result,
        });
        outcome
    }

    fn copy_loop(&self, job: &Job, total: u64) -> Result<Outcome> {
        if self.geom.level.is_parity() {
            return self.parity_pipeline(job, total);
        }
        let chunk = self.geom.chunk;
        let batch = ((1u64 << 20) / chunk).max(1);
        let mut last_checkpoint = Instant::now();
        let mut pacer = Pacer::new(self);
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
            let Some(bytes) = self.rebuild_mirror_batch(job, s0, s1)? else {
                continue;
            };
            self.recovery.done.fetch_add(bytes, Ordering::Relaxed);
            if last_checkpoint.elapsed() >= CHECKPOINT_EVERY {
                self.checkpoint(job)?;
                last_checkpoint = Instant::now();
            }
            pacer.pace(bytes);
        }
    }

    /// The other members a job reads from: every in-sync member but the
    /// one being built; when replacing, the member being replaced too.
    fn sources_for(&self, job: &Job, v: &View) -> Vec<Option<Arc<Disk>>> {
        (0..v.roles.len())
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
            .collect()
    }

    /// Parity levels: rebuild through a pipeline until done. Restarted
    /// (from the cursor) whenever the set of source members changes.
    fn parity_pipeline(&self, job: &Job, total: u64) -> Result<Outcome> {
        let chunk = self.geom.chunk;
        let stripes = total / chunk;
        // Steps of about 1 MiB per member.
        let step = ((1u64 << 20) / chunk).max(1);
        let mut pacer = Pacer::new(self);
        let mut last_checkpoint = Instant::now();
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
            let from = job.sync.cursor.load(Ordering::Acquire) / chunk;
            let mut steps = Vec::new();
            let mut s = from;
            while s < stripes {
                let dirty = |x: u64| {
                    job.sync
                        .dirty
                        .as_ref()
                        .is_none_or(|d| d.overlaps(x * chunk, (x + 1) * chunk))
                };
                if !dirty(s) {
                    s += 1;
                    continue;
                }
                let mut e = s + 1;
                while e < stripes && e - s < step && dirty(e) {
                    e += 1;
                }
                steps.push((s, e));
                s = e;
            }
            let sources = self.sources_for(job, &self.view.load());
            match self.run_pipeline(job, &sources, &steps, &mut pacer, &mut last_checkpoint)? {
                Run::Finished => {
                    job.sync.cursor.store(total, Ordering::Release);
                    return Ok(Outcome::Done);
                }
                Run::Again => continue,
                Run::Stopped(why) => {
                    self.checkpoint(job)?;
                    return Ok(Outcome::Stopped(why));
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
        pacer: &mut Pacer,
        last_checkpoint: &mut Instant,
    ) -> Result<Run> {
        const DEPTH: usize = 8;
        let chunk = self.geom.chunk;
        let t = &job.target;
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
                    for (a, b) in crx {
                        let mut buf = vec![0u8; ((b - a) * chunk) as usize];
                        let r = self
                            .timed(d, || d.member.read_at(&mut buf, d.data_offset + a * chunk))
                            .map(|()| buf)
                            .map_err(|e| e.to_string());
                        let failed = r.is_err();
                        if rtx.send(r).is_err() || failed {
                            return;
                        }
                    }
                });
                if let Err(e) = spawned {
                    spawn_failed = Some(e);
                    return;
                }
                cmds.push(Some(ctx));
                results.push(Some(rrx));
            }
            let (wtx, wrx) = std::sync::mpsc::sync_channel::<(usize, u64, Vec<u8>)>(2);
            let (ack_tx, ack_rx) = std::sync::mpsc::channel();
            let spawned = std::thread::Builder::new().spawn_scoped(sc, move || {
                for (i, a, out) in wrx {
                    let r = self.timed(t, || t.member.write_at(&out, t.data_offset + a * chunk));
                    let failed = r.is_err();
                    if ack_tx.send((i, r)).is_err() || failed {
                        return;
                    }
                }
            });
            if let Err(e) = spawned {
                spawn_failed = Some(e);
                return;
            }
            let mut guards = std::collections::VecDeque::new();
            let (mut issued, mut solved, mut sent, mut acked) = (0, 0, 0, 0);
            let mut halt = false;
            loop {
                while !halt && issued < steps.len() && issued - acked < DEPTH {
                    let (a, b) = steps[issued];
                    let g = self.lock_range(a, b);
                    let v = self.view.load();
                    if !job.current(&v) || !same_sources(&v) {
                        halt = true;
                        run = Run::Again;
                        break;
                    }
                    guards.push_back(g);
                    for c in cmds.iter().flatten() {
                        let _ = c.send((a, b));
                    }
                    issued += 1;
                }
                if !halt && solved < issued {
                    let (a, b) = steps[solved];
                    let mut bufs = Vec::with_capacity(results.len());
                    for (r, rx) in results.iter().enumerate() {
                        match rx.as_ref().map(|rx| rx.recv()) {
                            None => bufs.push(None),
                            Some(Ok(Ok(buf))) => bufs.push(Some(buf)),
                            Some(Ok(Err(e))) => read_failed.push((r, e)),
                            Some(Err(_)) => read_failed.push((r, "reader stopped".into())),
                        }
                    }
                    if !read_failed.is_empty() {
                        halt = true;
                        run = Run::Again;
                    } else {
                        match self.solve_step(job, &bufs, a, b) {
                            Ok(out) => {
                                if wtx.send((solved, a, out)).is_ok() {
                                    sent += 1;
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
                    let ack = if wait {
                        match ack_rx.recv() {
                            Ok(x) => x,
                            Err(_) => {
                                halt = true;
                                break;
                            }
                        }
                    } else {
                        match ack_rx.try_recv() {
                            Ok(x) => x,
                            Err(_) => break,
                        }
                    };
                    wait = false;
                    let (i, r) = ack;
                    acked += 1;
                    guards.pop_front();
                    if let Err(e) = r {
                        write_failed = Some(e);
                        halt = true;
                        continue;
                    }
                    let (a, b) = steps[i];
                    job.sync.cursor.store(b * chunk, Ordering::Release);
                    let bytes = (b - a) * chunk;
                    self.recovery.done.fetch_add(bytes, Ordering::Relaxed);
                    if last_checkpoint.elapsed() >= CHECKPOINT_EVERY {
                        if let Err(e) = self.checkpoint(job) {
                            solve_failed = Some(e);
                            halt = true;
                        }
                        *last_checkpoint = Instant::now();
                    }
                    pacer.pace(bytes);
                    if !halt && self.recovery.stopped() {
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
            drop(wtx);
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
        if let Some(e) = write_failed {
            self.fail_disk_by_ptr(t, &e.to_string());
            return Ok(Run::Again);
        }
        if !read_failed.is_empty() {
            for (r, e) in read_failed {
                if let Some(d) = &sources[r] {
                    self.fail_disk_by_ptr(d, &e);
                }
            }
            self.ensure_alive(0)?;
            return Ok(Run::Again);
        }
        Ok(run)
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
        let mut meta = self.meta.locked();
        if !job.current(&self.view.load()) {
            return Ok(());
        }
        job.target.sb.locked().recovery_offset = Some(at);
        self.write_superblocks(&mut meta)
    }

    /// The job member's contents for stripes `[s0, s1)` from the sources' data.
    fn solve_step(&self, job: &Job, bufs: &[Option<Vec<u8>>], s0: u64, s1: u64) -> Result<Vec<u8>> {
        let chunk = self.geom.chunk;
        let len = ((s1 - s0) * chunk) as usize;
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
        Ok(out)
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
        let mut meta = self.meta.locked();
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
        job.target.sb.locked().recovery_offset = None;
        meta.sb.roles[job.role].state = RoleState::Active;
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
            let mut meta = self.meta.locked();
            b.clear_idle(&members, || {
                // The event count this update records (write_superblocks
                // raises it): a member copy from before it is older.
                meta.sb.bitmap.events_cleared = meta.sb.events + 1;
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
