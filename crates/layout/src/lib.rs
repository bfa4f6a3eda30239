//! Where every byte of a raidkit array lives.
//!
//! This crate is pure arithmetic: it maps a logical array offset to member
//! offsets (and, for the parity levels, names the parity members of each
//! stripe) exactly as Linux md does, with no I/O at all, so that it can be
//! property-tested exhaustively.
//!
//! Offsets here are in a member's *data area*; the array engine adds each
//! member's `data_offset`.
//!
//! ```
//! use raidkit_layout::{Geometry, Level, Layout, ParityLayout};
//! // Four members, RAID-5 left-symmetric, 64 KiB chunks, 1 MiB of data each.
//! let g = Geometry::new(Level::Raid5, Layout::Parity(ParityLayout::LeftSymmetric),
//!                       64 * 1024, vec![1 << 20; 4]).unwrap();
//! assert_eq!(g.capacity(), 3 << 20);
//! // Stripe 0 holds its parity on the last member, stripe 1 on the one before.
//! assert_eq!(g.stripe_map(0).p, 3);
//! assert_eq!(g.stripe_map(1).p, 2);
//! ```

use smallvec::{smallvec, SmallVec};
use std::fmt;
use std::str::FromStr;

/// The largest number of members an array may have (bounded by the superblock's role table).
pub const MAX_MEMBERS: usize = 128;
/// The smallest chunk md accepts for striped levels, and raidkit's too.
pub const MIN_CHUNK: u64 = 4096;
/// The largest chunk raidkit accepts: a journal record's window is a
/// 32-bit length (a whole stripe's chunk), and recovery holds a chunk per
/// member in memory. md's arrays in use stay far below it.
pub const MAX_CHUNK: u64 = 1 << 30;
/// md's default chunk.
pub const DEFAULT_CHUNK: u64 = 512 * 1024;

/// Errors in an array's shape: things a user can get wrong on the command line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// unknown RAID level '{0}' (expected linear, 0, 1, 4, 5, 6 or 10)
    #[error("unknown RAID level '{0}' (expected linear, 0, 1, 4, 5, 6 or 10)")]
    UnknownLevel(String),
    #[error("unknown layout '{0}' (expected left-symmetric, right-symmetric, left-asymmetric, right-asymmetric, parity-first, parity-last, or for RAID-10 nN, fN or oN: N copies near, far or offset)")]
    UnknownLayout(String),
    #[error("layout {layout} does not apply to {level}")]
    LayoutNotForLevel { level: Level, layout: Layout },
    #[error("chunk size {0} is not a power of two of at least 4 KiB and at most 1 GiB")]
    BadChunk(u64),
    #[error("{level} needs at least {min} members, {got} given")]
    TooFewMembers {
        level: Level,
        min: usize,
        got: usize,
    },
    #[error("{got} members given; at most {max} are supported")]
    TooManyMembers { got: usize, max: usize },
    #[error("member data area of {size} bytes holds no whole {chunk}-byte chunk")]
    MemberTooSmall { size: u64, chunk: u64 },
    /// A RAID-10 far or offset layout needs a chunk row per copy.
    #[error("member data area of {size} bytes holds fewer {chunk}-byte chunks than the layout's {copies} far copies")]
    TooSmallForFarCopies { size: u64, chunk: u64, copies: u64 },
}

/// A RAID level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Level {
    Linear,
    Raid0,
    Raid1,
    Raid4,
    Raid5,
    Raid6,
    Raid10,
}

impl Level {
    /// md's level number (linear is -1).
    pub fn md_number(self) -> i32 {
        match self {
            Level::Linear => -1,
            Level::Raid0 => 0,
            Level::Raid1 => 1,
            Level::Raid4 => 4,
            Level::Raid5 => 5,
            Level::Raid6 => 6,
            Level::Raid10 => 10,
        }
    }

    pub fn from_md_number(n: i32) -> Option<Level> {
        Some(match n {
            -1 => Level::Linear,
            0 => Level::Raid0,
            1 => Level::Raid1,
            4 => Level::Raid4,
            5 => Level::Raid5,
            6 => Level::Raid6,
            10 => Level::Raid10,
            _ => return None,
        })
    }

