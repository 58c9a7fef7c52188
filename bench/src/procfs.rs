//! What `/proc` says of a process: resident memory and CPU time.

/// Resident memory of a process, in bytes.
pub fn rss_bytes(pid: u32) -> u64 {
    status_field(pid, "VmRSS")
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The value of `field` in `/proc/<pid>/status`, trimmed; none if the process has gone.
pub fn status_field(pid: u32, field: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        (name == field).then(|| value.trim().to_string())
    })
}

/// User plus system CPU time of a process, in seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at state, field 3.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15, i.e. indexes 11 and 12 after the state field.
    (ticks(11) + ticks(12)) / clock_ticks()
}

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_resident_size_and_a_status() {
        let me = std::process::id();
        assert!(rss_bytes(me) > 1024 * 1024);
        assert!(status_field(me, "Name").is_some_and(|n| !n.is_empty()));
        assert_eq!(status_field(me, "NoSuchField"), None);
        assert_eq!(rss_bytes(u32::MAX), 0);
    }
}
