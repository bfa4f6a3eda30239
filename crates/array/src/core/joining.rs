//! Members joining a running array: added (into a missing role or as a
//! spare), taken in by a reshape, or put beside a member to replace it.
//! Each is checked (not in service, large enough, blank or ours) and given
//! its superblock and layout before it is put in service.

use super::membership::{same_member, Added, Place};
use super::{Core, Disk, Meta, RoleView, SyncState, View};
use crate::error::{Error, Result};
use crate::events::{NewEvent, Severity};
use crate::superblock::{
    data_offset_for, member_layout_with, probe, write_superblock, ReshapePos, Role, RoleEntry,
    RoleState, Superblock, SB_SIZE,
};
use raidkit_layout::Geometry;
use raidkit_member::Locked;
use raidkit_member::Member;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uuid::Uuid;

impl Core {
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
                    let name = m.name().to_string();
                    let resync = self.return_to_role(&mut meta, v, r, m, msb)?;
                    // Added by hand while it was tried in the background.
                    self.forget_awaited(&name);
                    drop(meta);
                    self.returned(&name, r, resync, "back");
                    return Ok(Added::Role { role: r, resync });
                }
            }
        }
        let mut sb = self.new_member_sb(&meta, m.as_ref())?;
        self.init_member(m.as_ref(), &mut sb)?;
        let disk = Arc::new(Disk::new(m, sb, true));
        let name = disk.name().to_string();
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
        self.forget_awaited(&name);
        self.wake.kick();
        Ok(added)
    }

    /// The member that held role `r` coming back with its superblock `msb`
    /// (the caller checked that it is this array's and that the role
    /// waits for it): it takes the role again, resynced only where the
    /// bitmap says writes went while it was away, else rebuilt in full.
    /// Returns whether it is only resynced.
    pub(super) fn return_to_role(
        &self,
        meta: &mut Meta,
        mut v: View,
        r: usize,
        m: Arc<dyn Member>,
        msb: &Superblock,
    ) -> Result<bool> {
        let dirty = self.missed_writes(meta, msb);
        let resync = dirty.is_some();
        let disk = Arc::new(Disk::new(m, msb.clone(), true));
        self.enter_role(meta, &mut v, r, disk, dirty)?;
        self.commit(meta, v)?;
        Ok(resync)
    }

    /// Say that `name` is back in role `r` (`how`: what brought it back),
    /// and wake the background worker to resync or rebuild it.
    pub(super) fn returned(&self, name: &str, r: usize, resync: bool, how: &str) {
        self.emit(
            NewEvent::new(
                "MemberReturned",
                Severity::Info,
                format!(
                    "{how} in role {r}: {}",
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