    /// Number of parity chunks per stripe (RAID-4/5: 1, RAID-6: 2).
    pub fn parity_count(self) -> usize {
        match self {
            Level::Raid4 | Level::Raid5 => 1,
            Level::Raid6 => 2,
            _ => 0,
        }
    }

    pub fn is_parity(self) -> bool {
        self.parity_count() > 0
    }

    /// Whether a member can be lost (and rebuilt) without losing data.
    pub fn has_redundancy(self) -> bool {
        !matches!(self, Level::Linear | Level::Raid0)
    }

    /// The layout used when none is given.
    pub fn default_layout(self) -> Layout {
        match self {
            Level::Raid5 | Level::Raid6 => Layout::Parity(ParityLayout::LeftSymmetric),
            // md's RAID-4 is parity on the last member.
            Level::Raid4 => Layout::Parity(ParityLayout::ParityLast),
            Level::Raid10 => Layout::Near(2),
            _ => Layout::None,
        }
    }

    fn min_members(self, layout: Layout) -> usize {
        match self {
            Level::Linear | Level::Raid0 => 1,
            Level::Raid1 | Level::Raid4 | Level::Raid5 => 2,
            Level::Raid6 => 4,
            Level::Raid10 => match layout {
                Layout::Near(c) | Layout::Far(c) | Layout::Offset(c) => (c as usize).max(2),
                _ => 2,
            },
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Linear => "linear",
            Level::Raid0 => "raid0",
            Level::Raid1 => "raid1",
            Level::Raid4 => "raid4",
            Level::Raid5 => "raid5",
            Level::Raid6 => "raid6",
            Level::Raid10 => "raid10",
        })
    }
}

impl FromStr for Level {
    type Err = LayoutError;
    fn from_str(s: &str) -> Result<Level, LayoutError> {
        let t = s.trim().to_ascii_lowercase();
        let t = t.strip_prefix("raid").unwrap_or(&t);
        Ok(match t {
            "linear" => Level::Linear,
            "0" | "stripe" => Level::Raid0,
            "1" | "mirror" => Level::Raid1,
            "4" => Level::Raid4,
            "5" => Level::Raid5,
            "6" => Level::Raid6,
            "10" => Level::Raid10,
            _ => return Err(LayoutError::UnknownLevel(s.to_string())),
        })
    }
}

/// md's RAID-4/5/6 parity placements (the `ALGORITHM_*` numbers of md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ParityLayout {
    LeftAsymmetric = 0,
    RightAsymmetric = 1,
    LeftSymmetric = 2,
    RightSymmetric = 3,
    /// md's ALGORITHM_PARITY_0: P (and Q) on the first members.
    ParityFirst = 4,
    /// md's ALGORITHM_PARITY_N: P (and Q) on the last members.
    ParityLast = 5,
    /// RAID-6 only, md's ALGORITHM_*_6: the RAID-5 layout of that name
    /// over all members but the last, Q always on the last. md's RAID-5 to
    /// RAID-6 conversion with a new member keeps it (mdadm's
    /// `--layout=preserve`): no data moves, Q is built on the new member.
    LeftAsymmetric6 = 16,
    RightAsymmetric6 = 17,
    LeftSymmetric6 = 18,
    RightSymmetric6 = 19,
    ParityFirst6 = 20,
}

impl ParityLayout {
    pub const ALL: [ParityLayout; 6] = [
        ParityLayout::LeftAsymmetric,
        ParityLayout::RightAsymmetric,
        ParityLayout::LeftSymmetric,
        ParityLayout::RightSymmetric,
        ParityLayout::ParityFirst,
        ParityLayout::ParityLast,
    ];

