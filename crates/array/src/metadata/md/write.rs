//! md superblocks written: new ones (`create --metadata md`, a member
//! joining an md array) and every change of state, md's way.

use super::*;

/// Where mdadm (4.2, metadata 1.2) starts the data on a member of `len`
/// bytes: room to reshape ("headroom", 128 MiB, halved while 1024 times it
/// exceeds the member) plus 1 MiB for the superblock and bad-block log,
/// in whole MiB. Measured against mdadm in the test VM: 64 MiB and 256 MiB
/// members 1 MiB, 1 GiB 2 MiB, 4 GiB 5 MiB, 16 GiB 17 MiB, 64 GiB 65 MiB,
/// from 128 GiB on 129 MiB.
pub fn md_data_offset(len: u64) -> u64 {
    let sectors = len / SECTOR;
    let mut headroom: u64 = 128 * 1024 * 2;
    while (headroom << 10) > sectors && headroom > 1 {
        headroom >>= 1;
    }
    (headroom / 2048 + 1) * 2048 * SECTOR
}

/// What a new md v1.2 member's superblock says.
#[derive(Debug)]
pub struct NewMember<'a> {
    pub array_uuid: Uuid,
    pub name: &'a str,
    pub level: Level,
    pub layout: Layout,
    pub chunk: u64,
    pub raid_disks: u32,
    /// Devices in all, spares included: the role table's length.
    pub devices: u32,
    /// Bytes of each member the array uses.
    pub used: u64,
    pub dev_number: u32,
    pub data_offset: u64,
    pub data_size: u64,
    pub ctime: u64,
}

/// A new member's md v1.2 superblock, as mdadm --create writes one (the
/// state fields are written by `write_md` from the raidkit superblock).
pub fn new_v12(m: &NewMember<'_>) -> MdMeta {
    let mut b = vec![0u8; 4096];
    put32(&mut b, 0, MD_MAGIC);
    put32(&mut b, 4, 1);
    b[16..32].copy_from_slice(m.array_uuid.as_bytes());
    let name = m.name.as_bytes();
    let n = name.len().min(32);
    b[32..32 + n].copy_from_slice(&name[..n]);
    put64(&mut b, 64, m.ctime & 0xff_ffff_ffff);
    put32(&mut b, 72, m.level.md_number() as u32);
    put32(&mut b, 76, m.layout.md_number());
    put64(&mut b, 80, m.used / SECTOR);
    // Mirrors and linear arrays have no chunk in md.
    let chunk = if matches!(m.level, Level::Raid1 | Level::Linear) {
        0
    } else {
        m.chunk / SECTOR
    };
    put32(&mut b, 88, chunk as u32);
    put32(&mut b, 92, m.raid_disks);
    put64(&mut b, 128, m.data_offset / SECTOR);
    put64(&mut b, 136, m.data_size / SECTOR);
    put64(&mut b, 144, 8);
    put32(&mut b, 160, m.dev_number);
    b[168..184].copy_from_slice(Uuid::new_v4().as_bytes());
    put64(&mut b, 208, MAX_SECTOR);
    put32(&mut b, 220, m.devices);
    for d in 0..m.devices {
        let role: u16 = if d < m.raid_disks { d as u16 } else { 0xffff };
        let at = 256 + 2 * d as usize;
        b[at..at + 2].copy_from_slice(&role.to_le_bytes());
    }
    MdMeta {
        version: MdVersion::V1_2,
        sb_offset: 8 * SECTOR,
        dev_number: m.dev_number,
        bitmap: None,
        raw: b,
    }
}

/// A member joining an md v1 array (as `mdadm --add` makes one).
#[derive(Debug)]
pub struct Joining {
    pub meta: MdMeta,
    pub member_uuid: Uuid,
    pub data_offset: u64,
    pub data_size: u64,
}

