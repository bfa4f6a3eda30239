//! The parity kernels, written once over a small vector abstraction and
//! compiled for each instruction set: AVX-512BW (64-byte vectors), AVX2 (32),
//! SSSE3 (16) and a portable 64-bit SWAR path (8). The best one the CPU has
//! is chosen at run time; every one can be asked for by name, so the tests
//! check each path the CPU supports against the slow reference.
//!
//! Multiplication by 2 uses the sign-mask trick (md's and ISA-L's); by any
//! other constant, two 16-entry nibble tables and a byte shuffle.
//!
//! No crate does RAID-6 with md's polynomial and syndrome order at SIMD speed
//! in safe Rust, so the kernels are ours.

use crate::gf::gf_mul;

/// An instruction set the kernels are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Ssse3,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Isa {
    /// Every instruction set this CPU can run, best first.
    pub fn available() -> Vec<Isa> {
        Isa::detected().to_vec()
    }

    /// `available`, detected once.
    fn detected() -> &'static [Isa] {
        static ISAS: std::sync::OnceLock<Vec<Isa>> = std::sync::OnceLock::new();
        ISAS.get_or_init(Isa::detect)
    }

    fn detect() -> Vec<Isa> {
        let mut v = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
                v.push(Isa::Avx512);
            }
            if is_x86_feature_detected!("avx2") {
                v.push(Isa::Avx2);
            }
            if is_x86_feature_detected!("ssse3") {
                v.push(Isa::Ssse3);
            }
        }
        v.push(Isa::Portable);
        v
    }

    /// The fastest instruction set available (checked once).
    pub fn best() -> Isa {
        Isa::detected()[0]
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            #[cfg(target_arch = "x86_64")]
            Isa::Ssse3 => "ssse3",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => "avx512bw",
        }
    }
}

/// Multiplication by a constant, in the forms the vector types need.
#[derive(Debug, Clone, Copy)]
pub struct MulTable {
    lo: [u8; 16],
    hi: [u8; 16],
    full: [u8; 256],
}

impl MulTable {
    pub fn new(c: u8) -> MulTable {
        let mut t = MulTable {
            lo: [0; 16],
            hi: [0; 16],
            full: [0; 256],
        };
        for i in 0..16u8 {
            t.lo[i as usize] = gf_mul(c, i);
            t.hi[i as usize] = gf_mul(c, i << 4);
        }
        for (i, v) in t.full.iter_mut().enumerate() {
            *v = gf_mul(c, i as u8);
        }
        t
    }
}

/// One vector of bytes. Implementations are only ever used inside a
/// function compiled for their instruction set (see `dispatch!`).
trait Vector: Copy {
    const BYTES: usize;
    type Table: Copy;
    /// # Safety
    /// `p` must be valid for reading `BYTES` bytes.
    unsafe fn load(p: *const u8) -> Self;
    /// # Safety
    /// `p` must be valid for writing `BYTES` bytes.
    unsafe fn store(self, p: *mut u8);
    /// A store that bypasses the caches (no read for ownership).
    ///
    /// # Safety
    /// As `store`, and `p` must be aligned to `BYTES`.
    #[inline(always)]
    unsafe fn store_nt(self, p: *mut u8) {
        // SAFETY: forwarded from the caller.
        unsafe { self.store(p) }
    }
    /// Order streaming stores before whatever follows.
    #[inline(always)]
    fn fence() {}
    fn zero() -> Self;
    fn xor(self, o: Self) -> Self;
    /// `self ^ a ^ b` (one instruction on AVX-512).
    #[inline(always)]
    fn xor3(self, a: Self, b: Self) -> Self {
        self.xor(a).xor(b)
    }
    fn mul2(self) -> Self;
    /// `mul2(self) ^ d`.
    #[inline(always)]
    fn mul2_xor(self, d: Self) -> Self {
        self.mul2().xor(d)
    }
    fn table(t: &MulTable) -> Self::Table;
    fn mulc(self, t: &Self::Table) -> Self;
}

#[inline(always)]
fn mul2_u64(x: u64) -> u64 {
    let hi = x & 0x8080_8080_8080_8080;
    ((x << 1) & 0xfefe_fefe_fefe_fefe) ^ ((hi >> 7).wrapping_mul(0x1d))
}

