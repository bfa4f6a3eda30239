use super::*;
use proptest::prelude::*;

fn stripes(k: usize, len: usize, seed: u64) -> Vec<Vec<u8>> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..k)
        .map(|_| (0..len).map(|_| rng.gen()).collect())
        .collect()
}

#[test]
fn field_tables_agree_with_schoolbook() {
    for a in 0..=255u8 {
        for b in 0..=255u8 {
            assert_eq!(gf_mul(a, b), reference::mul(a, b));
        }
        if a != 0 {
            assert_eq!(gf_mul(a, gf_inv(a)), 1);
        }
    }
    for i in 0..300 {
        assert_eq!(gf_exp(i), reference::pow2(i));
    }
}

#[test]
fn known_q_values() {
    // Q of D0=1, D1=1: 1 ^ 2 = 3; of D2=0x80 alone: 4*0x80 = 0x1d*2 = 0x3a.
    let d = [[1u8], [1u8], [0u8]];
    let r: Vec<&[u8]> = d.iter().map(|x| &x[..]).collect();
    let (mut p, mut q) = ([0u8], [0u8]);
    gen_pq(&r, &mut p, &mut q);
    assert_eq!((p[0], q[0]), (0, 3));
    let d = [[0u8], [0u8], [0x80u8]];
    let r: Vec<&[u8]> = d.iter().map(|x| &x[..]).collect();
    gen_pq(&r, &mut p, &mut q);
    assert_eq!(q[0], 0x3a);
}

#[test]
fn every_isa_this_cpu_has_is_tested() {
    let isas = Isa::available();
    assert_eq!(*isas.last().unwrap(), Isa::Portable);
    assert_eq!(Isa::best(), isas[0]);
    eprintln!("parity kernels tested: {:?}", isas);
}

/// Lengths that exercise the vector bodies (multiples of 256 bytes for
/// AVX-512 x 4) and every kind of tail.
fn length() -> impl Strategy<Value = usize> {
    prop_oneof![
        0usize..300,
        250usize..1100,
        (1usize..20).prop_map(|n| n * 256),
        4000usize..5000
    ]
}

proptest! {
    #[test]
    fn pq_matches_reference(k in 1usize..20, len in length(), seed in any::<u64>(), skew in 0usize..64) {
        let d = stripes(k, len + skew, seed);
        // Unaligned slices: start `skew` bytes in.
        let refs: Vec<&[u8]> = d.iter().map(|v| &v[skew..]).collect();
        let (rp, rq) = reference::pq(&refs);
        for isa in Isa::available() {
            let mut p = vec![0xAA; len];
            let mut q = vec![0x55; len];
            gen_pq_with(isa, &refs, &mut p, &mut q);
            prop_assert_eq!(&p, &rp, "{:?}", isa);
            prop_assert_eq!(&q, &rq, "{:?}", isa);
            let mut p2 = vec![1; len];
            gen_p_with(isa, &refs, &mut p2);
            prop_assert_eq!(&p2, &rp, "{:?}", isa);
        }
    }

    #[test]
    fn recovery_round_trips(k in 2usize..20, len in length(), seed in any::<u64>(), x in 0usize..20, y in 0usize..20) {
        let x = x % k;
        let y = y % k;
        let d = stripes(k, len, seed);
        let refs: Vec<&[u8]> = d.iter().map(|v| v.as_slice()).collect();
        let (p, q) = reference::pq(&refs);
        for isa in Isa::available() {
            let mut lost = d.clone();
            lost[x].fill(0x5a);
            recover_data_p_with(isa, &mut lost, x, &p);
            prop_assert_eq!(&lost, &d, "{:?}", isa);

            let mut lost = d.clone();
            lost[x].fill(0xa5);
            recover_data_q_with(isa, &mut lost, x, &q);
            prop_assert_eq!(&lost, &d, "{:?}", isa);

            if x != y {
                let mut lost = d.clone();
                lost[x].fill(1);
                lost[y].fill(2);
                recover_two_data_with(isa, &mut lost, x, y, &p, &q);
                prop_assert_eq!(&lost, &d, "{:?}", isa);
            }
        }
    }

    #[test]
    fn rmw_update_matches_full_recompute(k in 1usize..12, len in length(), seed in any::<u64>(), slot in 0usize..12, skew in 0usize..16) {
        let slot = slot % k;
        let mut d = stripes(k + 1, len, seed);
        let new = d.pop().unwrap();
        let refs: Vec<&[u8]> = d.iter().map(|v| v.as_slice()).collect();
        let (p0, q0) = reference::pq(&refs);
        let old = d[slot].clone();
        let mut d2 = d.clone();
        d2[slot] = new.clone();
        let refs: Vec<&[u8]> = d2.iter().map(|v| v.as_slice()).collect();
        let (rp, rq) = reference::pq(&refs);
        for isa in Isa::available() {
            // Unaligned parity buffers.
            let mut pb = vec![0u8; len + skew];
            let mut qb = vec![0u8; len + skew];
            pb[skew..].copy_from_slice(&p0);
            qb[skew..].copy_from_slice(&q0);
            update_pq_with(isa, &mut pb[skew..], Some(&mut qb[skew..]), slot, &old, &new);
            prop_assert_eq!(&pb[skew..], &rp[..], "{:?}", isa);
            prop_assert_eq!(&qb[skew..], &rq[..], "{:?}", isa);
            let mut pb = p0.clone();
            update_pq_with(isa, &mut pb, None, slot, &old, &new);
            prop_assert_eq!(&pb, &rp, "{:?}", isa);
        }
    }
}

/// Long, aligned buffers take the streaming-store path; check it for every
/// instruction set (the property tests use short buffers).
#[test]
fn long_aligned_buffers_use_streaming_stores_correctly() {
    let len = 256 << 10;
    let k = 4;
    let d = stripes(k, len, 42);
    let refs: Vec<&[u8]> = d.iter().map(|v| v.as_slice()).collect();
    let (rp, rq) = reference::pq(&refs);
    let aligned = |n: usize| {
        let v = vec![0u8; n + 64];
        let off = v.as_ptr().align_offset(64);
        (v, off)
    };
    for isa in Isa::available() {
        let (mut pv, po) = aligned(len);
        let (mut qv, qo) = aligned(len);
        gen_pq_with(isa, &refs, &mut pv[po..po + len], &mut qv[qo..qo + len]);
        assert!(pv[po..po + len] == rp[..], "{isa:?} P");
        assert!(qv[qo..qo + len] == rq[..], "{isa:?} Q");
        let (mut xv, xo) = aligned(len);
        gen_p_with(isa, &refs, &mut xv[xo..xo + len]);
        assert!(xv[xo..xo + len] == rp[..], "{isa:?} xor");
        let lost: Vec<&[u8]> = refs
            .iter()
            .enumerate()
            .map(|(i, r)| if i < 2 { &[][..] } else { *r })
            .collect();
        let (mut dx, xo) = aligned(len);
        let (mut dy, yo) = aligned(len);
        recover_two_into(
            isa,
            &lost,
            0,
            1,
            &rp,
            &rq,
            &mut dx[xo..xo + len],
            &mut dy[yo..yo + len],
        );
        assert!(
            dx[xo..xo + len] == d[0][..] && dy[yo..yo + len] == d[1][..],
            "{isa:?} recover"
        );
    }
}
