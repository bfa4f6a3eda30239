//! Sizes with K/M/G/T suffixes (powers of 1024), as mdadm takes them.

pub use raidkit_member::units::{parse_rate, parse_size};

/// "15.0 MiB"-style rendering for people.
pub fn human(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes() {
        assert_eq!(human(15 << 20), "15.00 MiB");
    }
}