#[derive(Clone, Copy)]
struct Swar(u64);

impl Vector for Swar {
    const BYTES: usize = 8;
    type Table = [u8; 256];
    #[inline(always)]
    unsafe fn load(p: *const u8) -> Swar {
        // SAFETY: the caller guarantees 8 readable bytes; unaligned read.
        Swar(unsafe { (p as *const u64).read_unaligned() })
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8) {
        // SAFETY: the caller guarantees 8 writable bytes; unaligned write.
        unsafe { (p as *mut u64).write_unaligned(self.0) }
    }
    #[inline(always)]
    fn zero() -> Swar {
        Swar(0)
    }
    #[inline(always)]
    fn xor(self, o: Swar) -> Swar {
        Swar(self.0 ^ o.0)
    }
    #[inline(always)]
    fn mul2(self) -> Swar {
        Swar(mul2_u64(self.0))
    }
    fn table(t: &MulTable) -> [u8; 256] {
        t.full
    }
    #[inline(always)]
    fn mulc(self, t: &[u8; 256]) -> Swar {
        let b = self.0.to_ne_bytes().map(|x| t[x as usize]);
        Swar(u64::from_ne_bytes(b))
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{MulTable, Vector};
    use std::arch::x86_64::*;

    #[derive(Clone, Copy)]
    pub struct V128(__m128i);
    #[derive(Clone, Copy)]
    pub struct V256(__m256i);
    #[derive(Clone, Copy)]
    pub struct V512(__m512i);

    // SAFETY (for every intrinsic below): these methods are #[inline(always)]
    // and only called from kernels compiled with the matching
    // #[target_feature] (SSSE3, AVX2, AVX-512F+BW) after run-time detection,
    // so the instructions exist; loads and stores are unaligned and the
    // caller guarantees the bytes are in bounds.

    impl Vector for V128 {
        const BYTES: usize = 16;
        type Table = (__m128i, __m128i);
        #[inline(always)]
        unsafe fn load(p: *const u8) -> V128 {
            // SAFETY: see the comment above the impls.
            V128(unsafe { _mm_loadu_si128(p as *const __m128i) })
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut u8) {
            // SAFETY: see the comment above the impls.
            unsafe { _mm_storeu_si128(p as *mut __m128i, self.0) }
        }
        #[inline(always)]
        unsafe fn store_nt(self, p: *mut u8) {
            // SAFETY: see the comment above the impls; the caller
            // guarantees alignment.
            unsafe { _mm_stream_si128(p as *mut _, self.0) }
        }
        #[inline(always)]
        fn fence() {
            // SAFETY: see the comment above the impls (SSE2 fence).
            unsafe { _mm_sfence() }
        }
        #[inline(always)]
        fn zero() -> V128 {
            // SAFETY: see the comment above the impls.
            V128(unsafe { _mm_setzero_si128() })
        }
        #[inline(always)]
        fn xor(self, o: V128) -> V128 {
            // SAFETY: see the comment above the impls.
            V128(unsafe { _mm_xor_si128(self.0, o.0) })
        }
        #[inline(always)]
        fn mul2(self) -> V128 {
            // SAFETY: see the comment above the impls.
            unsafe {
                let neg = _mm_cmpgt_epi8(_mm_setzero_si128(), self.0);
                let poly = _mm_and_si128(neg, _mm_set1_epi8(0x1d));
                V128(_mm_xor_si128(_mm_add_epi8(self.0, self.0), poly))
            }
        }
        fn table(t: &MulTable) -> (__m128i, __m128i) {
            // SAFETY: see the comment above the impls (16-byte arrays).
            unsafe {
                (
                    _mm_loadu_si128(t.lo.as_ptr() as *const __m128i),
                    _mm_loadu_si128(t.hi.as_ptr() as *const __m128i),
                )
            }
        }
        #[inline(always)]
        fn mulc(self, t: &(__m128i, __m128i)) -> V128 {
            // SAFETY: see the comment above the impls.
            unsafe {
                let m = _mm_set1_epi8(0x0f);
                let lo = _mm_and_si128(self.0, m);
                let hi = _mm_and_si128(_mm_srli_epi64(self.0, 4), m);
                V128(_mm_xor_si128(
                    _mm_shuffle_epi8(t.0, lo),
                    _mm_shuffle_epi8(t.1, hi),
                ))
            }
        }
    }

    impl Vector for V256 {
        const BYTES: usize = 32;
        type Table = (__m256i, __m256i);
        #[inline(always)]
        unsafe fn load(p: *const u8) -> V256 {
            // SAFETY: see the comment above the impls.
            V256(unsafe { _mm256_loadu_si256(p as *const __m256i) })
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut u8) {
            // SAFETY: see the comment above the impls.
            unsafe { _mm256_storeu_si256(p as *mut __m256i, self.0) }
        }
        #[inline(always)]
        unsafe fn store_nt(self, p: *mut u8) {
            // SAFETY: see the comment above the impls; the caller
            // guarantees alignment.
            unsafe { _mm256_stream_si256(p as *mut _, self.0) }
        }
        #[inline(always)]
        fn fence() {
            // SAFETY: see the comment above the impls (SSE2 fence).
            unsafe { _mm_sfence() }
        }
        #[inline(always)]
        fn zero() -> V256 {
            // SAFETY: see the comment above the impls.
            V256(unsafe { _mm256_setzero_si256() })
        }
        #[inline(always)]
        fn xor(self, o: V256) -> V256 {
            // SAFETY: see the comment above the impls.
            V256(unsafe { _mm256_xor_si256(self.0, o.0) })
        }
        #[inline(always)]
        fn mul2(self) -> V256 {
            // SAFETY: see the comment above the impls.
            unsafe {
                let neg = _mm256_cmpgt_epi8(_mm256_setzero_si256(), self.0);
                let poly = _mm256_and_si256(neg, _mm256_set1_epi8(0x1d));
                V256(_mm256_xor_si256(_mm256_add_epi8(self.0, self.0), poly))
            }
        }
        fn table(t: &MulTable) -> (__m256i, __m256i) {
            // SAFETY: see the comment above the impls (16-byte arrays).
            unsafe {
                (
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(t.lo.as_ptr() as *const __m128i)),
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(t.hi.as_ptr() as *const __m128i)),
                )
            }
        }
        #[inline(always)]
        fn mulc(self, t: &(__m256i, __m256i)) -> V256 {
            // SAFETY: see the comment above the impls.
            unsafe {
                let m = _mm256_set1_epi8(0x0f);
                let lo = _mm256_and_si256(self.0, m);
                let hi = _mm256_and_si256(_mm256_srli_epi64(self.0, 4), m);
                V256(_mm256_xor_si256(
                    _mm256_shuffle_epi8(t.0, lo),
                    _mm256_shuffle_epi8(t.1, hi),
                ))
            }
        }
    }

    impl Vector for V512 {
        const BYTES: usize = 64;
        type Table = (__m512i, __m512i);
        #[inline(always)]
        unsafe fn load(p: *const u8) -> V512 {
            // SAFETY: see the comment above the impls.
            V512(unsafe { _mm512_loadu_si512(p as *const __m512i) })
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut u8) {
            // SAFETY: see the comment above the impls.
            unsafe { _mm512_storeu_si512(p as *mut __m512i, self.0) }
        }
        #[inline(always)]
        unsafe fn store_nt(self, p: *mut u8) {
            // SAFETY: see the comment above the impls; the caller
            // guarantees alignment.
            unsafe { _mm512_stream_si512(p as *mut _, self.0) }
        }
        #[inline(always)]
        fn fence() {
            // SAFETY: see the comment above the impls (SSE2 fence).
            unsafe { _mm_sfence() }
        }
        #[inline(always)]
        fn zero() -> V512 {
            // SAFETY: see the comment above the impls.
            V512(unsafe { _mm512_setzero_si512() })
        }
        #[inline(always)]
        fn xor(self, o: V512) -> V512 {
            // SAFETY: see the comment above the impls.
            V512(unsafe { _mm512_xor_si512(self.0, o.0) })
        }
        #[inline(always)]
        fn xor3(self, a: V512, b: V512) -> V512 {
            // SAFETY: see the comment above the impls.
            V512(unsafe { _mm512_ternarylogic_epi32::<0x96>(self.0, a.0, b.0) })
        }
        #[inline(always)]
        fn mul2(self) -> V512 {
            // SAFETY: see the comment above the impls.
            unsafe {
                let top = _mm512_movepi8_mask(self.0);
                let poly = _mm512_maskz_mov_epi8(top, _mm512_set1_epi8(0x1d));
                V512(_mm512_xor_si512(_mm512_add_epi8(self.0, self.0), poly))
            }
        }
        #[inline(always)]
        fn mul2_xor(self, d: V512) -> V512 {
            // SAFETY: see the comment above the impls.
            unsafe {
                let top = _mm512_movepi8_mask(self.0);
                let poly = _mm512_maskz_mov_epi8(top, _mm512_set1_epi8(0x1d));
                V512(_mm512_ternarylogic_epi32::<0x96>(
                    _mm512_add_epi8(self.0, self.0),
                    poly,
                    d.0,
                ))
            }
        }
        fn table(t: &MulTable) -> (__m512i, __m512i) {
            // SAFETY: see the comment above the impls (16-byte arrays).
            unsafe {
                (
                    _mm512_broadcast_i32x4(_mm_loadu_si128(t.lo.as_ptr() as *const __m128i)),
                    _mm512_broadcast_i32x4(_mm_loadu_si128(t.hi.as_ptr() as *const __m128i)),
                )
            }
        }
        #[inline(always)]
        fn mulc(self, t: &(__m512i, __m512i)) -> V512 {
            // SAFETY: see the comment above the impls.
            unsafe {
                let m = _mm512_set1_epi8(0x0f);
                let lo = _mm512_and_si512(self.0, m);
                let hi = _mm512_and_si512(_mm512_srli_epi64(self.0, 4), m);
                V512(_mm512_xor_si512(
                    _mm512_shuffle_epi8(t.0, lo),
                    _mm512_shuffle_epi8(t.1, hi),
                ))
            }
        }
    }
}

