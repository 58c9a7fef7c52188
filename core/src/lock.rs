//! Taking a `std::sync` lock without a panic path.
//!
//! A lock is poisoned only when a thread panicked while holding it. In the agents a panic ends
//! the process before that guard is dropped (`refract_shared::telemetry::exit_on_panic`), so no
//! agent ever sees a poisoned lock. Where the hook is not installed (in-process tests, the
//! benchmark's harness), the panic has already failed whatever ran it; the data is taken as it
//! is rather than turning one panic into a cascade of them.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// [`Mutex::lock`] that takes a poisoned lock's data as it is.
pub trait Locked<T: ?Sized> {
    /// Blocks until the lock is held, and returns its guard.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`RwLock::read`] and [`RwLock::write`] that take a poisoned lock's data as it is.
pub trait RwLocked<T: ?Sized> {
    /// Blocks until the lock is held for reading.
    fn read_locked(&self) -> RwLockReadGuard<'_, T>;
    /// Blocks until the lock is held for writing.
    fn write_locked(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> RwLocked<T> for RwLock<T> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_still_gives_its_data() {
        let mutex = std::sync::Arc::new(Mutex::new(1));
        let rw = std::sync::Arc::new(RwLock::new(2));
        let (m, r) = (mutex.clone(), rw.clone());
        let panicked = std::thread::spawn(move || {
            let _m = m.lock();
            let _r = r.write();
            panic!("poison both");
        })
        .join();
        assert!(panicked.is_err());
        assert!(mutex.is_poisoned() && rw.is_poisoned());
        *mutex.locked() += 1;
        *rw.write_locked() += 1;
        assert_eq!((*mutex.locked(), *rw.read_locked()), (2, 3));
    }
}
