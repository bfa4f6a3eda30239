//! Linux md's own metadata, read: the superblocks mdadm and the kernel
//! write (v1.2, the default since mdadm 3.x, 4 KiB from the start; v1.1
//! at the start; v1.0 near the end; v0.90, the raidtools era's, in the
//! last 64 KiB-aligned 64 KiB), so that raidkit can serve the md arrays
//! people already have. raidkit places every byte of data as md does, so
//! an md member is read as a raidkit member whose superblock is md's,
//! translated into raidkit's [`Superblock`]: identity, geometry, events,
//! roles, data_offset and data_size, recovery and resync offsets.
//!
//! Formats: the kernel's `include/uapi/linux/raid/md_p.h` (struct
//! mdp_superblock_1 and mdp_super_t), checksums as md.c's calc_sb_1_csum
//! and calc_sb_csum. Everything is written by hand: no crate reads md
//! metadata.
//!
//! What raidkit does not handle is refused with a message that names it:
//! a reshape in progress, an md journal device or PPL, clustered md,
//! layouts raidkit lacks (RAID-10 far/offset, RAID-6's rotating DDF
//! variants), external metadata (IMSM, DDF: no md superblock at all).

use super::superblock::{
    ArrayState, BitmapArea, ChecksumArea, JournalArea, Role, RoleEntry, RoleState, Superblock,
};
use crate::error::{Error, Result};
use raidkit_layout::{Geometry, Layout, Level};
use raidkit_member::Member;
use uuid::Uuid;

pub const MD_MAGIC: u32 = 0xa92b_4efc;
const SECTOR: u64 = 512;
/// md's "no sector": in sync, nothing to resync.
const MAX_SECTOR: u64 = u64::MAX;

// feature_map bits (md_p.h).
const FEATURE_BITMAP_OFFSET: u32 = 1;
const FEATURE_RECOVERY_OFFSET: u32 = 2;
const FEATURE_RESHAPE_ACTIVE: u32 = 4;
const FEATURE_BAD_BLOCKS: u32 = 8;
const FEATURE_REPLACEMENT: u32 = 16;
const FEATURE_CLUSTERED: u32 = 256;
const FEATURE_JOURNAL: u32 = 512;
const FEATURE_PPL: u32 = 1024 | 2048;

/// Which md superblock a member carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MdVersion {
    V0_90,
    V1_0,
    V1_1,
    V1_2,
}

impl MdVersion {
    pub fn name(self) -> &'static str {
        match self {
            MdVersion::V0_90 => "0.90",
            MdVersion::V1_0 => "1.0",
            MdVersion::V1_1 => "1.1",
            MdVersion::V1_2 => "1.2",
        }
    }
}

/// An md member's superblock as read, kept so that raidkit's updates
/// change only the fields that follow the array's state (events, update
/// time, resync offset, roles, recovery offset) and leave the rest as md
/// wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdMeta {
    pub version: MdVersion,
    /// Byte offset of the superblock on the member.
    pub sb_offset: u64,
    pub dev_number: u32,
    /// md's internal write-intent bitmap of the array, if it keeps one.
    pub bitmap: Option<MdBitmap>,
    /// The superblock's 4 KiB as read.
    pub raw: Vec<u8>,
}

/// md's internal write-intent bitmap (the kernel's md-bitmap.h,
/// bitmap_super_t): a 256-byte superblock `offset` sectors from the md
/// superblock, then one bit per `chunk` bytes of each member's data area,
/// bit `i` in bit `i % 8` of byte `i / 8` (version 4: little-endian). raidkit
/// keeps it as its own bitmap (`BitmapArea` points at md's bits), so that
/// the kernel re-adds a member raidkit left behind by resyncing only the
/// chunks written without it, as it would after its own degraded writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdBitmap {
    /// Byte offset of the bitmap superblock on the member.
    pub at: u64,
    /// Bytes of a member's data area one bit covers.
    pub chunk: u64,
    /// The bitmap superblock's 256 bytes as read.
    pub raw: Vec<u8>,
    /// The bitmap is out of date (md's BITMAP_STALE, or its event count
    /// behind the superblock's): every chunk is to be resynced.
    pub stale: bool,
    /// Why raidkit cannot keep this bitmap as md does, if it cannot.
    pub problem: Option<String>,
}

pub const BITMAP_MAGIC: u32 = 0x6d74_6962;
/// Bytes of md's bitmap superblock: the bits follow it.
pub const BITMAP_SB: u64 = 256;
/// md-bitmap.h's BITMAP_STALE, as a bit of the superblock's state field.
const BITMAP_STALE: u32 = 1 << 1;
/// md-bitmap.h's BITMAP_HOSTENDIAN: bits in the writer's byte order.
const BITMAP_HOSTENDIAN: u32 = 1 << 15;

