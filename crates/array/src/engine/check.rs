//! Checking redundancy against data, offline: every unit (stripe of a
//! parity level, chunk of a mirror) compared by its level
//! (`LevelOps::check_unit`: parity recomputed with the slow reference
//! code, copies compared).

use super::*;

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
        let v = self.core.view.load();
        if !v.degraded_roles().is_empty() {
            return Err(Error::Invalid(
                "checking redundancy needs every member in sync".into(),
            ));
        }
        let mut bad = 0;
        for u in 0..self.level.units(self) {
            bad += self.level.check_unit(self, &v, u, each)?;
        }
        Ok(bad)
    }
}
