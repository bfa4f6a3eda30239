//! Striped levels (linear, RAID-0): one copy of every byte, no redundancy.
//! Reads and writes go to the one member that holds each piece (the
//! copies code of `mirrored.rs` with a single copy); there is nothing to
//! resync, check or rebuild.

use super::LevelOps;
use crate::background::Process;
use crate::core::View;
use crate::engine::{in_parallel, write_in_runs, Array, Mismatch, PARALLEL_IO};
use crate::error::{Error, Result};
use crate::recovery::{Job, Outcome};
use raidkit_layout::{Level, Piece};

pub(crate) struct Striped;

impl LevelOps for Striped {
    fn read_piece(&self, a: &Array, v: &View, p: &Piece, dst: &mut [u8]) -> Result<()> {
        a.read_copies(v, p, dst)
    }

    fn read_role(&self, _a: &Array, _v: &View, p: &Piece) -> usize {
        p.copies[0].0
    }

    fn write<'a>(
        &self,
        a: &Array,
        v: &View,
        pieces: &[Piece],
        src: &(dyn Fn(&Piece) -> &'a [u8] + Sync),
        len: usize,
    ) -> Result<()> {
        if len >= PARALLEL_IO && pieces.len() > 1 {
            // Large writes: each member's pieces by its own thread.
            let mut groups: Vec<Vec<&Piece>> =
                (0..a.core.geom().members()).map(|_| Vec::new()).collect();
            for p in pieces {
                groups[p.copies[0].0].push(p);
            }
            let merge = !Array::page_cache_only(v);
            return in_parallel(groups.into_iter().filter(|g| !g.is_empty()), |g| {
                if !merge {
                    return g
                        .into_iter()
                        .try_for_each(|p| a.write_copies(v, p, src(p), false));
                }
                // Members that wait for devices: a member's chunks of
                // consecutive stripes as one request.
                write_in_runs(
                    g,
                    |p| p.copies[0].1,
                    |p| src(p),
                    |p, _, d| {
                        let whole = Piece {
                            len: d.len() as u64,
                            ..(*p).clone()
                        };
                        a.write_copies(v, &whole, d, false)
                    },
                )
            });
        }
        pieces
            .iter()
            .try_for_each(|p| a.write_copies(v, p, src(p), false))
    }

    fn discard(&self, a: &Array, v: &View, pieces: &[Piece]) -> Result<Option<(u64, u64)>> {
        for p in pieces {
            let (role, dev) = p.copies[0];
            a.core.member_discard(v, role, dev, p.len)?;
        }
        Ok(super::span(pieces))
    }

    /// Nothing to resync, except where checksums are kept: a pass after
    /// an unclean shutdown reads every chunk, to re-record the checksums
    /// of blocks the crash tore from theirs. RAID-0 by rows (one chunk of
    /// every member: a row is in one geometry during a reshape), linear
    /// by chunks of the address space.
    fn units(&self, a: &Array) -> u64 {
        let g = a.core.geom();
        match (a.checksums(), g.level) {
            (false, _) => 0,
            (true, Level::Raid0) => g.stripes(),
            (true, _) => a.core.capacity() / g.chunk,
        }
    }

    fn unit_in(&self, _a: &Array, _u: u64, _marked: &dyn Fn(u64, u64) -> bool) -> bool {
        false
    }

    fn resync_unit(&self, a: &Array, v: &View, u: u64) -> Result<()> {
        let g = &v.geom;
        let chunk = g.chunk;
        let (off, len) = match g.level {
            Level::Raid0 => (u * chunk * g.members() as u64, chunk * g.members() as u64),
            _ => (u * chunk, chunk),
        };
        let mut buf = crate::scratch::take(chunk as usize);
        let r = g
            .pieces(off, len)
            .iter()
            .try_for_each(|p| a.read_copies(v, p, &mut buf[..p.len as usize]));
        crate::scratch::give(buf);
        r
    }

    fn check_unit(
        &self,
        _a: &Array,
        _v: &View,
        _u: u64,
        _each: &mut dyn FnMut(Mismatch),
    ) -> Result<u64> {
        Ok(0)
    }

    fn rebuild(&self, a: &Array, _job: &Job, _total: u64, _p: &mut Process) -> Result<Outcome> {
        Err(Error::Invalid(format!(
            "{} has no redundancy to rebuild a member from",
            a.core.geom().level
        )))
    }
}
