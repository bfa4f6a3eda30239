//! The NBD wire protocol (doc/proto.md of the NetworkBlockDevice project):
//! constants, and pure parsers and encoders for the handshake and the
//! transmission phase. Nothing here does I/O, so it can be fuzzed.

use thiserror::Error;

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943; // "NBDMAGIC"
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054; // "IHAVEOPT"
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const CLIENT_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const CLIENT_NO_ZEROES: u32 = 1 << 1;

// Transmission flags.
pub const TF_HAS_FLAGS: u16 = 1 << 0;
pub const TF_READ_ONLY: u16 = 1 << 1;
pub const TF_SEND_FLUSH: u16 = 1 << 2;
pub const TF_SEND_FUA: u16 = 1 << 3;
pub const TF_ROTATIONAL: u16 = 1 << 4;
pub const TF_SEND_TRIM: u16 = 1 << 5;
pub const TF_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TF_SEND_DF: u16 = 1 << 7;
pub const TF_CAN_MULTI_CONN: u16 = 1 << 8;
pub const TF_SEND_CACHE: u16 = 1 << 10;
pub const TF_SEND_FAST_ZERO: u16 = 1 << 11;

// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

// Option replies.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = (1 << 31) | 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) | 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) | 3;
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) | 5;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) | 6;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) | 9;

// Info types.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Commands and command flags.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// Structured reply types and flags.
pub const REPLY_FLAG_DONE: u16 = 1;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;

// Errors (the spec's values, which are Linux errno values).
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// The one metadata context raidkit offers.
pub const BASE_ALLOCATION: &str = "base:allocation";
pub const BASE_ALLOCATION_ID: u32 = 1;

/// Longest export name or option payload accepted (the spec's string limit is 4096).
pub const MAX_STRING: usize = 4096;
/// Option payloads beyond this close the connection instead of being read.
pub const MAX_OPTION_LEN: u32 = 64 * 1024;

/// Request header size.
pub const REQUEST_LEN: usize = 28;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProtoError {
    #[error("bad magic {0:#x}")]
    BadMagic(u64),
    #[error("option payload is malformed: {0}")]
    Malformed(&'static str),
    #[error("string is not UTF-8")]
    NotUtf8,
}

/// An option header: `IHAVEOPT`, option, length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub len: u32,
}

pub fn parse_option_header(b: &[u8; 16]) -> Result<OptionHeader, ProtoError> {
    let magic = u64::from_be_bytes(b[0..8].try_into().expect("8"));
    if magic != IHAVEOPT {
        return Err(ProtoError::BadMagic(magic));
    }
    Ok(OptionHeader {
        option: u32::from_be_bytes(b[8..12].try_into().expect("4")),
        len: u32::from_be_bytes(b[12..16].try_into().expect("4")),
    })
}

/// A cursor over an option payload.
struct Cursor<'a> {
    b: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn u16(&mut self) -> Result<u16, ProtoError> {
        let (h, t) = self
            .b
            .split_at_checked(2)
            .ok_or(ProtoError::Malformed("truncated"))?;
        self.b = t;
        Ok(u16::from_be_bytes(h.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, ProtoError> {
        let (h, t) = self
            .b
            .split_at_checked(4)
            .ok_or(ProtoError::Malformed("truncated"))?;
        self.b = t;
        Ok(u32::from_be_bytes(h.try_into().expect("4")))
    }
    fn string(&mut self) -> Result<String, ProtoError> {
        let n = self.u32()? as usize;
        if n > MAX_STRING {
            return Err(ProtoError::Malformed("string too long"));
        }
        let (h, t) = self
            .b
            .split_at_checked(n)
            .ok_or(ProtoError::Malformed("string runs past the payload"))?;
        self.b = t;
        String::from_utf8(h.to_vec()).map_err(|_| ProtoError::NotUtf8)
    }
    fn done(&self) -> Result<(), ProtoError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(ProtoError::Malformed("trailing bytes"))
        }
    }
}

/// Payload of NBD_OPT_INFO and NBD_OPT_GO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoRequest {
    pub name: String,
    pub infos: Vec<u16>,
}

pub fn parse_go(b: &[u8]) -> Result<GoRequest, ProtoError> {
    let mut c = Cursor { b };
    let name = c.string()?;
    let n = c.u16()? as usize;
    let mut infos = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        infos.push(c.u16()?);
    }
    c.done()?;
    Ok(GoRequest { name, infos })
}

/// Payload of NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaRequest {
    pub export: String,
    pub queries: Vec<String>,
}

pub fn parse_meta(b: &[u8]) -> Result<MetaRequest, ProtoError> {
    let mut c = Cursor { b };
    let export = c.string()?;
    let n = c.u32()? as usize;
    let mut queries = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        queries.push(c.string()?);
    }
    c.done()?;
    Ok(MetaRequest { export, queries })
}

/// A transmission-phase request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub len: u32,
}

