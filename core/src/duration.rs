//! Human durations for flags: `500ms`, `20s`, `5m`, `1h`.

use std::time::Duration;

/// Parses a number followed by `ms`, `s`, `m` or `h`.
pub fn parse(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{s:?} has no unit: use ms, s, m or h (e.g. 30s)"))?;
    let (number, unit) = s.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{s:?} does not start with a whole number"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n.saturating_mul(60))),
        "h" => Ok(Duration::from_secs(n.saturating_mul(3600))),
        other => Err(format!(
            "unknown unit {other:?} in {s:?}: use ms, s, m or h"
        )),
    }
}

/// Writes `d` as the flags take it, largest units first: `1h30m`, `5m`, `20s`, `500ms`
/// (sub-second parts below a millisecond are dropped).
pub fn format(d: Duration) -> String {
    let secs = d.as_secs();
    let parts = [
        (secs / 3600, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
        (u64::from(d.subsec_millis()), "ms"),
    ];
    let text: String = parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect();
    if text.is_empty() {
        "0s".to_string()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("20s"), Ok(Duration::from_secs(20)));
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
    }

    #[test]
    fn formats_as_the_flags_take_it() {
        assert_eq!(format(Duration::from_secs(90)), "1m30s");
        assert_eq!(format(Duration::from_secs(300)), "5m");
        assert_eq!(format(Duration::from_secs(3600)), "1h");
        assert_eq!(format(Duration::from_millis(1500)), "1s500ms");
        assert_eq!(format(Duration::ZERO), "0s");
        for text in ["5m", "20s", "500ms", "1h"] {
            assert_eq!(format(parse(text).unwrap()), text);
        }
    }

    #[test]
    fn rejects_missing_or_unknown_units() {
        assert!(parse("20").is_err());
        assert!(parse("s").is_err());
        assert!(parse("3d").is_err());
    }
}