    /// The RAID-6 layouts with Q on the last member (md's "-6" ones).
    pub const Q_LAST: [ParityLayout; 5] = [
        ParityLayout::LeftAsymmetric6,
        ParityLayout::RightAsymmetric6,
        ParityLayout::LeftSymmetric6,
        ParityLayout::RightSymmetric6,
        ParityLayout::ParityFirst6,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ParityLayout::LeftAsymmetric => "left-asymmetric",
            ParityLayout::RightAsymmetric => "right-asymmetric",
            ParityLayout::LeftSymmetric => "left-symmetric",
            ParityLayout::RightSymmetric => "right-symmetric",
            ParityLayout::ParityFirst => "parity-first",
            ParityLayout::ParityLast => "parity-last",
            ParityLayout::LeftAsymmetric6 => "left-asymmetric-6",
            ParityLayout::RightAsymmetric6 => "right-asymmetric-6",
            ParityLayout::LeftSymmetric6 => "left-symmetric-6",
            ParityLayout::RightSymmetric6 => "right-symmetric-6",
            ParityLayout::ParityFirst6 => "parity-first-6",
        }
    }

    /// For a "-6" layout, the RAID-5 layout its P and data follow.
    pub fn raid5_part(self) -> Option<ParityLayout> {
        Some(match self {
            ParityLayout::LeftAsymmetric6 => ParityLayout::LeftAsymmetric,
            ParityLayout::RightAsymmetric6 => ParityLayout::RightAsymmetric,
            ParityLayout::LeftSymmetric6 => ParityLayout::LeftSymmetric,
            ParityLayout::RightSymmetric6 => ParityLayout::RightSymmetric,
            ParityLayout::ParityFirst6 => ParityLayout::ParityFirst,
            _ => return None,
        })
    }

    /// The RAID-6 layout a RAID-5 of this layout becomes when a member is
    /// added for Q and nothing moves (md's raid5 to raid6 takeover):
    /// parity-last keeps its number (P then Q last).
    pub fn with_q_last(self) -> Option<ParityLayout> {
        Some(match self {
            ParityLayout::LeftAsymmetric => ParityLayout::LeftAsymmetric6,
            ParityLayout::RightAsymmetric => ParityLayout::RightAsymmetric6,
            ParityLayout::LeftSymmetric => ParityLayout::LeftSymmetric6,
            ParityLayout::RightSymmetric => ParityLayout::RightSymmetric6,
            ParityLayout::ParityFirst => ParityLayout::ParityFirst6,
            ParityLayout::ParityLast => ParityLayout::ParityLast,
            _ => return None,
        })
    }
}

/// How data is arranged within a level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Levels without layout choices (linear, 0, 1).
    None,
    /// RAID-4/5/6 parity placement.
    Parity(ParityLayout),
    /// RAID-10 "near" layout with this many copies (md's `n2`, `n3`...).
    Near(u8),
    /// RAID-10 "far" layout (md's `f2`...): each member split into this
    /// many sections; the first holds the array as RAID-0 does, each next
    /// one the whole array again, shifted one member on.
    Far(u8),
    /// RAID-10 "offset" layout (md's `o2`...): each row of chunks followed
    /// by this many less one copies of itself, each shifted one member on.
    Offset(u8),
}

impl Layout {
    /// md's numeric layout, as stored in the superblock.
    pub fn md_number(self) -> u32 {
        match self {
            Layout::None => 0,
            Layout::Parity(p) => p as u32,
            // md: near copies in the low byte, far copies in the next,
            // the offset flag in bit 16.
            Layout::Near(c) => 0x100 | c as u32,
            Layout::Far(c) => (c as u32) << 8 | 1,
            Layout::Offset(c) => 0x10000 | (c as u32) << 8 | 1,
        }
    }

    pub fn from_md_number(level: Level, n: u32) -> Option<Layout> {
        match level {
            Level::Raid4 | Level::Raid5 | Level::Raid6 => ParityLayout::ALL
                .into_iter()
                .chain(ParityLayout::Q_LAST)
                .find(|p| *p as u32 == n)
                .filter(|p| level == Level::Raid6 || p.raid5_part().is_none())
                .map(Layout::Parity),
            // One of near and far copies is 1, as mdadm makes them (md's
            // "far sets", bit 17, are not made by mdadm and not read here).
            Level::Raid10 => {
                let (near, far, offset) = (n & 0xff, (n >> 8) & 0xff, n >> 16);
                match (near, far, offset) {
                    (2..=8, 1, 0) => Some(Layout::Near(near as u8)),
                    (1, 2..=8, 0) => Some(Layout::Far(far as u8)),
                    (1, 2..=8, 1) => Some(Layout::Offset(far as u8)),
                    _ => None,
                }
            }
            _ if n == 0 => Some(Layout::None),
            _ => None,
        }
    }