/// Vectors per loop iteration: enough independent work to hide latency.
const UNROLL: usize = 4;

/// The part of `len` the vector loop covers; the kernels finish the rest
/// byte by byte.
#[inline(always)]
fn body<V: Vector>(len: usize) -> usize {
    len / (V::BYTES * UNROLL) * (V::BYTES * UNROLL)
}

/// Outputs at least this long are written with streaming stores: they
/// would only push the sources out of the caches.
const STREAM_FROM: usize = 128 << 10;

/// Whether to stream stores into these outputs.
#[inline(always)]
fn stream<V: Vector>(len: usize, outs: &[*mut u8]) -> bool {
    len >= STREAM_FROM && outs.iter().all(|p| (*p as usize).is_multiple_of(V::BYTES))
}

/// Store, streaming or not.
///
/// # Safety
/// As `Vector::store`, and for `nt`, `Vector::store_nt`.
#[inline(always)]
unsafe fn put<V: Vector>(v: V, p: *mut u8, nt: bool) {
    // SAFETY: forwarded from the caller.
    unsafe {
        if nt {
            v.store_nt(p)
        } else {
            v.store(p)
        }
    }
}

#[inline(always)]
fn mul2_byte(x: u8) -> u8 {
    (x << 1) ^ if x & 0x80 != 0 { 0x1d } else { 0 }
}

