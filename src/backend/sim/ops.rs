//! The simulated kernels ([`Kernel`]) on spans of `f32` memory, and what they
//! do to it.

use super::SimState;
use crate::view::{Access, View, ViewTag};

/// A range of `f32` elements in simulated memory.
///
/// A span of a [`View`] remembers the view, and is usable only where the
/// view is (inside its capture's or consumer's closure, on its stream); a
/// span made from a raw address ([`Span::new`]) may not touch a plan's
/// arenas at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub(super) addr: u64,
    pub(super) len: usize,
    /// The view it was made from (its address and length cannot change).
    pub(super) view: Option<ViewTag>,
}

impl Span {
    /// `len` `f32`s at `addr` (host memory of this backend's buffers).
    pub fn new(addr: u64, len: usize) -> Span {
        Span {
            addr,
            len,
            view: None,
        }
    }

    /// Address of the first element.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Number of `f32` elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// One past the last byte; `None` when that overflows the address space
    /// (such a span lies outside every allocation).
    pub(super) fn end(&self) -> Option<u64> {
        u64::try_from(self.len)
            .ok()?
            .checked_mul(4)?
            .checked_add(self.addr)
    }
}

/// Anything that names simulated `f32` memory.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not memory of the `sim` backend",
    label = "a sim kernel reads and writes sim memory",
    note = "sim kernels take a plan's `View`, a `sim::HostBuffer` (from `sim::Device::alloc_f32`) or a `sim::Span`"
)]
pub trait AsSpan {
    /// The span.
    fn span(&self) -> Span;
}

impl AsSpan for Span {
    fn span(&self) -> Span {
        *self
    }
}

impl<T: AsSpan + ?Sized> AsSpan for &T {
    fn span(&self) -> Span {
        (**self).span()
    }
}

impl<A: Access> AsSpan for View<'_, A> {
    /// The view's bytes read as `f32` elements.
    fn span(&self) -> Span {
        Span {
            addr: self.device_address(),
            len: (self.bytes() / 4) as usize,
            view: Some(self.tag()),
        }
    }
}

/// One simulated kernel: what [`Device::launch`](super::Device::launch)
/// runs or captures. Memory nodes are no `Kernel`: only
/// [`Device::alloc_async`](super::Device::alloc_async) and
/// [`Device::free_async`](super::Device::free_async) put them in a graph,
/// so the model knows every temporary a capture allocates and frees.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kernel {
    /// `dst[i] = value`.
    Fill {
        /// Written.
        dst: Span,
        /// The value.
        value: f32,
    },
    /// `dst[i] = src[i]`.
    Copy {
        /// Read.
        src: Span,
        /// Written.
        dst: Span,
    },
    /// `dst[i] += src[i]`.
    Add {
        /// Read.
        src: Span,
        /// Read and written.
        dst: Span,
    },
    /// `dst[i] *= factor`.
    Scale {
        /// Read and written.
        dst: Span,
        /// The factor.
        factor: f32,
    },
}

impl Kernel {
    /// `dst[i] = value`.
    pub fn fill(dst: &impl AsSpan, value: f32) -> Kernel {
        Kernel::Fill {
            dst: dst.span(),
            value,
        }
    }

    /// `dst[i] = src[i]` (over the shorter of the two).
    pub fn copy(src: &impl AsSpan, dst: &impl AsSpan) -> Kernel {
        Kernel::Copy {
            src: src.span(),
            dst: dst.span(),
        }
    }

    /// `dst[i] += src[i]` (over the shorter of the two).
    pub fn add(src: &impl AsSpan, dst: &impl AsSpan) -> Kernel {
        Kernel::Add {
            src: src.span(),
            dst: dst.span(),
        }
    }

    /// `dst[i] *= factor`.
    pub fn scale(dst: &impl AsSpan, factor: f32) -> Kernel {
        Kernel::Scale {
            dst: dst.span(),
            factor,
        }
    }

    /// (span, written?) for every span the op touches.
    pub(super) fn accesses(&self) -> Vec<(Span, bool)> {
        match *self {
            Kernel::Fill { dst, .. } | Kernel::Scale { dst, .. } => vec![(dst, true)],
            Kernel::Copy { src, dst } => vec![(src, false), (dst, true)],
            Kernel::Add { src, dst } => vec![(src, false), (dst, true)],
        }
    }
}

/// One node of a captured graph ([`Graph::ops`](super::Graph::ops)): a
/// kernel, or a memory node that a capture's
/// [`Device::alloc_async`](super::Device::alloc_async) or
/// [`Device::free_async`](super::Device::free_async) made. No call takes a
/// `Node`: a program launches [`Kernel`]s, so a memory node it builds itself
/// never reaches a graph (the model's use-after-free check knows every
/// free).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Node {
    /// A kernel.
    Kernel(Kernel),
    /// A graph memory allocation node, as stream-ordered allocation during
    /// capture creates in CUDA ([`Device::alloc_async`](super::Device::alloc_async)). Its address
    /// is fixed for the graph's life; a plan accepts the graph only when
    /// the graph also frees it.
    Alloc {
        /// The address it hands out.
        addr: u64,
        /// Bytes it allocates.
        bytes: u64,
    },
    /// A graph memory free node ([`Device::free_async`](super::Device::free_async)); a plan accepts
    /// it only for memory the same graph allocated.
    Free {
        /// The address it frees.
        addr: u64,
    },
}

impl Node {
    /// (span, written?) for every span the node touches.
    pub(super) fn accesses(&self) -> Vec<(Span, bool)> {
        match self {
            Node::Kernel(op) => op.accesses(),
            Node::Alloc { .. } | Node::Free { .. } => Vec::new(),
        }
    }

    /// Whether it is an allocation or free node.
    pub(super) fn is_memory(&self) -> bool {
        matches!(self, Node::Alloc { .. } | Node::Free { .. })
    }
}

impl SimState {
    pub(super) fn apply(&mut self, node: Node) {
        match node {
            Node::Kernel(Kernel::Fill { dst, value }) => self.binary(dst, dst, |_, _| value),
            Node::Kernel(Kernel::Copy { src, dst }) => self.binary(src, dst, |_, s| s),
            Node::Kernel(Kernel::Add { src, dst }) => self.binary(src, dst, |d, s| d + s),
            Node::Kernel(Kernel::Scale { dst, factor }) => self.binary(dst, dst, |d, _| d * factor),
            Node::Alloc { .. } | Node::Free { .. } => {}
        }
    }

    /// `dst[i] = f(dst[i], src[i])` over the shorter of the two.
    fn binary(&mut self, src: Span, dst: Span, f: impl Fn(f32, f32) -> f32) {
        let n = src.len.min(dst.len);
        let src = Span { len: n, ..src };
        let dst = Span { len: n, ..dst };
        if let (Some(s), Some(d)) = (self.read(&src), self.read(&dst)) {
            let out: Vec<f32> = d.iter().zip(&s).map(|(&d, &s)| f(d, s)).collect();
            self.write(&dst, &out);
        }
    }
}