    /// Parse a user's layout name for `level`.
    pub fn parse(level: Level, s: &str) -> Result<Layout, LayoutError> {
        let t = s.trim().to_ascii_lowercase();
        let parsed = ParityLayout::ALL
            .into_iter()
            .chain(ParityLayout::Q_LAST)
            .find(|p| p.name() == t || short_name(*p) == t)
            .map(Layout::Parity)
            .or_else(|| {
                let (kind, n) = t.split_at_checked(1)?;
                let n: u8 = n.parse().ok().filter(|n| (2..=8).contains(n))?;
                match kind {
                    "n" => Some(Layout::Near(n)),
                    "f" => Some(Layout::Far(n)),
                    "o" => Some(Layout::Offset(n)),
                    _ => None,
                }
            })
            .ok_or_else(|| LayoutError::UnknownLayout(s.to_string()))?;
        // RAID-4 keeps parity on its last member whatever the layout says,
        // as md's does (its layout field is not read for level 4): any
        // other name would be recorded and not followed. (Arrays that
        // recorded another one still open: they were placed parity-last.)
        let fits = layout_fits(level, parsed)
            && (level != Level::Raid4 || parsed == Layout::Parity(ParityLayout::ParityLast));
        if !fits {
            return Err(LayoutError::LayoutNotForLevel {
                level,
                layout: parsed,
            });
        }
        Ok(parsed)
    }
}

/// Whether `level` can have `layout` (the "-6" layouts are RAID-6's).
fn layout_fits(level: Level, layout: Layout) -> bool {
    match (level, layout) {
        (Level::Linear | Level::Raid0 | Level::Raid1, Layout::None) => true,
        (Level::Raid4 | Level::Raid5, Layout::Parity(p)) => p.raid5_part().is_none(),
        (Level::Raid6, Layout::Parity(_)) => true,
        (Level::Raid10, Layout::Near(c) | Layout::Far(c) | Layout::Offset(c)) => {
            (2..=8).contains(&c)
        }
        _ => false,
    }
}

/// mdadm's short names (ls, rs, la, ra).
fn short_name(p: ParityLayout) -> &'static str {
    match p {
        ParityLayout::LeftAsymmetric => "la",
        ParityLayout::RightAsymmetric => "ra",
        ParityLayout::LeftSymmetric => "ls",
        ParityLayout::RightSymmetric => "rs",
        ParityLayout::ParityFirst => "parity-0",
        ParityLayout::ParityLast => "parity-n",
        ParityLayout::LeftAsymmetric6 => "la-6",
        ParityLayout::RightAsymmetric6 => "ra-6",
        ParityLayout::LeftSymmetric6 => "ls-6",
        ParityLayout::RightSymmetric6 => "rs-6",
        ParityLayout::ParityFirst6 => "parity-0-6",
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layout::None => f.write_str("-"),
            Layout::Parity(p) => f.write_str(p.name()),
            Layout::Near(c) => write!(f, "n{c}"),
            Layout::Far(c) => write!(f, "f{c}"),
            Layout::Offset(c) => write!(f, "o{c}"),
        }
    }
}

/// Where P and Q of one stripe live, and where its data chunks go.
///
/// `data[i]` is the member holding data chunk `i` of the stripe (logical
/// order); `syndrome[i]` is that chunk's index in the RAID-6 Q syndrome
/// (md computes Q over the data members in member order starting after Q,
/// which differs from logical order for the asymmetric layouts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StripeMap {
    pub p: usize,
    pub q: Option<usize>,
    pub data: SmallVec<[usize; 16]>,
    pub syndrome: SmallVec<[usize; 16]>,
}

/// Member locations of one piece (inline for up to three copies, so that
/// mapping a request allocates nothing).
pub type Copies = SmallVec<[(usize, u64); 3]>;

/// The pieces of one request (inline for short requests).
pub type Pieces = SmallVec<[Piece; 4]>;