impl MdBitmap {
    /// Read and check the bitmap superblock at member byte offset `at`
    /// for an array of `uuid` whose md superblock has `events`. A bitmap
    /// raidkit cannot keep (a bad magic, another array's, a version it does
    /// not know) is kept with its `problem`: the array is read-only then.
    fn read(m: &dyn Member, at: u64, uuid: Uuid, events: u64, level: Level) -> Result<MdBitmap> {
        let mut raw = vec![0u8; BITMAP_SB as usize];
        m.read_at(&mut raw, at)?;
        let version = u32_at(&raw, 4);
        let state = u32_at(&raw, 48);
        let chunk = u64::from(u32_at(&raw, 52));
        let problem = if u32_at(&raw, 0) != BITMAP_MAGIC {
            Some("an md bitmap whose superblock raidkit cannot read (bad magic)".to_string())
        } else if raw[8..24] != uuid.as_bytes()[..] {
            Some("an md bitmap of another array (uuid mismatch)".to_string())
        } else if !matches!(version, 3 | 4) {
            Some(format!(
                "an md bitmap of version {version} (raidkit keeps 3 and 4)"
            ))
        } else if (version == 3 || state & BITMAP_HOSTENDIAN != 0) && cfg!(target_endian = "big") {
            Some("an md bitmap in another machine's byte order".to_string())
        } else if chunk < 512 || !chunk.is_power_of_two() {
            Some(format!("an md bitmap with a chunk of {chunk} bytes"))
        } else if level == Level::Raid10 {
            // md's RAID-10 marks array sectors, raidkit's bitmap member
            // sectors: the two cannot be one.
            Some("an md internal write-intent bitmap on RAID-10, which raidkit reads past but does not keep up to date".to_string())
        } else {
            None
        };
        let stale = state & BITMAP_STALE != 0 || u64_at(&raw, 24) < events;
        Ok(MdBitmap {
            at,
            chunk,
            raw,
            stale,
            problem,
        })
    }

    /// md's events_cleared as read.
    pub fn events_cleared(&self) -> u64 {
        u64_at(&self.raw, 32)
    }

    /// The bitmap superblock for an md superblock of `events`, with bits
    /// last cleared at `events_cleared`: written before the md superblock,
    /// as md_update_sb does, since the kernel takes a bitmap whose count is
    /// behind the superblock's as stale and resyncs everything.
    fn header(&self, events: u64, events_cleared: u64) -> Vec<u8> {
        let mut b = self.raw.clone();
        if self.stale {
            // Its bits may miss writes: the raised count must not make
            // the kernel trust them.
            let state = u32_at(&b, 48) | BITMAP_STALE;
            put32(&mut b, 48, state);
        }
        put64(&mut b, 24, events);
        put64(&mut b, 32, events_cleared.min(events));
        b
    }
}

/// What an md superblock says that raidkit's own has no place for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdInfo {
    pub version: MdVersion,
    /// Byte offset of the superblock on the member.
    pub sb_offset: u64,
    /// md's device number (v1: index into the role table; v0.90: the
    /// descriptor's number).
    pub dev_number: u32,
    /// The internal write-intent bitmap's offset from the superblock, in
    /// sectors (v1), if there is one.
    pub bitmap_offset: Option<i32>,
    /// The array name as md has it ("host:name").
    pub md_name: String,
}

/// Where md puts a 1.0 superblock on a member of `len` bytes (at least
/// 8 KiB): (size in sectors - 8*2) & ~(4*2-1).
pub fn v1_0_offset(len: u64) -> u64 {
    ((len / SECTOR).saturating_sub(16) & !7) * SECTOR
}

