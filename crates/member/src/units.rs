//! Sizes and rates as every raidkit command and member spec takes them:
//! a number of bytes, or with a suffix K, M, G, T or P (also KiB, MiB...),
//! powers of 1024 as mdadm's; a rate is a size per second, "/s" accepted.
//! Decimal units (KB, MB, GB) are refused rather than guessed at: "50MB"
//! means 50,000,000 to some and 52,428,800 to others.

/// Parse "4096", "512K", "16M", "1.5G", "2T", "64KiB".
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let suffix = suffix.trim().to_ascii_uppercase();
    let mult: u64 = match suffix.as_str() {
        "" | "B" => 1,
        "K" | "KIB" => 1 << 10,
        "M" | "MIB" => 1 << 20,
        "G" | "GIB" => 1 << 30,
        "T" | "TIB" => 1 << 40,
        "P" | "PIB" => 1 << 50,
        "KB" | "MB" | "GB" | "TB" | "PB" => {
            let unit = &suffix[..1];
            return Err(format!(
                "'{s}': sizes are in powers of 1024; write {num}{unit} or {num}{unit}iB ({unit}B, powers of 1000, is not taken, to leave no doubt)"
            ));
        }
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

/// Parse a rate in bytes per second: "50M", "50M/s", "0".
pub fn parse_rate(s: &str) -> Result<u64, String> {
    parse_size(s.trim().trim_end_matches("/s"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_rates() {
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
        let e = parse_size("50MB").unwrap_err();
        assert!(e.contains("50M or 50MiB"), "{e}");
        assert_eq!(parse_rate("50M/s").unwrap(), 50 << 20);
        assert_eq!(parse_rate("0").unwrap(), 0);
        assert!(parse_rate("50MB/s").is_err());
    }
}