/// `dst = XOR of srcs`, or with `acc`, `dst ^= XOR of srcs`.
#[inline(always)]
fn xor_k<V: Vector>(srcs: &[&[u8]], dst: &mut [u8], acc: bool) {
    let len = dst.len();
    let end = body::<V>(len);
    let d = dst.as_mut_ptr();
    let mut at = 0;
    let nt = !acc && stream::<V>(len, &[d]);
    let (first, rest) = match srcs.split_first() {
        Some((f, r)) => (Some(*f), r),
        None => (None, srcs),
    };
    while at < end {
        let mut v = [V::zero(); UNROLL];
        // SAFETY: every offset below is at + u * BYTES + BYTES <= end <= len,
        // and every slice is `len` long (checked by the public entry points).
        unsafe {
            if let Some(f) = first {
                for (u, x) in v.iter_mut().enumerate() {
                    *x = V::load(f.as_ptr().add(at + u * V::BYTES));
                }
            }
            if acc {
                for (u, x) in v.iter_mut().enumerate() {
                    *x = x.xor(V::load(d.add(at + u * V::BYTES)));
                }
            }
            // Sources outermost: each source pointer is loaded once per
            // iteration, and pairs of sources fold with one three-way XOR.
            let mut pairs = rest.chunks_exact(2);
            for pair in &mut pairs {
                let (a, b) = (pair[0].as_ptr(), pair[1].as_ptr());
                for (u, x) in v.iter_mut().enumerate() {
                    let o = at + u * V::BYTES;
                    *x = x.xor3(V::load(a.add(o)), V::load(b.add(o)));
                }
            }
            for s in pairs.remainder() {
                for (u, x) in v.iter_mut().enumerate() {
                    *x = x.xor(V::load(s.as_ptr().add(at + u * V::BYTES)));
                }
            }
            for (u, x) in v.iter().enumerate() {
                put(*x, d.add(at + u * V::BYTES), nt);
            }
        }
        at += V::BYTES * UNROLL;
    }
    if nt {
        V::fence();
    }
    for i in end..len {
        let mut b = if acc { dst[i] } else { 0 };
        for s in srcs {
            b ^= s[i];
        }
        dst[i] = b;
    }
}

