//! What an array records on its members besides data: the superblock
//! (identity, geometry, state, roles), the write-intent bitmap, the
//! journal and the checksum area. Each file owns its on-disk format and nothing else; the engine
//! decides when they are written.

pub mod bitmap;
pub mod checksums;
pub mod journal;
pub mod md;
pub mod superblock;
