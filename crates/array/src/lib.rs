//! The raidkit array engine: self-describing members (superblocks),
//! assembly from members in any order, and the array itself, which reads
//! and writes through the members at every level, degraded where the level
//! allows.
//!
//! ```no_run
//! use raidkit_array::{spec::{self, Spec}, assemble::assemble, Array};
//! let specs: Vec<Spec> = ["d0.img", "d1.img", "d2.img"].iter()
//!     .map(|s| Spec::parse(s).unwrap()).collect();
//! let array = Array::open(assemble(spec::open_all(&specs, false).unwrap()).unwrap(),
//!                         "demo", false).unwrap();
//! array.write(b"hello", 0).unwrap();
//! array.close().unwrap();
//! ```

pub mod assemble;
mod consistency;
pub mod create;
mod engine;
pub mod error;
mod manage;
pub mod metadata;
mod recovery;
pub mod spec;
// The metadata formats keep their paths (raidkit_array::superblock...).
pub use metadata::{bitmap, journal, superblock};

pub use assemble::Health;
pub use engine::{Array, MemberStatus, Mismatch, OpenOptions, DEFAULT_MEMBER_TIMEOUT};
pub use error::{Error, Result};
pub use manage::Added;
pub use recovery::{LastRecovery, RecoveryStatus, DEFAULT_MIN_RATE};
pub use superblock::SB_SIZE;
