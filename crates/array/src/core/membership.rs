//! Membership changes on a running array: failing, removing and adding
//! members, hot spares taking over, and replacing a member while it stays in
//! service. Every change is recorded in the superblocks (event counter
//! raised) before the new set of members is put in service.

use super::{Core, Disk, Meta, RoleView, SyncState, View};
use crate::assemble::Absence;
use crate::error::{Error, Result};
use crate::events::{NewEvent, Severity};
use crate::superblock::{
    data_offset_for, member_layout_with, probe, write_superblock, ReshapePos, Role, RoleEntry,
    RoleState, Superblock, SB_SIZE,
};
use raidkit_layout::Geometry;
use raidkit_member::Locked;
use raidkit_member::Member;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Why a member whose link went is not taken back once the array failed.
const FAILED_WHILE_AWAY: &str = "the array failed, and a failed array takes no member back while it runs: stop it and start it again (when its members left at different times, the start refuses and says to add --force)";

/// What `add` did with a member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Added {
    /// Taken into a role and being rebuilt (`resync`: only the regions the
    /// bitmap marks).
    Role {
        role: usize,
        resync: bool,
    },
    Spare,
}

fn same_member(a: &str, b: &str) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    if a == b {
        return true;
    }
    if let (Ok(x), Ok(y)) = (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        if x == y {
            return true;
        }
    }
    // Other names of one file (hard links) or of one device (two device
    // nodes of it): the same member all the same.
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => {
            (x.dev(), x.ino()) == (y.dev(), y.ino())
                || (x.file_type().is_block_device()
                    && y.file_type().is_block_device()
                    && x.rdev() == y.rdev())
        }
        _ => false,
    }
}

/// Where a member named by the user sits.
enum Place {
    Role(usize),
    Replacement(usize),
    Spare(usize),
    Failed(usize),
}

/// One member's copy of the array-wide superblock `sb`, with the fields
/// that are its own. Kept as the member's once written, unless the writer
/// gave up on it meanwhile: the member was failed then, and may have been
/// added back with other fields since.
fn write_one(
    v: &View,
    role: usize,
    d: &Disk,
    mut sb: Superblock,
    rebuilding: bool,
    abandoned: &AtomicBool,
) -> Result<()> {
    {
        let own = d.sb.locked();
        sb.member_uuid = own.member_uuid;
        sb.domain = own.domain.clone();
        // Its own checksum area: a member that joined with another size
        // has it elsewhere, sized for its length (with the array's, the
        // next start read its checksums from a place that holds none, or
        // other bytes).
        sb.checksums = own.checksums;
        sb.recovery_offset = rebuilding.then(|| own.recovery_offset.unwrap_or(0));
        sb.data_offset = own.data_offset;
        sb.data_size = own.data_size;
        sb.seq = own.seq;
        // md's superblock of this member (its device number, its fields as
        // md wrote them), not the template's.
        sb.md = own.md.clone();
    }
    sb.role = Role::Active(role as u32);
    sb.replacing = !v.roles[role]
        .disk
        .as_ref()
        .is_some_and(|x| std::ptr::eq(Arc::as_ptr(x), d));
    d.sb_tried.fetch_max(sb.events, Ordering::AcqRel);
    // The member's own copy is not locked during the write: `status` reads
    // it, and a hung disk must not hang that.
    write_superblock(d.member.as_ref(), &mut sb)?;
    let mut own = d.sb.locked();
    if !abandoned.load(Ordering::Acquire) {
        *own = sb;
    }
    Ok(())
}

