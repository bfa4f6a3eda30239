//! The levels, one family per file, behind one trait ([`LevelOps`]), in the
//! spirit of SPDK's `raid_bdev_module`: what a request and a background
//! process need of a level, with the array (its core, consistency machinery
//! and background state) passed in.
//!
//! - `striped.rs`: linear and RAID-0, no redundancy.
//! - `mirrored.rs`: RAID-1 and RAID-10, copies.
//! - `parity.rs` (and `parity_rebuild.rs`): RAID-4, 5 and 6, P and Q.
//!
//! A new level is placed in `raidkit_layout` (its `Geometry`) and given
//! here: a family of its own, or an existing one its placement fits.

pub(crate) mod mirrored;
pub(crate) mod parity;
mod parity_rebuild;
mod parity_write;
pub(crate) mod striped;

use crate::background::Process;
use crate::core::View;
use crate::engine::{Array, Mismatch};
use crate::error::Result;
use crate::recovery::{Job, Outcome};
use raidkit_layout::{Level, Piece};

/// What the engine and the background processes ask of a level family.
pub(crate) trait LevelOps: Send + Sync {
    /// Read one piece of a request (`Geometry::pieces`) into `dst`,
    /// reconstructing from redundancy where its member cannot serve it.
    fn read_piece(&self, a: &Array, v: &View, p: &Piece, dst: &mut [u8]) -> Result<()>;

    /// The role whose member serves a piece's read first: large reads are
    /// grouped by it, one thread per member, and read with `read_piece_on`
    /// (a mirrored level's choice moves that disk's head: asked again, it
    /// might choose another copy).
    fn read_role(&self, a: &Array, v: &View, p: &Piece) -> usize;

    /// `read_piece`, trying `role` (from `read_role`) first.
    fn read_piece_on(
        &self,
        a: &Array,
        v: &View,
        p: &Piece,
        dst: &mut [u8],
        role: usize,
    ) -> Result<()> {
        let _ = role;
        self.read_piece(a, v, p, dst)
    }

    /// Write a request's pieces (`src` gives each piece's bytes; `len` is
    /// the request's length), keeping redundancy consistent.
    fn write<'a>(
        &self,
        a: &Array,
        v: &View,
        pieces: &[Piece],
        src: &(dyn Fn(&Piece) -> &'a [u8] + Sync),
        len: usize,
    ) -> Result<()>;

    /// Discard what the pieces cover where the level can keep redundancy
    /// consistent (it then reads back zeroes); elsewhere leave the data as
    /// it is (a discard is advisory). Returns the logical range discarded
    /// (one run: whole stripes in the middle for parity levels), if any.
    fn discard(&self, a: &Array, v: &View, pieces: &[Piece]) -> Result<Option<(u64, u64)>>;

    /// Units a pass over the whole array walks (parity resync, check):
    /// stripes of parity levels, chunks of the address space of mirrors,
    /// none without redundancy.
    fn units(&self, a: &Array) -> u64;

    /// Whether unit `u`'s redundancy covers any of the member regions
    /// `marked` says (device offsets of the data area).
    fn unit_in(&self, a: &Array, u: u64, marked: &dyn Fn(u64, u64) -> bool) -> bool;

    /// Make unit `u`'s redundancy agree with its data. Called with the
    /// unit locked and every member in service.
    fn resync_unit(&self, a: &Array, v: &View, u: u64) -> Result<()>;

    /// Compare unit `u`'s redundancy with its data (the slow reference
    /// code for parity), calling `each` with what disagrees and returning
    /// how many disagreements it found. Every member in service and in sync.
    fn check_unit(
        &self,
        a: &Array,
        v: &View,
        u: u64,
        each: &mut dyn FnMut(Mismatch),
    ) -> Result<u64>;

    /// Bring a job's member in sync (rebuild, resync of marked regions,
    /// replacement), reporting through `process`.
    fn rebuild(&self, a: &Array, job: &Job, total: u64, process: &mut Process) -> Result<Outcome>;
}

/// The family of `level`.
pub(crate) fn of(level: Level) -> &'static dyn LevelOps {
    match level {
        Level::Linear | Level::Raid0 => &striped::Striped,
        Level::Raid1 | Level::Raid10 => &mirrored::Mirrored,
        Level::Raid4 | Level::Raid5 | Level::Raid6 => &parity::Parity,
    }
}

/// The logical range `pieces` cover (they are in order, contiguous).
pub(crate) fn span(pieces: &[Piece]) -> Option<(u64, u64)> {
    let (first, last) = (pieces.first()?, pieces.last()?);
    Some((first.logical, last.logical + last.len))
}
