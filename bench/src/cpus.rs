//! Which CPUs a process may run on: set with util-linux's `taskset`, read from `/proc`.
//!
//! `refract-bench --control-plane-cpus 0 --others-cpus 1` keeps the agents off the API
//! servers' CPU, as in a peering whose agents run on other nodes than its control planes.

use anyhow::Context;

/// Restricts every thread of process `pid` to the CPUs of `list` (`taskset`'s syntax: `1`,
/// `0-3`, `0,2`). Threads and processes it starts afterwards inherit the restriction.
pub fn pin(pid: u32, list: &str) -> anyhow::Result<()> {
    let out = std::process::Command::new("taskset")
        .args(["--all-tasks", "--cpu-list", "--pid", list, &pid.to_string()])
        .output()
        .context("failed to run taskset (util-linux), which pins processes to CPUs")?;
    anyhow::ensure!(
        out.status.success(),
        "taskset could not pin process {pid} to CPUs {list:?}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// The CPUs process `pid` may run on, as `/proc` lists them (`0-1`); empty if it has gone.
pub fn allowed(pid: u32) -> String {
    crate::procfs::status_field(pid, "Cpus_allowed_list").unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_pinned_to_a_cpu_may_run_only_there_and_a_bad_list_is_refused() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        // The first CPU this test may use (`0-1`, `2,5`, `3`): a cpuset may leave out CPU 0.
        let mine = allowed(std::process::id());
        let first: String = mine.chars().take_while(char::is_ascii_digit).collect();
        pin(pid, &first).unwrap();
        assert_eq!(allowed(pid), first);
        let refused = pin(pid, "not-a-cpu").unwrap_err().to_string();
        assert!(refused.contains("not-a-cpu"), "{refused}");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