/// Write `sb` to each of `writes` (role, member, whether it is being
/// rebuilt) at once, on disks each costs seeks. Returns the members that
/// failed to take it, and those that had not within `limit`.
fn write_each(
    v: &Arc<View>,
    sb: &Superblock,
    writes: Vec<(usize, Arc<Disk>, bool)>,
    limit: Duration,
) -> Vec<(Arc<Disk>, Error)> {
    type Outcome = std::thread::Result<Result<()>>;
    let (tx, rx) = std::sync::mpsc::channel::<(usize, Outcome)>();
    let mut failed = Vec::new();
    let mut waiting = Vec::new();
    for (i, (role, d, rebuilding)) in writes.into_iter().enumerate() {
        let abandoned = Arc::new(AtomicBool::new(false));
        let (v2, sb2, d2, ab2, tx2) = (
            v.clone(),
            sb.clone(),
            d.clone(),
            abandoned.clone(),
            tx.clone(),
        );
        // Not a scoped thread: one that hangs in the kernel is left there.
        let spawned = std::thread::Builder::new()
            .name("superblock".into())
            .spawn(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    write_one(&v2, role, &d2, sb2, rebuilding, &ab2)
                }));
                // The member let go before the answer: a caller that
                // closes the array next finds its file no longer held.
                drop((v2, d2));
                let _ = tx2.send((i, r));
            });
        match spawned {
            Ok(_) => waiting.push(Some((d, abandoned))),
            Err(_) => {
                // A thread that cannot be had (the process is at its
                // limit) is no reason to stop: this copy is written here.
                if let Err(e) = write_one(v, role, &d, sb.clone(), rebuilding, &abandoned) {
                    d.write_errors.fetch_add(1, Ordering::Relaxed);
                    failed.push((d, e));
                }
                waiting.push(None);
            }
        }
    }
    drop(tx);
    // A remote member's write is bounded by its connection's own request
    // timeout (the member timeout), which fails it as disconnected, to be
    // resynced by bitmap when it comes back: only local ones are given up.
    let local_left = |w: &[Option<(Arc<Disk>, Arc<AtomicBool>)>]| {
        w.iter().flatten().any(|(d, _)| d.member.remote().is_none())
    };
    // An answer: the member off the waiting list, failed if it failed.
    fn take(
        waiting: &mut [Option<(Arc<Disk>, Arc<AtomicBool>)>],
        failed: &mut Vec<(Arc<Disk>, Error)>,
        i: usize,
        r: Outcome,
    ) {
        let (d, _) = waiting[i].take().expect("each writer answers once");
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                // A superblock write the member refused is one of its
                // write errors, as a data write's is.
                d.write_errors.fetch_add(1, Ordering::Relaxed);
                failed.push((d, e));
            }
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
    let deadline = Instant::now() + limit;
    let mut left = waiting.iter().flatten().count();
    while left > 0 {
        let got = if local_left(&waiting) {
            rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .ok()
        } else {
            rx.recv().ok()
        };
        let Some((i, r)) = got else {
            break;
        };
        left -= 1;
        take(&mut waiting, &mut failed, i, r);
    }
    for w in waiting.iter_mut() {
        let Some((d, abandoned)) = w.take_if(|(d, _)| d.member.remote().is_none()) else {
            continue;
        };
        abandoned.store(true, Ordering::Release);
        d.io.timeouts.fetch_add(1, Ordering::Relaxed);
        failed.push((
            d,
            Error::Invalid(format!(
                "not written within the member timeout ({:.1}s)",
                limit.as_secs_f64()
            )),
        ));
    }
    // The remote ones left, as long as their connections take.
    while waiting.iter().any(Option::is_some) {
        let Ok((i, r)) = rx.recv() else {
            break;
        };
        take(&mut waiting, &mut failed, i, r);
    }
    failed
}

impl Core {
    /// Write every role member's superblock from the array-wide state. A
    /// member that cannot take it is failed, and the others written again.
    /// A member that has not taken it within the member timeout is failed
    /// too, its write left to finish (or never) on its own thread: the
    /// meta lock is held meanwhile, and every writer, the stall watch
    /// and `status` would otherwise wait on one hung disk for good.
    pub(crate) fn write_superblocks(&self, meta: &mut Meta) -> Result<()> {
        meta.sb.utime = super::unix_now();
        loop {
            // Every update is an event (as md's md_update_sb): a copy of a
            // member taken before any later update is behind, so stale.
            // One update raises it by exactly one, so a crash in the middle
            // leaves members at most one behind, which assembly accepts.
            meta.sb.events += 1;
            self.sb_seen.store(Arc::new(meta.sb.clone()));
            let v = self.view.load_full();
            // A replacement too (raidkit's format: md's of this version
            // keeps it a spare on disk, rebuilt afresh after a restart),
            // so that a restart resumes it from where it got.
            let replacing = v.roles.iter().enumerate().filter_map(|(role, rv)| {
                let d = &rv.replacement.as_ref()?.0;
                d.sb.locked()
                    .md
                    .is_none()
                    .then_some((role, d.clone(), true))
            });
            let members = v
                .roles
                .iter()
                .enumerate()
                .filter_map(|(role, rv)| Some((role, rv.disk.clone()?, rv.sync.is_some())));
            let writes: Vec<(usize, Arc<Disk>, bool)> = members.chain(replacing).collect();
            let limit = Duration::from_nanos(self.timeout_ns.load(Ordering::Relaxed));
            let failed = write_each(&v, &meta.sb, writes, limit);
            if failed.is_empty() {
                return Ok(());
            }
            let mut changed = false;
            for (d, e) in failed {
                changed |= self.fail_locked(meta, &d, &format!("writing its superblock: {e}"));
            }
            if !changed {
                return Ok(());
            }
        }
    }

