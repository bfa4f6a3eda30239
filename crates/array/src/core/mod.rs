//! The array's core: the members in service and their state, and every
//! call made to a member. It owns the [`View`] (which member serves each
//! role, which are rebuilding, spares, failed members), the array-wide
//! superblock and the write-intent bitmap, the stripe locks, and member I/O
//! with its stall watch, failure (recorded in the other members'
//! superblocks before the request that found it completes) and repair of a
//! bad block. Level logic (`crate::levels`), consistency (journal, resync)
//! and background processes (`crate::background`, `crate::recovery`) work
//! through it and never change a view or a superblock themselves.

pub(crate) mod checked;
mod io;
mod joining;
mod locks;
mod membership;
mod outstanding;
mod remote;
mod status;
mod window;

pub use io::{MemberIo, LATENCY_BOUNDS_US};
pub(crate) use locks::{locks_held, with_locks_held, StripeGuard};
pub use membership::Added;
pub use remote::{Reopen, DEFAULT_REJOIN_TIMEOUT};
pub use status::{MemberStatus, Slow};
pub(crate) use window::{CrashWindow, Healed};

use crate::assemble::{Absence, Health};
use crate::bitmap::{Bitmap, RegionSet};
use crate::error::{Error, Result};
use crate::scratch;
use crate::superblock::{ArrayState, RoleState, Superblock};
use arc_swap::ArcSwap;
use checked::Checked;
use raidkit_layout::Geometry;
use raidkit_member::{Locked, Member, MemberError};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Stripe locks: a fixed table hashed by stripe number keeps unrelated
/// stripes concurrent while serialising updates of the same stripe.
pub(crate) const LOCKS: usize = 1024;

/// Default time after which a member that has not completed an operation is failed.
pub const DEFAULT_MEMBER_TIMEOUT: Duration = Duration::from_secs(30);

/// A member in service (in a role, a spare, or failed and not yet removed).
#[derive(Debug)]
pub(crate) struct Disk {
    /// The member as the array uses it: checked (`checked`) when the
    /// array keeps checksums.
    pub member: Arc<dyn Member>,
    /// The same member with its checksum operations, if it has them.
    pub checked: Option<Arc<Checked>>,
    pub data_offset: u64,
    pub uuid: Uuid,
    /// I/O errors seen on it: reads and writes that failed.
    pub read_errors: AtomicU64,
    pub write_errors: AtomicU64,
    /// The member's own superblock as last written (role, seq, checkpoint).
    pub sb: Mutex<Superblock>,
    inflight: AtomicU32,
    /// Nanoseconds (on the array's clock) of the last start-from-idle or completion.
    progress_at: AtomicU64,
    /// When each operation under way started.
    outstanding: outstanding::Outstanding,
    /// What went through it: bytes, operations, latencies.
    pub io: io::IoCounters,
    /// When (array clock, ns) its last ChecksumError event went out.
    checksum_event_at: AtomicU64,
    /// Set while it is failed because its link was lost, and may rejoin.
    pub away: Mutex<Option<remote::Away>>,
    /// The highest event count of a superblock write sent to it, done or
    /// not: a link cut in the middle of one leaves the member with that
    /// count or the one before (`sb`'s), both its own.
    pub sb_tried: AtomicU64,
    /// On a spinning disk (see `Member::rotational`; None: not known):
    /// mirrored reads choose it by where its head is.
    pub rotational: Option<bool>,
    /// Where its head will be once the reads sent to it by the mirrored
    /// levels' balancing are done: the member offset the last one ends at.
    pub read_head: AtomicU64,
}

impl Disk {
    /// `writable`: the array may write it (not a read-only open).
    pub fn new(member: Arc<dyn Member>, sb: Superblock, writable: bool) -> Disk {
        let checked = sb.checksums.enabled().then(|| {
            Arc::new(Checked::new(
                member.clone(),
                sb.data_offset,
                sb.checksums,
                writable,
            ))
        });
        Disk {
            rotational: member.rotational(),
            read_head: AtomicU64::new(0),
            data_offset: sb.data_offset,
            uuid: sb.member_uuid,
            member: match &checked {
                Some(c) => c.clone(),
                None => member,
            },
            checked,
            read_errors: AtomicU64::new(0),
            write_errors: AtomicU64::new(0),
            sb: Mutex::new(sb),
            inflight: AtomicU32::new(0),
            progress_at: AtomicU64::new(0),
            outstanding: Default::default(),
            io: io::IoCounters::default(),
            checksum_event_at: AtomicU64::new(0),
            away: Mutex::new(None),
            sb_tried: AtomicU64::new(0),
        }
    }

