//! A member held in memory: for tests, and as a model of a perfect disk.

use crate::{check_range, Member, Op, Result};

/// A member held in memory, for tests and as a model of a perfect disk.
#[derive(Debug)]
pub struct MemMember {
    name: String,
    data: std::sync::RwLock<Vec<u8>>,
}

impl MemMember {
    pub fn new(name: &str, len: u64) -> MemMember {
        MemMember {
            name: name.to_string(),
            data: std::sync::RwLock::new(vec![0; len as usize]),
        }
    }

    /// A copy of the whole contents.
    pub fn snapshot(&self) -> Vec<u8> {
        self.data.read().expect("lock").clone()
    }
}

impl Member for MemMember {
    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self) -> u64 {
        self.data.read().expect("lock").len() as u64
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let d = self.data.read().expect("lock");
        check_range(
            &self.name,
            Op::Read,
            offset,
            buf.len() as u64,
            d.len() as u64,
        )?;
        buf.copy_from_slice(&d[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let mut d = self.data.write().expect("lock");
        check_range(
            &self.name,
            Op::Write,
            offset,
            buf.len() as u64,
            d.len() as u64,
        )?;
        d[offset as usize..offset as usize + buf.len()].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }
}
