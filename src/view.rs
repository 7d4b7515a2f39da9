//! Views into arenas, and the marker that keeps an open capture on its
//! thread. A leaf module: phases and backends both use it.

use std::marker::PhantomData;

use crate::vocab::{DType, Domain, Key, Request, RunnerId};

/// Makes a type `!Send` and `!Sync` without naming a backend's types (so
/// compile-fail diagnostics name this crate's types only).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct NotSend(PhantomData<*const ()>);

/// A fixed-address, aligned view into a runner's arena. It borrows the
/// capture (or the [`Replayable`](crate::Replayable)) that handed it out, so
/// it cannot outlive the memory it points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct View<'a> {
    pub(crate) addr: u64,
    pub(crate) arena: usize,
    pub(crate) offset: u64,
    pub(crate) request: Request,
    pub(crate) runner: RunnerId,
    pub(crate) _owner: PhantomData<&'a ()>,
}

impl View<'_> {
    /// Device address of the first element (host address on `sim`), aligned
    /// to the domain's alignment.
    pub fn device_ptr(&self) -> u64 {
        self.addr
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        usize::try_from(self.request.elements).unwrap_or(usize::MAX)
    }

    /// Always false: requests have at least one element.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Bytes of the elements (without alignment padding).
    pub fn bytes(&self) -> u64 {
        self.request.elements * self.request.dtype.size_bytes()
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.request.dtype
    }

    /// Domain.
    pub fn domain(&self) -> Domain {
        self.request.domain
    }

    /// (domain, dtype).
    pub fn key(&self) -> Key {
        self.request.key()
    }

    /// The request this view answers.
    pub fn request(&self) -> Request {
        self.request
    }

    /// The runner that owns it.
    pub fn runner(&self) -> RunnerId {
        self.runner
    }

    /// Index of its arena in [`Planned::arenas`](crate::Planned::arenas).
    pub fn arena(&self) -> usize {
        self.arena
    }

    /// Byte offset inside its arena.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}
