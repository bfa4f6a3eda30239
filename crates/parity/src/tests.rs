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

proptest! {
    #[test]
    fn pq_matches_reference(k in 1usize..12, len in 0usize..300, seed in any::<u64>(), skew in 0usize..8) {
        let d = stripes(k, len + skew, seed);
        // Unaligned slices: start `skew` bytes in.
        let refs: Vec<&[u8]> = d.iter().map(|v| &v[skew..]).collect();
        let (rp, rq) = reference::pq(&refs);
        let mut p = vec![0xAA; len];
        let mut q = vec![0x55; len];
        gen_pq(&refs, &mut p, &mut q);
        prop_assert_eq!(&p, &rp);
        prop_assert_eq!(&q, &rq);
        let mut p2 = vec![1; len];
        gen_p(&refs, &mut p2);
        prop_assert_eq!(&p2, &rp);
    }

    #[test]
    fn recovery_round_trips(k in 2usize..12, len in 1usize..200, seed in any::<u64>(), x in 0usize..12, y in 0usize..12) {
        let x = x % k;
        let y = y % k;
        let d = stripes(k, len, seed);
        let refs: Vec<&[u8]> = d.iter().map(|v| v.as_slice()).collect();
        let (p, q) = reference::pq(&refs);

        let mut lost = d.clone();
        lost[x].fill(0x5a);
        recover_data_p(&mut lost, x, &p);
        prop_assert_eq!(&lost, &d);

        let mut lost = d.clone();
        lost[x].fill(0xa5);
        recover_data_q(&mut lost, x, &q);
        prop_assert_eq!(&lost, &d);

        if x != y {
            let mut lost = d.clone();
            lost[x].fill(1);
            lost[y].fill(2);
            recover_two_data(&mut lost, x, y, &p, &q);
            prop_assert_eq!(&lost, &d);
        }
    }

    #[test]
    fn rmw_update_matches_full_recompute(k in 1usize..10, len in 1usize..100, seed in any::<u64>(), slot in 0usize..10) {
        let slot = slot % k;
        let mut d = stripes(k + 1, len, seed);
        let new = d.pop().unwrap();
        let refs: Vec<&[u8]> = d.iter().map(|v| v.as_slice()).collect();
        let (mut p, mut q) = reference::pq(&refs);
        let old = d[slot].clone();
        update_pq(&mut p, Some(&mut q), slot, &old, &new);
        d[slot] = new;
        let refs: Vec<&[u8]> = d.iter().map(|v| v.as_slice()).collect();
        let (rp, rq) = reference::pq(&refs);
        prop_assert_eq!(p, rp);
        prop_assert_eq!(q, rq);
    }
}
