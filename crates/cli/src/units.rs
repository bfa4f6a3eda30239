//! Sizes with K/M/G/T suffixes (powers of 1024), as mdadm takes them.

/// Parse "4096", "512K", "16M", "1.5G", "2T", "64KiB"; a suffix-less number is bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let mult: u64 = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        "T" | "TB" | "TIB" => 1 << 40,
        "P" | "PB" | "PIB" => 1 << 50,
        _ => return Err(format!("'{s}': unknown size suffix (use K, M, G or T)")),
    };
    if num.is_empty() {
        return Err(format!("'{s}' is not a size"));
    }
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(mult)
            .ok_or_else(|| format!("'{s}' is too large"));
    }
    let f: f64 = num.parse().map_err(|_| format!("'{s}' is not a size"))?;
    let v = f * mult as f64;
    if !(0.0..1.8e19).contains(&v) || v.fract() != 0.0 {
        return Err(format!("'{s}' is not a whole number of bytes"));
    }
    Ok(v as u64)
}

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
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("512K").unwrap(), 512 << 10);
        assert_eq!(parse_size("16m").unwrap(), 16 << 20);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("2TiB").unwrap(), 2 << 40);
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("K").is_err());
        assert!(parse_size("0.3").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(human(15 << 20), "15.00 MiB");
    }
}