    /// Take `d` out of service (under the meta lock; the caller writes the
    /// superblocks). Returns false if it was not in service.
    pub(crate) fn fail_locked(&self, meta: &mut Meta, d: &Disk, why: &str) -> bool {
        let old = self.view.load_full();
        let mut v = View::clone(&old);
        let is = |x: &Arc<Disk>| std::ptr::eq(Arc::as_ptr(x), d);
        let mut place = None;
        for (r, rv) in v.roles.iter().enumerate() {
            if rv.disk.as_ref().is_some_and(is) {
                place = Some(Place::Role(r));
            } else if rv.replacement.as_ref().is_some_and(|x| is(&x.0)) {
                place = Some(Place::Replacement(r));
            }
        }
        if place.is_none() {
            place = v.spares.iter().position(is).map(Place::Spare);
        }
        // md's FailSpare: the member failed was not in sync yet (a spare
        // being rebuilt, a replacement) or was a spare.
        let mut spare = !matches!(place, Some(Place::Role(_)));
        let (disk, role) = match place {
            None | Some(Place::Failed(_)) => return false,
            Some(Place::Spare(i)) => (v.spares.remove(i), None),
            Some(Place::Replacement(r)) => {
                let (x, _) = v.roles[r].replacement.take().expect("replacement");
                (x, Some(r))
            }
            Some(Place::Role(r)) => {
                let rv = &mut v.roles[r];
                spare = rv.sync.is_some();
                let x = rv.disk.take().expect("disk");
                rv.sync = None;
                meta.sb.roles[r].state = RoleState::Faulty;
                if let Some((rep, sync)) = rv.replacement.take() {
                    // The member being replaced failed first: its
                    // replacement carries on as an ordinary rebuild.
                    rep.sb.locked().recovery_offset = Some(sync.cursor.load(Ordering::Acquire));
                    meta.sb.roles[r].member_uuid = rep.uuid;
                    meta.sb.roles[r].state = RoleState::Rebuilding;
                    rv.disk = Some(rep);
                    rv.sync = Some(sync);
                } else {
                    rv.absence = Some(Absence::Missing);
                }
                (x, Some(r))
            }
        };
        let lost = self.note_lost(&disk, !spare);
        // A replacement carrying the role on took it from this member.
        let held = role.filter(|&r| v.roles[r].disk.is_none());
        v.failed.push((disk.clone(), held, why.to_string()));
        let failed = !self.geom().survives(&v.degraded_roles());
        // A failed array answers nothing, so members whose link went do
        // not rejoin it while it runs: what it takes back (which stale
        // copies, which writes half done to replay or resync) is the
        // assembly's choice at the next start, as for md. They are failed
        // for good, and say so, rather than shown as coming back.
        let mut given_up = Vec::new();
        if failed {
            for f in v.failed.iter_mut() {
                if f.0.away.locked().take().is_some() {
                    f.2 = format!("{}; {FAILED_WHILE_AWAY}", f.2);
                    if !std::ptr::eq(Arc::as_ptr(&f.0), Arc::as_ptr(&disk)) {
                        given_up.push((f.0.clone(), f.1, f.2.clone()));
                    }
                }
            }
        }
        // The reason as recorded, with the note above if it applies.
        let why = v.failed.last().map_or(why.to_string(), |f| f.2.clone());
        match lost.filter(|_| !failed) {
            Some(lost) if !spare => {
                tracing::warn!(member = disk.name(), role, "member disconnected: {why}");
                self.emit(
                    NewEvent::new(
                        "Disconnected",
                        Severity::Warning,
                        format!(
                            "connection lost ({lost}): the array serves without it; it rejoins by itself if it is back within {}s",
                            self.rejoin_timeout().as_secs()
                        ),
                    )
                    .member(disk.name(), role),
                );
            }
            _ => {
                tracing::warn!(member = disk.name(), role, "member failed: {why}");
                self.emit(
                    NewEvent::new(
                        if spare { "FailSpare" } else { "Fail" },
                        Severity::Warning,
                        format!("failed: {why}"),
                    )
                    .member(disk.name(), role),
                );
            }
        }
        for (d, r, why) in given_up {
            tracing::warn!(member = d.name(), role = r, "member failed: {why}");
            self.emit(
                NewEvent::new("Fail", Severity::Warning, format!("failed: {why}"))
                    .member(d.name(), r),
            );
        }
        if failed {
            self.alive.store(false, Ordering::Release);
            tracing::error!("array '{}' has failed: too many members lost", self.name);
        }
        self.view.store(Arc::new(v));
        if failed {
            self.emit(NewEvent::new(
                "ArrayFailed",
                Severity::Critical,
                "too many members lost: the array cannot serve its data",
            ));
        } else if !spare {
            self.emit_degraded(&self.view.load());
        }
        true
    }

    /// DegradedArray, if the array is (with the roles that lack redundancy).
    pub(crate) fn emit_degraded(&self, v: &View) {
        let gone = v.degraded_roles();
        if gone.is_empty() || !self.geom().survives(&gone) {
            return;
        }
        let roles: Vec<String> = gone.iter().map(|r| r.to_string()).collect();
        self.emit(
            NewEvent::new(
                "DegradedArray",
                Severity::Warning,
                format!(
                    "the array is degraded: role(s) {} without an in-sync member",
                    roles.join(", ")
                ),
            )
            .data(serde_json::json!({ "roles": gone })),
        );
    }