pub fn parse_request(b: &[u8; REQUEST_LEN]) -> Result<Request, ProtoError> {
    let magic = u32::from_be_bytes(b[0..4].try_into().expect("4"));
    if magic != REQUEST_MAGIC {
        return Err(ProtoError::BadMagic(magic as u64));
    }
    Ok(Request {
        flags: u16::from_be_bytes(b[4..6].try_into().expect("2")),
        kind: u16::from_be_bytes(b[6..8].try_into().expect("2")),
        cookie: u64::from_be_bytes(b[8..16].try_into().expect("8")),
        offset: u64::from_be_bytes(b[16..24].try_into().expect("8")),
        len: u32::from_be_bytes(b[24..28].try_into().expect("4")),
    })
}

/// Encode a request header (for tests and clients).
pub fn encode_request(r: &Request) -> [u8; REQUEST_LEN] {
    let mut b = [0u8; REQUEST_LEN];
    b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&r.flags.to_be_bytes());
    b[6..8].copy_from_slice(&r.kind.to_be_bytes());
    b[8..16].copy_from_slice(&r.cookie.to_be_bytes());
    b[16..24].copy_from_slice(&r.offset.to_be_bytes());
    b[24..28].copy_from_slice(&r.len.to_be_bytes());
    b
}

/// An option reply header plus payload.
pub fn option_reply(option: u32, kind: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(20 + payload.len());
    v.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    v.extend_from_slice(&option.to_be_bytes());
    v.extend_from_slice(&kind.to_be_bytes());
    v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    v.extend_from_slice(payload);
    v
}

/// NBD_INFO_EXPORT payload.
pub fn info_export(size: u64, flags: u16) -> Vec<u8> {
    let mut v = Vec::with_capacity(12);
    v.extend_from_slice(&INFO_EXPORT.to_be_bytes());
    v.extend_from_slice(&size.to_be_bytes());
    v.extend_from_slice(&flags.to_be_bytes());
    v
}

/// NBD_INFO_BLOCK_SIZE payload.
pub fn info_block_size(min: u32, preferred: u32, max: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(14);
    v.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    v.extend_from_slice(&min.to_be_bytes());
    v.extend_from_slice(&preferred.to_be_bytes());
    v.extend_from_slice(&max.to_be_bytes());
    v
}

/// NBD_INFO_NAME payload.
pub fn info_name(name: &str) -> Vec<u8> {
    let mut v = INFO_NAME.to_be_bytes().to_vec();
    v.extend_from_slice(name.as_bytes());
    v
}

/// NBD_INFO_DESCRIPTION payload.
pub fn info_description(desc: &str) -> Vec<u8> {
    let mut v = INFO_DESCRIPTION.to_be_bytes().to_vec();
    v.extend_from_slice(desc.as_bytes());
    v
}

/// Simple reply header.
pub fn simple_reply(error: u32, cookie: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// Structured reply chunk header.
pub fn structured_header(flags: u16, kind: u16, cookie: u64, len: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..20].copy_from_slice(&len.to_be_bytes());
    b
}

/// A structured error chunk (with DONE) carrying a message.
pub fn structured_error(cookie: u64, error: u32, msg: &str) -> Vec<u8> {
    let msg = &msg.as_bytes()[..msg.len().min(1024)];
    let len = 4 + 2 + msg.len();
    let mut v = structured_header(REPLY_FLAG_DONE, REPLY_TYPE_ERROR, cookie, len as u32).to_vec();
    v.extend_from_slice(&error.to_be_bytes());
    v.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    v.extend_from_slice(msg);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn go_payload_round_trip() {
        let mut b = Vec::new();
        b.extend_from_slice(&4u32.to_be_bytes());
        b.extend_from_slice(b"demo");
        b.extend_from_slice(&2u16.to_be_bytes());
        b.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        b.extend_from_slice(&INFO_NAME.to_be_bytes());
        let g = parse_go(&b).unwrap();
        assert_eq!(g.name, "demo");
        assert_eq!(g.infos, vec![INFO_BLOCK_SIZE, INFO_NAME]);
        assert!(parse_go(&b[..b.len() - 1]).is_err());
        let mut long = b.clone();
        long.push(0);
        assert!(parse_go(&long).is_err());
        let mut lie = b.clone();
        lie[3] = 200; // name length beyond the payload
        assert!(parse_go(&lie).is_err());
    }

    #[test]
    fn request_round_trip_and_magic() {
        let r = Request {
            flags: CMD_FLAG_FUA,
            kind: CMD_WRITE,
            cookie: 0xdead_beef,
            offset: 1 << 40,
            len: 4096,
        };
        let b = encode_request(&r);
        assert_eq!(parse_request(&b).unwrap(), r);
        let mut bad = b;
        bad[0] ^= 1;
        assert!(matches!(parse_request(&bad), Err(ProtoError::BadMagic(_))));
    }

    proptest! {
        #[test]
        fn parsers_never_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_go(&b);
            let _ = parse_meta(&b);
            if b.len() >= REQUEST_LEN {
                let _ = parse_request(b[..REQUEST_LEN].try_into().unwrap());
            }
            if b.len() >= 16 {
                let _ = parse_option_header(b[..16].try_into().unwrap());
            }
        }
    }
}
