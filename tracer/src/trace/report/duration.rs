//! Durations as people read and write them: `12.345 us` in the report's
//! columns (like `uftrace report`), `10us` on the command line (like
//! `uftrace replay -t`).

/// Units `parse` accepts, with their size in ns.
const UNITS: [(&str, u64); 6] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("sec", 1_000_000_000),
];

/// `ns` in the largest unit that keeps it at least 1: `742 ns`,
/// `12.345 us`, `1.500 ms`, `2.000 s` (three decimals, truncated, so a
/// value never reads as more than it was).
pub fn human(ns: u64) -> String {
    let (div, unit) = match ns {
        0..=999 => return format!("{ns} ns"),
        1_000..=999_999 => (1_000, "us"),
        1_000_000..=999_999_999 => (1_000_000, "ms"),
        _ => (1_000_000_000, "s"),
    };
    // Thousandths of the unit, truncated.
    let milli = ns / (div / 1_000);
    format!("{}.{:03} {unit}", milli / 1_000, milli % 1_000)
}

/// Parses a duration such as `10us`, `1.5ms`, `2 s` or `500` (no unit:
/// nanoseconds) into nanoseconds. The error says what is wrong, in one line.
pub fn parse(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = (&t[..split], t[split..].trim());
    if number.is_empty() {
        return Err(format!(
            "'{s}' is not a duration; expected a number and a unit, e.g. 10us"
        ));
    }
    let scale = if unit.is_empty() {
        1
    } else {
        UNITS
            .iter()
            .find(|(u, _)| u.eq_ignore_ascii_case(unit))
            .map(|&(_, n)| n)
            .ok_or_else(|| format!("unknown unit '{unit}' in '{s}'; use ns, us, ms or s"))?
    };
    let bad = || format!("'{number}' in '{s}' is not a number");
    let (int, frac) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(bad());
    }
    let too_long = || format!("'{s}' is too long (at most {} s)", u64::MAX / 1_000_000_000);
    let int: u128 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| too_long())?
    };
    // The fraction, to nanosecond precision of the unit (digits beyond are cut).
    let digits: String = frac.chars().take(9).collect();
    let frac_ns: u128 = if digits.is_empty() {
        0
    } else {
        let n: u128 = digits.parse().map_err(|_| bad())?;
        n * u128::from(scale) / 10u128.pow(digits.len() as u32)
    };
    let ns = int
        .checked_mul(u128::from(scale))
        .and_then(|v| v.checked_add(frac_ns))
        .ok_or_else(too_long)?;
    u64::try_from(ns).map_err(|_| too_long())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_units() {
        assert_eq!(human(0), "0 ns");
        assert_eq!(human(999), "999 ns");
        assert_eq!(human(1_000), "1.000 us");
        assert_eq!(human(12_345), "12.345 us");
        assert_eq!(human(999_999), "999.999 us");
        assert_eq!(human(1_500_000), "1.500 ms");
        assert_eq!(human(2_000_000_999), "2.000 s");
        assert_eq!(human(u64::MAX), "18446744073.709 s");
    }

    #[test]
    fn parse_units_and_errors() {
        assert_eq!(parse("10us"), Ok(10_000));
        assert_eq!(parse("10 us"), Ok(10_000));
        assert_eq!(parse("1.5ms"), Ok(1_500_000));
        assert_eq!(parse("2s"), Ok(2_000_000_000));
        assert_eq!(parse("500"), Ok(500));
        assert_eq!(parse("0.5US"), Ok(500));
        assert_eq!(parse(".25s"), Ok(250_000_000));
        assert_eq!(parse("3µs"), Ok(3_000));
        assert_eq!(
            parse("10xs").unwrap_err(),
            "unknown unit 'xs' in '10xs'; use ns, us, ms or s"
        );
        assert_eq!(
            parse("fast").unwrap_err(),
            "'fast' is not a duration; expected a number and a unit, e.g. 10us"
        );
        assert_eq!(
            parse("-1us").unwrap_err(),
            "'-1us' is not a duration; expected a number and a unit, e.g. 10us"
        );
        assert_eq!(
            parse("1.2.3us").unwrap_err(),
            "'1.2.3' in '1.2.3us' is not a number"
        );
        assert_eq!(parse(".us").unwrap_err(), "'.' in '.us' is not a number");
        assert_eq!(
            parse("99999999999999s").unwrap_err(),
            "'99999999999999s' is too long (at most 18446744073 s)"
        );
    }
}
