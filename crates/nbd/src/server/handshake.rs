//! The fixed-newstyle handshake: the greeting, then options until the
//! client picks the export (or leaves). It settles whether replies may be
//! structured and whether block status was asked for, which the
//! transmission phase needs to shape its replies.

use super::{Export, Target, MAX_PAYLOAD};
use crate::proto::*;
use crate::stream::Stream;
use crate::tls::ServerTls;
use std::io::{self, Read, Write};
use std::sync::Arc;
use std::time::Duration;

/// How long a client may take over each handshake step: a client that
/// never finishes must not hold a connection (and its thread) forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// What the handshake settled.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Negotiated {
    pub(super) structured: bool,
    pub(super) base_allocation: bool,
}

/// The fixed-newstyle handshake on `s`, for one of `targets`: the one
/// chosen and what was settled. `Ok(None)`: the client left cleanly. The
/// stream is left with no read timeout.
pub(super) fn handshake(
    s: &mut Stream,
    targets: &[Arc<Target>],
    tls: Option<&ServerTls>,
) -> io::Result<Option<(Arc<Target>, Negotiated)>> {
    s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let neg = options(s, targets, tls)?;
    if neg.is_some() {
        // Transmission waits for requests as long as the client likes.
        s.set_read_timeout(None)?;
    }
    Ok(neg)
}

/// The export a client's name means (the empty name is the default
/// export, the first).
fn find<'a>(targets: &'a [Arc<Target>], name: &str) -> Option<&'a Arc<Target>> {
    if name.is_empty() {
        return targets.first();
    }
    targets.iter().find(|t| t.export.name == name)
}

/// The transmission flags advertised.
fn tflags(export: &Export, neg: Negotiated) -> u16 {
    let mut f = TF_HAS_FLAGS
        | TF_SEND_FLUSH
        | TF_SEND_FUA
        | TF_SEND_TRIM
        | TF_SEND_WRITE_ZEROES
        | TF_SEND_FAST_ZERO
        | TF_SEND_CACHE
        // Writes go straight to the members (no cache in this process),
        // so a FLUSH on any connection covers writes completed on all.
        | TF_CAN_MULTI_CONN;
    if export.read_only {
        f |= TF_READ_ONLY;
    }
    if neg.structured {
        // Reads are always answered in one chunk, so DF is honoured.
        f |= TF_SEND_DF;
    }
    f
}

