//! RAID parity math: XOR (P) and the RAID-6 Reed-Solomon syndrome (Q) over
//! GF(2^8) with polynomial 0x11d and generator 2, as in H. Peter Anvin's
//! "The mathematics of RAID-6" and Linux md.
//!
//! `Q = sum(g^i * D_i)` where `i` is a data chunk's index in md's syndrome
//! order (the caller supplies the chunks in that order).
//!
//! The kernels here are portable (64-bit SWAR); [`reference`] holds slow
//! byte-at-a-time versions that the tests check them against.
//!
//! ```
//! use raidkit_parity::{gen_pq, recover_two_data};
//! let d: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i * 17 + 1; 64]).collect();
//! let refs: Vec<&[u8]> = d.iter().map(|v| v.as_slice()).collect();
//! let (mut p, mut q) = (vec![0; 64], vec![0; 64]);
//! gen_pq(&refs, &mut p, &mut q);
//! // Lose chunks 1 and 3, then rebuild them from the rest plus P and Q.
//! let mut lost = d.clone();
//! lost[1].fill(0);
//! lost[3].fill(0);
//! recover_two_data(&mut lost, 1, 3, &p, &q);
//! assert_eq!(lost, d);
//! ```

mod gf;
pub mod reference;

pub use gf::{gf_div, gf_exp, gf_inv, gf_mul};

/// `dst ^= src`.
pub fn xor_into(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len());
    let (d8, dt) = dst.split_at_mut(dst.len() / 8 * 8);
    let (s8, st) = src.split_at(d8.len());
    for (d, s) in d8.chunks_exact_mut(8).zip(s8.chunks_exact(8)) {
        let v =
            u64::from_ne_bytes(d.try_into().unwrap()) ^ u64::from_ne_bytes(s.try_into().unwrap());
        d.copy_from_slice(&v.to_ne_bytes());
    }
    for (d, s) in dt.iter_mut().zip(st) {
        *d ^= s;
    }
}

/// `dst = a ^ b`, in one pass.
pub fn xor2(dst: &mut [u8], a: &[u8], b: &[u8]) {
    assert!(dst.len() == a.len() && a.len() == b.len());
    let n8 = dst.len() / 8 * 8;
    for ((d, x), y) in dst[..n8]
        .chunks_exact_mut(8)
        .zip(a[..n8].chunks_exact(8))
        .zip(b[..n8].chunks_exact(8))
    {
        let v =
            u64::from_ne_bytes(x.try_into().unwrap()) ^ u64::from_ne_bytes(y.try_into().unwrap());
        d.copy_from_slice(&v.to_ne_bytes());
    }
    for i in n8..dst.len() {
        dst[i] = a[i] ^ b[i];
    }
}

/// P = XOR of all data chunks.
pub fn gen_p(data: &[&[u8]], p: &mut [u8]) {
    let len = p.len();
    assert!(data.iter().all(|d| d.len() == len));
    let Some((first, rest)) = data.split_first() else {
        p.fill(0);
        return;
    };
    // One pass over P in blocks that stay in L1, rather than one pass per source.
    const BLOCK: usize = 4096;
    let mut at = 0;
    while at < len {
        let end = (at + BLOCK).min(len);
        let dst = &mut p[at..end];
        match rest.split_first() {
            Some((second, more)) => {
                xor2(dst, &first[at..end], &second[at..end]);
                for d in more {
                    xor_into(dst, &d[at..end]);
                }
            }
            None => dst.copy_from_slice(&first[at..end]),
        }
        at = end;
    }
}

/// Multiply eight GF(2^8) bytes packed in a u64 by 2.
#[inline]
fn mul2_u64(x: u64) -> u64 {
    const HI: u64 = 0x8080_8080_8080_8080;
    let hi = x & HI;
    // Each byte whose top bit was set gets the polynomial's low byte 0x1d.
    let mask = (hi >> 7).wrapping_mul(0x1d);
    ((x << 1) & !0x0101_0101_0101_0101) ^ mask
}

