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
                    "RAID-10 layout {layout_n:#x} (near {}, far {}{}; raidkit has near copies only)",
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
    let unit = if t.level.is_parity() || t.level == Level::Raid10 || t.level == Level::Raid1 {
        t.chunk
    } else {
        u64::MAX
    };
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
        roles: t.roles,
        md: Some(t.meta),
    })
}

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

/// Device numbers a 4 KiB md v1 superblock has room for.
const MAX_DEVS: u32 = (4096 - 256) / 2;

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

/// The member uuid of md device number `dev` of `array` (see `dev_uuid`).
pub fn member_uuid(array: Uuid, dev: u32) -> Uuid {
    dev_uuid(array, dev)
}

/// Why raidkit cannot keep this md array's metadata as md would, if it
/// cannot: then the array is opened read-only or not at all.
pub fn unwritable(meta: &MdMeta) -> Option<String> {
    meta.bitmap.as_ref().and_then(|b| b.problem.clone())
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
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    set(&mut b, 32, now as u32);
    let unit = if sb.level.is_parity() || sb.level == Level::Raid10 || sb.level == Level::Raid1 {
        sb.chunk
    } else {
        0
    };
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
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    put64(&mut b, 192, now & 0xff_ffff_ffff);
    let unit = if sb.level.is_parity() || sb.level == Level::Raid10 || sb.level == Level::Raid1 {
        sb.chunk
    } else {
        0
    };
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
        // RAID-10 far 2: refused, named.
        let e = read_md(&member_with(&sb12(10, 0x201, 4, 0, 1), 4096))
            .unwrap_err()
            .to_string();
        assert!(e.contains("far 2"), "{e}");
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
