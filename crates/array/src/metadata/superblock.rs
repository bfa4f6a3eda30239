//! The per-member superblock: what makes a member self-describing.
//!
//! # Metadata area (start of every member)
//!
//! | offset  | size    | content                                   |
//! |---------|---------|-------------------------------------------|
//! | 0       | 8 KiB   | superblock, copy A                        |
//! | 8 KiB   | 8 KiB   | superblock, copy B                        |
//! | 16 KiB  | ...     | write-intent bitmap (see `bitmap`), then reserved for a journal |
//! | `data_offset` | `data_size` | array data                     |
//!
//! `data_offset` is a multiple of 1 MiB: 1/128 of the member rounded up to
//! a MiB, at least 1 MiB and at most 128 MiB. A 16 MiB member thus keeps
//! 15 MiB of data (6.25% metadata); from 128 MiB on the share is at most
//! 1/128 (0.8%), and above 16 GiB it is a fixed 128 MiB.
//!
//! # Crash safety
//!
//! Both copies carry a crc32c and a sequence number raised on every write.
//! An update writes copy A, flushes, then writes copy B and flushes, so a
//! crash tears at most one copy; reading takes the valid copy with the
//! highest sequence number.
//!
//! # Encoding (little-endian)
//!
//! ```text
//!   0 magic "RAIDKIT\0"      8 version u32     12 size u32 (8192)
//!  16 crc32c u32 (of the block with this field zero)   20 flags u32
//!     (bit 0: a resync is pending from resync_offset)
//!  24 seq u64                32 array uuid     48 member uuid
//!  64 name [64] (UTF-8, zero padded)
//! 128 level i32 (md's)      132 layout u32 (md's)     136 chunk u64
//! 144 raid_disks u32        148 role u32 (0xffffffff: spare)
//! 152 ctime u64             160 utime u64             168 events u64
//! 176 data_offset u64       184 data_size u64         192 array_size u64
//! 200 state u32 (0 clean, 1 dirty)                    204 reserved
//! 208 recovery_offset u64 (u64::MAX: in sync)
//! 216 bitmap: offset u64, region size u64 (0: no bitmap), events_cleared u64
//! 240 journal: offset u64, size u64 (0: no journal), applied_seq u64
//! 264 resync_offset u64: with flag 1 set, the redundancy of units (stripes
//!     of parity levels, chunks of mirrors) from here on was never made
//!     consistent (an initial sync, or a full resync, still to finish)
//! 272 checksums (version 2): offset u64, size u64 (0: none), block u32
//!     (4096), algorithm u32 (1: crc32c), format u32 (see `checksums`)
//! 304 scrub_offset u64: with flag 2 set, a scrub to resume from this unit
//!     (flag 4: it only checks)
//! 312 domain [32]: this member's failure domain as given at create (a
//!     host, a rack, an enclosure; UTF-8, zero padded; empty: none given)
//! 344 reshape (flag 8; version 3 while set, so that raidkit without
//!     reshape refuses the members rather than place data by the new
//!     member count alone): old raid_disks u32, old chunk u32 at 348 (in
//!     512-byte sectors; 0: the chunk does not change), rows u64
//!     at 352 (stripes of the new geometry written and durable), backup
//!     u64 at 360 (bytes of array data from 0 kept in the backup area
//!     while their old place is overwritten; 0: none), backup crc32c u32
//!     at 368 (see `crate::reshape`); version 4 while an array with a
//!     journal is open (state dirty), whatever else it has
//! 376 converted from (flag 16): level i32, layout u32 at 380, chunk u64 at
//!     384: the shape before the last level takeover (`grow --level`, which
//!     moves no data), so that a member one update behind with that shape
//!     is known to be current
//!     flag 32: this member is being built to replace the member that
//!     holds its role (`raidkit replace`), which stays in service until it
//!     is done; recovery_offset says how far it got (md's replacement
//!     feature)
//! 392 last scrub (flag 64): when it ended u64 (Unix seconds), how
//!     long it took u64 at 400 (milliseconds), bytes of each member read u64 at 408, repaired
//!     u64 at 416, unrepaired u64 at 424, findings u64 at 432, check only
//!     u32 at 440 (1: it only checked), reserved u32 at 444, its result
//!     [64] at 448 (`done`, or why it stopped; UTF-8, zero padded), so
//!     that a restarted server still tells when the array was last verified
//! 1024 role table: raid_disks entries of 32 bytes:
//!      member uuid [16], state u32, reserved u32, data_size u64
//! ```