/// md's superblock for a member of `len` bytes joining the array whose
/// member's superblock is `template`, as a spare (`write_md` then records
/// the role it takes): the template's with a device number no member of
/// the array holds (`held`: the member uuids of the roles and spares), a
/// new device uuid, its own offsets, no recovery, no bad blocks; 1.1 and
/// 1.2 keep the template's data offset, 1.0 keeps its reserved space
/// before the superblock at the member's end. Its bitmap superblock lies
/// where the template's does, relative to its superblock.
pub fn joining(
    template: &MdMeta,
    array: Uuid,
    held: &[Uuid],
    len: u64,
    name: &str,
) -> Result<Joining> {
    if template.version == MdVersion::V0_90 {
        return Err(Error::Invalid(format!(
            "{name}: the array has md 0.90 metadata, which raidkit does not write (nothing was written)"
        )));
    }
    let t = &template.raw;
    let max_dev = u32_at(t, 220);
    let in_use: Vec<u32> = held.iter().filter_map(|u| dev_of(array, *u)).collect();
    // md writes 0xffff for numbers nobody holds and for spares; numbers
    // of members md or raidkit failed (0xfffe) are not reused, so that
    // such a disk coming back is never taken for the new one.
    // Beyond the table's end every number is free: the table grows (as
    // the kernel's super_1_sync grows it), up to what 4 KiB holds.
    let dev = (0..MAX_DEVS)
        .find(|&d| {
            (d >= max_dev || u16_at(t, 256 + 2 * d as usize) == 0xffff) && !in_use.contains(&d)
        })
        .ok_or_else(|| {
            Error::Invalid(format!(
                "{name}: md's role table of this array is full ({MAX_DEVS} device numbers); nothing was written"
            ))
        })?;
    let used = u64_at(t, 80);
    let (sb_sectors, data_offset, data_size) = match template.version {
        MdVersion::V1_0 => {
            // The template's space between its data and its superblock
            // (bitmap, bad-block log) is kept.
            let reserved = u64_at(t, 144).saturating_sub(u64_at(t, 136));
            let at = v1_0_offset(len) / SECTOR;
            (at, 0, at.saturating_sub(reserved))
        }
        v => {
            let at = if v == MdVersion::V1_2 { 8 } else { 0 };
            let off = u64_at(t, 128);
            (at, off, (len / SECTOR).saturating_sub(off))
        }
    };
    if data_size < used || (data_offset + data_size) * SECTOR > len {
        return Err(Error::Invalid(format!(
            "{name} is too small for this md array: {len} bytes, but {} bytes of data are needed after md's metadata",
            used * SECTOR
        )));
    }
    let mut b = t.clone();
    put64(&mut b, 128, data_offset);
    put64(&mut b, 136, data_size);
    put64(&mut b, 144, sb_sectors);
    put64(&mut b, 152, 0);
    put32(&mut b, 160, dev);
    put32(&mut b, 164, 0); // corrected read errors
    b[168..184].copy_from_slice(Uuid::new_v4().as_bytes());
    b[184] = 0; // devflags (write-mostly, failfast)
                // Per-device features: no recovery yet, no bad blocks recorded, not a
                // replacement.
    let feature =
        u32_at(&b, 8) & !(FEATURE_RECOVERY_OFFSET | FEATURE_BAD_BLOCKS | FEATURE_REPLACEMENT);
    put32(&mut b, 8, feature);
    grow_roles(&mut b, dev + 1);
    let at = 256 + 2 * dev as usize;
    b[at..at + 2].copy_from_slice(&0xffffu16.to_le_bytes());
    let sb_offset = sb_sectors * SECTOR;
    let bitmap = template.bitmap.as_ref().map(|bm| MdBitmap {
        at: (sb_offset as i64 + (bm.at as i64 - template.sb_offset as i64)).max(0) as u64,
        ..bm.clone()
    });
    Ok(Joining {
        meta: MdMeta {
            version: template.version,
            sb_offset,
            dev_number: dev,
            bitmap,
            raw: b,
        },
        member_uuid: dev_uuid(array, dev),
        data_offset: data_offset * SECTOR,
        data_size: data_size * SECTOR,
    })
}

