//! What `/proc` says of a process: resident memory, CPU time and wake-ups.

/// Resident memory of a process, in bytes.
pub fn rss_bytes(pid: u32) -> u64 {
    status_field(pid, "VmRSS")
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The value of `field` in `/proc/<pid>/status`, trimmed; none if the process has gone.
pub fn status_field(pid: u32, field: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    field_of(&status, field).map(str::to_string)
}

/// The value of `field` in the text of a `status` file, trimmed.
fn field_of<'a>(status: &'a str, field: &str) -> Option<&'a str> {
    status.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        (name == field).then(|| value.trim())
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

/// How often the process's threads gave up the CPU to wait: the voluntary context switches of
/// its live threads, summed. Each is a wait for I/O, a timer or another task that ends in a
/// wake-up, the cost per message that a profile of functions spreads over the kernel, the
/// scheduler and the runtime. 0 if the process has gone.
pub fn wakeups(pid: u32) -> u64 {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    threads
        .flatten()
        .filter_map(|thread| {
            let status = std::fs::read_to_string(thread.path().join("status")).ok()?;
            field_of(&status, "voluntary_ctxt_switches")?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// What a process has used so far, or in a window (the difference of two readings).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// User plus system CPU time, seconds.
    pub cpu_seconds: f64,
    /// Voluntary context switches (see [`wakeups`]).
    pub wakeups: u64,
}

impl Usage {
    /// What process `pid` has used since it started.
    pub fn of(pid: u32) -> Self {
        Self {
            cpu_seconds: cpu_seconds(pid),
            wakeups: wakeups(pid),
        }
    }

    /// What was used between the reading `before` and this one.
    pub fn since(self, before: Usage) -> Usage {
        Usage {
            cpu_seconds: self.cpu_seconds - before.cpu_seconds,
            wakeups: self.wakeups.saturating_sub(before.wakeups),
        }
    }
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Usage) {
        self.cpu_seconds += other.cpu_seconds;
        self.wakeups += other.wakeups;
    }
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

    #[test]
    fn a_sleeping_process_has_woken_and_a_gone_one_has_used_nothing() {
        let mut sleeper = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let used = Usage::of(sleeper.id());
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
        assert!(used.wakeups >= 1, "{used:?}");
        assert_eq!(Usage::of(u32::MAX), Usage::default());
    }

    #[test]
    fn usage_in_a_window_is_the_difference_of_two_readings() {
        let before = Usage {
            cpu_seconds: 1.5,
            wakeups: 10,
        };
        let after = Usage {
            cpu_seconds: 2.0,
            wakeups: 25,
        };
        let mut total = after.since(before);
        assert_eq!(total.wakeups, 15);
        assert!((total.cpu_seconds - 0.5).abs() < 1e-9);
        // A thread that ended in between took its switches with it: never below zero.
        assert_eq!(before.since(after).wakeups, 0);
        total += total;
        assert_eq!(total.wakeups, 30);
    }
}