/// The greeting, then options until one ends the handshake.
fn options(
    s: &mut Stream,
    targets: &[Arc<Target>],
    tls: Option<&ServerTls>,
) -> io::Result<Option<(Arc<Target>, Negotiated)>> {
    let mut hello = Vec::with_capacity(18);
    hello.extend_from_slice(&NBDMAGIC.to_be_bytes());
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&hello)?;
    let mut cf = [0u8; 4];
    s.read_exact(&mut cf)?;
    let cflags = u32::from_be_bytes(cf);
    if cflags & !(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES) != 0
        || cflags & CLIENT_FIXED_NEWSTYLE == 0
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unsupported client flags {cflags:#x}"),
        ));
    }
    let no_zeroes = cflags & CLIENT_NO_ZEROES != 0;
    let mut neg = Negotiated::default();
    let mut secured = false;
    loop {
        let mut hb = [0u8; 16];
        s.read_exact(&mut hb)?;
        let h =
            parse_option_header(&hb).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if h.len > MAX_OPTION_LEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("option {} with a {}-byte payload", h.option, h.len),
            ));
        }
        let mut data = vec![0u8; h.len as usize];
        s.read_exact(&mut data)?;
        let reply = |s: &mut Stream, kind: u32, payload: &[u8]| {
            s.write_all(&option_reply(h.option, kind, payload))
        };
        // A server that requires TLS answers nothing but STARTTLS and
        // ABORT before it (NBD's FORCEDTLS).
        let tls_first = tls.is_some_and(|t| t.require) && !secured;
        if tls_first && h.option != OPT_STARTTLS && h.option != OPT_ABORT {
            if h.option == OPT_EXPORT_NAME {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "a client asked for an export without TLS, which is required",
                ));
            }
            reply(
                s,
                REP_ERR_TLS_REQD,
                b"TLS is required: NBD_OPT_STARTTLS first",
            )?;
            continue;
        }
        match h.option {
            OPT_EXPORT_NAME => {
                let name = String::from_utf8_lossy(&data);
                let Some(target) = find(targets, &name) else {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("unknown export '{name}'"),
                    ));
                };
                let export = &target.export;
                let size = export.device.len();
                let mut r = Vec::with_capacity(134);
                r.extend_from_slice(&size.to_be_bytes());
                r.extend_from_slice(&tflags(export, neg).to_be_bytes());
                if !no_zeroes {
                    r.extend_from_slice(&[0u8; 124]);
                }
                s.write_all(&r)?;
                return Ok(Some((target.clone(), neg)));
            }
            OPT_ABORT => {
                let _ = reply(s, REP_ACK, &[]);
                return Ok(None);
            }
            OPT_LIST => {
                if !data.is_empty() {
                    reply(s, REP_ERR_INVALID, b"NBD_OPT_LIST takes no data")?;
                    continue;
                }
                for t in targets {
                    let export = &t.export;
                    let mut p = (export.name.len() as u32).to_be_bytes().to_vec();
                    p.extend_from_slice(export.name.as_bytes());
                    p.extend_from_slice(export.description.as_bytes());
                    reply(s, REP_SERVER, &p)?;
                }
                reply(s, REP_ACK, &[])?;
            }
            OPT_INFO | OPT_GO => {
                let go = match parse_go(&data) {
                    Ok(g) => g,
                    Err(e) => {
                        reply(s, REP_ERR_INVALID, e.to_string().as_bytes())?;
                        continue;
                    }
                };
                let Some(target) = find(targets, &go.name) else {
                    reply(s, REP_ERR_UNKNOWN, b"no such export")?;
                    continue;
                };
                let export = &target.export;
                let size = export.device.len();
                reply(s, REP_INFO, &info_export(size, tflags(export, neg)))?;
                if go.infos.contains(&INFO_NAME) {
                    reply(s, REP_INFO, &info_name(&export.name))?;
                }
                if go.infos.contains(&INFO_DESCRIPTION) {
                    reply(s, REP_INFO, &info_description(&export.description))?;
                }
                reply(
                    s,
                    REP_INFO,
                    &info_block_size(1, export.preferred_block, MAX_PAYLOAD),
                )?;
                reply(s, REP_ACK, &[])?;
                if h.option == OPT_GO {
                    return Ok(Some((target.clone(), neg)));
                }
            }
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    reply(
                        s,
                        REP_ERR_INVALID,
                        b"NBD_OPT_STRUCTURED_REPLY takes no data",
                    )?;
                } else {
                    neg.structured = true;
                    reply(s, REP_ACK, &[])?;
                }
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                let set = h.option == OPT_SET_META_CONTEXT;
                if !neg.structured {
                    reply(s, REP_ERR_INVALID, b"negotiate structured replies first")?;
                    continue;
                }
                let m = match parse_meta(&data) {
                    Ok(m) => m,
                    Err(e) => {
                        reply(s, REP_ERR_INVALID, e.to_string().as_bytes())?;
                        continue;
                    }
                };
                if find(targets, &m.export).is_none() {
                    reply(s, REP_ERR_UNKNOWN, b"no such export")?;
                    continue;
                }
                let wanted = m
                    .queries
                    .iter()
                    .any(|q| q == BASE_ALLOCATION || (!set && (q == "base:" || q.is_empty())))
                    || (!set && m.queries.is_empty());
                if set {
                    neg.base_allocation = wanted;
                }
                if wanted {
                    let mut p = BASE_ALLOCATION_ID.to_be_bytes().to_vec();
                    p.extend_from_slice(BASE_ALLOCATION.as_bytes());
                    reply(s, REP_META_CONTEXT, &p)?;
                }
                reply(s, REP_ACK, &[])?;
            }
            OPT_STARTTLS => match tls {
                None => reply(s, REP_ERR_UNSUP, b"TLS is not offered by this server")?,
                Some(_) if secured => reply(s, REP_ERR_INVALID, b"TLS is already on")?,
                Some(_) if !data.is_empty() => {
                    reply(s, REP_ERR_INVALID, b"NBD_OPT_STARTTLS takes no data")?
                }
                Some(t) => {
                    reply(s, REP_ACK, &[])?;
                    *s = t.accept(s)?;
                    s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
                    secured = true;
                    // Anything settled before TLS is forgotten (the spec).
                    neg = Negotiated::default();
                }
            },
            _ => reply(s, REP_ERR_UNSUP, b"unsupported option")?,
        }
    }
}

/// For the fuzzer: a client's bytes through the whole handshake of a
/// server with one small export. Never panics, never hangs (the bytes end).
#[doc(hidden)]
pub fn fuzz_client_bytes(data: &[u8]) {
    let Some((mut s, mut theirs)) = Stream::fed(data) else {
        return;
    };
    let server = super::Server::new(
        Export {
            name: "fuzz".into(),
            description: "fuzzed".into(),
            device: Arc::new(raidkit_member::MemMember::new("fuzz", 1 << 20)),
            read_only: false,
            preferred_block: super::PREFERRED_BLOCK,
        },
        super::Config::default(),
    );
    // A reply bigger than the socket's buffer would wait for a reader:
    // someone drains them.
    let drain = std::thread::spawn(move || {
        let mut sink = [0u8; 4096];
        while matches!(theirs.read(&mut sink), Ok(n) if n > 0) {}
    });
    let _ = handshake(&mut s, &server.targets, None);
    s.shutdown(std::net::Shutdown::Both);
    let _ = drain.join();
}