/// The offsets where each version's superblock would be on a member of
/// `len` bytes.
fn candidates(len: u64) -> Vec<(MdVersion, u64)> {
    let sectors = len / SECTOR;
    let mut out = vec![(MdVersion::V1_2, 8 * SECTOR), (MdVersion::V1_1, 0)];
    if sectors >= 16 {
        out.push((MdVersion::V1_0, v1_0_offset(len)));
    }
    if len >= 128 << 10 {
        out.push((MdVersion::V0_90, (len & !(65535)) - 65536));
    }
    out
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// md.c's calc_sb_1_csum: the sum of the little-endian words of the
/// superblock and its role table, with the checksum field zero, folded.
pub fn sb1_csum(b: &[u8]) -> u32 {
    let max_dev = u32_at(b, 220) as usize;
    let size = (256 + max_dev * 2).min(b.len());
    let mut sum: u64 = 0;
    let mut i = 0;
    while i + 4 <= size {
        if i != 216 {
            sum += u64::from(u32_at(b, i));
        }
        i += 4;
    }
    if size - i == 2 {
        sum += u64::from(u16_at(b, i));
    }
    ((sum & 0xffff_ffff) + (sum >> 32)) as u32
}

/// md.c's calc_sb_csum for v0.90: the 4 KiB superblock's words.
pub fn sb0_csum(b: &[u8]) -> u32 {
    let mut sum: u64 = 0;
    for i in (0..4096).step_by(4) {
        if i != 38 * 4 {
            sum += u64::from(u32_at(b, i));
        }
    }
    ((sum & 0xffff_ffff) + (sum >> 32)) as u32
}

/// The member uuid raidkit gives the holder of md device number `dev`:
/// md names members by number, raidkit by uuid, and the role table must
/// name the same member from every member's superblock.
fn dev_uuid(array: Uuid, dev: u32) -> Uuid {
    let mut b = *array.as_bytes();
    for (i, x) in dev.to_le_bytes().iter().enumerate() {
        b[12 + i] ^= x;
    }
    b[8] ^= 0x5a;
    Uuid::from_bytes(b)
}

/// An md superblock read and translated; `None`: no md superblock there.
pub fn read_md(m: &dyn Member) -> Result<Option<(Superblock, MdInfo)>> {
    let name = m.name();
    let mut found = Vec::new();
    let mut buf = vec![0u8; 4096];
    for (version, at) in candidates(m.len()) {
        if at + 4096 > m.len() {
            continue;
        }
        m.read_at(&mut buf, at)?;
        if u32_at(&buf, 0) != MD_MAGIC {
            continue;
        }
        let major = u32_at(&buf, 4);
        let mut parsed = match (version, major) {
            (MdVersion::V0_90, 0) => decode0(&buf, at, m.len(), name)?,
            (MdVersion::V0_90, _) | (_, 0) => continue,
            (_, 1) => decode1(&buf, version, name)?,
            (_, v) => {
                return Err(Error::UnsupportedVersion {
                    member: name.to_string(),
                    version: v,
                    supported: 1,
                })
            }
        };
        // A v1 superblock at a place its own offset field disagrees with
        // is some other version's (1.1 read at 4 KiB...): skipped.
        if parsed.1.sb_offset != at {
            continue;
        }
        if let Some(off) = parsed.1.bitmap_offset {
            attach_bitmap(m, &mut parsed.0, off)?;
        }
        found.push(parsed);
    }
    // Two superblocks (a disk reused without zeroing): the most recently
    // updated is the array's.
    Ok(found.into_iter().max_by_key(|(sb, _)| sb.utime))
}

/// Read md's internal bitmap, `off` sectors from the superblock, into
/// `sb`: raidkit's bitmap then lies on md's bits.
fn attach_bitmap(m: &dyn Member, sb: &mut Superblock, off: i32) -> Result<()> {
    let meta = sb.md.as_mut().expect("an md superblock");
    let at = meta.sb_offset as i64 + i64::from(off) * SECTOR as i64;
    let Ok(at) = u64::try_from(at) else {
        return Err(corrupt(
            m.name(),
            format!("md bitmap offset {off} before the member's start"),
        ));
    };
    if at + BITMAP_SB > m.len() {
        return Err(corrupt(
            m.name(),
            format!("md bitmap offset {off} beyond the member's end"),
        ));
    }
    let bm = MdBitmap::read(m, at, sb.array_uuid, sb.events, sb.level)?;
    if bm.problem.is_none() {
        sb.bitmap = BitmapArea {
            offset: at + BITMAP_SB,
            region: bm.chunk,
            events_cleared: bm.events_cleared(),
        };
    }
    meta.bitmap = Some(bm);
    Ok(())
}

/// A role table of `n` roles nobody holds yet (filled from md's table).
fn unheld_roles(n: u32, size: u64) -> Vec<RoleEntry> {
    (0..n)
        .map(|_| RoleEntry {
            member_uuid: Uuid::nil(),
            state: RoleState::Removed,
            data_size: size,
        })
        .collect()
}

fn corrupt(member: &str, detail: String) -> Error {
    Error::CorruptSuperblock {
        member: member.to_string(),
        detail,
    }
}

fn unsupported(member: &str, what: String) -> Error {
    Error::Invalid(format!(
        "{member}: md array with {what}: not supported by raidkit (nothing was written)"
    ))
}

/// Level, layout and chunk as raidkit has them, or why not.
fn shape(member: &str, level_n: i32, layout_n: u32, chunk: u64) -> Result<(Level, Layout, u64)> {
    let level = Level::from_md_number(level_n)
        .ok_or_else(|| unsupported(member, format!("level {level_n}")))?;
    let layout = match level {
        // RAID-0's layout (multi-zone arrays of unequal members) and
        // linear's do not matter for members of one size.
        Level::Raid0 | Level::Linear | Level::Raid1 => Layout::None,
        // md's RAID-4 is parity on the last member, layout 0 or 5.
        Level::Raid4 if layout_n == 0 => {
            Layout::Parity(raidkit_layout::ParityLayout::ParityLast)
        }
        _ => Layout::from_md_number(level, layout_n).ok_or_else(|| {
            let what = if level == Level::Raid10 {
                format!(
                    "RAID-10 layout {layout_n:#x} (near {}, far {}{}; raidkit has near, far or offset copies, one kind at a time, over every member)",
                    layout_n & 0xff,
                    (layout_n >> 8) & 0xff,
                    if layout_n & 0x10000 != 0 { ", offset" } else { "" }
                )
            } else {
                format!("{level} layout {layout_n}")
            };
            unsupported(member, what)
        })?,
    };
    // Mirrors and linear arrays have no chunk in md; raidkit counts their
    // units in 4 KiB.
    let chunk = if chunk == 0 { 4096 } else { chunk };
    Ok((level, layout, chunk))
}

fn decode1(b: &[u8], version: MdVersion, member: &str) -> Result<(Superblock, MdInfo)> {
    let max_dev = u32_at(b, 220) as usize;
    if 256 + max_dev * 2 > b.len() {
        return Err(corrupt(
            member,
            format!("md role table of {max_dev} entries"),
        ));
    }
    if u32_at(b, 216) != sb1_csum(b) {
        return Err(corrupt(member, "md superblock checksum mismatch".into()));
    }
    let feature = u32_at(b, 8);
    for (bit, what) in [
        (FEATURE_RESHAPE_ACTIVE, "a reshape in progress"),
        (FEATURE_JOURNAL, "an md journal"),
        (FEATURE_PPL, "a partial parity log (PPL)"),
        (FEATURE_CLUSTERED, "clustered md"),
    ] {
        if feature & bit != 0 {
            return Err(unsupported(member, what.into()));
        }
    }
    let array_uuid = Uuid::from_bytes(b[16..32].try_into().expect("16 bytes"));
    let raw_name = &b[32..64];
    let n = raw_name.iter().position(|&c| c == 0).unwrap_or(32);
    let md_name = String::from_utf8_lossy(&raw_name[..n]).into_owned();
    let level_n = u32_at(b, 72) as i32;
    let (level, layout, chunk) = shape(
        member,
        level_n,
        u32_at(b, 76),
        u64::from(u32_at(b, 88)) * SECTOR,
    )?;
    // RAID-0 and linear arrays record no used size (md sizes them from
    // each device): the data area is used, in whole chunks.
    let size = match u64_at(b, 80) * SECTOR {
        0 => u64_at(b, 136) * SECTOR,
        s => s,
    };
    let raid_disks = u32_at(b, 92);
    let sb_offset = u64_at(b, 144) * SECTOR;
    let dev_number = u32_at(b, 160);
    let roles_raw: Vec<u16> = (0..max_dev).map(|i| u16_at(b, 256 + 2 * i)).collect();
    let my = *roles_raw.get(dev_number as usize).ok_or_else(|| {
        corrupt(
            member,
            format!("md device number {dev_number} beyond the role table"),
        )
    })?;
    let role = match my {
        0xffff => Role::Spare,
        0xfffe => Role::Spare,
        0xfffd => return Err(unsupported(member, "an md journal device".into())),
        r if u32::from(r) < raid_disks => Role::Active(u32::from(r)),
        r => {
            return Err(corrupt(
                member,
                format!("md role {r} beyond {raid_disks} members"),
            ))
        }
    };
    let faulty = my == 0xfffe;
    let recovery = (feature & FEATURE_RECOVERY_OFFSET != 0).then(|| u64_at(b, 152) * SECTOR);
    let mut roles = unheld_roles(raid_disks, size);
    for (dev, &r) in roles_raw.iter().enumerate() {
        if let Some(e) = roles.get_mut(usize::from(r)) {
            e.member_uuid = dev_uuid(array_uuid, dev as u32);
            e.state = RoleState::Active;
        }
    }
    if let (Role::Active(r), Some(_)) = (role, recovery) {
        roles[r as usize].state = RoleState::Rebuilding;
    }
    let resync = u64_at(b, 208);
    let time = |v: u64| v & 0xff_ffff_ffff;
    let sb = translated(Translated {
        meta: MdMeta {
            version,
            sb_offset,
            dev_number,
            bitmap: None,
            raw: b.to_vec(),
        },
        member,
        array_uuid,
        member_uuid: if faulty {
            // A member md failed holds no role: never taken as one.
            Uuid::from_bytes(b[168..184].try_into().expect("16 bytes"))
        } else {
            dev_uuid(array_uuid, dev_number)
        },
        md_name: &md_name,
        level,
        layout,
        chunk,
        role,
        ctime: time(u64_at(b, 64)),
        utime: time(u64_at(b, 192)),
        events: u64_at(b, 200),
        data_offset: u64_at(b, 128) * SECTOR,
        data_size: u64_at(b, 136) * SECTOR,
        resync_sector: resync,
        recovery,
        roles,
    })?;
    let info = MdInfo {
        version,
        sb_offset,
        dev_number,
        bitmap_offset: (feature & FEATURE_BITMAP_OFFSET != 0).then(|| u32_at(b, 96) as i32),
        md_name,
    };
    Ok((sb, info))
}

fn decode0(b: &[u8], at: u64, len: u64, member: &str) -> Result<(Superblock, MdInfo)> {
    let w = |i: usize| u32_at(b, 4 * i);
    if w(38) != sb0_csum(b) {
        return Err(corrupt(
            member,
            "md 0.90 superblock checksum mismatch".into(),
        ));
    }
    if w(2) != 90 {
        return Err(Error::UnsupportedVersion {
            member: member.to_string(),
            version: w(2),
            supported: 90,
        });
    }
    let mut u = [0u8; 16];
    for (k, i) in [5, 13, 14, 15].into_iter().enumerate() {
        u[4 * k..4 * k + 4].copy_from_slice(&w(i).to_be_bytes());
    }
    let array_uuid = Uuid::from_bytes(u);
    let level_n = w(7) as i32;
    let (level, layout, chunk) = shape(member, level_n, w(64), u64::from(w(65)))?;
    // No recorded size (RAID-0, linear): up to the superblock.
    let size = match u64::from(w(8)) * 1024 {
        0 => at.min(len),
        s => s,
    };
    let raid_disks = w(10);
    // Descriptors: number, major, minor, raid_disk, state (faulty 1,
    // active 2, sync 4, removed 8).
    let desc = |i: usize| (w(i), w(i + 3), w(i + 4));
    let (number, raid_disk, state) = desc(992);
    let in_sync = state & 0b110 == 0b110 && state & 1 == 0;
    let role = if in_sync && raid_disk < raid_disks {
        Role::Active(raid_disk)
    } else {
        Role::Spare
    };
    let mut roles = unheld_roles(raid_disks, size);
    for d in 0..27 {
        let (num, rd, st) = desc(128 + 32 * d);
        if st & 0b110 == 0b110 && st & 1 == 0 && rd < raid_disks {
            roles[rd as usize] = RoleEntry {
                member_uuid: dev_uuid(array_uuid, num),
                state: RoleState::Active,
                data_size: size,
            };
        }
    }
    let events = u64::from(w(39)) | (u64::from(w(40)) << 32);
    let clean = w(33) & 1 != 0;
    let sb = translated(Translated {
        meta: MdMeta {
            version: MdVersion::V0_90,
            sb_offset: at,
            dev_number: number,
            bitmap: None,
            raw: b.to_vec(),
        },
        member,
        array_uuid,
        member_uuid: dev_uuid(array_uuid, number),
        md_name: "",
        level,
        layout,
        chunk,
        role,
        ctime: u64::from(w(6)),
        utime: u64::from(w(32)),
        events,
        data_offset: 0,
        data_size: at.min(len),
        resync_sector: if clean { MAX_SECTOR } else { u64::from(w(43)) },
        recovery: None,
        roles,
    })?;
    Ok((
        sb,
        MdInfo {
            version: MdVersion::V0_90,
            sb_offset: at,
            dev_number: number,
            bitmap_offset: None,
            md_name: String::new(),
        },
    ))
}

struct Translated<'a> {
    meta: MdMeta,
    member: &'a str,
    array_uuid: Uuid,
    member_uuid: Uuid,
    md_name: &'a str,
    level: Level,
    layout: Layout,
    chunk: u64,
    role: Role,
    ctime: u64,
    utime: u64,
    events: u64,
    data_offset: u64,
    data_size: u64,
    resync_sector: u64,
    recovery: Option<u64>,
    roles: Vec<RoleEntry>,
}

