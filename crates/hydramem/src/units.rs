//! Human-friendly sizes on the command line: `4096`, `64KiB`, `16M`, `1GiB`, `25%`.
//!
//! Binary multiples throughout (K = KiB = 1024). A percentage is of the machine's physical
//! memory, read from /proc/meminfo; it is resolved where the value is used.

/// A size as given: bytes, or a share of the machine's memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Size {
    /// An absolute number of bytes.
    Bytes(u64),
    /// A percentage of physical memory.
    Percent(f64),
}

impl Size {
    /// Bytes, resolving a percentage against the machine's physical memory.
    pub fn bytes(&self) -> u64 {
        match *self {
            Size::Bytes(b) => b,
            Size::Percent(p) => (total_memory() as f64 * p / 100.0) as u64,
        }
    }
}

/// Parses a size (see module doc).
pub fn parse_size(s: &str) -> Result<Size, String> {
    let t = s.trim();
    if let Some(p) = t.strip_suffix('%') {
        let v: f64 = p
            .trim()
            .parse()
            .map_err(|_| format!("bad percentage {s:?}"))?;
        if !(v > 0.0 && v <= 100.0) {
            return Err(format!("percentage {s:?} must be in (0, 100]"));
        }
        return Ok(Size::Percent(v));
    }
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("bad size {s:?}: expected e.g. 4096, 64MiB, 1G or 25%"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => return Err(format!("bad size unit {u:?} in {s:?}: use K, M, G, T or %")),
    };
    n.checked_mul(mult)
        .map(Size::Bytes)
        .ok_or_else(|| format!("size {s:?} overflows"))
}

/// Formats bytes with a binary unit, e.g. "1.5 GiB".
pub fn human(bytes: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

/// Physical memory of the machine in bytes (0 if unknown).
pub fn total_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kb * 1024)
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(Size::Bytes(4096)));
        assert_eq!(parse_size("64KiB"), Ok(Size::Bytes(65536)));
        assert_eq!(parse_size("16M"), Ok(Size::Bytes(16 << 20)));
        assert_eq!(parse_size("1 GiB"), Ok(Size::Bytes(1 << 30)));
        assert_eq!(parse_size("25%"), Ok(Size::Percent(25.0)));
        assert!(parse_size("0%").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(human(1536 << 20), "1.5 GiB");
    }
}