    pub fn name(&self) -> &str {
        self.member.name()
    }

    /// Whether some operation on it is under way.
    pub(crate) fn busy(&self) -> bool {
        self.inflight.load(Ordering::Acquire) > 0
    }

    /// Make what was written to the device durable (its cache flushed),
    /// without writing back the checksum pages changed since the last
    /// full flush: for journal records, which cover the checksums of
    /// what they describe until a checkpoint (a full flush) retires them.
    pub fn flush_device(&self) -> raidkit_member::Result<()> {
        match &self.checked {
            Some(c) => c.flush_device(),
            None => self.member.flush(),
        }
    }

    /// Its error counters.
    pub fn errors(&self) -> ErrorCounts {
        ErrorCounts {
            read: self.read_errors.load(Ordering::Relaxed),
            write: self.write_errors.load(Ordering::Relaxed),
            checksum: self
                .checked
                .as_ref()
                .map_or(0, |c| c.mismatches.load(Ordering::Relaxed)),
            timeout: self.io.timeouts.load(Ordering::Relaxed),
        }
    }
}

/// A member's errors, as zpool status counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ErrorCounts {
    /// Reads that failed (I/O errors).
    pub read: u64,
    /// Writes that failed.
    pub write: u64,
    /// Blocks that disagreed with their checksum (each once until rewritten).
    pub checksum: u64,
    /// Operations that took longer than the member timeout.
    pub timeout: u64,
}

/// Rebuild progress of a disk: which part of its data area is in sync.
#[derive(Debug)]
pub(crate) struct SyncState {
    /// Device offsets below this are in sync.
    pub cursor: AtomicU64,
    /// For a resync after re-adding: only these regions were out of sync.
    pub dirty: Option<RegionSet>,
    /// Where this rebuild started (a checkpoint, or 0).
    pub start: u64,
}

impl SyncState {
    pub fn new(start: u64, dirty: Option<RegionSet>) -> Arc<SyncState> {
        Arc::new(SyncState {
            cursor: AtomicU64::new(start),
            dirty,
            start,
        })
    }

    fn readable(&self, dev: u64, len: u64) -> bool {
        dev + len <= self.cursor.load(Ordering::Acquire)
            || self
                .dirty
                .as_ref()
                .is_some_and(|d| !d.overlaps(dev.max(self.start), dev + len))
    }
}

/// What is in a role now.
#[derive(Debug, Clone, Default)]
pub(crate) struct RoleView {
    pub disk: Option<Arc<Disk>>,
    /// Set while `disk` is being rebuilt.
    pub sync: Option<Arc<SyncState>>,
    /// A member being rebuilt to take over from `disk` (replace).
    pub replacement: Option<(Arc<Disk>, Arc<SyncState>)>,
    /// Why there is no disk.
    pub absence: Option<Absence>,
}

/// The members in service, replaced as a whole on every change.
#[derive(Debug, Clone)]
pub(crate) struct View {
    /// The geometry requests through this view are placed by: the
    /// array's, or during a reshape the old one, for the part of the
    /// address space not yet moved (`crate::reshape`).
    pub geom: Arc<Geometry>,
    pub roles: Vec<RoleView>,
    pub spares: Vec<Arc<Disk>>,
    /// Failed members still open (until removed), with their role and why.
    pub failed: Vec<(Arc<Disk>, Option<usize>, String)>,
}

impl View {
    /// Roles whose data cannot be read from their own disk everywhere.
    pub fn degraded_roles(&self) -> Vec<usize> {
        (0..self.roles.len())
            .filter(|&r| self.roles[r].disk.is_none() || self.roles[r].sync.is_some())
            .collect()
    }

    /// The role `d` is the member of (not a replacement's or a spare's).
    pub fn role_of(&self, d: &Disk) -> Option<usize> {
        self.roles
            .iter()
            .position(|r| r.disk.as_ref().is_some_and(|x| std::ptr::eq(x.as_ref(), d)))
    }