/// What raidkit counts a resync position in for `level` (its `resync` is
/// in units, md's in sectors): chunks, for the levels that resync.
fn resync_unit(level: Level, chunk: u64) -> Option<u64> {
    (level.is_parity() || level == Level::Raid10 || level == Level::Raid1).then_some(chunk)
}

fn translated(t: Translated<'_>) -> Result<Superblock> {
    let sizes: Vec<u64> = t.roles.iter().map(|r| r.data_size).collect();
    let geometry = Geometry::new(t.level, t.layout, t.chunk, sizes)
        .map_err(|e| corrupt(t.member, format!("md array shape: {e}")))?;
    // md's "host:name" (mdadm's homehost prefix): the name part is the
    // array's name; a 0.90 array has none, so its md minor's place is
    // taken by its uuid's first part.
    let name = match t.md_name.rsplit_once(':') {
        Some((_, n)) if !n.is_empty() => n.to_string(),
        _ if !t.md_name.is_empty() => t.md_name.to_string(),
        _ => format!("md-{}", &t.array_uuid.simple().to_string()[..8]),
    };
    let unit = resync_unit(t.level, t.chunk).unwrap_or(u64::MAX);
    let dirty = t.resync_sector != MAX_SECTOR;
    Ok(Superblock {
        seq: 0,
        array_uuid: t.array_uuid,
        member_uuid: t.member_uuid,
        name,
        level: t.level,
        layout: t.layout,
        chunk: t.chunk,
        role: t.role,
        ctime: t.ctime,
        utime: t.utime,
        events: t.events,
        data_offset: t.data_offset,
        data_size: t.data_size,
        array_size: geometry.capacity(),
        state: if dirty {
            ArrayState::Dirty
        } else {
            ArrayState::Clean
        },
        recovery_offset: t.recovery,
        bitmap: BitmapArea::default(),
        journal: JournalArea::default(),
        resync: (dirty && t.level.has_redundancy())
            .then(|| t.resync_sector.saturating_mul(SECTOR) / unit),
        checksums: ChecksumArea::default(),
        scrub: None,
        domain: String::new(),
        reshape: None,
        converted_from: None,
        replacing: false,
        last_scrub: None,
        roles: t.roles,
        md: Some(t.meta),
    })
}