    /// Fail a member found to be faulty by the I/O path.
    pub(crate) fn fail_disk_by_ptr(&self, d: &Disk, why: &str) {
        self.fail_disk_if(d, why, |_| true);
    }

    /// Fail `d` if `allowed` says so of the members as they are once the
    /// metadata lock is held: the look and the failure are one step, so
    /// two members failed at once each see the other gone (two members
    /// past their checksum limit within 2 ms both passed a survival check
    /// made before the lock, and a RAID-6 lost three).
    /// Whether it was allowed (a member already failed was).
    pub(crate) fn fail_disk_if(
        &self,
        d: &Disk,
        why: &str,
        allowed: impl FnOnce(&View) -> bool,
    ) -> bool {
        let changed = {
            let mut meta = self.meta.locked();
            if !allowed(&self.view.load()) {
                return false;
            }
            let changed = self.fail_locked(&mut meta, d, why);
            if changed {
                let _ = self.write_superblocks(&mut meta);
            }
            changed
        };
        if changed {
            let _ = self.use_spares();
            self.wake.kick();
        }
        true
    }

    /// Put spares into roles that have no member, to be rebuilt there.
    pub(crate) fn use_spares(&self) -> Result<()> {
        // During a reshape a role is not rebuilt: the spare waits for its end.
        if self.read_only || !self.alive.load(Ordering::Acquire) || self.is_reshaping() {
            return Ok(());
        }
        let mut meta = self.meta.locked();
        let mut v = View::clone(&self.view.load());
        let mut took = false;
        for r in 0..v.roles.len() {
            if v.roles[r].disk.is_some() || v.spares.is_empty() {
                continue;
            }
            let spare = v.spares.remove(0);
            self.enter_role(&mut meta, &mut v, r, spare, None)?;
            took = true;
        }
        if took {
            self.commit(&mut meta, v)?;
            self.wake.kick();
        }
        Ok(())
    }

    /// Record a new set of members: superblocks written (events raised).
    pub(super) fn commit(&self, meta: &mut Meta, v: View) -> Result<()> {
        self.view.store(Arc::new(v));
        self.write_superblocks(meta)
    }

    /// The regions a member coming back with superblock `msb` missed, if
    /// the bitmap knows them: it was in sync when it left, and every write
    /// since then is still marked (no bit was cleared after it left).
    /// None: it must be rebuilt in full.
    pub(super) fn missed_writes(
        &self,
        meta: &Meta,
        msb: &Superblock,
    ) -> Option<crate::bitmap::RegionSet> {
        let b = self.bitmap.as_ref()?;
        (msb.recovery_offset.is_none()
            && meta.sb.bitmap.events_cleared > 0
            && msb.events >= meta.sb.bitmap.events_cleared)
            .then(|| b.snapshot())
    }

    /// Put `disk` into role `r` to be rebuilt (fully, or only `dirty` regions).
    pub(super) fn enter_role(
        &self,
        meta: &mut Meta,
        v: &mut View,
        r: usize,
        disk: Arc<Disk>,
        dirty: Option<crate::bitmap::RegionSet>,
    ) -> Result<()> {
        {
            let mut own = disk.sb.locked();
            own.role = Role::Active(r as u32);
            own.recovery_offset = Some(0);
            own.data_size = meta.sb.roles[r].data_size;
        }
        if let Some(b) = &self.bitmap {
            b.write_to(disk.member.as_ref())?;
        }
        meta.sb.roles[r].member_uuid = disk.uuid;
        meta.sb.roles[r].state = RoleState::Rebuilding;
        v.failed
            .retain(|f| !(f.1 == Some(r) && f.0.uuid == disk.uuid));
        // The role's earlier members failed are its members no more: shown
        // without a role (and not tried back into it), so that the role
        // never shows one of them again once this one has gone.
        for f in v.failed.iter_mut().filter(|f| f.1 == Some(r)) {
            f.1 = None;
        }
        // Membership changes reach the log at the default level: an
        // administrator reading it afterwards must see every one.
        tracing::warn!(
            member = disk.name(),
            role = r,
            "member takes role {r} and is {}",
            if dirty.is_some() {
                "resynced where it missed writes"
            } else {
                "rebuilt"
            }
        );
        let rv = &mut v.roles[r];
        rv.disk = Some(disk);
        rv.sync = Some(SyncState::new(0, dirty));
        rv.absence = None;
        Ok(())
    }