/// One contiguous run of a logical range that lies within one chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// Logical array offset of the piece's first byte.
    pub logical: u64,
    pub len: u64,
    /// Stripe (row of chunks) number; for linear, the member index.
    pub stripe: u64,
    /// Offset of the piece within its chunk.
    pub col: u64,
    /// Data chunk index within the stripe (parity levels); 0 otherwise.
    pub dd: usize,
    /// Every (member, data-area offset) holding this piece: one for
    /// linear/0/4/5/6, all members for RAID-1, the copies for RAID-10.
    pub copies: Copies,
}

impl Piece {
    /// Where member `role` holds this piece (its data-area offset), if it
    /// holds a copy.
    pub fn dev_on(&self, role: usize) -> Option<u64> {
        self.copies.iter().find(|c| c.0 == role).map(|c| c.1)
    }
}

/// The shape of an array: level, layout, chunk and per-member data sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    pub level: Level,
    pub layout: Layout,
    pub chunk: u64,
    /// Usable data bytes of each member, rounded down to whole chunks.
    /// Equal for every level but linear.
    pub member_sizes: Vec<u64>,
    /// Linear only: logical start of each member.
    starts: Vec<u64>,
}

/// Check that `chunk` is a power of two from 4 KiB to 1 GiB.
pub fn check_chunk(chunk: u64) -> Result<(), LayoutError> {
    if !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk) || !chunk.is_power_of_two() {
        return Err(LayoutError::BadChunk(chunk));
    }
    Ok(())
}

/// md's RAID-5 placement of stripe `stripe` over `n` members with one
/// parity: P's member, and the data chunks' members pushed onto `data`.
fn raid5_placement(
    alg: ParityLayout,
    n: usize,
    stripe: u64,
    data: &mut SmallVec<[usize; 16]>,
) -> usize {
    let k = n - 1;
    let r = (stripe % n as u64) as usize;
    let p = match alg {
        ParityLayout::LeftAsymmetric | ParityLayout::LeftSymmetric => k - r,
        ParityLayout::RightAsymmetric | ParityLayout::RightSymmetric => r,
        ParityLayout::ParityFirst => 0,
        _ => k,
    };
    for d in 0..k {
        data.push(match alg {
            ParityLayout::LeftAsymmetric | ParityLayout::RightAsymmetric => {
                if d >= p {
                    d + 1
                } else {
                    d
                }
            }
            ParityLayout::LeftSymmetric | ParityLayout::RightSymmetric => (p + 1 + d) % n,
            ParityLayout::ParityFirst => d + 1,
            _ => d,
        });
    }
    p
}

impl Geometry {
    /// Build a geometry. `member_sizes` are the raw data-area sizes; they are
    /// rounded down to whole chunks (as md does), and for every level but
    /// linear the smallest is used for all members.
    pub fn new(
        level: Level,
        layout: Layout,
        chunk: u64,
        member_sizes: Vec<u64>,
    ) -> Result<Geometry, LayoutError> {
        check_chunk(chunk)?;
        let n = member_sizes.len();
        if !layout_fits(level, layout) {
            return Err(LayoutError::LayoutNotForLevel { level, layout });
        }
        let min = level.min_members(layout);
        if n < min {
            return Err(LayoutError::TooFewMembers { level, min, got: n });
        }
        if n > MAX_MEMBERS {
            return Err(LayoutError::TooManyMembers {
                got: n,
                max: MAX_MEMBERS,
            });
        }
        let mut sizes: Vec<u64> = member_sizes.iter().map(|s| s / chunk * chunk).collect();
        if level != Level::Linear {
            let smallest = *sizes.iter().min().expect("n >= 1");
            sizes.iter_mut().for_each(|s| *s = smallest);
        }
        if let Some(&s) = sizes.iter().find(|&&s| s == 0) {
            let raw = member_sizes[sizes.iter().position(|&x| x == s).unwrap_or(0)];
            return Err(LayoutError::MemberTooSmall { size: raw, chunk });
        }
        if let Layout::Far(c) | Layout::Offset(c) = layout {
            if sizes[0] / chunk < c as u64 {
                return Err(LayoutError::TooSmallForFarCopies {
                    size: sizes[0],
                    chunk,
                    copies: c as u64,
                });
            }
            // md uses whole groups of far copies (calc_sectors): the rows
            // past the last are never used, and mdadm, which shows an
            // array's size as a member's times members over copies, shows
            // the kernel's size only when the members' are whole groups.
            let group = chunk * c as u64;
            sizes.iter_mut().for_each(|s| *s = *s / group * group);
        }
        let mut starts = Vec::new();
        if level == Level::Linear {
            let mut acc = 0;
            for s in &sizes {
                starts.push(acc);
                acc += s;
            }
        }
        Ok(Geometry {
            level,
            layout,
            chunk,
            member_sizes: sizes,
            starts,
        })
    }

