//! Throughput of the parity kernels, measured the way the ISA-L anchor
//! (`shared/anchors/parity_isal.c`) measures ISA-L, so that the two can run
//! side by side: GB/s of data (k chunks per stripe) on one core, rotating
//! over 64 stripe sets so that large chunks come from DRAM.

use crate::{gen_p_with, gen_pq_with, recover_two_into, update_pq_with, Isa};
use std::hint::black_box;
use std::time::{Duration, Instant};

const SETS: usize = 64;
/// Most data chunks a benchmark stripe may have.
pub const MAX_K: usize = 64;

/// One line of results.
#[derive(Debug, Clone)]
pub struct Figure {
    pub name: &'static str,
    pub k: usize,
    pub chunk: usize,
    pub gbps: f64,
}

/// A buffer whose first byte is 64-byte aligned, as the anchor allocates
/// with posix_memalign (unaligned 64-byte vectors straddle cache lines).
struct Aligned {
    v: Vec<u8>,
    off: usize,
    len: usize,
}

impl Aligned {
    fn new(bytes: Vec<u8>) -> Aligned {
        let len = bytes.len();
        let mut v = vec![0u8; len + 64];
        let off = v.as_ptr().align_offset(64);
        v[off..off + len].copy_from_slice(&bytes);
        Aligned { v, off, len }
    }
    fn get(&self) -> &[u8] {
        &self.v[self.off..self.off + self.len]
    }
    fn get_mut(&mut self) -> &mut [u8] {
        &mut self.v[self.off..self.off + self.len]
    }
}

/// Call `f(set)` over all sets, round after round, for at least `dur`;
/// returns rounds per second.
fn rate(dur: Duration, mut f: impl FnMut(usize)) -> f64 {
    let t = Instant::now();
    let mut rounds = 0u64;
    while rounds == 0 || t.elapsed() < dur {
        for s in 0..SETS {
            f(s);
        }
        rounds += 1;
    }
    rounds as f64 / t.elapsed().as_secs_f64()
}

/// Run every kernel for about `seconds` each with `k` data chunks of
/// `chunk` bytes, using `isa`'s kernels.
pub fn run(isa: Isa, k: usize, chunk: usize, seconds: f64) -> Vec<Figure> {
    assert!((2..=MAX_K).contains(&k), "k must be between 2 and {MAX_K}");
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut random = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect()
    };
    let data: Vec<Vec<Aligned>> = (0..SETS)
        .map(|_| (0..k).map(|_| Aligned::new(random(chunk))).collect())
        .collect();
    let mut par: Vec<(Aligned, Aligned)> = (0..SETS)
        .map(|_| (Aligned::new(vec![0; chunk]), Aligned::new(vec![0; chunk])))
        .collect();
    // Source lists built once, outside the timed loops.
    let refs: Vec<Vec<&[u8]>> = data
        .iter()
        .map(|set| set.iter().map(|d| d.get()).collect())
        .collect();
    // Data chunks 0 and 1 lost (empty slices) for the recovery line.
    let lost: Vec<Vec<&[u8]>> = refs
        .iter()
        .map(|r| {
            let mut v = r.clone();
            v[0] = &[];
            v[1] = &[];
            v
        })
        .collect();
    let mut sink = Aligned::new(vec![0; chunk]);
    let mut out = (Aligned::new(vec![0; chunk]), Aligned::new(vec![0; chunk]));
    let dur = Duration::from_secs_f64(seconds);
    let per_round = (SETS * k * chunk) as f64 / 1e9;
    let mut figs = Vec::new();
    let mut push = |name, rounds_per_s: f64| {
        figs.push(Figure {
            name,
            k,
            chunk,
            gbps: rounds_per_s * per_round,
        })
    };

    push(
        "memcpy",
        rate(dur, |s| {
            for d in &refs[s] {
                sink.get_mut().copy_from_slice(d);
                black_box(sink.get());
            }
        }),
    );
    push(
        "xor_gen",
        rate(dur, |s| {
            gen_p_with(isa, &refs[s], par[s].0.get_mut());
            black_box(par[s].0.get());
        }),
    );
    push(
        "pq_gen",
        rate(dur, |s| {
            let (p, q) = &mut par[s];
            gen_pq_with(isa, &refs[s], p.get_mut(), q.get_mut());
            black_box(q.get());
        }),
    );
    push(
        "rs_recover_2",
        rate(dur, |s| {
            let (p, q) = &par[s];
            let (dx, dy) = &mut out;
            recover_two_into(
                isa,
                &lost[s],
                0,
                1,
                p.get(),
                q.get(),
                dx.get_mut(),
                dy.get_mut(),
            );
            black_box(dy.get());
        }),
    );
    // The recovery must give back the data it replaced, so a fast wrong
    // kernel cannot report a figure.
    assert!(
        out.0.get() == data[SETS - 1][0].get() && out.1.get() == data[SETS - 1][1].get(),
        "rs_recover_2 produced wrong data"
    );
    push(
        "pq_rmw",
        rate(dur, |s| {
            // Read-modify-write of P and Q as each chunk of the stripe
            // changes (k updates: data bytes comparable with the lines above).
            let (p, q) = &mut par[s];
            for i in 0..k {
                let (p, q) = (p.get_mut(), q.get_mut());
                update_pq_with(isa, p, Some(q), i, refs[s][i], refs[s][(i + 1) % k]);
            }
            black_box(q.get());
        }),
    );
    figs
}