    fn find(&self, v: &View, who: &str) -> Result<Place> {
        if let Ok(r) = who.parse::<usize>() {
            if r >= v.roles.len() {
                return Err(Error::Invalid(format!(
                    "there is no role {r}: the array has roles 0 to {}",
                    v.roles.len() - 1
                )));
            }
            if v.roles[r].disk.is_some() {
                return Ok(Place::Role(r));
            }
            // The role's most recent member (a role failed twice, its
            // first member never removed, has two).
            if let Some(i) = v.failed.iter().rposition(|f| f.1 == Some(r)) {
                return Ok(Place::Failed(i));
            }
            return Err(Error::Invalid(format!("role {r} has no member")));
        }
        for (r, rv) in v.roles.iter().enumerate() {
            if rv.disk.as_ref().is_some_and(|d| same_member(d.name(), who)) {
                return Ok(Place::Role(r));
            }
            if rv
                .replacement
                .as_ref()
                .is_some_and(|d| same_member(d.0.name(), who))
            {
                return Ok(Place::Replacement(r));
            }
        }
        if let Some(i) = v.spares.iter().position(|d| same_member(d.name(), who)) {
            return Ok(Place::Spare(i));
        }
        if let Some(i) = v.failed.iter().position(|f| same_member(f.0.name(), who)) {
            return Ok(Place::Failed(i));
        }
        Err(Error::Invalid(format!(
            "{who} is not a member of this array"
        )))
    }

    /// Mark a member faulty, as if it had failed. Refused if that would
    /// stop the array, unless `force`.
    pub fn fail_member(&self, who: &str, force: bool) -> Result<String> {
        self.check_writable()?;
        let v = self.view.load_full();
        let d = match self.find(&v, who)? {
            Place::Role(r) => {
                if !force && !self.geom().survives(&v.gone_with(r)) {
                    return Err(Error::Invalid(format!(
                        "failing role {r} would leave {} unable to serve (too many members gone); use --force to fail it anyway",
                        self.geom().level
                    )));
                }
                v.roles[r].disk.clone().expect("disk")
            }
            Place::Replacement(r) => v.roles[r].replacement.clone().expect("replacement").0,
            Place::Spare(i) => v.spares[i].clone(),
            Place::Failed(i) => {
                return Err(Error::Invalid(format!(
                    "{} has already failed",
                    v.failed[i].0.name()
                )))
            }
        };
        let name = d.name().to_string();
        // Looked at again under the lock: two members failed at once (two
        // `raidkit fail`, or one and the I/O path) must not both pass.
        let failed = self.fail_disk_if(&d, "failed by the administrator", |v| {
            force
                || v.role_of(&d)
                    .is_none_or(|r| v.geom.survives(&v.gone_with(r)))
        });
        if !failed {
            return Err(Error::Invalid(format!(
                "failing {name} would leave {} unable to serve (another member was lost meanwhile); use --force to fail it anyway",
                self.geom().level
            )));
        }
        Ok(name)
    }

    /// Let go of a failed member or a spare (it can then be taken away).
    pub fn remove_member(&self, who: &str) -> Result<String> {
        let _meta = self.meta.locked();
        let mut v = View::clone(&self.view.load());
        let d = match self.find(&v, who)? {
            Place::Failed(i) => v.failed.remove(i).0,
            Place::Spare(i) => v.spares.remove(i),
            Place::Role(r) | Place::Replacement(r) => {
                return Err(Error::Invalid(format!(
                    "{who} is in service in role {r}; fail it first (raidkit fail)"
                )))
            }
        };
        self.view.store(Arc::new(v));
        let _ = d.member.close();
        tracing::warn!(member = d.name(), "member removed");
        self.emit(
            NewEvent::new(
                "DeviceDisappeared",
                Severity::Info,
                "removed from the array",
            )
            .member(d.name(), None),
        );
        Ok(d.name().to_string())
    }