mod write;
pub use write::{bitmap_extent, joining, md_data_offset, new_v12, write_md, Joining, NewMember};

/// Device numbers a 4 KiB md v1 superblock has room for.
const MAX_DEVS: u32 = (4096 - 256) / 2;

/// The member uuid of md device number `dev` of `array` (see `dev_uuid`).
pub fn member_uuid(array: Uuid, dev: u32) -> Uuid {
    dev_uuid(array, dev)
}

/// Why raidkit cannot keep this md array's metadata as md would, if it
/// cannot: then the array is opened read-only or not at all.
pub fn unwritable(meta: &MdMeta) -> Option<String> {
    meta.bitmap.as_ref().and_then(|b| b.problem.clone())
}

/// The md device number behind a member uuid `dev_uuid` gave, if it is one.
fn dev_of(array: Uuid, member: Uuid) -> Option<u32> {
    let (a, m) = (array.as_bytes(), member.as_bytes());
    let same = (0..16)
        .filter(|&i| !(8..9).contains(&i) && !(12..16).contains(&i))
        .all(|i| a[i] == m[i]);
    if !same || a[8] ^ 0x5a != m[8] {
        return None;
    }
    let mut d = [0u8; 4];
    for i in 0..4 {
        d[i] = a[12 + i] ^ m[12 + i];
    }
    Some(u32::from_le_bytes(d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use raidkit_member::MemMember;

    /// A v1.2 superblock as mdadm writes one (the fields read here).
    pub(crate) fn sb12(level: i32, layout: u32, disks: u32, dev: u32, events: u64) -> Vec<u8> {
        let mut b = vec![0u8; 4096];
        put32(&mut b, 0, MD_MAGIC);
        put32(&mut b, 4, 1);
        b[16..32].copy_from_slice(&[7u8; 16]);
        b[32..43].copy_from_slice(b"labhost:lab");
        put32(&mut b, 72, level as u32);
        put32(&mut b, 76, layout);
        put64(&mut b, 80, 120 * 2048); // 120 MiB used per member
        put32(&mut b, 88, 128); // 64 KiB chunk
        put32(&mut b, 92, disks);
        put64(&mut b, 128, 2048); // data at 1 MiB
        put64(&mut b, 136, 120 * 2048);
        put64(&mut b, 144, 8);
        put32(&mut b, 160, dev);
        put64(&mut b, 200, events);
        put64(&mut b, 208, u64::MAX);
        put32(&mut b, 220, disks);
        for d in 0..disks {
            b[256 + 2 * d as usize..258 + 2 * d as usize]
                .copy_from_slice(&(d as u16).to_le_bytes());
        }
        let c = sb1_csum(&b);
        put32(&mut b, 216, c);
        b
    }

    fn member_with(sb: &[u8], at: u64) -> MemMember {
        let m = MemMember::new("m", 128 << 20);
        m.write_at(sb, at).unwrap();
        m
    }

    #[test]
    fn reads_a_v1_2_raid5_member_as_md_has_it() {
        let m = member_with(&sb12(5, 2, 3, 1, 42), 4096);
        let (sb, info) = read_md(&m).unwrap().expect("found");
        assert_eq!(info.version, MdVersion::V1_2);
        assert_eq!(info.md_name, "labhost:lab");
        assert_eq!(sb.name, "lab");
        assert_eq!(sb.level, Level::Raid5);
        assert_eq!(
            sb.layout,
            Layout::Parity(raidkit_layout::ParityLayout::LeftSymmetric)
        );
        assert_eq!(
            (sb.chunk, sb.role, sb.events),
            (64 << 10, Role::Active(1), 42)
        );
        assert_eq!((sb.data_offset, sb.data_size), (1 << 20, 120 << 20));
        assert_eq!(sb.array_size, 2 * (120 << 20));
        assert_eq!(sb.state, ArrayState::Clean);
        assert_eq!(sb.roles.len(), 3);
        assert!(sb.roles.iter().all(|r| r.state == RoleState::Active));
        assert_eq!(sb.roles[1].member_uuid, sb.member_uuid);
    }

    /// A member with `sb12`'s superblock and md's internal bitmap 8
    /// sectors after it (bitmap events `bm_events`, cleared at 1).
    fn with_bitmap(events: u64, bm_events: u64) -> MemMember {
        let mut b = sb12(5, 2, 3, 0, events);
        put32(&mut b, 8, FEATURE_BITMAP_OFFSET);
        put32(&mut b, 96, 8);
        let c = sb1_csum(&b);
        put32(&mut b, 216, c);
        let m = member_with(&b, 4096);
        let mut h = vec![0u8; 256];
        put32(&mut h, 0, BITMAP_MAGIC);
        put32(&mut h, 4, 4);
        h[8..24].copy_from_slice(&[7u8; 16]);
        put64(&mut h, 24, bm_events);
        put64(&mut h, 32, 1);
        put32(&mut h, 52, 1 << 20);
        m.write_at(&h, 8192).unwrap();
        m
    }

    #[test]
    fn md_bitmap_is_kept_as_raidkit_bitmap_with_its_events() {
        let m = with_bitmap(42, 42);
        let (mut sb, _) = read_md(&m).unwrap().unwrap();
        assert_eq!(sb.bitmap.offset, 8192 + 256);
        assert_eq!((sb.bitmap.region, sb.bitmap.events_cleared), (1 << 20, 1));
        let meta = sb.md.as_ref().unwrap();
        assert!(unwritable(meta).is_none());
        assert!(!meta.bitmap.as_ref().unwrap().stale);
        // A state update writes the bitmap's events and events cleared
        // along with the superblock's; md would take it stale otherwise.
        sb.events = 50;
        sb.bitmap.events_cleared = 45;
        write_md(&m, &sb).unwrap();
        let mut h = vec![0u8; 256];
        m.read_at(&mut h, 8192).unwrap();
        assert_eq!((u64_at(&h, 24), u64_at(&h, 32)), (50, 45));
        assert_eq!(u32_at(&h, 48) & BITMAP_STALE, 0);
        let (again, _) = read_md(&m).unwrap().unwrap();
        assert_eq!((again.events, again.bitmap.events_cleared), (50, 45));
    }

    #[test]
    fn an_md_bitmap_behind_its_superblock_is_stale_and_stays_so() {
        let m = with_bitmap(42, 40);
        let (mut sb, _) = read_md(&m).unwrap().unwrap();
        assert!(sb.md.as_ref().unwrap().bitmap.as_ref().unwrap().stale);
        sb.events = 43;
        write_md(&m, &sb).unwrap();
        let mut h = vec![0u8; 256];
        m.read_at(&mut h, 8192).unwrap();
        // Raised to the superblock's count, but marked stale for md.
        assert_eq!(u64_at(&h, 24), 43);
        assert_ne!(u32_at(&h, 48) & BITMAP_STALE, 0);
        // Another array's bitmap, or RAID-10's: read-only.
        let m = with_bitmap(42, 42);
        m.write_at(&[9u8; 16], 8192 + 8).unwrap();
        let (sb, _) = read_md(&m).unwrap().unwrap();
        assert!(unwritable(sb.md.as_ref().unwrap())
            .unwrap()
            .contains("another array"));
        assert_eq!(sb.bitmap.region, 0);
    }

    #[test]
    fn a_joining_member_gets_a_free_number_and_md_offsets_of_its_own() {
        let m = with_bitmap(42, 42);
        let (sb, _) = read_md(&m).unwrap().unwrap();
        let mut template = sb.md.clone().unwrap();
        // Device 1 failed (md's 0xfffe) and device 3 is a spare raidkit
        // knows: neither number is given again.
        template.raw[258..260].copy_from_slice(&0xfffeu16.to_le_bytes());
        let held = [
            member_uuid(sb.array_uuid, 0),
            member_uuid(sb.array_uuid, 2),
            member_uuid(sb.array_uuid, 3),
        ];
        let j = joining(&template, sb.array_uuid, &held, 200 << 20, "n").unwrap();
        assert_eq!(j.meta.dev_number, 4);
        assert_eq!(j.member_uuid, member_uuid(sb.array_uuid, 4));
        assert_eq!((j.data_offset, j.data_size), (1 << 20, 199 << 20));
        assert_eq!(j.meta.bitmap.as_ref().unwrap().at, 8192);
        assert_ne!(j.meta.raw[168..184], template.raw[168..184]);
        // Written and read back: the new member, a spare of the array.
        let n = MemMember::new("n", 200 << 20);
        let mut nsb = sb.clone();
        nsb.member_uuid = j.member_uuid;
        nsb.role = Role::Spare;
        nsb.md = Some(j.meta);
        write_md(&n, &nsb).unwrap();
        let (back, info) = read_md(&n).unwrap().unwrap();
        assert_eq!((info.dev_number, back.role), (4, Role::Spare));
        assert_eq!(back.array_uuid, sb.array_uuid);
        // Too small, or no number left: refused.
        let e = joining(&template, sb.array_uuid, &held, 64 << 20, "n").unwrap_err();
        assert!(e.to_string().contains("too small"), "{e}");
        let all: Vec<Uuid> = (0..MAX_DEVS)
            .map(|d| member_uuid(sb.array_uuid, d))
            .collect();
        let e = joining(&template, sb.array_uuid, &all, 200 << 20, "n").unwrap_err();
        assert!(e.to_string().contains("full"), "{e}");
        // Past the table's end: the table grows for the new member, and
        // the others' grow when they are next written.
        let j = joining(&template, sb.array_uuid, &all[..3], 200 << 20, "n").unwrap();
        assert_eq!((j.meta.dev_number, u32_at(&j.meta.raw, 220)), (3, 4));
        let mut old = sb.clone();
        old.roles[1].member_uuid = j.member_uuid;
        write_md(&m, &old).unwrap();
        let mut raw = vec![0u8; 4096];
        m.read_at(&mut raw, 4096).unwrap();
        assert_eq!((u32_at(&raw, 220), u16_at(&raw, 256 + 6)), (4, 1));
        assert!(read_md(&m).is_ok());
    }

    #[test]
    fn a_member_joining_a_v1_0_array_keeps_the_space_before_its_superblock() {
        let len = 128u64 << 20;
        let at = v1_0_offset(len);
        let mut b = sb12(1, 0, 2, 0, 3);
        put64(&mut b, 128, 0);
        put64(&mut b, 136, at / 512 - 16);
        put64(&mut b, 144, at / 512);
        let c = sb1_csum(&b);
        put32(&mut b, 216, c);
        let (sb, _) = read_md(&member_with(&b, at)).unwrap().unwrap();
        let bigger = 200u64 << 20;
        let j = joining(sb.md.as_ref().unwrap(), sb.array_uuid, &[], bigger, "n").unwrap();
        assert_eq!(j.meta.sb_offset, v1_0_offset(bigger));
        assert_eq!(j.data_offset, 0);
        assert_eq!(j.data_size, v1_0_offset(bigger) - 16 * 512);
        assert_eq!(j.meta.dev_number, 2);
    }

    #[test]
    fn a_bad_checksum_or_an_unsupported_shape_is_refused_by_name() {
        let mut b = sb12(5, 2, 3, 0, 1);
        b[200] ^= 1;
        let e = read_md(&member_with(&b, 4096)).unwrap_err().to_string();
        assert!(e.contains("checksum"), "{e}");
        // RAID-10 far 2 and offset 2 are read as such; near and far
        // copies both above 1 (never made by mdadm): refused, named.
        for (md, layout) in [(0x201, Layout::Far(2)), (0x10201, Layout::Offset(2))] {
            let (sb, _) = read_md(&member_with(&sb12(10, md, 4, 0, 1), 4096))
                .unwrap()
                .unwrap();
            assert_eq!(sb.layout, layout);
        }
        let e = read_md(&member_with(&sb12(10, 0x202, 4, 0, 1), 4096))
            .unwrap_err()
            .to_string();
        assert!(e.contains("near 2, far 2"), "{e}");
        // A reshape in progress.
        let mut b = sb12(5, 2, 3, 0, 1);
        b[8] = FEATURE_RESHAPE_ACTIVE as u8;
        let c = sb1_csum(&b);
        b[216..220].copy_from_slice(&c.to_le_bytes());
        let e = read_md(&member_with(&b, 4096)).unwrap_err().to_string();
        assert!(e.contains("reshape"), "{e}");
        // Nothing md: None.
        assert!(read_md(&MemMember::new("z", 8 << 20)).unwrap().is_none());
    }

    #[test]
    fn v1_1_and_v1_0_are_found_where_md_puts_them() {
        let mut b = sb12(1, 0, 2, 0, 3);
        b[144..152].copy_from_slice(&0u64.to_le_bytes());
        let c = sb1_csum(&b);
        b[216..220].copy_from_slice(&c.to_le_bytes());
        let (sb, info) = read_md(&member_with(&b, 0)).unwrap().unwrap();
        assert_eq!(info.version, MdVersion::V1_1);
        assert_eq!(dev_of(sb.array_uuid, sb.member_uuid), Some(0));
        let at = (((128u64 << 20) / 512 - 16) & !7) * 512;
        let mut b = sb12(1, 0, 2, 0, 3);
        b[144..152].copy_from_slice(&(at / 512).to_le_bytes());
        let c = sb1_csum(&b);
        b[216..220].copy_from_slice(&c.to_le_bytes());
        let (sb, info) = read_md(&member_with(&b, at)).unwrap().unwrap();
        assert_eq!(info.version, MdVersion::V1_0);
        assert_eq!(sb.level, Level::Raid1);
    }
}
