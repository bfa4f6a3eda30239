//! Slow, obviously-correct parity: one byte at a time, multiplication by
//! shift-and-add with the polynomial, no tables. The fast kernels and the
//! array engine are checked against these.

/// Multiply in GF(2^8) mod 0x11d by the schoolbook method.
pub fn mul(mut a: u8, mut b: u8) -> u8 {
    let mut r = 0u8;
    while b != 0 {
        if b & 1 != 0 {
            r ^= a;
        }
        let carry = a & 0x80 != 0;
        a <<= 1;
        if carry {
            a ^= 0x1d;
        }
        b >>= 1;
    }
    r
}

/// g^i for generator 2.
pub fn pow2(i: usize) -> u8 {
    let mut r = 1u8;
    for _ in 0..i {
        r = mul(r, 2);
    }
    r
}

/// P and Q of `data` (syndrome order), byte by byte.
pub fn pq(data: &[&[u8]]) -> (Vec<u8>, Vec<u8>) {
    let len = data.first().map_or(0, |d| d.len());
    let mut p = vec![0u8; len];
    let mut q = vec![0u8; len];
    for (i, d) in data.iter().enumerate() {
        let g = pow2(i);
        for b in 0..len {
            p[b] ^= d[b];
            q[b] ^= mul(g, d[b]);
        }
    }
    (p, q)
}