    fn check_writable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::Invalid("the array is served read-only".into()));
        }
        if !self.geom().level.has_redundancy() {
            return Err(Error::Invalid(format!(
                "{} has no redundancy: members cannot be failed, added or replaced",
                self.geom().level
            )));
        }
        Ok(())
    }

    /// Refuse a member the array already has in service, named as the
    /// user named it (`spec_text`) or by its file (`path`): to be asked
    /// before opening it (opening a member in service fails on its lock,
    /// with a less helpful message).
    pub fn check_not_in_service(&self, spec_text: &str, path: Option<&str>) -> Result<()> {
        Self::not_in_service(&self.view.load(), spec_text, path)
    }

    fn not_in_service(v: &View, spec_text: &str, path: Option<&str>) -> Result<()> {
        let in_service = v
            .writable()
            .iter()
            .chain(&v.spares)
            .chain(v.failed.iter().map(|f| &f.0))
            .any(|d| {
                same_member(d.name(), spec_text) || path.is_some_and(|p| same_member(d.name(), p))
            });
        if in_service {
            return Err(Error::Invalid(format!(
                "{spec_text} is already in the array (a failed member must be removed first: raidkit remove)"
            )));
        }
        Ok(())
    }

    /// Check a member to be added (not in service, big enough, blank or
    /// ours unless `force`), with its superblock if it has ours.
    fn prepare(
        &self,
        meta: &Meta,
        v: &View,
        m: Arc<dyn Member>,
        force: bool,
    ) -> Result<(Arc<dyn Member>, Option<Superblock>)> {
        Self::not_in_service(v, m.name(), None)?;
        let sb = &meta.sb;
        let ours = match probe(m.as_ref())? {
            Some(Ok(msb)) if msb.array_uuid == sb.array_uuid => Some(msb),
            _ => {
                crate::create::check_blank(m.as_ref(), force)?;
                None
            }
        };
        let need = sb.roles.iter().map(|r| r.data_size).max().unwrap_or(0);
        let off = joining_layout(sb, m.len()).0;
        // md's metadata takes its own room (`md::joining` checks it).
        if sb.md.is_none() && m.len() < off + need {
            return Err(Error::Invalid(format!(
                "{} is too small: {} bytes, but {off} bytes of metadata plus {need} bytes of data are needed",
                m.name(),
                m.len()
            )));
        }
        Ok((m, ours))
    }

    /// A fresh superblock for a member joining as a spare.
    fn new_member_sb(&self, meta: &Meta, m: &dyn Member) -> Result<Superblock> {
        let mut sb = meta.sb.clone();
        sb.seq = 0;
        sb.member_uuid = Uuid::new_v4();
        sb.domain = String::new();
        sb.role = Role::Spare;
        (sb.data_offset, sb.checksums) = joining_layout(&meta.sb, m.len());
        sb.data_size = meta.sb.roles.iter().map(|r| r.data_size).max().unwrap_or(0);
        sb.recovery_offset = None;
        if let Some(template) = &meta.sb.md {
            // md names members by device number: the new one gets a number
            // nobody in the array holds, and md's superblock of its own.
            let v = self.view.load();
            let held: Vec<Uuid> = meta
                .sb
                .roles
                .iter()
                .map(|r| r.member_uuid)
                .chain(v.spares.iter().map(|d| d.uuid))
                .chain(v.failed.iter().map(|f| f.0.uuid))
                .collect();
            let j =
                crate::metadata::md::joining(template, sb.array_uuid, &held, m.len(), m.name())?;
            sb.member_uuid = j.member_uuid;
            sb.data_offset = j.data_offset;
            sb.data_size = j.data_size;
            sb.md = Some(j.meta);
        }
        Ok(sb)
    }

    /// Blank a new member's metadata area and write its spare superblock.
    fn init_member(&self, m: &dyn Member, sb: &mut Superblock) -> Result<()> {
        if let Some(md) = &sb.md {
            // Neither raidkit's superblock copies of an earlier life
            // (found before md's) nor old bits of a bitmap may remain.
            m.write_at(&vec![0u8; 2 * SB_SIZE], 0)?;
            let used = sb.roles.iter().map(|r| r.data_size).max().unwrap_or(0);
            let regions = used.div_ceil(sb.bitmap.region.max(1));
            if let Some((at, len)) = crate::metadata::md::bitmap_extent(md, regions) {
                m.write_at(&vec![0u8; len as usize], at)?;
            }
            return write_superblock(m, sb);
        }
        let blank = vec![0u8; (sb.data_offset - 2 * SB_SIZE as u64).min(1 << 20) as usize];
        m.write_at(&blank, 2 * SB_SIZE as u64)?;
        raidkit_member::write_zeroes(m, sb.checksums.offset, sb.checksums.size)?;
        write_superblock(m, sb)
    }

    /// Add a member (opened by the caller: see the raidkit-open crate): it
    /// takes the place of a missing one (and is rebuilt, only where the
    /// bitmap says if it is that member coming back), or becomes a spare.
    pub fn add_member(&self, m: Arc<dyn Member>, force: bool) -> Result<Added> {
        self.check_writable()?;
        if !self.alive.load(Ordering::Acquire) {
            return Err(Error::Invalid(
                "the array has failed; stop it and start it again with the members back (--force if needed)".into(),
            ));
        }
        let mut meta = self.meta.locked();
        let mut v = View::clone(&self.view.load());
        let (m, ours) = self.prepare(&meta, &v, m, force)?;
        // During a reshape no role is rebuilt: a member added is a spare.
        let open_role = (0..v.roles.len())
            .find(|&r| v.roles[r].disk.is_none())
            .filter(|_| !self.is_reshaping());
        // The same member coming back to its role.
        if let Some(msb) = &ours {
            if let Role::Active(r) = msb.role {
                let r = r as usize;
                if v.roles[r].disk.is_none() && meta.sb.roles[r].member_uuid == msb.member_uuid {
                    let dirty = self.missed_writes(&meta, msb);
                    let resync = dirty.is_some();
                    let disk = Arc::new(Disk::new(m, msb.clone(), true));
                    let name = disk.name().to_string();
                    self.enter_role(&mut meta, &mut v, r, disk, dirty)?;
                    self.commit(&mut meta, v)?;
                    drop(meta);
                    self.emit(
                        NewEvent::new(
                            "MemberReturned",
                            Severity::Info,
                            format!(
                                "back in role {r}: {}",
                                if resync {
                                    "only the regions written while it was away are resynced"
                                } else {
                                    "rebuilt in full"
                                }
                            ),
                        )
                        .member(name, Some(r)),
                    );
                    self.wake.kick();
                    return Ok(Added::Role { role: r, resync });
                }
            }
        }
        let mut sb = self.new_member_sb(&meta, m.as_ref())?;
        self.init_member(m.as_ref(), &mut sb)?;
        let disk = Arc::new(Disk::new(m, sb, true));
        let added = match open_role {
            Some(r) => {
                self.enter_role(&mut meta, &mut v, r, disk, None)?;
                Added::Role {
                    role: r,
                    resync: false,
                }
            }
            None => {
                tracing::warn!(member = disk.name(), "member added as a spare");
                v.spares.push(disk);
                Added::Spare
            }
        };
        self.commit(&mut meta, v)?;
        drop(meta);
        self.wake.kick();
        Ok(added)
    }

    /// New members joining as new roles for a reshape to geometry `geom`
    /// (checked and initialised as any member added), recorded with the
    /// reshape's position in every superblock. Nothing is written to the
    /// array's members if a new one is refused.
    pub(crate) fn join_for_reshape(
        &self,
        members: Vec<Arc<dyn Member>>,
        geom: Arc<Geometry>,
        pos: ReshapePos,
        force: bool,
    ) -> Result<()> {
        let mut meta = self.meta.locked();
        let mut v = View::clone(&self.view.load());
        let mut prepared = Vec::new();
        for m in members {
            let (m, _) = self.prepare(&meta, &v, m, force)?;
            if prepared
                .iter()
                .any(|p: &Arc<dyn Member>| same_member(p.name(), m.name()))
            {
                return Err(Error::Invalid(format!("{} is given twice", m.name())));
            }
            prepared.push(m);
        }
        let data_size = meta.sb.roles.iter().map(|r| r.data_size).max().unwrap_or(0);
        // Every new member first gets the spare superblock of the array as
        // it is (the start update may be cut: assembly then finds them one
        // behind, with the old shape), then they all join at once.
        let mut disks = Vec::new();
        for m in prepared {
            let mut sb = self.new_member_sb(&meta, m.as_ref())?;
            self.init_member(m.as_ref(), &mut sb)?;
            let disk = Arc::new(Disk::new(m, sb, true));
            if let Some(b) = &self.bitmap {
                b.write_to(disk.member.as_ref())?;
            }
            disks.push(disk);
        }
        for disk in disks {
            meta.sb.roles.push(RoleEntry {
                member_uuid: disk.uuid,
                state: RoleState::Active,
                data_size,
            });
            v.roles.push(RoleView {
                disk: Some(disk),
                ..RoleView::default()
            });
        }
        v.geom = geom;
        meta.sb.reshape = Some(pos);
        self.set_reshaping(true);
        let r = self.commit(&mut meta, v);
        if r.is_err() {
            self.set_reshaping(false);
        }
        r
    }

    /// Start a change of chunk to `geom`'s: the new chunk and the reshape's
    /// position recorded in one superblock update (a crash in it leaves
    /// members one behind with the old chunk, which assembly accepts:
    /// nothing has moved yet). The caller holds requests off.
    pub(crate) fn begin_chunk_change(&self, geom: Arc<Geometry>, pos: ReshapePos) -> Result<()> {
        let mut meta = self.meta.locked();
        let before = (meta.sb.clone(), self.view.load_full());
        let mut v = View::clone(&before.1);
        meta.sb.chunk = geom.chunk;
        meta.sb.reshape = Some(pos);
        v.geom = geom;
        self.set_reshaping(true);
        let r = self.commit(&mut meta, v);
        if r.is_err() {
            self.set_reshaping(false);
            meta.sb.chunk = before.0.chunk;
            meta.sb.reshape = before.0.reshape;
            self.view.store(before.1);
        }
        r
    }

    /// The spare `name` takes a new last role of `geom` (one member more,
    /// every other byte where it was: RAID-5 to RAID-6 with Q on the new
    /// member) and is rebuilt there; the new shape and the one it came from
    /// are recorded in one superblock update. The caller holds requests
    /// off while the geometry changes.
    pub(crate) fn join_as_new_role(&self, name: &str, geom: Arc<Geometry>) -> Result<()> {
        let mut meta = self.meta.locked();
        let before = (meta.sb.clone(), self.view.load_full());
        let mut v = View::clone(&before.1);
        let i = v
            .spares
            .iter()
            .position(|d| same_member(d.name(), name))
            .ok_or_else(|| Error::Invalid(format!("{name} is not a spare of the array")))?;
        let disk = v.spares.remove(i);
        let data_size = meta.sb.roles.iter().map(|e| e.data_size).max().unwrap_or(0);
        meta.sb.roles.push(RoleEntry {
            member_uuid: disk.uuid,
            state: RoleState::Rebuilding,
            data_size,
        });
        v.roles.push(RoleView::default());
        meta.sb.converted_from = Some((meta.sb.level, meta.sb.layout, meta.sb.chunk));
        (meta.sb.level, meta.sb.layout, meta.sb.chunk) = (geom.level, geom.layout, geom.chunk);
        v.geom = geom;
        let r = v.roles.len() - 1;
        let done = self
            .enter_role(&mut meta, &mut v, r, disk, None)
            .and_then(|()| self.commit(&mut meta, v));
        if done.is_err() {
            // Not recorded: the array stays as the members say.
            meta.sb = before.0;
            self.view.store(before.1);
        }
        done
    }

    /// Whether `who` could be replaced now: the role it serves in. To be
    /// asked before opening the new member.
    pub fn check_replaceable(&self, who: &str) -> Result<usize> {
        self.check_writable()?;
        self.replaceable(&self.view.load(), who)
    }

    fn replaceable(&self, v: &View, who: &str) -> Result<usize> {
        if self.is_reshaping() {
            return Err(Error::Invalid(
                "a reshape is in progress: replace the member once it has ended (raidkit wait)"
                    .into(),
            ));
        }
        let r = match self.find(v, who)? {
            Place::Role(r) => r,
            _ => {
                return Err(Error::Invalid(format!(
                    "{who} is not in service in a role, so there is nothing to replace"
                )))
            }
        };
        if v.roles[r].sync.is_some() || v.roles[r].replacement.is_some() {
            return Err(Error::Invalid(format!(
                "role {r} is already being rebuilt; wait for it (raidkit wait)"
            )));
        }
        Ok(r)
    }

    /// Rebuild `who`'s contents onto a new member (opened by the caller)
    /// while `who` stays in service; when done the new member takes the
    /// role.
    pub fn replace_member(&self, who: &str, with: Arc<dyn Member>, force: bool) -> Result<usize> {
        self.check_writable()?;
        let mut meta = self.meta.locked();
        let mut v = View::clone(&self.view.load());
        let r = self.replaceable(&v, who)?;
        let (m, _) = self.prepare(&meta, &v, with, force)?;
        let mut sb = self.new_member_sb(&meta, m.as_ref())?;
        self.init_member(m.as_ref(), &mut sb)?;
        let disk = Arc::new(Disk::new(m, sb, true));
        if let Some(b) = &self.bitmap {
            b.write_to(disk.member.as_ref())?;
        }
        tracing::warn!(
            member = disk.name(),
            role = r,
            "member is rebuilt as the replacement of {who} in role {r}"
        );
        v.roles[r].replacement = Some((disk, SyncState::new(0, None)));
        self.view.store(Arc::new(v));
        // Recorded on every member (the new one says what it replaces), so
        // that a restart goes on with it rather than forget it.
        self.write_superblocks(&mut meta)?;
        drop(meta);
        self.wake.kick();
        Ok(r)
    }
}