/// Make the role table of superblock `b` at least `n` entries long, the
/// new ones unheld (0xffff).
fn grow_roles(b: &mut [u8], n: u32) {
    let max_dev = u32_at(b, 220);
    if n <= max_dev {
        return;
    }
    for d in max_dev..n {
        let at = 256 + 2 * d as usize;
        b[at..at + 2].copy_from_slice(&0xffffu16.to_le_bytes());
    }
    put32(b, 220, n);
}

/// The member bytes a joining member's md metadata takes beyond its
/// superblock: its bitmap (superblock and bits for `regions` chunks), to be
/// blanked before it joins.
pub fn bitmap_extent(meta: &MdMeta, regions: u64) -> Option<(u64, u64)> {
    meta.bitmap
        .as_ref()
        .map(|bm| (bm.at, BITMAP_SB + regions.div_ceil(8)))
}

/// Write `sb`'s state into the member's md 0.90 superblock, md's way
/// (md_p.h's mdp_super_t, little-endian words as on x86): events, update
/// time, the clean bit and resync checkpoint, each disk descriptor's state
/// (active and in sync, faulty; a member being rebuilt is not yet in sync,
/// as 0.90 records no recovery offset, so md rebuilds it whole), the
/// counters, this disk's copy, the checksum.
fn write_md0(m: &dyn Member, sb: &Superblock, meta: &MdMeta) -> Result<()> {
    const FAULTY: u32 = 1;
    const ACTIVE_SYNC: u32 = 2 | 4;
    let mut b = meta.raw.clone();
    let w = |b: &[u8], i: usize| u32_at(b, 4 * i);
    let set = |b: &mut Vec<u8>, i: usize, v: u32| put32(b, 4 * i, v);
    set(&mut b, 39, sb.events as u32);
    set(&mut b, 40, (sb.events >> 32) as u32);
    let now = crate::core::unix_now();
    set(&mut b, 32, now as u32);
    let unit = resync_unit(sb.level, sb.chunk).unwrap_or(0);
    // Clean: the clean bit. Otherwise md resyncs from recovery_cp when the
    // checkpoint's events are the superblock's, else from the start.
    let (clean, cp) = match (sb.state, sb.resync) {
        (ArrayState::Clean, None) => (true, u32::MAX),
        (ArrayState::Clean, Some(u)) => (false, (u.saturating_mul(unit) / SECTOR) as u32),
        (ArrayState::Dirty, _) => (false, 0),
    };
    let state = w(&b, 33);
    set(&mut b, 33, if clean { state | 1 } else { state & !1 });
    set(&mut b, 41, sb.events as u32);
    set(&mut b, 42, (sb.events >> 32) as u32);
    set(&mut b, 43, cp);
    let (mut active, mut failed) = (0, 0);
    for d in 0..27 {
        let at = 128 + 32 * d;
        let number = w(&b, at);
        let old = w(&b, at + 4);
        if old == 0 && number == 0 && d != 0 {
            continue; // an empty descriptor
        }
        let held = sb
            .roles
            .iter()
            .enumerate()
            .find(|(_, e)| dev_of(sb.array_uuid, e.member_uuid) == Some(number));
        let (raid_disk, st) = match held {
            Some((r, e)) if e.state == RoleState::Active => (r as u32, ACTIVE_SYNC),
            Some((r, e)) if e.state == RoleState::Rebuilding => (r as u32, 0),
            Some((r, _)) => (r as u32, FAULTY),
            // In the table for a role another member now holds: faulty.
            None if old & ACTIVE_SYNC != 0 => (w(&b, at + 3), FAULTY),
            None => continue,
        };
        set(&mut b, at + 3, raid_disk);
        set(&mut b, at + 4, st);
        active += u32::from(st == ACTIVE_SYNC);
        failed += u32::from(st == FAULTY);
        if number == meta.dev_number {
            for k in 0..5 {
                let v = w(&b, at + k);
                set(&mut b, 992 + k, v);
            }
        }
    }
    set(&mut b, 34, active);
    set(&mut b, 35, active);
    set(&mut b, 36, failed);
    let c = sb0_csum(&b);
    set(&mut b, 38, c);
    m.write_at(&b, meta.sb_offset)?;
    m.flush()?;
    Ok(())
}