use crate::error::{Error, Result};
use raidkit_layout::{Layout, Level, MAX_MEMBERS};
use raidkit_member::Member;
use serde::Serialize;
use uuid::Uuid;

pub const MAGIC: [u8; 8] = *b"RAIDKIT\0";
/// The format version written: 1 for members without checksums (so that
/// older raidkit still opens them), 2 with (older raidkit refuses them
/// rather than write data without updating its checksums).
pub const VERSION: u32 = 2;
const VERSION_NO_CHECKSUMS: u32 = 1;
/// The version written while a reshape is in progress.
const VERSION_RESHAPE: u32 = 3;
/// The version written while an array with a journal is open (dirty): its
/// records may then span stripes (a run of whole stripes, or the stripes
/// logged ahead of a sequential writer), which raidkit before such records
/// would replay as one stripe each after a crash, leaving the others'
/// parity stale. It refuses these members instead. A clean stop (every
/// record applied) writes the version of the other features again.
const VERSION_OPEN_JOURNAL: u32 = 4;
/// The versions this build reads.
const VERSIONS: [u32; 4] = [
    VERSION_NO_CHECKSUMS,
    VERSION,
    VERSION_RESHAPE,
    VERSION_OPEN_JOURNAL,
];
pub const SB_SIZE: usize = 8192;
/// Where the two superblock copies live.
pub const SB_OFFSETS: [u64; 2] = [0, SB_SIZE as u64];
const ROLE_TABLE: usize = 1024;
const ROLE_ENTRY: usize = 32;
const SPARE: u32 = u32::MAX;
const MIB: u64 = 1 << 20;
/// Bytes a member's failure domain label may take.
pub const MAX_DOMAIN: usize = 32;

/// The data offset raidkit gives a member of `len` bytes.
pub fn data_offset_for(len: u64) -> u64 {
    (len / 128).div_ceil(MIB).clamp(1, 128) * MIB
}

/// Whether the array was shut down cleanly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ArrayState {
    Clean,
    Dirty,
}

/// The state of one role as the array records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RoleState {
    Active,
    Faulty,
    /// Absent when the array changed: the member that held it is stale.
    Removed,
    Rebuilding,
}

impl RoleState {
    fn code(self) -> u32 {
        match self {
            RoleState::Active => 1,
            RoleState::Faulty => 2,
            RoleState::Removed => 3,
            RoleState::Rebuilding => 4,
        }
    }

    fn from_code(c: u32) -> Option<RoleState> {
        Some(match c {
            1 => RoleState::Active,
            2 => RoleState::Faulty,
            3 => RoleState::Removed,
            4 => RoleState::Rebuilding,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            RoleState::Active => "active",
            RoleState::Faulty => "faulty",
            RoleState::Removed => "removed",
            RoleState::Rebuilding => "rebuilding",
        }
    }
}

/// One entry of the role table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoleEntry {
    pub member_uuid: Uuid,
    pub state: RoleState,
    pub data_size: u64,
}

/// This member's place in the array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Active(u32),
    Spare,
}

/// A decoded superblock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub seq: u64,
    pub array_uuid: Uuid,
    pub member_uuid: Uuid,
    pub name: String,
    pub level: Level,
    pub layout: Layout,
    pub chunk: u64,
    pub role: Role,
    pub ctime: u64,
    pub utime: u64,
    pub events: u64,
    pub data_offset: u64,
    pub data_size: u64,
    pub array_size: u64,
    pub state: ArrayState,
    pub recovery_offset: Option<u64>,
    pub bitmap: BitmapArea,
    pub journal: JournalArea,
    /// A resync still to finish: units (stripes of parity levels, chunks
    /// of mirrors) from this one on have redundancy never made consistent.
    pub resync: Option<u64>,
    pub checksums: ChecksumArea,
    /// A scrub to resume: from this unit, and whether it only checks.
    pub scrub: Option<(u64, bool)>,
    /// This member's failure domain as given at create (empty: none).
    pub domain: String,
    /// A reshape in progress (the role table and geometry fields give the
    /// new shape; this says where the old one still holds).
    pub reshape: Option<ReshapePos>,
    /// The level, layout and chunk before the last level takeover.
    pub converted_from: Option<(Level, Layout, u64)>,
    /// This member is being built to replace the one holding its role,
    /// which serves meanwhile (`recovery_offset`: how far it got).
    pub replacing: bool,
    /// How the last scrub that ended went.
    pub last_scrub: Option<ScrubSummary>,
    pub roles: Vec<RoleEntry>,
    /// Read from md's own superblock of this version (see `md`), not
    /// from raidkit's: not written back by raidkit.
    pub md: Option<crate::metadata::md::MdMeta>,
}