    pub fn members(&self) -> usize {
        self.member_sizes.len()
    }

    /// Data chunks per stripe (RAID-0: members; RAID-4/5/6: members minus parity).
    pub fn data_members(&self) -> usize {
        self.members() - self.level.parity_count()
    }

    fn near_copies(&self) -> usize {
        match self.layout {
            Layout::Near(c) => c as usize,
            _ => 1,
        }
    }

    /// RAID-10's far copies (sections of each member, or for the offset
    /// layout rows of each stripe); 1 for near layouts.
    fn far_copies(&self) -> u64 {
        match self.layout {
            Layout::Far(c) | Layout::Offset(c) => c as u64,
            _ => 1,
        }
    }

    /// md's stride of a RAID-10 far layout, in chunk rows: how far each
    /// far copy lies below the one before (md's calc_sectors: the rows a
    /// member uses, over the far copies). 1 for the offset layout.
    fn far_stride(&self) -> u64 {
        match self.layout {
            Layout::Far(_) => self.used_rows() / self.far_copies(),
            _ => 1,
        }
    }

    /// Chunk rows of each member that hold data (md's calc_sectors): a
    /// far or offset layout leaves the rows past a whole number of
    /// sections unused.
    fn used_rows(&self) -> u64 {
        if self.level != Level::Raid10 {
            return self.member_chunks();
        }
        let (n, nc, fc) = (
            self.members() as u64,
            self.near_copies() as u64,
            self.far_copies(),
        );
        (self.capacity() / self.chunk * nc * fc).div_ceil(n)
    }

    /// Chunks per member.
    fn member_chunks(&self) -> u64 {
        self.member_sizes[0] / self.chunk
    }

    /// Usable bytes of the array (md's formulas).
    pub fn capacity(&self) -> u64 {
        let n = self.members() as u64;
        match self.level {
            Level::Linear => self.member_sizes.iter().sum(),
            Level::Raid0 => self.member_sizes[0] * n,
            Level::Raid1 => self.member_sizes[0],
            Level::Raid4 | Level::Raid5 | Level::Raid6 => {
                self.member_sizes[0] * self.data_members() as u64
            }
            // md's raid10_size: chunks per member over far copies, times
            // members over near copies.
            Level::Raid10 => {
                self.member_chunks() / self.far_copies() * n / self.near_copies() as u64
                    * self.chunk
            }
        }
    }

    /// Number of stripes (rows of chunks) for striped levels.
    pub fn stripes(&self) -> u64 {
        self.member_chunks()
    }