/// Write `sb`'s state into the member's md v1 superblock, md's way: the
/// superblock as read with events, update time, resync offset (clean: in
/// sync, or where a pending resync stands; dirty: 0, as md records an
/// array in use), the role table (faulty members 0xfffe) and the recovery
/// offset changed, its checksum recomputed.
pub fn write_md(m: &dyn Member, sb: &Superblock) -> Result<()> {
    let meta = sb.md.as_ref().expect("an md member");
    if let Some(why) = unwritable(meta) {
        return Err(Error::Invalid(format!(
            "{}: the array has {why}: open it read-only (nothing was written)",
            m.name()
        )));
    }
    if dev_of(sb.array_uuid, sb.member_uuid) != Some(meta.dev_number) {
        return Err(Error::Invalid(format!(
            "{}: adding a member to an md array is not supported yet (nothing was written)",
            m.name()
        )));
    }
    if meta.version == MdVersion::V0_90 {
        return write_md0(m, sb, meta);
    }
    let mut b = meta.raw.clone();
    put64(&mut b, 200, sb.events);
    let now = crate::core::unix_now();
    put64(&mut b, 192, now & 0xff_ffff_ffff);
    let unit = resync_unit(sb.level, sb.chunk).unwrap_or(0);
    let resync = match (sb.state, sb.resync) {
        (ArrayState::Dirty, _) => 0,
        (ArrayState::Clean, None) => MAX_SECTOR,
        (ArrayState::Clean, Some(u)) => u.saturating_mul(unit) / SECTOR,
    };
    put64(&mut b, 208, resync);
    let mut feature = u32_at(&b, 8);
    match sb.recovery_offset {
        Some(off) => {
            feature |= FEATURE_RECOVERY_OFFSET;
            put64(&mut b, 152, off / SECTOR);
        }
        None => {
            feature &= !FEATURE_RECOVERY_OFFSET;
            put64(&mut b, 152, 0);
        }
    }
    put32(&mut b, 8, feature);
    // A member that joined after this superblock was written may have a
    // number beyond its table.
    let needed = sb
        .roles
        .iter()
        .filter_map(|e| dev_of(sb.array_uuid, e.member_uuid))
        .chain([meta.dev_number])
        .filter(|&d| d < MAX_DEVS)
        .max()
        .map_or(0, |d| d + 1);
    grow_roles(&mut b, needed);
    let max_dev = u32_at(&b, 220) as usize;
    let set_role = |b: &mut Vec<u8>, dev: u32, v: u16| {
        if (dev as usize) < max_dev {
            let at = 256 + 2 * dev as usize;
            b[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
    };
    // A device the table has in a role that another member now holds (a
    // replaced or failed one) is faulty, as md's super_1_sync marks every
    // device it no longer has: no assembly may take it for that role.
    for d in 0..max_dev as u32 {
        let r = u16_at(&b, 256 + 2 * d as usize);
        let holder = sb
            .roles
            .get(usize::from(r))
            .and_then(|e| dev_of(sb.array_uuid, e.member_uuid));
        if usize::from(r) < sb.roles.len() && holder != Some(d) && d != meta.dev_number {
            set_role(&mut b, d, 0xfffe);
        }
    }
    for (r, e) in sb.roles.iter().enumerate() {
        let Some(dev) = dev_of(sb.array_uuid, e.member_uuid) else {
            continue;
        };
        match e.state {
            RoleState::Active | RoleState::Rebuilding => set_role(&mut b, dev, r as u16),
            RoleState::Faulty | RoleState::Removed => set_role(&mut b, dev, 0xfffe),
        }
    }
    match sb.role {
        Role::Active(r) => set_role(&mut b, meta.dev_number, r as u16),
        Role::Spare => set_role(&mut b, meta.dev_number, 0xffff),
    }
    let c = sb1_csum(&b);
    put32(&mut b, 216, c);
    if let Some(bm) = &meta.bitmap {
        m.write_at(&bm.header(sb.events, sb.bitmap.events_cleared), bm.at)?;
    }
    m.write_at(&b, meta.sb_offset)?;
    m.flush()?;
    Ok(())
}