/// Where a reshape stands (see `crate::reshape`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct ReshapePos {
    /// Members before the reshape.
    pub old_disks: u32,
    /// Stripes of the new geometry written and durable: array data below
    /// `rows` new stripes is placed by the new geometry, the rest by the old.
    pub rows: u64,
    /// Bytes of array data from offset 0 kept in the backup area while
    /// their old place is overwritten (0: no backup in use).
    pub backup: u64,
    pub backup_crc: u32,
    /// The chunk before the reshape, for a change of chunk (0: the chunk
    /// does not change).
    pub old_chunk: u64,
}

impl ReshapePos {
    /// The position of a reshape from `old` that has not moved anything
    /// yet; `old_chunk` for a change of chunk.
    pub fn starting(old: &raidkit_layout::Geometry, old_chunk: Option<u64>) -> ReshapePos {
        ReshapePos {
            old_disks: old.members() as u32,
            old_chunk: old_chunk.unwrap_or(0),
            ..ReshapePos::default()
        }
    }
}

/// Where the checksum area lies on a member (see `checksums`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChecksumArea {
    /// Byte offset on the member.
    pub offset: u64,
    /// Bytes; 0: the array keeps no checksums.
    pub size: u64,
}

impl ChecksumArea {
    pub fn enabled(&self) -> bool {
        self.size > 0
    }
}

/// Where a member of `len` bytes keeps its data, and its checksum area
/// (just before the data) when the array keeps checksums, with the
/// metadata area raidkit gives it by default.
pub fn member_layout(len: u64, checksums: bool) -> (u64, ChecksumArea) {
    member_layout_with(len, checksums, data_offset_for(len))
}

/// As [`member_layout`], with a metadata area (superblocks, bitmap,
/// journal and, when it fits in a quarter of it, the checksum area) of
/// `meta` bytes: create's `--data-offset`, or what a member joining an
/// array needs to hold the journal the array was made with.
pub fn member_layout_with(len: u64, checksums: bool, meta: u64) -> (u64, ChecksumArea) {
    if !checksums {
        return (meta, ChecksumArea::default());
    }
    let size = crate::metadata::checksums::area_size(len);
    // Small enough: carved from the end of the metadata area (the journal
    // there gets the rest); else the data starts later.
    let data = if size <= meta / 4 {
        meta
    } else {
        (meta + size).next_multiple_of(MIB)
    };
    (
        data,
        ChecksumArea {
            offset: data - size,
            size,
        },
    )
}

/// Where the write-intent bitmap lies on each member, and what it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BitmapArea {
    /// Byte offset on the member.
    pub offset: u64,
    /// Bytes of the member's data area one bit covers; 0: no bitmap.
    pub region: u64,
    /// The event count when bits were last cleared: a member that left
    /// before it missed writes the bitmap no longer shows, and needs a
    /// full rebuild rather than a resync of the marked regions.
    pub events_cleared: u64,
}

/// Where the journal lies on each member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JournalArea {
    /// Byte offset on the member.
    pub offset: u64,
    /// Bytes; 0: no journal.
    pub size: u64,
    /// Sequence number of the last record known applied in place (replay
    /// starts after it).
    pub applied_seq: u64,
}

/// Flag bit: `resync` holds a pending resync's position.
const FLAG_RESYNC: u32 = 1;
/// Flag bits: a scrub to resume, and whether it only checks.
const FLAG_SCRUB: u32 = 2;
const FLAG_SCRUB_CHECK_ONLY: u32 = 4;
/// Flag bit: a reshape is in progress (`reshape`).
const FLAG_RESHAPE: u32 = 8;
/// Flag bit: `converted_from` is set.
const FLAG_CONVERTED: u32 = 16;
/// Flag bit: `replacing`.
const FLAG_REPLACING: u32 = 32;
/// Flag bit: `last_scrub` is set.
const FLAG_LAST_SCRUB: u32 = 64;
/// Bytes of a last scrub's result text kept.
const SCRUB_RESULT: usize = 64;

