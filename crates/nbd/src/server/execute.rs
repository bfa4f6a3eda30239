//! Serving a request against the device: checking it (flags, range,
//! read-only) and answering every fault with the NBD error the spec asks
//! for, then the device call, or a fast path where one applies.

use super::fastpath::{FastPaths, Outcome};
use super::handshake::Negotiated;
use super::request::Taken;
use super::{inc, Target, MAX_PAYLOAD};
use crate::proto::*;
use raidkit_member::AlignedVec;

/// Serve what a worker took. Every request of a run of writes fails if the
/// device failed the payloads placed on arrival.
pub(super) fn serve(
    server: &Target,
    t: &mut Taken,
    taken: &[Request],
    payload: &[u8],
    neg: Negotiated,
    buf: &mut AlignedVec,
    fast: &mut FastPaths,
) -> Result<(), (u32, String)> {
    let st = &server.stats;
    let result = match t.failed.take() {
        Some(msg) => {
            inc(&st.errors, 1);
            Err((EIO, msg))
        }
        None => execute(
            server,
            &t.whole,
            (&payload[..t.used], t.placed),
            neg,
            buf,
            fast,
        ),
    };
    if t.placed > 0 && result.is_ok() {
        fast.count_placed(taken, t.placed);
    }
    if taken.len() > 1 {
        inc(&st.merged_writes, taken.len() as u64 - 1);
        if result.is_ok() {
            inc(&st.writes, taken.len() as u64 - 1);
        }
    }
    result
}

/// Serve one request (for a successful read, the data is left in `buf`,
/// or loaded by a fast path). A write's payload comes with the number of
/// its first bytes already written on arrival. `Err`: the NBD error code
/// and a message for the log.
fn execute(
    server: &Target,
    r: &Request,
    (payload, placed): (&[u8], usize),
    neg: Negotiated,
    buf: &mut AlignedVec,
    fast: &mut FastPaths,
) -> Result<(), (u32, String)> {
    let dev = &server.export.device;
    let size = dev.len();
    let in_range = r
        .offset
        .checked_add(r.len as u64)
        .is_some_and(|e| e <= size);
    let st = &server.stats;
    let result = (|| {
        let known_flags = match r.kind {
            CMD_READ => CMD_FLAG_FUA | CMD_FLAG_DF,
            CMD_WRITE | CMD_TRIM => CMD_FLAG_FUA,
            CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
            CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
            _ => 0,
        };
        if r.flags & !known_flags != 0 {
            return Err((EINVAL, format!("unsupported flags {:#x}", r.flags)));
        }
        let writes = matches!(r.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
        if writes && server.export.read_only {
            return Err((EPERM, "the export is read-only".into()));
        }
        let io_err = |e: raidkit_member::MemberError| (EIO, e.to_string());
        match r.kind {
            CMD_READ | CMD_CACHE | CMD_BLOCK_STATUS => {
                if r.len == 0 || r.len > MAX_PAYLOAD && r.kind == CMD_READ {
                    return Err((EINVAL, format!("bad length {}", r.len)));
                }
                if !in_range {
                    return Err((EINVAL, "request beyond the end of the export".into()));
                }
                match r.kind {
                    CMD_READ => {
                        if fast.read(dev.as_ref(), r.offset, r.len as usize) == Outcome::Served {
                            buf.clear();
                        } else {
                            buf.resize(r.len as usize);
                            dev.read_at(buf, r.offset).map_err(io_err)?;
                        }
                        inc(&st.reads, 1);
                        inc(&st.bytes_read, r.len as u64);
                    }
                    CMD_BLOCK_STATUS if !neg.base_allocation => {
                        return Err((EINVAL, "no metadata context negotiated".into()));
                    }
                    _ => {}
                }
            }
            CMD_WRITE | CMD_WRITE_ZEROES | CMD_TRIM => {
                if !in_range {
                    let e = if r.kind == CMD_TRIM { EINVAL } else { ENOSPC };
                    return Err((e, "request beyond the end of the export".into()));
                }
                // A write whose bytes all go through the device: FUA as
                // one durable write rather than a write and a flush.
                let fua_alone = r.kind == CMD_WRITE && r.flags & CMD_FLAG_FUA != 0 && placed == 0;
                match r.kind {
                    CMD_WRITE => {
                        if placed < payload.len() {
                            let rest = (&payload[placed..], r.offset + placed as u64);
                            // A FUA write is made durable as one (a device
                            // behind write-behind then neither answers it
                            // early nor counts it so); bytes placed by the
                            // fast path before it are flushed below.
                            if fua_alone {
                                dev.write_at_durable(rest.0, rest.1)
                            } else {
                                dev.write_at(rest.0, rest.1)
                            }
                            .map_err(io_err)?;
                        }
                        inc(&st.writes, 1);
                        inc(&st.bytes_written, r.len as u64);
                    }
                    CMD_WRITE_ZEROES => {
                        if r.flags & CMD_FLAG_FAST_ZERO != 0 {
                            // Zeroing costs a full write here: say so.
                            return Err((ENOTSUP, "zeroing is not faster than writing".into()));
                        }
                        if r.flags & CMD_FLAG_NO_HOLE != 0 {
                            raidkit_member::write_zeroes(dev.as_ref(), r.offset, r.len as u64)
                        } else {
                            // A discard reads back zeroes, and frees the
                            // space where the device can.
                            dev.discard(r.offset, r.len as u64)
                        }
                        .map_err(io_err)?;
                        inc(&st.zeroes, 1);
                    }
                    _ => {
                        // The space freed where the device can; what it
                        // cannot free is zeroed, so a trimmed range reads
                        // the same (zeroes) whatever the layout.
                        dev.discard(r.offset, r.len as u64).map_err(io_err)?;
                        inc(&st.trims, 1);
                    }
                }
                if r.flags & CMD_FLAG_FUA != 0 && !fua_alone {
                    dev.flush().map_err(io_err)?;
                }
            }
            CMD_FLUSH => {
                dev.flush().map_err(io_err)?;
                inc(&st.flushes, 1);
            }
            other => return Err((EINVAL, format!("unknown command {other}"))),
        }
        Ok(())
    })();
    if let Err((_, msg)) = &result {
        inc(&st.errors, 1);
        tracing::debug!("request {:?} failed: {msg}", r);
    }
    result
}
