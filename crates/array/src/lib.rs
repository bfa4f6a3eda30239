//! The raidkit array engine: self-describing members (superblocks),
//! assembly from members in any order, and the array itself, which reads
//! and writes through the members at every level, degraded where the level
//! allows.
//!
//! Members are opened by the caller (the raidkit-open crate turns what a
//! user types into members):
//!
//! ```no_run
//! use raidkit_array::{assemble::assemble, Array};
//! use raidkit_member::{FileMember, Member};
//! use std::sync::Arc;
//! let members: Vec<Arc<dyn Member>> = ["d0.img", "d1.img", "d2.img"].iter()
//!     .map(|p| Arc::new(FileMember::open(p, false).unwrap()) as Arc<dyn Member>)
//!     .collect();
//! let array = Array::open(assemble(members).unwrap(), "demo", false).unwrap();
//! array.write(b"hello", 0).unwrap();
//! array.close().unwrap();
//! ```

pub mod assemble;
mod background;
mod consistency;
mod core;
pub mod create;
pub mod domains;
mod engine;
pub mod error;
pub mod events;
mod levels;
pub mod metadata;
pub mod policy;
mod recovery;
mod reshape;
mod resize;
mod scratch;
pub mod scrub;
mod seams;
// The metadata formats keep their paths (raidkit_array::superblock...).
pub use metadata::{bitmap, checksums, journal, superblock};

pub use crate::core::{
    Added, ErrorCounts, MemberIo, MemberStatus, Reopen, Slow, DEFAULT_MEMBER_TIMEOUT,
    LATENCY_BOUNDS_US,
};
pub use assemble::Health;
pub use background::{LastRecovery, RecoveryStatus, DEFAULT_MIN_RATE};
pub use engine::{Array, Mismatch, OpenOptions};
pub use error::{Error, Result};
pub use events::{Event, Events, NewEvent, Severity};
pub use scrub::{Finding, LastScrub};
pub use superblock::SB_SIZE;
