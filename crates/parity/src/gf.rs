//! GF(2^8) with the RAID-6 polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d).

/// exp[i] = 2^i, doubled in length so that exp[log a + log b] needs no modulo.
const EXP: [u8; 512] = build_exp();
const LOG: [u8; 256] = build_log();

const fn build_exp() -> [u8; 512] {
    let mut t = [0u8; 512];
    let mut x: u16 = 1;
    let mut i = 0;
    while i < 512 {
        t[i] = x as u8;
        x <<= 1;
        if x & 0x100 != 0 {
            x ^= 0x11d;
        }
        i += 1;
    }
    t
}

const fn build_log() -> [u8; 256] {
    let exp = build_exp();
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 255 {
        t[exp[i] as usize] = i as u8;
        i += 1;
    }
    t
}

/// Product in GF(2^8).
pub fn gf_mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        return 0;
    }
    EXP[LOG[a as usize] as usize + LOG[b as usize] as usize]
}

/// 2^i (the generator to the power i).
pub fn gf_exp(i: usize) -> u8 {
    EXP[i % 255]
}

/// Multiplicative inverse; 0 has none.
///
/// # Panics
/// On `a == 0`.
pub fn gf_inv(a: u8) -> u8 {
    assert_ne!(a, 0, "0 has no inverse in GF(2^8)");
    EXP[255 - LOG[a as usize] as usize]
}

/// a / b.
pub fn gf_div(a: u8, b: u8) -> u8 {
    gf_mul(a, gf_inv(b))
}