    /// md's raid5_compute_sector for one stripe: where P, Q and the data go.
    ///
    /// # Panics
    /// If the level has no parity.
    pub fn stripe_map(&self, stripe: u64) -> StripeMap {
        let n = self.members();
        let k = self.data_members();
        let Layout::Parity(alg) = self.layout else {
            panic!("stripe_map on {} which has no parity", self.level)
        };
        let r = (stripe % n as u64) as usize;
        let mut data: SmallVec<[usize; 16]> = SmallVec::with_capacity(k);
        let (p, q) = match (self.level, alg.raid5_part()) {
            (Level::Raid4, _) => {
                data.extend(0..k);
                (k, None)
            }
            (Level::Raid5, _) => (raid5_placement(alg, n, stripe, &mut data), None),
            // md's ALGORITHM_*_6: RAID-5 over the first n - 1, Q last.
            (Level::Raid6, Some(base)) => {
                (raid5_placement(base, n - 1, stripe, &mut data), Some(n - 1))
            }
            (Level::Raid6, None) => {
                let (p, q) = match alg {
                    ParityLayout::LeftAsymmetric | ParityLayout::LeftSymmetric => {
                        let p = n - 1 - r;
                        (p, (p + 1) % n)
                    }
                    ParityLayout::RightAsymmetric | ParityLayout::RightSymmetric => {
                        (r, (r + 1) % n)
                    }
                    ParityLayout::ParityFirst => (0, 1),
                    ParityLayout::ParityLast => (k, k + 1),
                    _ => unreachable!("a -6 layout has its RAID-5 part"),
                };
                for d in 0..k {
                    data.push(match alg {
                        ParityLayout::LeftAsymmetric | ParityLayout::RightAsymmetric => {
                            if p == n - 1 {
                                d + 1 // Q D D D P
                            } else if d >= p {
                                d + 2 // D D P Q D
                            } else {
                                d
                            }
                        }
                        ParityLayout::LeftSymmetric | ParityLayout::RightSymmetric => {
                            (p + 2 + d) % n
                        }
                        ParityLayout::ParityFirst => d + 2,
                        _ => d,
                    });
                }
                (p, Some(q))
            }
            _ => unreachable!(),
        };
        // md's set_syndrome_sources: walk the members starting after Q
        // (from 0 when Q is the last member), skipping P and Q.
        let mut syndrome: SmallVec<[usize; 16]> = smallvec![0; k];
        if let Some(q) = q {
            let d0 = if q == n - 1 { 0 } else { q + 1 };
            let mut slot = 0;
            for i in 0..n {
                let m = (d0 + i) % n;
                if m == p || m == q {
                    continue;
                }
                let dd = data.iter().position(|&x| x == m).expect("data member");
                syndrome[dd] = slot;
                slot += 1;
            }
        } else {
            syndrome.iter_mut().enumerate().for_each(|(i, s)| *s = i);
        }
        StripeMap {
            p,
            q,
            data,
            syndrome,
        }
    }

    /// Split the logical range `[off, off + len)` into pieces that each lie
    /// within one chunk (one member for linear). The range must lie within
    /// the capacity.
    pub fn pieces(&self, off: u64, len: u64) -> Pieces {
        assert!(
            off.checked_add(len).is_some_and(|e| e <= self.capacity()),
            "range {off}+{len} beyond capacity {}",
            self.capacity()
        );
        let mut out = Pieces::new();
        let mut pos = off;
        let end = off + len;
        while pos < end {
            let p = self.piece_at(pos, end - pos);
            pos += p.len;
            out.push(p);
        }
        out
    }

    /// The piece starting at logical offset `pos`, at most `max` bytes long.
    fn piece_at(&self, pos: u64, max: u64) -> Piece {
        let chunk = self.chunk;
        let n = self.members() as u64;
        if self.level == Level::Linear {
            let m = self.starts.partition_point(|&s| s <= pos) - 1;
            let within = pos - self.starts[m];
            let len = max.min(self.member_sizes[m] - within);
            return Piece {
                logical: pos,
                len,
                stripe: m as u64,
                col: within,
                dd: 0,
                copies: smallvec![(m, within)],
            };
        }
        let col = pos % chunk;
        let len = max.min(chunk - col);
        let chunk_no = pos / chunk;
        let (stripe, dd, copies) = match self.level {
            Level::Raid0 => {
                let stripe = chunk_no / n;
                let m = (chunk_no % n) as usize;
                (stripe, 0, smallvec![(m, stripe * chunk + col)])
            }
            Level::Raid1 => (chunk_no, 0, (0..n as usize).map(|m| (m, pos)).collect()),
            Level::Raid10 => {
                let copies: Copies = self
                    .raid10_rows_of_chunk(chunk_no)
                    .map(|(m, row)| (m, row * chunk + col))
                    .collect();
                (copies[0].1 / chunk, 0, copies)
            }
            Level::Raid4 | Level::Raid5 | Level::Raid6 => {
                let k = self.data_members() as u64;
                let stripe = chunk_no / k;
                let dd = (chunk_no % k) as usize;
                let m = self.stripe_map(stripe).data[dd];
                (stripe, dd, smallvec![(m, stripe * chunk + col)])
            }
            Level::Linear => unreachable!(),
        };
        Piece {
            logical: pos,
            len,
            stripe,
            col,
            dd,
            copies,
        }
    }