/// Accumulate P (XOR) and Q (Horner's rule, highest index first) of the
/// present sources over `UNROLL` vectors at `at`; missing sources count as zero.
#[inline(always)]
fn syndrome_step<V: Vector>(srcs: &[&[u8]], at: usize, vp: &mut [V; UNROLL], vq: &mut [V; UNROLL]) {
    for s in srcs.iter().rev() {
        if s.is_empty() {
            // A missing chunk: it contributes zero, but still shifts Q.
            for x in vq.iter_mut() {
                *x = x.mul2();
            }
            continue;
        }
        let base = s.as_ptr();
        for u in 0..UNROLL {
            // SAFETY: at + u * BYTES + BYTES <= end <= the slice's length
            // (checked by the public entry points).
            let d = unsafe { V::load(base.add(at + u * V::BYTES)) };
            vp[u] = vp[u].xor(d);
            vq[u] = vq[u].mul2_xor(d);
        }
    }
}

/// P and Q with missing chunks taken as zero; srcs in syndrome order.
#[inline(always)]
fn pq_k<V: Vector>(srcs: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    let len = p.len();
    let end = body::<V>(len);
    let (pp, qp) = (p.as_mut_ptr(), q.as_mut_ptr());
    let nt = stream::<V>(len, &[pp, qp]);
    let mut at = 0;
    while at < end {
        let mut vp = [V::zero(); UNROLL];
        let mut vq = [V::zero(); UNROLL];
        syndrome_step::<V>(srcs, at, &mut vp, &mut vq);
        for u in 0..UNROLL {
            let o = at + u * V::BYTES;
            // SAFETY: in bounds, as in xor_k; aligned when streaming.
            unsafe {
                put(vp[u], pp.add(o), nt);
                put(vq[u], qp.add(o), nt);
            }
        }
        at += V::BYTES * UNROLL;
    }
    if nt {
        V::fence();
    }
    for i in end..len {
        let (mut bp, mut bq) = (0u8, 0u8);
        for s in srcs.iter().rev() {
            bq = mul2_byte(bq);
            if !s.is_empty() {
                bp ^= s[i];
                bq ^= s[i];
            }
        }
        p[i] = bp;
        q[i] = bq;
    }
}

/// Read-modify-write: `p ^= old ^ new`, `q ^= c * (old ^ new)`.
#[inline(always)]
fn rmw_k<V: Vector>(p: &mut [u8], mut q: Option<&mut [u8]>, old: &[u8], new: &[u8], t: &MulTable) {
    let len = p.len();
    let end = body::<V>(len);
    let tab = V::table(t);
    let pp = p.as_mut_ptr();
    let qp = q.as_mut().map(|q| q.as_mut_ptr());
    let mut at = 0;
    while at < end {
        for u in 0..UNROLL {
            let o = at + u * V::BYTES;
            // SAFETY: in bounds, as in xor_k.
            unsafe {
                let delta = V::load(old.as_ptr().add(o)).xor(V::load(new.as_ptr().add(o)));
                V::load(pp.add(o)).xor(delta).store(pp.add(o));
                if let Some(qp) = qp {
                    V::load(qp.add(o)).xor(delta.mulc(&tab)).store(qp.add(o));
                }
            }
        }
        at += V::BYTES * UNROLL;
    }
    for i in end..len {
        let delta = old[i] ^ new[i];
        p[i] ^= delta;
        if let Some(q) = q.as_mut() {
            q[i] ^= t.full[delta as usize];
        }
    }
}