    /// The roles gone if `role` went too: a role still rebuilding holds
    /// no redundancy yet, and is counted once.
    pub fn gone_with(&self, role: usize) -> Vec<usize> {
        let mut gone = self.degraded_roles();
        if !gone.contains(&role) {
            gone.push(role);
        }
        gone
    }

    /// Every member that takes writes: role disks and replacements.
    pub fn writable(&self) -> Vec<Arc<Disk>> {
        self.roles
            .iter()
            .flat_map(|r| r.disk.iter().chain(r.replacement.iter().map(|x| &x.0)))
            .cloned()
            .collect()
    }
}

pub(crate) struct Meta {
    /// The array-wide superblock content (role table, events, state).
    pub sb: Superblock,
}

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Wakes the background worker when there may be work (a member failed, a
/// spare or new member joined) and tells it to stop at close.
#[derive(Debug, Default)]
pub(crate) struct Wake {
    flags: Mutex<WakeFlags>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct WakeFlags {
    work: bool,
    stop: bool,
}

impl Wake {
    /// Something may need doing.
    pub fn kick(&self) {
        self.flags.locked().work = true;
        self.cv.notify_all();
    }

    /// Stop: background work ends at its next step, for good.
    pub fn stop(&self) {
        self.flags.locked().stop = true;
        self.cv.notify_all();
    }

    pub fn stopped(&self) -> bool {
        self.flags.locked().stop
    }

    /// Wait until kicked, stopped, or `poll()` (asked every `every`) says
    /// there is work. Returns false once stopped.
    pub fn wait(&self, every: Duration, poll: impl Fn() -> bool) -> bool {
        let mut f = self.flags.locked();
        while !f.stop && !f.work {
            f = self
                .cv
                .wait_timeout(f, every)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
            if !f.work && poll() {
                f.work = true;
            }
        }
        f.work = false;
        !f.stop
    }
}

/// The members of a running array, its metadata, and member I/O.
pub(crate) struct Core {
    pub name: String,
    /// What clients see: the geometry's capacity, or during a reshape
    /// the old geometry's until it ends.
    size: AtomicU64,
    pub view: ArcSwap<View>,
    pub meta: Mutex<Meta>,
    /// The superblock content last written (or being written): what
    /// reports show while the meta lock is held, by a superblock write
    /// waiting on a slow disk for instance.
    pub sb_seen: ArcSwap<Superblock>,
    /// Set once the superblocks say dirty (and record missing members);
    /// cleared again when an idle array is marked clean.
    pub write_ready: AtomicBool,
    /// Writes under way (each holds a `Writing`), writes begun in all, and
    /// when the last one ended (ns since `epoch`): when an idle array may
    /// be marked clean.
    writing: AtomicU64,
    writes_begun: AtomicU64,
    last_write_ns: AtomicU64,
    pub read_only: bool,
    locks: Box<[Mutex<()>]>,
    pub bitmap: Option<Bitmap>,
    /// Read errors cured by rewriting from redundancy.
    pub corrected: AtomicU64,
    epoch: Instant,
    timeout_ns: AtomicU64,
    /// How long a disconnected member may be away and still rejoin.
    rejoin_ns: AtomicU64,
    /// Cleared when the array fails: no member is written after that.
    pub alive: AtomicBool,
    /// The background worker's wake-up.
    pub wake: Wake,
    /// Where a crash may have torn data from its checksums.
    pub window: CrashWindow,
    /// Whether the array keeps checksums (the superblocks say).
    pub checksums: bool,
    /// Where its events go (the server's, shared by its arrays).
    pub events: Arc<crate::events::Events>,
    /// Set while a reshape runs: spares wait, no role is rebuilt.
    reshaping: AtomicBool,
    /// Remote members the array started without because their hosts did
    /// not answer, tried again in the background.
    pub(crate) awaited: Mutex<remote::Awaiting>,
}

impl Core {
    pub fn new(
        name: &str,
        view: View,
        sb: Superblock,
        bitmap: Option<Bitmap>,
        opts: &crate::engine::OpenOptions,
    ) -> Core {
        let (read_only, member_timeout) = (opts.read_only, opts.member_timeout);
        let events = opts.events.clone().unwrap_or_default();
        let checksums = sb.checksums.enabled();
        Core {
            name: name.to_string(),
            size: AtomicU64::new(view.geom.capacity()),
            view: ArcSwap::from_pointee(view),
            sb_seen: ArcSwap::from_pointee(sb.clone()),
            meta: Mutex::new(Meta { sb }),
            write_ready: AtomicBool::new(false),
            writing: AtomicU64::new(0),
            writes_begun: AtomicU64::new(0),
            last_write_ns: AtomicU64::new(0),
            read_only,
            locks: (0..LOCKS).map(|_| Mutex::new(())).collect(),
            bitmap,
            corrected: AtomicU64::new(0),
            epoch: Instant::now(),
            timeout_ns: AtomicU64::new(member_timeout.as_nanos() as u64),
            rejoin_ns: AtomicU64::new(opts.rejoin_timeout.as_nanos() as u64),
            alive: AtomicBool::new(true),
            wake: Wake::default(),
            window: CrashWindow::default(),
            checksums,
            events,
            reshaping: AtomicBool::new(false),
            awaited: Mutex::new(remote::Awaiting::default()),
        }
    }

    /// Send an event of this array.
    pub(crate) fn emit(&self, e: crate::events::NewEvent) {
        self.events.emit(&self.name, e);
    }

    pub fn capacity(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    /// Export `bytes` from now on (a reshape grew the array).
    pub(crate) fn set_capacity(&self, bytes: u64) {
        self.size.store(bytes, Ordering::Release);
    }

    pub(crate) fn set_reshaping(&self, on: bool) {
        self.reshaping.store(on, Ordering::Release);
    }

    pub(crate) fn is_reshaping(&self) -> bool {
        self.reshaping.load(Ordering::Acquire)
    }

    /// The array's geometry (the new one while a reshape runs).
    pub fn geom(&self) -> Arc<Geometry> {
        self.view.load().geom.clone()
    }

    /// Whether every member is present, some redundancy is lost, or data is.
    pub fn health(&self) -> Health {
        if !self.alive.load(Ordering::Acquire) {
            return Health::Failed;
        }
        let missing = self.view.load().degraded_roles();
        if missing.is_empty() {
            Health::Optimal
        } else if self.geom().survives(&missing) {
            Health::Degraded
        } else {
            Health::Failed
        }
    }

    pub fn member_timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_ns.load(Ordering::Relaxed))
    }

    pub fn set_member_timeout(&self, t: Duration) {
        self.timeout_ns
            .store(t.as_nanos() as u64, Ordering::Relaxed);
    }

    pub(crate) fn check(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.capacity() => Ok(()),
            _ => Err(Error::OutOfRange {
                offset,
                len,
                size: self.capacity(),
            }),
        }
    }

    pub(crate) fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Run one member operation, keeping the stall watch up to date.
    pub(crate) fn timed<T>(
        &self,
        d: &Disk,
        f: impl FnOnce() -> std::result::Result<T, MemberError>,
    ) -> std::result::Result<T, MemberError> {
        self.timed_all(&[d], f)
    }

    /// Run an operation on several members at once (a zero-copy read over
    /// them), keeping the stall watch of each up to date.
    pub(crate) fn timed_all<T, E>(
        &self,
        ds: &[&Disk],
        f: impl FnOnce() -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        let t = Instant::now();
        let at = t.saturating_duration_since(self.epoch).as_nanos() as u64;
        // At most a few members (a read over all of them): no allocation.
        let mut slots = [outstanding::Slot::default(); 8];
        for (i, d) in ds.iter().enumerate() {
            if d.inflight.fetch_add(1, Ordering::AcqRel) == 0 {
                d.progress_at.store(at, Ordering::Release);
            }
            if let Some(s) = slots.get_mut(i) {
                *s = d.outstanding.enter(at);
            }
        }
        let r = f();
        let took = t.elapsed().as_nanos() as u64;
        for (i, d) in ds.iter().enumerate() {
            if let Some(&s) = slots.get(i) {
                d.outstanding.leave(s);
            }
            d.progress_at.store(self.now_ns(), Ordering::Release);
            d.inflight.fetch_sub(1, Ordering::AcqRel);
            d.io.took(took);
        }
        let limit = self.timeout_ns.load(Ordering::Relaxed);
        if r.is_ok() && took > limit {
            for d in ds {
                d.io.timeouts.fetch_add(1, Ordering::Relaxed);
            }
            let why = format!(
                "an operation took {:.1}s (member timeout {:.1}s)",
                t.elapsed().as_secs_f64(),
                limit as f64 / 1e9
            );
            for d in ds {
                self.fail_disk_by_ptr(d, &why);
            }
        }
        r
    }

    /// Fail members that have had an operation outstanding, with nothing
    /// completing, for longer than the member timeout. Returns their names.
    pub fn check_stalls(&self) -> Vec<String> {
        let limit = self.timeout_ns.load(Ordering::Relaxed);
        let now = self.now_ns();
        let v = self.view.load();
        let mut failed = Vec::new();
        for d in v.writable() {
            let quiet = d.inflight.load(Ordering::Acquire) > 0
                && now.saturating_sub(d.progress_at.load(Ordering::Acquire)) > limit;
            let waiting = d
                .outstanding
                .oldest()
                .map(|t| now.saturating_sub(t))
                .filter(|&w| w > limit);
            if quiet || waiting.is_some() {
                let why = match waiting {
                    // Others on it may complete meanwhile: a sector the
                    // disk retries while it serves its other commands.
                    Some(w) if !quiet => format!(
                        "an operation outstanding for {:.1}s (member timeout {:.1}s)",
                        w as f64 / 1e9,
                        limit as f64 / 1e9
                    ),
                    _ => format!(
                        "no operation completed for {:.1}s (member timeout)",
                        limit as f64 / 1e9
                    ),
                };
                // A remote member's connection is dropped, so that the
                // requests waiting on it fail now (and it may come back).
                if let Some(link) = d.member.remote() {
                    link.cut(&why);
                }
                self.fail_disk_by_ptr(&d, &why);
                failed.push(d.name().to_string());
            }
        }
        failed
    }

    /// Whether `role` can serve reads of device range `[dev, dev+len)`.
    pub(crate) fn readable(v: &View, role: usize, dev: u64, len: u64) -> Option<&Arc<Disk>> {
        let rv = &v.roles[role];
        let d = rv.disk.as_ref()?;
        match &rv.sync {
            Some(s) if !s.readable(dev, len) => None,
            _ => Some(d),
        }
    }

    /// Read from `role`. None: the role cannot serve this range.
    pub(crate) fn member_read(
        &self,
        v: &View,
        role: usize,
        buf: &mut [u8],
        dev: u64,
    ) -> Option<std::result::Result<(), MemberError>> {
        let d = Self::readable(v, role, dev, buf.len() as u64)?;
        Some(self.disk_read(d, buf, dev))
    }

    /// Read the runs `(dev, buf)` from `role` together (see
    /// [`Member::read_runs`]). Not read where they cannot be read so: the
    /// role cannot serve one of them, one lies in a crash window, or the
    /// read failed; nothing is counted then, and the caller reads them as
    /// any read (which counts, heals, reconstructs and fails members).
    /// Checksum mismatches the read found are counted by the checksum
    /// layer, once per block whoever reads it again.
    pub(crate) fn member_read_runs(
        &self,
        v: &View,
        role: usize,
        runs: &mut [(u64, &mut [u8])],
    ) -> RunsRead {
        let Some(d) = v.roles[role].disk.as_ref() else {
            return RunsRead::Not;
        };
        for (dev, buf) in runs.iter() {
            let len = buf.len() as u64;
            if Self::readable(v, role, *dev, len).is_none()
                || (d.checked.is_some() && self.window.covers(*dev, len))
            {
                return RunsRead::Not;
            }
        }
        let mut at: crate::engine::Small<(u64, &mut [u8])> = runs
            .iter_mut()
            .map(|(dev, buf)| (d.data_offset + *dev, &mut **buf))
            .collect();
        match self.timed(d, || d.member.read_runs(&mut at)) {
            Ok(()) => {
                d.io.read(at.iter().map(|r| r.1.len()).sum());
                RunsRead::Read
            }
            Err(e) if checked::is_mismatch(&e) => RunsRead::Not,
            Err(_) => RunsRead::IoError(d.clone()),
        }
    }

    /// Read from a member's data area at `dev`: checked against its
    /// checksums (adopting them within a crash window), timed, and its
    /// I/O errors counted.
    pub(crate) fn disk_read(
        &self,
        d: &Disk,
        buf: &mut [u8],
        dev: u64,
    ) -> std::result::Result<(), MemberError> {
        let at = d.data_offset + dev;
        let r = match &d.checked {
            Some(c) if self.window.covers(dev, buf.len() as u64) => {
                // The heal reads other members and the adoption may wait
                // for a write in flight: neither counts against this
                // member's timer, only its own reads do.
                self.timed(d, || c.read_window(buf, at)).and_then(|bad| {
                    let mut heal = |off, blk: &mut [u8]| self.window_heal(d, off, blk);
                    let mut torn = |off, _: &mut [u8]| self.window_torn(d, off);
                    let heal: Option<checked::Heal<'_>> = match self.window.heals() {
                        true => Some(&mut heal),
                        false => Some(&mut torn),
                    };
                    let reread = |blk: &mut [u8], off| self.timed(d, || c.read_raw(blk, off));
                    c.settle(buf, at, &bad, heal, &reread)
                })
            }
            _ => self.timed(d, || d.member.read_at(buf, at)),
        };
        d.io.read(buf.len());
        if let Err(e) = &r {
            if checked::is_mismatch(e) {
                self.checksum_event(d, e);
            }
            if !checked::is_mismatch(e) {
                d.read_errors.fetch_add(1, Ordering::Relaxed);
            } else {
                self.fail_if_rotting(d);
            }
        }
        r
    }

    /// Fail `d` if it has had checksum errors at `MISMATCH_LIMIT` places
    /// within `MISMATCH_WINDOW` (a client's read or a scrub found them),
    /// where the array survives it.
    pub(crate) fn fail_if_rotting(&self, d: &Disk) {
        if d.checked.as_ref().is_some_and(|c| c.past_limit()) {
            self.fail_if_survivable(
                d,
                &format!(
                    "checksum errors at {} places within {} s",
                    checked::MISMATCH_LIMIT,
                    checked::MISMATCH_WINDOW.as_secs()
                ),
            );
        }
    }

    /// A ChecksumError event for a block found rotten on `d`, at most one
    /// per member every `CHECKSUM_EVENT_EVERY` (a scrub of a rotten disk
    /// must not start a program per block; the counters count them all).
    fn checksum_event(&self, d: &Disk, e: &MemberError) {
        const CHECKSUM_EVENT_EVERY: u64 = 10_000_000_000;
        let now = self.now_ns().max(1);
        let last = d.checksum_event_at.load(Ordering::Relaxed);
        if last != 0 && now - last < CHECKSUM_EVENT_EVERY {
            return;
        }
        if d.checksum_event_at
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let role = self.view.load().role_of(d);
        self.emit(
            crate::events::NewEvent::new(
                "ChecksumError",
                crate::events::Severity::Warning,
                e.source.to_string(),
            )
            .member(d.name(), role)
            .data(serde_json::json!({
                "member_offset": e.offset,
                "checksum_errors": d.errors().checksum,
            })),
        );
    }

    /// Fail a member that keeps going bad, unless the array could not
    /// serve without it (its good blocks are then better than none).
    fn fail_if_survivable(&self, d: &Disk, why: &str) {
        self.fail_disk_if(d, why, |v| {
            v.role_of(d)
                .is_some_and(|role| v.geom.survives(&v.gone_with(role)))
        });
    }

    /// Write to a member's data area at `dev`, timed, its errors counted.
    pub(crate) fn disk_write(
        &self,
        d: &Disk,
        buf: &[u8],
        dev: u64,
    ) -> std::result::Result<(), MemberError> {
        let r = self.timed(d, || d.member.write_at(buf, d.data_offset + dev));
        d.io.wrote(buf.len());
        if r.is_err() {
            d.write_errors.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// Write to every member of `role` (its disk and any replacement). A
    /// member that fails the write is failed; the write as a whole fails
    /// only if that leaves the array unable to serve.
    pub(crate) fn member_write(&self, v: &View, role: usize, buf: &[u8], dev: u64) -> Result<()> {
        let rv = &v.roles[role];
        for d in rv.disk.iter().chain(rv.replacement.iter().map(|x| &x.0)) {
            if let Err(e) = self.disk_write(d, buf, dev) {
                self.fail_disk_by_ptr(d, &e.to_string());
            }
        }
        self.ensure_alive(dev)
    }

    /// Discard `[dev, dev + len)` of every member of `role` (it reads back
    /// zeroes after), failing a member that cannot, as `member_write`.
    pub(crate) fn member_discard(&self, v: &View, role: usize, dev: u64, len: u64) -> Result<()> {
        let rv = &v.roles[role];
        for d in rv.disk.iter().chain(rv.replacement.iter().map(|x| &x.0)) {
            if let Err(e) = self.timed(d, || d.member.discard(d.data_offset + dev, len)) {
                self.fail_disk_by_ptr(d, &e.to_string());
            }
        }
        self.ensure_alive(dev)
    }

    pub(crate) fn ensure_alive(&self, dev: u64) -> Result<()> {
        if self.alive.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(Error::Unavailable {
                offset: dev,
                detail: format!(
                    "array '{}' has failed: too many members are gone",
                    self.name
                ),
            })
        }
    }

    /// The members in service, loaded again once a write holds its
    /// stripe (or chunk) lock. The view the write started with may be
    /// older than a rebuild that has since passed this stripe under the
    /// same lock: a member added meanwhile, already rebuilt here, would
    /// miss the write (left stale, and the stripe's redundancy
    /// inconsistent). Under the lock the rebuild cannot pass it, so the
    /// view now is the one to write to.
    ///
    /// `like`: the view the request started with; the one returned places
    /// by the same geometry (the old one, for a request a reshape has not
    /// reached).
    pub(crate) fn view_under_lock(&self, like: &View) -> Arc<View> {
        let v = self.view.load_full();
        if Arc::ptr_eq(&v.geom, &like.geom) {
            v
        } else {
            Arc::new(View {
                geom: like.geom.clone(),
                ..(*v).clone()
            })
        }
    }

    /// Every role served by its own member, in sync, nothing being
    /// replaced: full-stripe updates may then log their intent only.
    pub(crate) fn whole(v: &View) -> bool {
        v.roles
            .iter()
            .all(|r| r.disk.is_some() && r.sync.is_none() && r.replacement.is_none())
    }

    /// Whether `role` has a member that takes writes.
    pub(crate) fn writable(v: &View, role: usize) -> bool {
        v.roles[role].disk.is_some() || v.roles[role].replacement.is_some()
    }

    /// Whether `data`, rebuilt for `role` at `dev`, agrees with the
    /// checksums that role's member recorded (members without any agree).
    /// A checksum entry that is itself what went bad (the member holds
    /// exactly `data`) is recorded afresh.
    /// Whether a block of `role`'s `[dev, dev + len)` is one a rebuild
    /// could not make (marked lost: it reads as an error until written).
    pub(crate) fn lost_in(&self, v: &View, role: usize, dev: u64, len: u64) -> bool {
        let Some((c, base)) = v.roles[role]
            .disk
            .as_ref()
            .and_then(|d| d.checked.as_ref().map(|c| (c, d.data_offset)))
        else {
            return false;
        };
        let first = dev / crate::checksums::BLOCK * crate::checksums::BLOCK;
        (first..dev + len)
            .step_by(crate::checksums::BLOCK as usize)
            .any(|at| c.is_lost(base + at).unwrap_or(false))
    }

    pub(crate) fn agrees(&self, v: &View, role: usize, data: &[u8], dev: u64) -> bool {
        let Some(d) = v.roles[role].disk.as_ref() else {
            return true;
        };
        let Some(c) = &d.checked else {
            return true;
        };
        let at = d.data_offset + dev;
        match c.agrees(data, at) {
            Ok(true) => return true,
            Ok(false) => {}
            // The member's checksums cannot be read (it is going or gone):
            // nothing to check the rebuild against, and what it was built
            // from was itself verified.
            Err(_) => return true,
        }
        let mut raw = scratch::take(data.len());
        let same = c.read_raw(&mut raw, at).is_ok() && raw == data;
        scratch::give(raw);
        same && c.adopt(at, data.len() as u64).is_ok()
    }

    /// Rewrite a block that failed to read with its contents rebuilt from
    /// redundancy, then read it back (as md does); fail the member if that
    /// does not work.
    pub(crate) fn repair(&self, v: &View, role: usize, good: &[u8], dev: u64) {
        let Some(d) = v.roles[role].disk.as_ref() else {
            return;
        };
        if self.read_only {
            // Served from redundancy; the block is left for a writable start.
            return;
        }
        let at = d.data_offset + dev;
        let mut back = scratch::take(good.len());
        let ok = self
            .disk_write(d, good, dev)
            .and_then(|()| self.timed(d, || d.member.read_at(&mut back, at)));
        match ok {
            Ok(()) if back == good => {
                self.corrected.fetch_add(1, Ordering::Relaxed);
            }
            Ok(()) => self.fail_disk_by_ptr(d, "a rewritten block read back different"),
            Err(e) => self.fail_disk_by_ptr(d, &format!("read error not cured by rewriting: {e}")),
        }
        scratch::give(back);
    }

    /// Flush every member in service.
    pub fn flush(&self) -> Result<()> {
        let v = self.view.load();
        // Every member at once: a flush waits for the slowest device, not
        // for the sum of them (a journal checkpoint holds writers meanwhile).
        let _ = crate::engine::in_parallel(v.writable(), |d| {
            if let Err(e) = self.timed(&d, || d.member.flush()) {
                self.fail_disk_by_ptr(&d, &e.to_string());
            }
            Ok(())
        });
        self.ensure_alive(0)
    }

    /// Before the first write: record that the array is dirty and which
    /// roles are absent (raising the event counter), so that a member that
    /// missed these writes is known to be stale when it comes back.
    pub(crate) fn begin_write(&self) -> Result<Writing<'_>> {
        if self.read_only {
            return Err(Error::Invalid("the array is open read-only".into()));
        }
        // Counted before the flag is looked at, both sequentially
        // consistent: an idle marking (`mark_clean_if_idle`) that clears
        // the flag either sees this write under way and gives up, or this
        // write sees the flag cleared and marks the array dirty again.
        self.writing.fetch_add(1, Ordering::SeqCst);
        self.writes_begun.fetch_add(1, Ordering::SeqCst);
        let w = Writing(self);
        if self.write_ready.load(Ordering::SeqCst) {
            return Ok(w);
        }
        let mut meta = self.meta.locked();
        if self.write_ready.load(Ordering::SeqCst) {
            return Ok(w);
        }
        let v = self.view.load();
        for (role, rv) in v.roles.iter().enumerate() {
            if rv.disk.is_none() && meta.sb.roles[role].state == RoleState::Active {
                meta.sb.roles[role].state = RoleState::Removed;
            }
        }
        meta.sb.state = ArrayState::Dirty;
        self.write_superblocks(&mut meta)?;
        self.write_ready.store(true, Ordering::SeqCst);
        Ok(w)
    }

    /// Whether no write is under way, none has begun since `begun` was
    /// taken (`writes_begun`), and the last ended at least `idle` ago.
    pub(crate) fn idle_since(&self, begun: u64, idle: Duration) -> bool {
        let last = Duration::from_nanos(self.last_write_ns.load(Ordering::SeqCst));
        self.writing.load(Ordering::SeqCst) == 0
            && self.writes_begun.load(Ordering::SeqCst) == begun
            && self.epoch.elapsed().saturating_sub(last) >= idle
    }

    pub(crate) fn writes_begun(&self) -> u64 {
        self.writes_begun.load(Ordering::SeqCst)
    }
}

/// A write under way (see `Core::begin_write`): the array stays marked
/// dirty while one is held.
pub(crate) struct Writing<'a>(&'a Core);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let c = self.0;
        c.last_write_ns
            .store(c.epoch.elapsed().as_nanos() as u64, Ordering::SeqCst);
        c.writing.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What [`Core::member_read_runs`] did.
pub(crate) enum RunsRead {
    /// Every run read.
    Read,
    /// Not read that way; nothing to count.
    Not,
    /// The member returned an I/O error: the caller reads the runs as any
    /// read, and counts this error if those reads meet none (a sector that
    /// reads on a retry is still a disk's error, as a pool's status counts
    /// it).
    IoError(Arc<Disk>),
}
