//! The async runtime both agents (and the benchmark's direct copier) run on, and their memory
//! allocator.

/// The allocator of the agents and the benchmark's direct copier (each binary declares it
/// `#[global_allocator]`). An agent allocates and frees a few buffers per object on a runtime
/// worker thread; glibc's malloc gives that thread an arena of its own and trims and regrows
/// its heap as those buffers come and go (an `mprotect` and fresh page faults about twice per
/// object). mimalloc keeps freed pages for reuse: in the benchmark's steady load, glibc's malloc
/// tuned not to trim cut the CPU per object by a third in every process, agents and copier alike.
///
/// Built without transparent huge pages (the workspace enables mimalloc's `no_thp`): otherwise
/// mimalloc asks the kernel for huge pages on its arenas, so a page it touches again after
/// returning it is faulted in as 2 MiB zeroed at once. For these small heaps that is memory
/// held for nothing (7–13 MiB more resident in each process, empty or with 5,000 objects,
/// in the benchmark) and 5 % of each agent's CPU at a steady load spent zeroing pages. That
/// covers hosts whose THP mode is `madvise`, the usual default; where it is `always`,
/// `MIMALLOC_ALLOW_THP=0` in the environment turns it off for the process.
pub use mimalloc::MiMalloc as Allocator;

/// The process's runtime flags.
#[derive(Debug, Clone, clap::Args)]
pub struct RuntimeArgs {
    /// Worker threads of the async runtime. An agent waits on the network nearly all the time;
    /// one thread does its work with fewer cross-thread wake-ups (in the benchmark: less CPU
    /// per object than two, and more left for the API servers beside it). Raise it for a
    /// remote agent serving many busy tenants.
    #[arg(long, default_value_t = 1, env = "REFRACT_WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..))]
    pub worker_threads: u16,
}

impl RuntimeArgs {
    /// Runs `main` to completion on a multi-threaded runtime (so blocking sections may still
    /// hand their thread over) with `--worker-threads` workers. On a worker, not on the calling
    /// thread: a future driven by `block_on` is polled there, so every wake-up of it (say, a
    /// loop handling each message of a stream) would be handed across threads, a futex wake
    /// and a context switch each time. A panic in `main` is resumed here.
    pub fn run<F>(&self, main: F) -> anyhow::Result<()>
    where
        F: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(usize::from(self.worker_threads))
            .enable_all()
            .build()?;
        let main = runtime.spawn(main);
        match runtime.block_on(main) {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(anyhow::anyhow!("the main task was cancelled: {e}")),
        }
    }
}

impl Default for RuntimeArgs {
    fn default() -> Self {
        Self { worker_threads: 1 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_polls_the_future_on_a_worker_and_returns_its_result() {
        let main_thread = std::thread::current().id();
        RuntimeArgs::default()
            .run(async move {
                anyhow::ensure!(std::thread::current().id() != main_thread, "on main thread");
                Ok(())
            })
            .unwrap();
        let err = RuntimeArgs::default()
            .run(async { anyhow::bail!("boom") })
            .unwrap_err();
        assert_eq!(err.to_string(), "boom");
    }
}