/// A scrub that ended, as the superblock keeps it (its findings are
/// counted, not listed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrubSummary {
    /// When it ended, in seconds since the Unix epoch.
    pub ended: u64,
    /// How long it took, in milliseconds.
    pub millis: u64,
    pub bytes: u64,
    pub repaired: u64,
    pub unrepaired: u64,
    pub found: u64,
    pub check_only: bool,
    /// `done`, or why it stopped (at most 64 bytes).
    pub result: String,
}

pub(crate) fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
pub(crate) fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn get_uuid(b: &[u8], at: usize) -> Uuid {
    Uuid::from_bytes(b[at..at + 16].try_into().expect("16 bytes"))
}

/// Write a block's checksum (for tools and fuzzers that build blocks by hand).
pub fn seal(b: &mut [u8]) {
    let crc = block_crc(b);
    put_u32(b, 16, crc);
}

/// crc32c of a block, computed with the crc field taken as zero.
fn block_crc(b: &[u8]) -> u32 {
    crate::checksums::crc32c_of(&[&b[..16], &[0; 4], &b[20..]])
}

impl Superblock {
    pub fn raid_disks(&self) -> usize {
        self.roles.len()
    }

    /// Encode into one 8 KiB block.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SB_SIZE];
        b[0..8].copy_from_slice(&MAGIC);
        put_u32(
            &mut b,
            8,
            if self.state == ArrayState::Dirty && self.journal.size > 0 {
                VERSION_OPEN_JOURNAL
            } else if self.reshape.is_some() {
                VERSION_RESHAPE
            } else if self.checksums.enabled() {
                VERSION
            } else {
                VERSION_NO_CHECKSUMS
            },
        );
        put_u32(&mut b, 12, SB_SIZE as u32);
        put_u64(&mut b, 24, self.seq);
        b[32..48].copy_from_slice(self.array_uuid.as_bytes());
        b[48..64].copy_from_slice(self.member_uuid.as_bytes());
        let name = self.name.as_bytes();
        let n = name.len().min(64);
        b[64..64 + n].copy_from_slice(&name[..n]);
        put_u32(&mut b, 128, self.level.md_number() as u32);
        put_u32(&mut b, 132, self.layout.md_number());
        put_u64(&mut b, 136, self.chunk);
        put_u32(&mut b, 144, self.roles.len() as u32);
        put_u32(
            &mut b,
            148,
            match self.role {
                Role::Active(r) => r,
                Role::Spare => SPARE,
            },
        );
        put_u64(&mut b, 152, self.ctime);
        put_u64(&mut b, 160, self.utime);
        put_u64(&mut b, 168, self.events);
        put_u64(&mut b, 176, self.data_offset);
        put_u64(&mut b, 184, self.data_size);
        put_u64(&mut b, 192, self.array_size);
        put_u32(&mut b, 200, (self.state == ArrayState::Dirty) as u32);
        put_u64(&mut b, 208, self.recovery_offset.unwrap_or(u64::MAX));
        put_u64(&mut b, 216, self.bitmap.offset);
        put_u64(&mut b, 224, self.bitmap.region);
        put_u64(&mut b, 232, self.bitmap.events_cleared);
        put_u64(&mut b, 240, self.journal.offset);
        put_u64(&mut b, 248, self.journal.size);
        put_u64(&mut b, 256, self.journal.applied_seq);
        let mut flags = 0;
        if let Some(at) = self.resync {
            flags |= FLAG_RESYNC;
            put_u64(&mut b, 264, at);
        }
        if let Some((at, check_only)) = self.scrub {
            flags |= FLAG_SCRUB;
            if check_only {
                flags |= FLAG_SCRUB_CHECK_ONLY;
            }
            put_u64(&mut b, 304, at);
        }
        if let Some(r) = &self.reshape {
            flags |= FLAG_RESHAPE;
            put_u32(&mut b, 344, r.old_disks);
            put_u32(&mut b, 348, (r.old_chunk / 512) as u32);
            put_u64(&mut b, 352, r.rows);
            put_u64(&mut b, 360, r.backup);
            put_u32(&mut b, 368, r.backup_crc);
        }
        if let Some((level, layout, chunk)) = self.converted_from {
            flags |= FLAG_CONVERTED;
            put_u32(&mut b, 376, level.md_number() as u32);
            put_u32(&mut b, 380, layout.md_number());
            put_u64(&mut b, 384, chunk);
        }
        if self.replacing {
            flags |= FLAG_REPLACING;
        }
        if let Some(l) = &self.last_scrub {
            flags |= FLAG_LAST_SCRUB;
            put_u64(&mut b, 392, l.ended);
            put_u64(&mut b, 400, l.millis);
            put_u64(&mut b, 408, l.bytes);
            put_u64(&mut b, 416, l.repaired);
            put_u64(&mut b, 424, l.unrepaired);
            put_u64(&mut b, 432, l.found);
            put_u32(&mut b, 440, l.check_only as u32);
            // Cut at a character boundary.
            let mut n = l.result.len().min(SCRUB_RESULT);
            while !l.result.is_char_boundary(n) {
                n -= 1;
            }
            b[448..448 + n].copy_from_slice(&l.result.as_bytes()[..n]);
        }
        put_u32(&mut b, 20, flags);
        let domain = self.domain.as_bytes();
        let n = domain.len().min(MAX_DOMAIN);
        b[312..312 + n].copy_from_slice(&domain[..n]);
        if self.checksums.enabled() {
            use crate::metadata::checksums;
            put_u64(&mut b, 272, self.checksums.offset);
            put_u64(&mut b, 280, self.checksums.size);
            put_u32(&mut b, 288, checksums::BLOCK as u32);
            put_u32(&mut b, 292, checksums::CRC32C);
            put_u32(&mut b, 296, checksums::FORMAT);
        }
        for (i, r) in self.roles.iter().enumerate() {
            let at = ROLE_TABLE + i * ROLE_ENTRY;
            b[at..at + 16].copy_from_slice(r.member_uuid.as_bytes());
            put_u32(&mut b, at + 16, r.state.code());
            put_u64(&mut b, at + 24, r.data_size);
        }
        let crc = block_crc(&b);
        put_u32(&mut b, 16, crc);
        b
    }

    /// Decode one block. `Ok(None)`: no magic (not a superblock at all).
    pub fn decode(b: &[u8], member: &str) -> Result<Option<Superblock>> {
        let corrupt = |detail: String| Error::CorruptSuperblock {
            member: member.to_string(),
            detail,
        };
        if b.len() < SB_SIZE || b[0..8] != MAGIC {
            return Ok(None);
        }
        let version = get_u32(b, 8);
        if get_u32(b, 16) != block_crc(&b[..SB_SIZE]) {
            return Err(corrupt("checksum mismatch".into()));
        }
        if !VERSIONS.contains(&version) {
            return Err(Error::UnsupportedVersion {
                member: member.to_string(),
                version,
                supported: VERSION_OPEN_JOURNAL,
            });
        }
        let level_n = get_u32(b, 128) as i32;
        let level = Level::from_md_number(level_n)
            .ok_or_else(|| corrupt(format!("unknown level {level_n}")))?;
        let layout_n = get_u32(b, 132);
        let layout = Layout::from_md_number(level, layout_n)
            .ok_or_else(|| corrupt(format!("unknown layout {layout_n} for {level}")))?;
        let raid_disks = get_u32(b, 144) as usize;
        if raid_disks == 0 || raid_disks > MAX_MEMBERS {
            return Err(corrupt(format!("impossible member count {raid_disks}")));
        }
        let role = match get_u32(b, 148) {
            SPARE => Role::Spare,
            r if (r as usize) < raid_disks => Role::Active(r),
            r => return Err(corrupt(format!("role {r} beyond {raid_disks} members"))),
        };
        let name_raw = &b[64..128];
        let name_len = name_raw.iter().position(|&c| c == 0).unwrap_or(64);
        let name = String::from_utf8_lossy(&name_raw[..name_len]).into_owned();
        let mut roles = Vec::with_capacity(raid_disks);
        for i in 0..raid_disks {
            let at = ROLE_TABLE + i * ROLE_ENTRY;
            let code = get_u32(b, at + 16);
            roles.push(RoleEntry {
                member_uuid: get_uuid(b, at),
                state: RoleState::from_code(code)
                    .ok_or_else(|| corrupt(format!("role {i} has unknown state {code}")))?,
                data_size: get_u64(b, at + 24),
            });
        }
        let rec = get_u64(b, 208);
        let checksums = if version >= 2 && get_u64(b, 280) > 0 {
            use crate::metadata::checksums;
            let (block, algo, format) = (get_u32(b, 288), get_u32(b, 292), get_u32(b, 296));
            if block as u64 != checksums::BLOCK
                || algo != checksums::CRC32C
                || format != checksums::FORMAT
            {
                return Err(Error::UnsupportedVersion {
                    member: member.to_string(),
                    version: format,
                    supported: checksums::FORMAT,
                });
            }
            ChecksumArea {
                offset: get_u64(b, 272),
                size: get_u64(b, 280),
            }
        } else {
            ChecksumArea::default()
        };
        Ok(Some(Superblock {
            seq: get_u64(b, 24),
            array_uuid: get_uuid(b, 32),
            member_uuid: get_uuid(b, 48),
            name,
            level,
            layout,
            chunk: get_u64(b, 136),
            role,
            ctime: get_u64(b, 152),
            utime: get_u64(b, 160),
            events: get_u64(b, 168),
            data_offset: get_u64(b, 176),
            data_size: get_u64(b, 184),
            array_size: get_u64(b, 192),
            state: if get_u32(b, 200) == 1 {
                ArrayState::Dirty
            } else {
                ArrayState::Clean
            },
            recovery_offset: (rec != u64::MAX).then_some(rec),
            bitmap: BitmapArea {
                offset: get_u64(b, 216),
                region: get_u64(b, 224),
                events_cleared: get_u64(b, 232),
            },
            journal: JournalArea {
                offset: get_u64(b, 240),
                size: get_u64(b, 248),
                applied_seq: get_u64(b, 256),
            },
            resync: (get_u32(b, 20) & FLAG_RESYNC != 0).then(|| get_u64(b, 264)),
            checksums,
            scrub: (get_u32(b, 20) & FLAG_SCRUB != 0)
                .then(|| (get_u64(b, 304), get_u32(b, 20) & FLAG_SCRUB_CHECK_ONLY != 0)),
            domain: String::from_utf8_lossy(&b[312..312 + MAX_DOMAIN])
                .trim_end_matches('\0')
                .to_string(),
            reshape: (get_u32(b, 20) & FLAG_RESHAPE != 0).then(|| ReshapePos {
                old_disks: get_u32(b, 344),
                old_chunk: get_u32(b, 348) as u64 * 512,
                rows: get_u64(b, 352),
                backup: get_u64(b, 360),
                backup_crc: get_u32(b, 368),
            }),
            converted_from: if get_u32(b, 20) & FLAG_CONVERTED != 0 {
                let l = get_u32(b, 376) as i32;
                let level = Level::from_md_number(l)
                    .ok_or_else(|| corrupt(format!("unknown level {l} converted from")))?;
                let layout = Layout::from_md_number(level, get_u32(b, 380))
                    .ok_or_else(|| corrupt("unknown layout converted from".into()))?;
                Some((level, layout, get_u64(b, 384)))
            } else {
                None
            },
            replacing: get_u32(b, 20) & FLAG_REPLACING != 0,
            last_scrub: (get_u32(b, 20) & FLAG_LAST_SCRUB != 0).then(|| ScrubSummary {
                ended: get_u64(b, 392),
                millis: get_u64(b, 400),
                bytes: get_u64(b, 408),
                repaired: get_u64(b, 416),
                unrepaired: get_u64(b, 424),
                found: get_u64(b, 432),
                check_only: get_u32(b, 440) == 1,
                result: String::from_utf8_lossy(&b[448..448 + SCRUB_RESULT])
                    .trim_end_matches('\0')
                    .to_string(),
            }),
            roles,
            md: None,
        }))
    }
}

