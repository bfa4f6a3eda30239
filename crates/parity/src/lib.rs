//! RAID parity math: XOR (P) and the RAID-6 Reed-Solomon syndrome (Q) over
//! GF(2^8) with polynomial 0x11d and generator 2, as in H. Peter Anvin's
//! "The mathematics of RAID-6" and Linux md.
//!
//! `Q = sum(g^i * D_i)` where `i` is a data chunk's index in md's syndrome
//! order (the caller supplies the chunks in that order).
//!
//! The kernels are vectorised for AVX-512BW, AVX2 and SSSE3, with a
//! portable 64-bit path; the best one the CPU has is chosen at run time
//! ([`Isa`]). [`reference`] holds slow byte-at-a-time versions that the
//! tests check every kernel against.
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

pub mod bench;
mod gf;
pub mod reference;
mod simd;

pub use gf::{gf_div, gf_exp, gf_inv, gf_mul};
pub use simd::{Isa, MulTable};

/// P = XOR of all data chunks.
pub fn gen_p(data: &[&[u8]], p: &mut [u8]) {
    gen_p_with(Isa::best(), data, p)
}

/// [`gen_p`] with the kernels of one instruction set.
pub fn gen_p_with(isa: Isa, data: &[&[u8]], p: &mut [u8]) {
    simd::xor(isa, data, p, false)
}

/// P and Q of the data chunks, given in md's syndrome order.
pub fn gen_pq(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    gen_pq_with(Isa::best(), data, p, q)
}

/// [`gen_pq`] with the kernels of one instruction set.
pub fn gen_pq_with(isa: Isa, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    assert!(
        data.iter().all(|d| d.len() == p.len()),
        "parity buffers differ in length"
    );
    if p.is_empty() {
        return;
    }
    simd::pq(isa, data, p, q)
}

/// Read-modify-write update of P and Q for one data chunk at syndrome
/// index `slot` changing from `old` to `new`.
pub fn update_pq(p: &mut [u8], q: Option<&mut [u8]>, slot: usize, old: &[u8], new: &[u8]) {
    update_pq_with(Isa::best(), p, q, slot, old, new)
}

/// [`update_pq`] with the kernels of one instruction set.
pub fn update_pq_with(
    isa: Isa,
    p: &mut [u8],
    q: Option<&mut [u8]>,
    slot: usize,
    old: &[u8],
    new: &[u8],
) {
    simd::rmw(isa, p, q, old, new, &MulTable::new(gf_exp(slot)))
}

/// Rebuild data chunk `x` from the others and P (RAID-5, or RAID-6 with P).
/// `data[x]` is overwritten.
pub fn recover_data_p(data: &mut [Vec<u8>], x: usize, p: &[u8]) {
    recover_data_p_with(Isa::best(), data, x, p)
}

/// [`recover_data_p`] with the kernels of one instruction set.
pub fn recover_data_p_with(isa: Isa, data: &mut [Vec<u8>], x: usize, p: &[u8]) {
    let mut out = std::mem::take(&mut data[x]);
    out.resize(p.len(), 0);
    {
        let mut srcs: Vec<&[u8]> = data
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != x)
            .map(|(_, d)| d.as_slice())
            .collect();
        srcs.push(p);
        simd::xor(isa, &srcs, &mut out, false);
    }
    data[x] = out;
}

/// Rebuild data chunk `x` from the other data chunks and Q (RAID-6 with P lost).
pub fn recover_data_q(data: &mut [Vec<u8>], x: usize, q: &[u8]) {
    recover_data_q_with(Isa::best(), data, x, q)
}

/// [`recover_data_q`] with the kernels of one instruction set.
pub fn recover_data_q_with(isa: Isa, data: &mut [Vec<u8>], x: usize, q: &[u8]) {
    // Q ^ Qx = g^x * Dx, where Qx is the syndrome with Dx = 0.
    let mut out = std::mem::take(&mut data[x]);
    out.resize(q.len(), 0);
    {
        let mut srcs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        srcs[x] = &[];
        let c = MulTable::new(gf_inv(gf_exp(x)));
        simd::recover_q(isa, &srcs, q, &c, &mut out);
    }
    data[x] = out;
}

/// Rebuild data chunks `x` and `y` (x != y) from the other data chunks, P and Q.
pub fn recover_two_data(data: &mut [Vec<u8>], x: usize, y: usize, p: &[u8], q: &[u8]) {
    recover_two_data_with(Isa::best(), data, x, y, p, q)
}

/// [`recover_two_data`] with the kernels of one instruction set.
pub fn recover_two_data_with(
    isa: Isa,
    data: &mut [Vec<u8>],
    x: usize,
    y: usize,
    p: &[u8],
    q: &[u8],
) {
    assert_ne!(x, y);
    let mut dx = std::mem::take(&mut data[x]);
    let mut dy = std::mem::take(&mut data[y]);
    dx.resize(p.len(), 0);
    dy.resize(p.len(), 0);
    {
        let mut srcs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        srcs[x] = &[];
        srcs[y] = &[];
        recover_two_into(isa, &srcs, x, y, p, q, &mut dx, &mut dy);
    }
    data[x] = dx;
    data[y] = dy;
}

/// The two-data-chunk recovery kernel on borrowed buffers (for benchmarks
/// and callers that keep their own): `srcs` in syndrome order with the two
/// lost chunks given as empty slices, results into `dx` and `dy`.
#[allow(clippy::too_many_arguments)]
pub fn recover_two_into(
    isa: Isa,
    srcs: &[&[u8]],
    x: usize,
    y: usize,
    p: &[u8],
    q: &[u8],
    dx: &mut [u8],
    dy: &mut [u8],
) {
    // Dx = A * Pxy ^ B * Qxy with A = g^(y-x) / (g^(y-x) ^ 1), B = g^-x / (g^(y-x) ^ 1),
    // where Pxy, Qxy are P and Q plus the survivors' contributions.
    let gyx = gf_div(gf_exp(y), gf_exp(x));
    let denom = gyx ^ 1;
    let a = MulTable::new(gf_div(gyx, denom));
    let b = MulTable::new(gf_div(gf_inv(gf_exp(x)), denom));
    simd::recover2(isa, srcs, p, q, &a, &b, dx, dy)
}

#[cfg(test)]
mod tests;