    /// md's raid10_find_phys: the (member, chunk row) of every copy of
    /// logical chunk `chunk_no`, near copies first, each followed by its
    /// far copies. Near: copy j of chunk c in slot c * copies + j, slots
    /// filled row by row across the members. Far: each further copy one
    /// section (`far_stride` rows) down and `near` members on; offset: one
    /// row down instead of a section (the stripe's rows then come in
    /// groups of the far copies). md's far sets (layout bit 17) are not
    /// made by mdadm: the set is every member.
    fn raid10_rows_of_chunk(&self, chunk_no: u64) -> impl Iterator<Item = (usize, u64)> {
        let n = self.members() as u64;
        let (nc, fc) = (self.near_copies() as u64, self.far_copies());
        let offset = matches!(self.layout, Layout::Offset(_));
        let stride = self.far_stride();
        let first = chunk_no * nc;
        let (mut row, dev) = (first / n, first % n);
        if offset {
            row *= fc;
        }
        (0..nc).flat_map(move |j| {
            // Near copy j: the next member, wrapping to the next row (md
            // moves one row on there in every layout; near and far copies
            // are not both above 1 here).
            let slot = dev + j;
            let (d, r) = (slot % n, row + slot / n);
            (0..fc).map(move |f| (((d + f * nc) % n) as usize, r + f * stride))
        })
    }

    /// Mirrored levels: the logical chunk that member `role` holds in its
    /// chunk row `row` (None past the end of the array, or in rows a
    /// RAID-10 far or offset layout leaves unused). md's raid10_find_virt.
    pub fn mirror_chunk_at(&self, role: usize, row: u64) -> Option<u64> {
        let c = match self.level {
            Level::Raid1 => row,
            Level::Raid10 => {
                if row >= self.used_rows() {
                    return None;
                }
                let n = self.members() as u64;
                let (nc, fc) = (self.near_copies() as u64, self.far_copies());
                // Back to the first section (row) and its member.
                let (f, base) = match self.layout {
                    Layout::Offset(_) => (row % fc, row / fc),
                    Layout::Far(_) => (row / self.far_stride(), row % self.far_stride()),
                    _ => (0, row),
                };
                let d = (role as u64 + n - f * nc % n) % n;
                (base * n + d) / nc
            }
            _ => return None,
        };
        (c < self.capacity() / self.chunk).then_some(c)
    }

    /// Logical offset of data chunk `dd` of `stripe` (parity levels).
    pub fn stripe_data_offset(&self, stripe: u64, dd: usize) -> u64 {
        (stripe * self.data_members() as u64 + dd as u64) * self.chunk
    }

    /// For RAID-10: which members form each mirror set is not fixed (copies
    /// rotate when members % copies != 0), so redundancy is judged per chunk:
    /// the members holding logical chunk `chunk_no`.
    pub fn raid10_members_of_chunk(&self, chunk_no: u64) -> Vec<usize> {
        self.raid10_rows_of_chunk(chunk_no)
            .map(|(m, _)| m)
            .collect()
    }

    /// How many members may be lost without losing data, in the worst case.
    pub fn redundancy(&self) -> usize {
        match self.level {
            Level::Linear | Level::Raid0 => 0,
            Level::Raid1 => self.members() - 1,
            Level::Raid4 | Level::Raid5 => 1,
            Level::Raid6 => 2,
            Level::Raid10 => self.near_copies() * self.far_copies() as usize - 1,
        }
    }

    /// Whether the array can serve every byte with the members in `missing` absent.
    pub fn survives(&self, missing: &[usize]) -> bool {
        if missing.is_empty() {
            return true;
        }
        match self.level {
            Level::Linear | Level::Raid0 => false,
            Level::Raid1 => missing.len() < self.members(),
            Level::Raid4 | Level::Raid5 | Level::Raid6 => {
                missing.len() <= self.level.parity_count()
            }
            Level::Raid10 => {
                // The copy pattern repeats every `members` chunks.
                (0..self.members() as u64).all(|c| {
                    self.raid10_members_of_chunk(c)
                        .iter()
                        .any(|m| !missing.contains(m))
                })
            }
        }
    }
}

#[cfg(test)]
mod tests;