/// What reading a member's superblock found.
#[derive(Debug, Clone)]
pub struct SuperblockRead {
    pub sb: Superblock,
    /// Which copies (A, B) were valid. One invalid copy means an update
    /// was interrupted or a block went bad; the next write mends it.
    pub copies_valid: [bool; 2],
}

/// Read a member's superblock, taking the valid copy with the highest sequence number.
pub fn read_superblock(m: &dyn Member) -> Result<SuperblockRead> {
    let name = m.name();
    if m.len() < 2 * SB_SIZE as u64 {
        return Err(Error::NoSuperblock {
            member: name.to_string(),
        });
    }
    let mut found: [Option<Superblock>; 2] = [None, None];
    let mut errors = Vec::new();
    let mut magic_seen = false;
    let mut buf = vec![0u8; SB_SIZE];
    for (i, &off) in SB_OFFSETS.iter().enumerate() {
        m.read_at(&mut buf, off)?;
        magic_seen |= buf[0..8] == MAGIC;
        match Superblock::decode(&buf, name) {
            Ok(sb) => found[i] = sb,
            Err(e) => errors.push(e),
        }
    }
    let copies_valid = [found[0].is_some(), found[1].is_some()];
    let best = match found {
        [Some(a), Some(b)] => {
            if b.seq > a.seq {
                b
            } else {
                a
            }
        }
        [Some(a), None] => a,
        [None, Some(b)] => b,
        [None, None] => {
            if !magic_seen {
                // No raidkit superblock: perhaps md's own.
                if let Some((sb, _)) = crate::metadata::md::read_md(m)? {
                    return Ok(SuperblockRead {
                        sb,
                        copies_valid: [true, true],
                    });
                }
                return Err(Error::NoSuperblock {
                    member: name.to_string(),
                });
            }
            // Report an unsupported version over a checksum error.
            let e = errors
                .into_iter()
                .reduce(|a, b| match a {
                    Error::UnsupportedVersion { .. } => a,
                    _ => b,
                })
                .expect("magic seen, so decoding failed at least once");
            return Err(match e {
                Error::CorruptSuperblock { member, detail } => Error::CorruptSuperblock {
                    member,
                    detail: format!("both copies are bad ({detail})"),
                },
                other => other,
            });
        }
    };
    Ok(SuperblockRead {
        sb: best,
        copies_valid,
    })
}