/// Two lost data chunks in one pass: with `px = P ^ (xor of survivors)` and
/// `qx = Q ^ (syndrome of survivors)`, `Dx = a*px ^ b*qx` and `Dy = px ^ Dx`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn recover2_k<V: Vector>(
    srcs: &[&[u8]],
    p: &[u8],
    q: &[u8],
    a: &MulTable,
    b: &MulTable,
    dx: &mut [u8],
    dy: &mut [u8],
) {
    let len = p.len();
    let end = body::<V>(len);
    let (ta, tb) = (V::table(a), V::table(b));
    let (xp, yp) = (dx.as_mut_ptr(), dy.as_mut_ptr());
    let nt = stream::<V>(len, &[xp, yp]);
    let mut at = 0;
    while at < end {
        let mut vp = [V::zero(); UNROLL];
        let mut vq = [V::zero(); UNROLL];
        syndrome_step::<V>(srcs, at, &mut vp, &mut vq);
        for u in 0..UNROLL {
            let o = at + u * V::BYTES;
            // SAFETY: in bounds, as in xor_k.
            unsafe {
                let px = V::load(p.as_ptr().add(o)).xor(vp[u]);
                let qx = V::load(q.as_ptr().add(o)).xor(vq[u]);
                let x = px.mulc(&ta).xor(qx.mulc(&tb));
                put(x, xp.add(o), nt);
                put(px.xor(x), yp.add(o), nt);
            }
        }
        at += V::BYTES * UNROLL;
    }
    if nt {
        V::fence();
    }
    for i in end..len {
        let (mut bp, mut bq) = (p[i], q[i]);
        let mut sq = 0u8;
        for s in srcs.iter().rev() {
            sq = mul2_byte(sq);
            if !s.is_empty() {
                bp ^= s[i];
                sq ^= s[i];
            }
        }
        bq ^= sq;
        let x = a.full[bp as usize] ^ b.full[bq as usize];
        dx[i] = x;
        dy[i] = bp ^ x;
    }
}

/// One lost data chunk without P: `Dx = c * (Q ^ syndrome of survivors)`.
#[inline(always)]
fn recover_q_k<V: Vector>(srcs: &[&[u8]], q: &[u8], c: &MulTable, out: &mut [u8]) {
    let len = q.len();
    let end = body::<V>(len);
    let tc = V::table(c);
    let op = out.as_mut_ptr();
    let mut at = 0;
    while at < end {
        let mut vq = [V::zero(); UNROLL];
        let mut vp = [V::zero(); UNROLL];
        syndrome_step::<V>(srcs, at, &mut vp, &mut vq);
        for (u, x) in vq.iter().enumerate() {
            let o = at + u * V::BYTES;
            // SAFETY: in bounds, as in xor_k.
            unsafe {
                V::load(q.as_ptr().add(o))
                    .xor(*x)
                    .mulc(&tc)
                    .store(op.add(o));
            }
        }
        at += V::BYTES * UNROLL;
    }
    for i in end..len {
        let mut sq = 0u8;
        for s in srcs.iter().rev() {
            sq = mul2_byte(sq);
            if !s.is_empty() {
                sq ^= s[i];
            }
        }
        out[i] = c.full[(q[i] ^ sq) as usize];
    }
}

/// For each kernel, one function per instruction set: the generic kernel
/// inlined into a function compiled with that instruction set enabled.
macro_rules! per_isa {
    ($name:ident = $kernel:ident ($($p:ident : $t:ty),*)) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512bw")]
            #[allow(clippy::too_many_arguments)]
            pub unsafe fn avx512($($p: $t),*) { $kernel::<x86::V512>($($p),*) }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2")]
            #[allow(clippy::too_many_arguments)]
            pub unsafe fn avx2($($p: $t),*) { $kernel::<x86::V256>($($p),*) }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "ssse3")]
            #[allow(clippy::too_many_arguments)]
            pub unsafe fn ssse3($($p: $t),*) { $kernel::<x86::V128>($($p),*) }
            #[allow(clippy::too_many_arguments)]
            pub fn portable($($p: $t),*) { $kernel::<Swar>($($p),*) }
        }
    };
}

