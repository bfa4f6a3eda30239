//! The array crate's one error type: every variant names the member (or
//! members) involved, so a message alone tells the user what to do.

use raidkit_layout::LayoutError;
use raidkit_member::MemberError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Member(#[from] MemberError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("{member}: not a raidkit member (no superblock found)")]
    NoSuperblock { member: String },
    #[error("{member}: corrupt superblock: {detail}")]
    CorruptSuperblock { member: String, detail: String },
    #[error("{member}: superblock format version {version} is not supported (this raidkit reads versions up to {supported})")]
    UnsupportedVersion {
        member: String,
        version: u32,
        supported: u32,
    },
    #[error("members belong to different arrays:\n{0}")]
    MixedArrays(String),
    #[error(
        "{first} and {second} are the same member (member uuid {uuid}); give each member once"
    )]
    DuplicateMember {
        first: String,
        second: String,
        uuid: String,
    },
    #[error("array '{name}' cannot run: {detail}")]
    NotEnoughMembers { name: String, detail: String },
    #[error("{member} already belongs to array {uuid} ('{name}'); use --force to overwrite it")]
    InUse {
        member: String,
        uuid: String,
        name: String,
    },
    #[error(
        "{member} holds data (bytes at offset {offset} are not zero); use --force to overwrite it"
    )]
    HoldsData { member: String, offset: u64 },
    #[error("range {offset}+{len} lies beyond the end of the array ({size} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("data at array offset {offset} is unavailable: {detail}")]
    Unavailable { offset: u64, detail: String },
    /// A remote member whose host did not answer (refused, timed out, no
    /// route): the detail names it and what was tried.
    #[error("{detail}")]
    Unreachable { member: String, detail: String },
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// As an I/O error, for code that sees an array through the Member trait.
    pub fn into_io(self) -> std::io::Error {
        match self {
            Error::Member(m) => std::io::Error::new(m.source.kind(), m.to_string()),
            Error::OutOfRange { .. } => {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, self.to_string())
            }
            other => std::io::Error::other(other.to_string()),
        }
    }
}
