//! Checking redundancy against data, offline: every unit (stripe of a
//! parity level, chunk of a mirror) compared by its level
//! (`LevelOps::check_unit`: parity recomputed with the slow reference
//! code, copies compared). An array with checksums is checked as a scrub
//! that only reports: each block against its own checksum first, so the
//! member that is wrong is named rather than the parity that disagrees.

use super::*;
use crate::scrub::Finding;

impl Array {
    /// Count stripes (parity levels) or chunks (mirrors) whose redundancy
    /// disagrees with the data, P and Q recomputed by the slow reference
    /// code. Needs every member present and in sync.
    pub fn count_mismatches(&self) -> Result<u64> {
        self.scan_mismatches(&mut |_| {})
    }

    /// As `count_mismatches`, calling `each` with every mismatch found, in
    /// order: which unit, where, and which roles disagree.
    pub fn scan_mismatches(&self, each: &mut dyn FnMut(Mismatch)) -> Result<u64> {
        self.scan_findings(each, &mut |_| {})
    }

    /// As `scan_mismatches`; with checksums, `named` also gets every block
    /// found wrong (member, role, offsets, kind), and a unit's roles are
    /// the members found wrong.
    pub fn scan_findings(
        &self,
        each: &mut dyn FnMut(Mismatch),
        named: &mut dyn FnMut(Finding),
    ) -> Result<u64> {
        if self.reshape_in_progress() {
            return Err(Error::Invalid(
                "a reshape is in progress (its rows are in two geometries): serve the array to let it finish, then check".into(),
            ));
        }
        let v = self.core.view.load();
        if !v.degraded_roles().is_empty() {
            return Err(Error::Invalid(
                "checking redundancy needs every member in sync".into(),
            ));
        }
        let mut bad = 0;
        let units = self.level().units(self);
        let mut ahead = crate::scrub::ReadAhead::new(self, units);
        for u in 0..units {
            if !self.core.checksums {
                bad += self.level().check_unit(self, &v, u, each)?;
                continue;
            }
            let mut found = Vec::new();
            self.scrub_unit(&v, u, false, &mut |f| found.push(f), Some(ahead.at(u)))?;
            if found.is_empty() {
                continue;
            }
            bad += 1;
            let g = &self.core.geom();
            let (array_offset, member_offset) = if g.level.is_parity() {
                (g.stripe_data_offset(u, 0), u * g.chunk)
            } else {
                (u * g.chunk, g.pieces(u * g.chunk, g.chunk)[0].copies[0].1)
            };
            let mut roles: Vec<usize> = found.iter().map(|f| f.role).collect();
            roles.sort_unstable();
            roles.dedup();
            each(Mismatch {
                unit: u,
                array_offset,
                member_offset,
                roles,
            });
            found.into_iter().for_each(&mut *named);
        }
        Ok(bad)
    }
}
