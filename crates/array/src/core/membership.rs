//! Membership changes on a running array: failing and removing members,
//! hot spares taking over, and the superblock writes that record every
//! change (event counter raised) before the new set of members is put in
//! service. Members joining (added, replacing one) are in `joining`.

use super::{Core, Disk, Meta, SyncState, View};
use crate::assemble::Absence;
use crate::error::{Error, Result};
use crate::events::{NewEvent, Severity};
use crate::superblock::{write_superblock, Role, RoleState, Superblock};
use raidkit_member::Locked;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

pub(super) fn same_member(a: &str, b: &str) -> bool {
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
pub(super) enum Place {
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
            // Nor members not reached at start.
            let awaited = self.awaited.locked().members.clone();
            for a in awaited {
                if self.give_up_on(&a, FAILED_WHILE_AWAY) {
                    self.emit(
                        NewEvent::new("Fail", Severity::Warning, FAILED_WHILE_AWAY)
                            .member(&a.name, None),
                    );
                }
            }
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

    pub(super) fn find(&self, v: &View, who: &str) -> Result<Place> {
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
        // A member not reached at start: no longer tried.
        if let Some(name) = self.forget_awaited(who) {
            tracing::warn!(member = name, "member no longer awaited");
            self.emit(
                NewEvent::new(
                    "DeviceDisappeared",
                    Severity::Info,
                    "removed from the array (it had not been reached since the start)",
                )
                .member(&name, None),
            );
            return Ok(name);
        }
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

    pub(super) fn check_writable(&self) -> Result<()> {
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
}
