//! `raidkit bench`: the benchmark suite. `storage/` measures any storage
//! (files, devices, directories, NBD exports, arrays) with dd/fio-style,
//! bonnie++-style and the lab's data-path tests; `engine.rs` the array
//! engine through its API; `sweep.rs` throughput against the member count
//! on simulated disks; `parity` the parity kernels (here), in the ISA-L
//! anchor's format.

pub mod engine;
pub mod storage;
pub mod sweep;

use anyhow::{bail, Result};

pub fn parity(a: crate::cli::BenchParityArgs) -> Result<()> {
    use raidkit_parity::Isa;
    let max = raidkit_parity::bench::MAX_K;
    if !(2..=max).contains(&a.k) {
        bail!("--k must be between 2 and {max}");
    }
    if a.chunk == 0 || a.chunk > 1 << 30 {
        bail!("--chunk must be between 1 byte and 1 GiB");
    }
    if !(a.seconds > 0.0 && a.seconds <= 600.0) {
        bail!("--seconds must be more than 0 and at most 600");
    }
    let available = Isa::available();
    let isa = match &a.isa {
        None => Isa::best(),
        Some(name) => *available.iter().find(|i| i.name() == name).ok_or_else(|| {
            anyhow::anyhow!(
                "instruction set '{name}' is not available here (have: {})",
                available
                    .iter()
                    .map(|i| i.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?,
    };
    eprintln!("raidkit: parity kernels: {}", isa.name());
    for f in raidkit_parity::bench::run(isa, a.k, a.chunk as usize, a.seconds) {
        println!("{:<14} {} {} {:.2}", f.name, f.k, f.chunk, f.gbps);
    }
    Ok(())
}