/// Write a superblock to both copies (A, flush, B, flush), raising its sequence number.
pub fn write_superblock(m: &dyn Member, sb: &mut Superblock) -> Result<()> {
    if sb.md.is_some() {
        sb.seq += 1;
        return crate::metadata::md::write_md(m, sb);
    }
    sb.seq += 1;
    let block = sb.encode();
    for off in SB_OFFSETS {
        m.write_at(&block, off)?;
        m.flush()?;
    }
    Ok(())
}

/// Whether a member carries anything that looks like a raidkit superblock
/// (valid or not): create refuses to overwrite one without --force.
pub fn probe(m: &dyn Member) -> Result<Option<Result<Superblock>>> {
    match read_superblock(m) {
        Ok(r) => Ok(Some(Ok(r.sb))),
        Err(Error::NoSuperblock { .. }) => Ok(None),
        Err(Error::Member(e)) => Err(Error::Member(e)),
        Err(e) => Ok(Some(Err(e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raidkit_layout::ParityLayout;
    use raidkit_member::MemMember;

    pub(crate) fn sample() -> Superblock {
        Superblock {
            seq: 7,
            array_uuid: Uuid::from_u128(0x1234),
            member_uuid: Uuid::from_u128(0x5678),
            name: "lab-array".into(),
            level: Level::Raid6,
            layout: Layout::Parity(ParityLayout::RightAsymmetric),
            chunk: 65536,
            role: Role::Active(2),
            ctime: 1,
            utime: 2,
            events: 9,
            data_offset: 1 << 20,
            data_size: 15 << 20,
            array_size: 30 << 20,
            state: ArrayState::Dirty,
            recovery_offset: Some(4096),
            bitmap: BitmapArea {
                offset: 16384,
                region: 4096,
                events_cleared: 64 << 20,
            },
            journal: JournalArea::default(),
            resync: Some(77),
            checksums: ChecksumArea {
                offset: 1 << 20,
                size: 1 << 20,
            },
            scrub: Some((12, true)),
            domain: "rack-2".into(),
            reshape: Some(ReshapePos {
                old_disks: 3,
                rows: 77,
                backup: 1 << 20,
                backup_crc: 0xdead_beef,
                old_chunk: 512 << 10,
            }),
            converted_from: Some((Level::Raid1, Layout::None, 65536)),
            replacing: true,
            last_scrub: Some(ScrubSummary {
                ended: 1_795_000_000,
                millis: 12_500,
                bytes: 15 << 20,
                repaired: 3,
                unrepaired: 1,
                found: 5,
                check_only: false,
                result: "a member was lost".into(),
            }),
            roles: (0..4)
                .map(|i| RoleEntry {
                    member_uuid: Uuid::from_u128(i),
                    state: if i == 1 {
                        RoleState::Faulty
                    } else {
                        RoleState::Active
                    },
                    data_size: 15 << 20,
                })
                .collect(),
            md: None,
        }
    }

    #[test]
    fn encode_decode_round_trip() {
        let sb = sample();
        let b = sb.encode();
        assert_eq!(Superblock::decode(&b, "m").unwrap().unwrap(), sb);
    }

    #[test]
    fn an_open_array_with_a_journal_is_written_as_version_4() {
        let version = |sb: &Superblock| get_u32(&sb.encode(), 8);
        let mut sb = sample();
        assert_eq!(version(&sb), VERSION_RESHAPE);
        sb.journal = JournalArea {
            offset: 64 << 10,
            size: 1 << 20,
            applied_seq: 5,
        };
        // Open: whatever else the array has, readers from before spanning
        // intent records refuse it.
        for reshape in [sb.reshape, None] {
            sb.reshape = reshape;
            assert_eq!(version(&sb), VERSION_OPEN_JOURNAL);
            assert_eq!(Superblock::decode(&sb.encode(), "m").unwrap().unwrap(), sb);
        }
        // Stopped cleanly: the version of the other features again.
        sb.state = ArrayState::Clean;
        assert_eq!(version(&sb), VERSION);
        sb.checksums = ChecksumArea::default();
        assert_eq!(version(&sb), VERSION_NO_CHECKSUMS);
        sb.state = ArrayState::Dirty;
        sb.journal = JournalArea::default();
        assert_eq!(version(&sb), VERSION_NO_CHECKSUMS);
        // A version past this build's is refused, not guessed at.
        let mut b = sample().encode();
        put_u32(&mut b, 8, VERSION_OPEN_JOURNAL + 1);
        let crc = block_crc(&b);
        put_u32(&mut b, 16, crc);
        assert!(matches!(
            Superblock::decode(&b, "m"),
            Err(Error::UnsupportedVersion { version: 5, .. })
        ));
    }

    #[test]
    fn any_flipped_bit_is_detected() {
        let b = sample().encode();
        for byte in [9usize, 20, 100, 200, 1100, 5000, 8191] {
            let mut c = b.clone();
            c[byte] ^= 0x10;
            assert!(Superblock::decode(&c, "m").is_err(), "byte {byte}");
        }
    }

    #[test]
    fn torn_update_keeps_the_other_copy() {
        let m = MemMember::new("m", 1 << 20);
        let mut sb = sample();
        write_superblock(&m, &mut sb).unwrap();
        let old_seq = sb.seq;
        // Simulate a crash while writing copy A of the next update: half of
        // the new block lands, copy B still holds the previous version.
        // Only the first sector (new header and checksum) reaches the disk;
        // the role table behind it is still the old one.
        sb.seq += 1;
        sb.events += 1;
        sb.roles[3].state = RoleState::Faulty;
        let new = sb.encode();
        m.write_at(&new[..512], 0).unwrap();
        let r = read_superblock(&m).unwrap();
        assert_eq!(r.copies_valid, [false, true]);
        assert_eq!(r.sb.seq, old_seq);
        // Crash after A was written but before B: A (newer) wins.
        m.write_at(&new, 0).unwrap();
        let r = read_superblock(&m).unwrap();
        assert_eq!(r.copies_valid, [true, true]);
        assert_eq!(r.sb.seq, old_seq + 1);
        assert_eq!(r.sb.events, sb.events);
    }

    #[test]
    fn blank_and_garbage_members() {
        let m = MemMember::new("blank", 1 << 20);
        assert!(matches!(
            read_superblock(&m),
            Err(Error::NoSuperblock { .. })
        ));
        let small = MemMember::new("tiny", 100);
        assert!(matches!(
            read_superblock(&small),
            Err(Error::NoSuperblock { .. })
        ));
        let mut b = sample().encode();
        b[3000] ^= 1;
        m.write_at(&b, 0).unwrap();
        m.write_at(&b, SB_SIZE as u64).unwrap();
        let e = read_superblock(&m).unwrap_err();
        assert!(e.to_string().contains("both copies"), "{e}");
    }

    #[test]
    fn data_offset_policy() {
        assert_eq!(data_offset_for(16 << 20), MIB);
        assert_eq!(data_offset_for(128 << 20), MIB);
        assert_eq!(data_offset_for(1 << 30), 8 * MIB);
        assert_eq!(data_offset_for(1 << 40), 128 * MIB);
    }
}
