//! Background recovery: rebuilding a member from the others (onto a spare,
//! an added member, or a replacement), or resyncing only the regions a
//! returning member missed. One job at a time, in batches of stripes that
//! are locked while they are rebuilt, so that clients keep reading and
//! writing; throttled in the spirit of md's speed_limit_min/max; with a
//! checkpoint in the member's superblock so that a restarted server resumes
//! where it was.

use crate::background::{Plan, Process};
use crate::core::{Disk, SyncState, View};
use crate::engine::Array;
use crate::error::Result;
use crate::superblock::RoleState;
use raidkit_member::Locked;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// How long an array goes without writes before it is marked clean (see
/// `Array::mark_clean_if_idle`; housekeeping looks every 2 s).
const IDLE_CLEAN: Duration = Duration::from_secs(1);

/// One member to bring in sync.
pub(crate) struct Job {
    pub role: usize,
    pub target: Arc<Disk>,
    pub sync: Arc<SyncState>,
    pub replace: bool,
    /// Members rebuilt in the same pass (RAID-6 with two members to
    /// rebuild): the sources are read once for both, as md recovers every
    /// spare it has added at once, instead of a second whole pass at one
    /// member's redundancy.
    pub partners: Vec<Job>,
}

impl Job {
    pub fn kind(&self) -> &'static str {
        if self.replace {
            "replace"
        } else if self.sync.dirty.is_some() {
            "resync"
        } else {
            "rebuild"
        }
    }

    /// Whether the job's member is still where the job expects it.
    pub fn current(&self, v: &View) -> bool {
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

    /// The job and its partners: every member the pass builds.
    pub fn targets(&self) -> impl Iterator<Item = &Job> {
        std::iter::once(self).chain(self.partners.iter())
    }

    /// A member of `v` that needs a whole rebuild and could be this job's
    /// partner but is not: it came after the job started (a second spare
    /// taking a role, or a member added). Only for a whole rebuild on a
    /// level with two parities and no partner yet.
    pub fn joiner<'v>(&self, v: &'v View) -> Option<&'v Arc<Disk>> {
        if self.replace
            || self.sync.dirty.is_some()
            || !self.partners.is_empty()
            || v.geom.level.parity_count() != 2
        {
            return None;
        }
        v.roles
            .iter()
            .enumerate()
            .find_map(|(r, rv)| match (&rv.disk, &rv.sync, &rv.replacement) {
                (Some(d), Some(s), None) if r != self.role && s.dirty.is_none() => Some(d),
                _ => None,
            })
    }

    /// A partner that is no longer where the job expects it.
    pub fn partner_gone(&self, v: &View) -> Option<&Job> {
        self.partners.iter().find(|p| !p.current(v))
    }
}

/// How a rebuild ended.
pub(crate) enum Outcome {
    Done,
    Stopped(String),
    /// Another member to rebuild came while it ran: its position recorded,
    /// it is taken up again at once with that member as its partner.
    Regroup(String),
}

impl Array {
    /// Blocks of the member being built (offsets from `dev`) that nothing
    /// could rebuild: their checksums are set so that they read as bad
    /// (EIO, never the zeroes written there) until written anew, as md's
    /// bad block list does.
    pub(crate) fn mark_lost(
        &self,
        job: &Job,
        dev: u64,
        lost: &[u64],
    ) -> std::result::Result<(), raidkit_member::MemberError> {
        let t = &job.target;
        for &off in lost {
            tracing::warn!(
                member = t.name(),
                role = job.role,
                member_offset = t.data_offset + dev + off,
                "rebuild: a block could not be rebuilt (bad blocks beyond what redundancy covers): it reads as an error until written"
            );
            if let Some(c) = &t.checked {
                c.mark_lost(t.data_offset + dev + off)?;
            }
        }
        Ok(())
    }

    /// Whether some member still needs rebuilding.
    pub fn needs_recovery(&self) -> bool {
        self.next_job().is_some()
            || self.recovery.pending_parity.locked().is_some()
            || self.reshape_in_progress()
            || self.lost_marked_resync().is_some()
    }

    /// The resync of the regions an unclean stop left marked, if one was
    /// given up because a member was missing (a degraded start with
    /// `--force`, a member lost during it) and the array is whole again:
    /// it must run before the array may be called clean.
    fn lost_marked_resync(&self) -> Option<crate::background::ParityResync> {
        if !self.recovery.parity_unfinished.load(Ordering::Acquire)
            || self.recovery.pending_parity.locked().is_some()
            || self.next_job().is_some()
            || !self.core.view.load().degraded_roles().is_empty()
        {
            return None;
        }
        let marked = self.recovery.resync_marked.locked().clone()?;
        Some(crate::background::ParityResync {
            from: None,
            marked: Some(marked),
        })
    }

