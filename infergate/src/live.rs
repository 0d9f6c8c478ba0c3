//! Settings a reload swaps and every request reads: an `ArcSwap` plus each thread's copy of what it read last.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;

/// Each value ever stored in any [`Live`] of the process gets a new number.
static NEXT_VERSION: AtomicU64 = AtomicU64::new(1);

/// A type read through [`Live`]: its own per-thread slot for the last value read ([`live_slot!`]).
pub trait Slot: Sized + Send + Sync + 'static {
    /// Run `f` on (number, value) this thread read last from any `Live` of this type.
    fn with_last_read<R>(f: impl FnOnce(&RefCell<(u64, Option<Arc<Self>>)>) -> R) -> R;
}

/// Give a type its per-thread slot: `crate::live::live_slot!(Config);`.
macro_rules! live_slot {
    ($t:ty) => {
        impl $crate::live::Slot for $t {
            #[inline]
            fn with_last_read<R>(
                f: impl FnOnce(&::std::cell::RefCell<(u64, Option<::std::sync::Arc<$t>>)>) -> R,
            ) -> R {
                ::std::thread_local! {
                    static LAST: ::std::cell::RefCell<(u64, Option<::std::sync::Arc<$t>>)> =
                        const { ::std::cell::RefCell::new((0, None)) };
                }
                LAST.with(f)
            }
        }
    };
}
pub(crate) use live_slot;

/// A value read on every request (a dozen times) and swapped by reloads. An `ArcSwap` load costs several times
/// what an atomic read of the value's number and a reference count cost; a thread that reads values of two
/// `Live`s of one type in turn (two pools) reads the `ArcSwap` each time, as before.
pub struct Live<T> {
    swap: ArcSwap<T>,
    version: AtomicU64,
}

impl<T: Slot> Live<T> {
    pub fn new(value: T) -> Live<T> {
        Live {
            swap: ArcSwap::from_pointee(value),
            version: AtomicU64::new(NEXT_VERSION.fetch_add(1, Ordering::Relaxed)),
        }
    }

    /// The value in effect.
    #[inline]
    pub fn load(&self) -> Arc<T> {
        let version = self.version.load(Ordering::Acquire);
        T::with_last_read(|last| {
            let mut last = last.try_borrow_mut().ok()?;
            if last.0 != version || last.1.is_none() {
                // Stored before its number (`store`): at least as new as `version`.
                *last = (version, Some(self.swap.load_full()));
            }
            last.1.clone()
        })
        .unwrap_or_else(|| self.swap.load_full())
    }

    /// Put `value` in effect.
    pub fn store(&self, value: T) {
        self.swap.store(Arc::new(value));
        let version = NEXT_VERSION.fetch_add(1, Ordering::Relaxed);
        self.version.store(version, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::live::live_slot!(u32);
    crate::live::live_slot!(usize);
    crate::live::live_slot!(String);

    #[test]
    fn a_store_is_read_at_once_and_values_do_not_mix() {
        let a = Live::new(1u32);
        let b = Live::new(String::from("b"));
        let c = Live::new(3u32);
        assert_eq!(*a.load(), 1);
        assert_eq!(*b.load(), "b");
        assert_eq!(*c.load(), 3);
        a.store(2);
        assert_eq!(*a.load(), 2);
        assert_eq!(*c.load(), 3);
        // Another thread sees the new value too.
        let a = Arc::new(a);
        let a2 = a.clone();
        assert_eq!(std::thread::spawn(move || *a2.load()).join().unwrap(), 2);
        a.store(7);
        assert_eq!(*a.load(), 7);
    }

    #[test]
    fn many_values_on_one_thread_stay_right() {
        let all: Vec<Live<usize>> = (0..40).map(Live::new).collect();
        for _ in 0..2 {
            for (i, l) in all.iter().enumerate() {
                assert_eq!(*l.load(), i);
            }
        }
    }
}
