//! Kubernetes resource quantities as whole milli-units, for capacity arithmetic.
//!
//! `100m` → 100, `2` → 2000, `64Mi` → 64·2²⁰·1000, `1.5` → 1500. Everything is kept in
//! milli-units (i128) so CPU and memory use one representation without floating point.

/// Parses a quantity into milli-units; `None` for text that is not a quantity.
pub fn parse_milli(q: &str) -> Option<i128> {
    parse_in(q, 1000)
}

/// Parses a quantity into nano-units (CPU as nanocores, as `metrics.k8s.io` reports it:
/// `1234567n`), rounded down; `None` for text that is not a quantity.
pub fn parse_nano(q: &str) -> Option<i128> {
    parse_in(q, 1_000_000_000)
}

/// Parses a quantity into units of `1/per_one`.
fn parse_in(q: &str, per_one: i128) -> Option<i128> {
    let q = q.trim();
    let split = q
        .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let (mantissa, exponent) = match number.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.parse::<i32>().ok()?),
        None => (number, 0),
    };
    // What one of the suffix is worth, as a fraction of one.
    let (one_num, one_den): (i128, i128) = match suffix {
        "" => (1, 1),
        "m" => (1, 1000),
        "u" => (1, 1_000_000),
        "n" => (1, 1_000_000_000),
        "k" => (1000, 1),
        "M" => (1000_i128.pow(2), 1),
        "G" => (1000_i128.pow(3), 1),
        "T" => (1000_i128.pow(4), 1),
        "P" => (1000_i128.pow(5), 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        _ => return None,
    };
    let (scale_num, scale_den) = (one_num.checked_mul(per_one)?, one_den);
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let negative = int.starts_with('-');
    let digits: String = format!("{}{}", int.trim_start_matches(['+', '-']), frac);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let value: i128 = digits.parse().ok()?;
    // Quantities come from other clusters: an exponent like `1e2147483647` must cost a few
    // multiplications and end in `None`, never a loop or an overflow.
    let exp = exponent.checked_sub(i32::try_from(frac.len()).ok()?)?;
    let pow = 10_i128.checked_pow(exp.unsigned_abs())?;
    let (num, den) = if exp >= 0 {
        (scale_num.checked_mul(pow)?, scale_den)
    } else {
        (scale_num, scale_den.checked_mul(pow)?)
    };
    let value = value.checked_mul(num)? / den;
    Some(if negative { -value } else { value })
}

/// Formats milli-units for a resource: CPU as millicores (`1500m`), everything else as whole
/// units rounded down (bytes for memory, counts for pods and GPUs).
pub fn format_milli(resource: &str, milli: i128) -> String {
    let milli = milli.max(0);
    if resource == "cpu" {
        format!("{milli}m")
    } else {
        (milli / 1000).to_string()
    }
}

/// `percent` of a quantity in milli-units, rounded down; integer resources are rounded down to
/// whole units (one GPU at 90% is zero GPUs).
pub fn share(resource: &str, milli: i128, percent: u32) -> i128 {
    let shared = milli.max(0) * percent as i128 / 100;
    if resource == "cpu" {
        shared
    } else {
        shared / 1000 * 1000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_quantities_end_quickly_in_none() {
        let started = std::time::Instant::now();
        let long = "9".repeat(60);
        for q in ["1e2147483647", "1e-2147483648", "9e40", "1e38Pi", &long] {
            assert_eq!(parse_milli(q), None, "{q}");
        }
        assert_eq!(parse_milli("1e-3"), Some(1));
        assert_eq!(parse_milli("1.5e3"), Some(1_500_000));
        assert!(started.elapsed() < std::time::Duration::from_millis(100));
    }

    #[test]
    fn parses_common_quantities() {
        assert_eq!(parse_milli("100m"), Some(100));
        assert_eq!(parse_milli("2"), Some(2000));
        assert_eq!(parse_milli("1.5"), Some(1500));
        assert_eq!(parse_milli("64Mi"), Some(64 * 1024 * 1024 * 1000));
        assert_eq!(parse_milli("1G"), Some(1_000_000_000_000));
        assert_eq!(parse_milli("1e3"), Some(1_000_000));
        assert_eq!(parse_milli("110"), Some(110_000));
        assert_eq!(parse_milli("abc"), None);
        assert_eq!(parse_milli("5Qi"), None);
    }

    #[test]
    fn parses_nanocores_without_losing_them() {
        assert_eq!(parse_nano("1234567n"), Some(1_234_567));
        assert_eq!(parse_nano("250m"), Some(250_000_000));
        assert_eq!(parse_nano("2"), Some(2_000_000_000));
        assert_eq!(parse_nano("1500u"), Some(1_500_000));
        assert_eq!(parse_nano("1Ki"), Some(1024 * 1_000_000_000));
        assert_eq!(parse_milli("1234567n"), Some(1));
    }

    #[test]
    fn shares_round_down_integer_resources() {
        assert_eq!(share("cpu", 100_000, 90), 90_000);
        assert_eq!(format_milli("cpu", share("cpu", 1_000, 90)), "900m");
        assert_eq!(share("nvidia.com/gpu", 1_000, 90), 0);
        assert_eq!(share("pods", 110_000, 90), 99_000);
        assert_eq!(
            format_milli("memory", share("memory", parse_milli("1Gi").unwrap(), 90)),
            "966367641"
        );
    }
}
