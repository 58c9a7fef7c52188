//! Writing a command's output to stdout without panicking when the reader goes away.
//!
//! `println!` panics when stdout is a closed pipe (`local-agent preview ... | head`). A
//! command-line tool should stop quietly instead, as `cat` does: Rust ignores SIGPIPE, so the
//! write fails with `BrokenPipe`, which [`quiet_when_closed`] turns into a clean exit.

use std::io::Write;

/// Writes `text` to stdout and flushes it; a closed pipe comes back as an error.
pub fn write(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// Writes `text` and a newline to stdout.
pub fn write_line(text: &str) -> std::io::Result<()> {
    write(&format!("{text}\n"))
}

/// A command's result with a closed stdout counted as success: the reader had what it wanted.
pub fn quiet_when_closed(result: anyhow::Result<()>) -> anyhow::Result<()> {
    match result {
        Err(error) if is_broken_pipe(&error) => Ok(()),
        other => other,
    }
}

fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_closed_pipe_is_quiet() {
        let closed = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        assert!(quiet_when_closed(Err(anyhow::Error::new(closed).context("printing"))).is_ok());
        let other = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert!(quiet_when_closed(Err(other.into())).is_err());
        assert!(quiet_when_closed(Err(anyhow::anyhow!("bad flag"))).is_err());
    }
}