per_isa!(xor_isa = xor_k(srcs: &[&[u8]], dst: &mut [u8], acc: bool));
per_isa!(pq_isa = pq_k(srcs: &[&[u8]], p: &mut [u8], q: &mut [u8]));
per_isa!(rmw_isa = rmw_k(p: &mut [u8], q: Option<&mut [u8]>, old: &[u8], new: &[u8], t: &MulTable));
per_isa!(recover2_isa = recover2_k(srcs: &[&[u8]], p: &[u8], q: &[u8], a: &MulTable, b: &MulTable, dx: &mut [u8], dy: &mut [u8]));
per_isa!(recover_q_isa = recover_q_k(srcs: &[&[u8]], q: &[u8], c: &MulTable, out: &mut [u8]));

/// Call the version of a kernel for `isa`.
macro_rules! call {
    ($isa:expr, $name:ident ($($a:expr),*)) => {
        match $isa.checked() {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `checked` proved at run time that the CPU has AVX-512F/BW.
            Isa::Avx512 => unsafe { $name::avx512($($a),*) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `checked` proved at run time that the CPU has AVX2.
            Isa::Avx2 => unsafe { $name::avx2($($a),*) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `checked` proved at run time that the CPU has SSSE3.
            Isa::Ssse3 => unsafe { $name::ssse3($($a),*) },
            Isa::Portable => $name::portable($($a),*),
        }
    };
}

impl Isa {
    /// This instruction set, if the CPU has it.
    ///
    /// # Panics
    /// If it does not: running its kernels would be undefined behaviour.
    fn checked(self) -> Isa {
        assert!(
            Isa::detected().contains(&self),
            "this CPU cannot run the {} kernels",
            self.name()
        );
        self
    }
}

fn same_len(len: usize, slices: &[&[u8]]) {
    assert!(
        slices.iter().all(|s| s.len() == len),
        "parity buffers differ in length"
    );
}

fn same_len_opt(len: usize, slices: &[&[u8]]) {
    assert!(
        slices.iter().all(|s| s.is_empty() || s.len() == len),
        "parity buffers differ in length"
    );
}

/// `dst = XOR of srcs` (`acc`: `dst ^= ...`).
pub fn xor(isa: Isa, srcs: &[&[u8]], dst: &mut [u8], acc: bool) {
    same_len(dst.len(), srcs);
    call!(isa, xor_isa(srcs, dst, acc))
}

/// P and Q of `srcs` in syndrome order; an empty slice is a missing chunk
/// (taken as zero).
pub fn pq(isa: Isa, srcs: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    assert_eq!(p.len(), q.len());
    same_len_opt(p.len(), srcs);
    call!(isa, pq_isa(srcs, p, q))
}

/// `p ^= old ^ new`; `q ^= c * (old ^ new)`.
pub fn rmw(isa: Isa, p: &mut [u8], q: Option<&mut [u8]>, old: &[u8], new: &[u8], t: &MulTable) {
    same_len(p.len(), &[old, new]);
    if let Some(q) = &q {
        same_len(p.len(), &[q]);
    }
    call!(isa, rmw_isa(p, q, old, new, t))
}

/// Two lost data chunks (see `recover2_k`).
#[allow(clippy::too_many_arguments)]
pub fn recover2(
    isa: Isa,
    srcs: &[&[u8]],
    p: &[u8],
    q: &[u8],
    a: &MulTable,
    b: &MulTable,
    dx: &mut [u8],
    dy: &mut [u8],
) {
    same_len_opt(p.len(), srcs);
    same_len(p.len(), &[q, dx, dy]);
    call!(isa, recover2_isa(srcs, p, q, a, b, dx, dy))
}

/// One lost data chunk from Q (see `recover_q_k`).
pub fn recover_q(isa: Isa, srcs: &[&[u8]], q: &[u8], c: &MulTable, out: &mut [u8]) {
    same_len_opt(q.len(), srcs);
    same_len(q.len(), &[out]);
    call!(isa, recover_q_isa(srcs, q, c, out))
}