/// P and Q of the data chunks, given in md's syndrome order.
pub fn gen_pq(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    let len = p.len();
    assert_eq!(q.len(), len);
    assert!(data.iter().all(|d| d.len() == len));
    p.fill(0);
    q.fill(0);
    if data.is_empty() {
        return;
    }
    let words = len / 8;
    // Horner's rule from the highest index down: q = q*2 ^ d_i.
    for w in 0..words {
        let r = w * 8..w * 8 + 8;
        let mut wp = 0u64;
        let mut wq = 0u64;
        for d in data.iter().rev() {
            let v = u64::from_ne_bytes(d[r.clone()].try_into().unwrap());
            wp ^= v;
            wq = mul2_u64(wq) ^ v;
        }
        p[r.clone()].copy_from_slice(&wp.to_ne_bytes());
        q[r].copy_from_slice(&wq.to_ne_bytes());
    }
    for i in words * 8..len {
        let mut bp = 0u8;
        let mut bq = 0u8;
        for d in data.iter().rev() {
            bp ^= d[i];
            bq = gf_mul(bq, 2) ^ d[i];
        }
        p[i] = bp;
        q[i] = bq;
    }
}

/// `dst ^= c * src` in GF(2^8).
pub fn mul_xor_into(dst: &mut [u8], src: &[u8], c: u8) {
    assert_eq!(dst.len(), src.len());
    if c == 0 {
        return;
    }
    if c == 1 {
        return xor_into(dst, src);
    }
    let table = gf::mul_table(c);
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= table[*s as usize];
    }
}

/// `buf = c * buf` in GF(2^8).
pub fn mul_in_place(buf: &mut [u8], c: u8) {
    let table = gf::mul_table(c);
    for b in buf.iter_mut() {
        *b = table[*b as usize];
    }
}

/// Read-modify-write update of P and Q for one data chunk at syndrome
/// index `slot` changing from `old` to `new`.
pub fn update_pq(p: &mut [u8], q: Option<&mut [u8]>, slot: usize, old: &[u8], new: &[u8]) {
    assert!(p.len() == old.len() && old.len() == new.len());
    match q {
        None => {
            xor_into(p, old);
            xor_into(p, new);
        }
        Some(q) => {
            assert_eq!(q.len(), p.len());
            let table = gf::mul_table(gf_exp(slot));
            for i in 0..p.len() {
                let delta = old[i] ^ new[i];
                p[i] ^= delta;
                q[i] ^= table[delta as usize];
            }
        }
    }
}

/// Rebuild data chunk `x` from the others and P (RAID-5, or RAID-6 with P).
/// `data[x]` is overwritten.
pub fn recover_data_p(data: &mut [Vec<u8>], x: usize, p: &[u8]) {
    let mut acc = p.to_vec();
    for (i, d) in data.iter().enumerate() {
        if i != x {
            xor_into(&mut acc, d);
        }
    }
    data[x] = acc;
}

/// Rebuild data chunk `x` from the other data chunks and Q (RAID-6 with P lost).
pub fn recover_data_q(data: &mut [Vec<u8>], x: usize, q: &[u8]) {
    // Q ^ Qx = g^x * Dx, where Qx is the syndrome with Dx = 0.
    let len = q.len();
    let mut acc = q.to_vec();
    for (i, d) in data.iter().enumerate() {
        if i != x {
            mul_xor_into(&mut acc, d, gf_exp(i));
        }
    }
    debug_assert_eq!(acc.len(), len);
    mul_in_place(&mut acc, gf_inv(gf_exp(x)));
    data[x] = acc;
}

/// Rebuild data chunks `x` and `y` (x != y) from the other data chunks, P and Q.
pub fn recover_two_data(data: &mut [Vec<u8>], x: usize, y: usize, p: &[u8], q: &[u8]) {
    assert_ne!(x, y);
    let len = p.len();
    // Pxy = P ^ (XOR of the surviving data) = Dx ^ Dy
    // Qxy = Q ^ (syndrome of the surviving data) = g^x Dx ^ g^y Dy
    let mut pxy = p.to_vec();
    let mut qxy = q.to_vec();
    for (i, d) in data.iter().enumerate() {
        if i != x && i != y {
            xor_into(&mut pxy, d);
            mul_xor_into(&mut qxy, d, gf_exp(i));
        }
    }
    // Dx = A * Pxy ^ B * Qxy with A = g^(y-x) / (g^(y-x) ^ 1), B = g^-x / (g^(y-x) ^ 1).
    let gyx = gf_div(gf_exp(y), gf_exp(x));
    let denom = gyx ^ 1;
    let a = gf_div(gyx, denom);
    let b = gf_div(gf_inv(gf_exp(x)), denom);
    let mut dx = vec![0u8; len];
    mul_xor_into(&mut dx, &pxy, a);
    mul_xor_into(&mut dx, &qxy, b);
    let mut dy = pxy;
    xor_into(&mut dy, &dx);
    data[x] = dx;
    data[y] = dy;
}

#[cfg(test)]
mod tests;