    fn next_job(&self) -> Option<Job> {
        // During a reshape no role is rebuilt (a member back from an
        // absence waits, its writes kept, for the new geometry).
        if !self.core.alive.load(Ordering::Acquire)
            || self.core.read_only
            || self.core.is_reshaping()
        {
            return None;
        }
        let v = self.core.view.load();
        let rebuild_of = |role: usize| {
            let rv = &v.roles[role];
            match (&rv.disk, &rv.sync, &rv.replacement) {
                (Some(d), Some(s), None) => Some(Job {
                    role,
                    target: d.clone(),
                    sync: s.clone(),
                    replace: false,
                    partners: Vec::new(),
                }),
                _ => None,
            }
        };
        for (role, rv) in v.roles.iter().enumerate() {
            if let Some((d, s)) = &rv.replacement {
                return Some(Job {
                    role,
                    target: d.clone(),
                    sync: s.clone(),
                    replace: true,
                    partners: Vec::new(),
                });
            }
            if let (Some(d), Some(s)) = (&rv.disk, &rv.sync) {
                let mut job = Job {
                    role,
                    target: d.clone(),
                    sync: s.clone(),
                    replace: false,
                    partners: Vec::new(),
                };
                // A whole rebuild on a level with two parities takes the
                // other whole rebuild with it (a resync of a returning
                // member's dirty regions, or a replacement, goes alone).
                if v.geom.level.parity_count() == 2 && s.dirty.is_none() {
                    job.partners = (role + 1..v.roles.len())
                        .filter_map(rebuild_of)
                        .filter(|p| p.sync.dirty.is_none())
                        .take(1)
                        .collect();
                }
                return Some(job);
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
        if let Some(r) = self.reshaping() {
            if self.core.wake.stopped() || self.core.read_only {
                return Ok(());
            }
            self.run_reshape(r)?;
            // The resync of the new stripes, then what waited.
            let parity = self.recovery.pending_parity.locked().take();
            if let Some(plan) = parity {
                self.run_parity_resync(plan, &mut |_, _| {})?;
            }
        }
        while let Some(job) = self.next_job() {
            if self.core.wake.stopped() {
                break;
            }
            match self.run_job(job)? {
                Outcome::Stopped(why) => {
                    if self.core.wake.stopped() {
                        break;
                    }
                    tracing::warn!("recovery stopped: {why}");
                    if !self.core.alive.load(Ordering::Acquire) {
                        break;
                    }
                }
                Outcome::Regroup(why) => tracing::info!("rebuild taken up again: {why}"),
                Outcome::Done => {}
            }
        }
        // The marked regions of an unclean stop, given up while a member
        // was missing, once the rebuild has brought it back.
        if let Some(plan) = self
            .lost_marked_resync()
            .filter(|_| !self.core.wake.stopped())
        {
            self.run_parity_resync(plan, &mut |_, _| {})?;
        }
        // A resync from a position that stopped for a member being rebuilt
        // (the new stripes of a reshape, an initial sync) goes on now.
        let from = self.unsynced_from.load(Ordering::Acquire);
        if from != u64::MAX
            && !self.core.wake.stopped()
            && self.next_job().is_none()
            && self.core.view.load().degraded_roles().is_empty()
            && self.recovery.pending_parity.locked().is_none()
        {
            self.run_parity_resync(
                crate::background::ParityResync {
                    from: Some(from),
                    marked: None,
                },
                &mut |_, _| {},
            )?;
        }
        if !self.core.wake.stopped() && self.next_job().is_none() {
            self.run_pending_scrub()?;
        }
        Ok(())
    }

    /// The background recovery loop: waits for work, runs it, until the
    /// array is closed. Errors are logged and recorded in `last_recovery`.
    pub fn recovery_loop(&self) {
        while self
            .core
            .wake
            .wait(Duration::from_secs(1), || self.next_job().is_some())
        {
            if let Err(e) = self.recover_all() {
                tracing::error!("recovery failed: {e}");
            }
        }
    }

    /// Bring one member in sync.
    fn run_job(&self, job: Job) -> Result<Outcome> {
        let chunk = self.core.geom().chunk;
        let stripes = self.core.geom().stripes();
        let total = stripes * chunk;
        // A pass with partners starts where the one furthest behind is.
        let start = job
            .targets()
            .map(|t| t.sync.cursor.load(Ordering::Acquire))
            .min()
            .unwrap_or(0);
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
        let mut process = Process::start(
            self,
            Plan {
                kind: job.kind(),
                role: Some(job.role),
                member: job.target.name().to_string(),
                with: job
                    .partners
                    .iter()
                    .map(|p| crate::background::Partner {
                        role: p.role,
                        member: p.target.name().to_string(),
                    })
                    .collect(),
                bytes_before,
                bytes_total,
                resumed_from: start,
            },
        );
        // Record that the role is being rebuilt (and where) before the
        // first byte is written to the member.
        let recorded = if job.replace {
            Ok(())
        } else {
            let mut meta = self.core.meta.locked();
            for t in job.targets() {
                meta.sb.roles[t.role].state = RoleState::Rebuilding;
                t.target.sb.locked().recovery_offset = Some(t.sync.cursor.load(Ordering::Acquire));
            }
            self.core.write_superblocks(&mut meta)
        };
        let outcome = recorded
            .and_then(|()| self.level().rebuild(self, &job, total, &mut process))
            .and_then(|o| match o {
                Outcome::Done => job
                    .targets()
                    .try_for_each(|t| self.finish(t))
                    .map(|()| Outcome::Done),
                other => Ok(other),
            });
        match &outcome {
            Ok(Outcome::Regroup(why)) => process.end_regrouped(why.clone()),
            Ok(Outcome::Done) => process.end("done".to_string()),
            Ok(Outcome::Stopped(why)) => process.end(why.clone()),
            Err(e) => process.end(e.to_string()),
        }
        if matches!(outcome, Ok(Outcome::Done)) {
            // After RebuildFinished, as md sends them.
            for t in job.targets() {
                self.core.emit(
                    crate::events::NewEvent::new(
                        "SpareActive",
                        crate::events::Severity::Info,
                        format!("in sync and active in role {}", t.role),
                    )
                    .member(t.target.name(), Some(t.role)),
                );
            }
        }
        outcome
    }

    /// Whether a rebuild must end before its next step: the array is
    /// being stopped (its position recorded first), or the job's member
    /// left the array.
    pub(crate) fn interrupted(&self, job: &Job, process: &Process) -> Result<Option<Outcome>> {
        if process.stopped() {
            self.checkpoint(job)?;
            return Ok(Some(Outcome::Stopped("the array was stopped".into())));
        }
        let v = self.core.view.load();
        if let Some(gone) = std::iter::once(job)
            .filter(|j| !j.current(&v))
            .chain(job.partner_gone(&v))
            .next()
        {
            // A partner gone: the recovery loop takes the job up again
            // alone, from its checkpoint.
            self.checkpoint(job)?;
            return Ok(Some(Outcome::Stopped(format!(
                "{} left the array",
                gone.target.name()
            ))));
        }
        Ok(None)
    }

    /// Record how far the rebuild got, once the member holds it durably.
    pub(crate) fn checkpoint(&self, job: &Job) -> Result<()> {
        if job.replace && job.target.sb.locked().md.is_some() {
            // md's format of this version records no replacement: it is a
            // spare on disk, rebuilt afresh after a restart.
            return Ok(());
        }
        // Each member's position once it holds what lies below it; a
        // member whose flush fails is left out (its next write fails it),
        // and one that left the array is not flushed (it may hang).
        let v = self.core.view.load();
        let held: Vec<(&Job, u64)> = job
            .targets()
            .filter(|t| t.current(&v))
            .map(|t| (t, t.sync.cursor.load(Ordering::Acquire)))
            .filter(|(t, _)| t.target.member.flush().is_ok())
            .collect();
        drop(v);
        let mut meta = self.core.meta.locked();
        let v = self.core.view.load();
        let mut any = false;
        for (t, at) in held {
            if t.current(&v) {
                t.target.sb.locked().recovery_offset = Some(at);
                any = true;
            }
        }
        if !any {
            return Ok(());
        }
        self.core.write_superblocks(&mut meta)
    }

    /// The member is in sync: record it, and for a replacement retire the
    /// member it replaces.
    fn finish(&self, job: &Job) -> Result<()> {
        job.target.member.flush()?;
        let mut meta = self.core.meta.locked();
        let mut v = View::clone(&self.core.view.load());
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
        self.core.view.store(Arc::new(v));
        self.core.write_superblocks(&mut meta)?;
        if let Some(b) = &self.core.bitmap {
            b.write_to(job.target.member.as_ref())?;
        }
        Ok(())
    }

    /// Mark the array clean in its superblocks when no write has come for
    /// `IDLE_CLEAN` and nothing else keeps it dirty (a parity resync
    /// pending or under way, a reshape, blocks a crash may have torn), as
    /// md's safe mode does after 200 ms: a crash after that leaves nothing
    /// to replay or resync, and a degraded array then starts without
    /// `--force`. The next write marks it dirty again first. Every write
    /// so far is made durable (checksums included) before. Returns
    /// whether it was marked.
    pub fn mark_clean_if_idle(&self) -> bool {
        let c = &self.core;
        if c.read_only || !c.alive.load(Ordering::Acquire) || !c.write_ready.load(Ordering::SeqCst)
        {
            return false;
        }
        let begun = c.writes_begun();
        if !c.idle_since(begun, IDLE_CLEAN) || self.kept_dirty() {
            return false;
        }
        // Outside the metadata lock: a member failing its flush is failed
        // under it.
        if c.flush().is_err() {
            return false;
        }
        let mut meta = c.meta.locked();
        // From here a write that begins takes the metadata lock to mark
        // the array dirty, and waits for this; one that began since the
        // flush (its data maybe not durable) makes this give up.
        c.write_ready.store(false, Ordering::SeqCst);
        if !c.idle_since(begun, Duration::ZERO)
            || self.kept_dirty()
            || meta.sb.resync.is_some()
            || meta.sb.reshape.is_some()
            || !c.alive.load(Ordering::Acquire)
        {
            c.write_ready.store(true, Ordering::SeqCst);
            return false;
        }
        if let Some(j) = &self.journal {
            // No write under way: no record either, every one applied.
            meta.sb.journal.applied_seq = j.quiesce();
        }
        meta.sb.state = crate::superblock::ArrayState::Clean;
        // A failure leaves the flag cleared: the next write marks the
        // array dirty again, whatever reached the members.
        c.write_superblocks(&mut meta).is_ok()
    }

    /// Whether something besides writes keeps the array dirty.
    fn kept_dirty(&self) -> bool {
        self.recovery.parity_unfinished.load(Ordering::Acquire)
            || self.recovery.pending_parity.locked().is_some()
            || self.unsynced_from.load(Ordering::Acquire) != u64::MAX
            || self.core.window.is_open()
    }

    /// Periodic upkeep: clear the bitmap bits of idle regions when every
    /// member is in sync, mark an idle array clean, and fail members that
    /// stall. Returns how many bits were cleared.
    pub fn housekeeping(&self) -> u64 {
        self.core.check_stalls();
        self.core.check_slow();
        if self.core.read_only || !self.core.alive.load(Ordering::Acquire) {
            return 0;
        }
        if let Some(j) = &self.journal {
            // Records whose writes are done made known applied: after an
            // idle spell a crash leaves nothing to replay, so no crash
            // window at the next start takes blocks that disagree with
            // their checksums (rot since) as torn writes. A failure is met
            // again by the next write's checkpoint or flush.
            let _ = j.checkpoint_done(|seq| self.journal_checkpoint(seq));
        }
        self.mark_clean_if_idle();
        let Some(b) = &self.core.bitmap else { return 0 };
        let v = self.core.view.load_full();
        if !v.degraded_roles().is_empty() || v.roles.iter().any(|r| r.replacement.is_some()) {
            return 0; // bits must stay until every member has the writes
        }
        // The regions an unclean stop left marked are idle (nothing wrote
        // them in this run) but not consistent until the resync after it
        // has passed them: cleared before that, a crash in between would
        // leave their torn stripes unmarked. md clears a bit only once its
        // region is synced, for the same reason.
        if self.recovery.parity_unfinished.load(Ordering::Acquire) {
            return 0;
        }
        let members: Vec<_> = v.writable().iter().map(|d| d.member.clone()).collect();
        // Every write done so far durable before bits are cleared (the
        // bitmap is written durably by itself, with no flush of the data).
        // A write after this flush marks its region active, which keeps
        // its bit for another round. Flushed before the meta lock is
        // taken: a member failing the flush is failed under that lock. No
        // bit set: nothing to clear, and no flush either.
        if !b.any_set() {
            return 0;
        }
        if self.core.flush().is_err() {
            return 0;
        }
        // Lock order: meta before the bitmap's own lock, as everywhere.
        let (n, failed) = {
            let mut meta = self.core.meta.locked();
            // Again under the lock failures are recorded under: a member
            // lost since the test above (its link gone during the flush)
            // must find every bit it missed still set when it comes back.
            let now = self.core.view.load();
            if !now.degraded_roles().is_empty() || now.roles.iter().any(|r| r.replacement.is_some())
            {
                return 0;
            }
            b.clear_idle(&members, || {
                // The event count this update records (write_superblocks
                // raises it): a member copy from before it is older.
                meta.sb.bitmap.events_cleared = meta.sb.events + 1;
                let _ = self.core.write_superblocks(&mut meta);
            })
        };
        let ws = v.writable();
        for (i, e) in failed {
            self.core
                .fail_disk_by_ptr(&ws[i], &format!("writing the bitmap: {e}"));
        }
        n
    }
}
