//! A consuming transition that failed hands its input back: [`Failed`] is
//! the reason and the input, one type for every phase
//! ([`PlanFailed`](crate::PlanFailed), [`AllocateFailed`](crate::AllocateFailed),
//! [`SealError`](crate::SealError)), as std's `FromUtf8Error` returns the
//! bytes. A leaf module: each phase names its own alias.

use std::fmt;

/// A failed consuming transition: why (`E`), and the value it consumed
/// (`T`) back, so the caller can try again without redoing the work behind
/// it (an eager discovery run, a plan, the captures).
///
/// It prints as its reason (its `source()` is the reason's), and it is
/// `Send + Sync` when `E` is and `T` is `Send` (the input is reached only
/// by value or through `&mut self`), so `?` into `anyhow` works.
pub struct Failed<E, T> {
    error: E,
    input: Exclusive<Box<T>>,
}

impl<E, T> Failed<E, T> {
    pub(crate) fn new(error: E, input: T) -> Failed<E, T> {
        Failed {
            error,
            input: Exclusive(Box::new(input)),
        }
    }

    /// Why the transition failed.
    pub fn error(&self) -> &E {
        &self.error
    }

    /// The reason alone (the input is dropped).
    pub fn into_error(self) -> E {
        self.error
    }

    /// The input, as it was before the transition, to try again.
    pub fn into_input(self) -> T {
        *self.input.into_inner()
    }

    /// The input in place (to mend it before taking it back).
    pub fn input_mut(&mut self) -> &mut T {
        self.input.get_mut()
    }

    /// The reason and the input.
    pub fn into_parts(self) -> (E, T) {
        (self.error, *self.input.into_inner())
    }
}

impl<E: fmt::Debug, T> fmt::Debug for Failed<E, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The input is not reachable through `&self` (see `Exclusive`).
        f.debug_struct("Failed")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<E: fmt::Display, T> fmt::Display for Failed<E, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl<E: std::error::Error, T> std::error::Error for Failed<E, T> {
    /// The reason's own cause: the reason prints as this error, so it is
    /// not its `source()` too (a chain would print it twice).
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

/// Holds a value that is reached only through `&mut self` or by value, never
/// through `&self`, so sharing a reference to the holder shares nothing
/// (the `Exclusive` pattern of std's unstable `std::sync::Exclusive` and the
/// `sync_wrapper` crate). It lets a [`Failed`] be `Sync`, as error handling
/// (`anyhow`, `Box<dyn Error + Send + Sync>`) needs, while its input (a
/// `Capturing`, say) is not.
struct Exclusive<T>(T);

impl<T> Exclusive<T> {
    fn get_mut(&mut self) -> &mut T {
        &mut self.0
    }

    fn into_inner(self) -> T {
        self.0
    }
}

// SAFETY: a `&Exclusive<T>` gives no access to the `T` (no method takes
// `&self`, the field is private and no trait is implemented), so sharing it
// between threads shares nothing; moving the `T` between threads still needs
// `T: Send`.
unsafe impl<T: Send> Sync for Exclusive<T> {}