/// Where a member of `len` bytes joining the array of `sb` keeps its data
/// and checksums: raidkit's default for its size, or more where the array
/// was made with a larger metadata area (`create --data-offset`), whose
/// bitmap and journal lie at the same offsets on every member.
fn joining_layout(sb: &Superblock, len: u64) -> (u64, crate::superblock::ChecksumArea) {
    let end = if sb.checksums.enabled() {
        sb.checksums.offset
    } else {
        sb.data_offset
    };
    let meta = data_offset_for(len).max(end.next_multiple_of(1 << 20));
    let (data, area) = member_layout_with(len, sb.checksums.enabled(), meta);
    if !area.enabled() || area.offset >= end {
        return (data, area);
    }
    // A member larger than those the array was made of gets a larger
    // checksum area, which carved from the end of the metadata area would
    // reach down into the journal (at the same offsets on every member):
    // each journal record overwrote checksums of the new member. An area
    // for the data the array holds per member fits where the others' are
    // (a later `--size max` that needs more is refused); failing that, it
    // goes after what the members share, the data later.
    let held = sb.roles.iter().map(|r| r.data_size).max().unwrap_or(0);
    let size = crate::metadata::checksums::area_size(held);
    let data = if meta >= end + size {
        meta
    } else {
        (end + size).next_multiple_of(1 << 20)
    };
    (
        data,
        crate::superblock::ChecksumArea {
            offset: data - size,
            size,
        },
    )
}
