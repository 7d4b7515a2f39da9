//! Views into arenas, and the marker that keeps an open capture on its
//! thread. A leaf module: phases and backends both use it.

use std::marker::PhantomData;

use crate::vocab::{DType, Domain, Key, ParamId, Purpose, Request, RunnerId};

/// Makes a type `!Send` and `!Sync` without naming a backend's types (so
/// compile-fail diagnostics name this crate's types only).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct NotSend(PhantomData<*const ()>);

/// A fixed-address, aligned view into a runner's arena. It borrows the
/// capture (or the [`Replayable`](crate::Replayable)) that handed it out, so
/// it cannot outlive the memory it points at.
///
/// Device work can be put on a view only inside the work closure of the
/// capture or consumer that handed it out, on that closure's stream
/// ([`RunnerCapture::stream_capture`](crate::RunnerCapture::stream_capture),
/// [`Replayable::consume`](crate::Replayable::consume)): there the fence
/// orders it. Elsewhere (another plan's capture, another stream, after the
/// closure returned) every backend refuses it with a typed error; see
/// `docs/safety.md`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct View<'a> {
    pub(crate) addr: u64,
    pub(crate) arena: usize,
    pub(crate) offset: u64,
    pub(crate) request: Request,
    pub(crate) runner: RunnerId,
    /// The capture or consumer whose closure may use it on the device (0:
    /// none, a view for reading addresses only).
    pub(crate) scope: u64,
    /// A handoff its reader received: the capture may only read it.
    pub(crate) read_only: bool,
    /// The handoff it is, if any: unusable once its writer marked it ready.
    pub(crate) handoff: Option<u32>,
    pub(crate) _owner: PhantomData<&'a ()>,
}

/// What a backend needs to check a view's use: its scope, and what to name
/// in the error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ViewTag {
    pub(crate) scope: u64,
    pub(crate) request: Request,
    pub(crate) runner: RunnerId,
    pub(crate) read_only: bool,
    pub(crate) handoff: Option<u32>,
}

impl<'a> View<'a> {
    /// Its scope and names, for backends' checks.
    pub(crate) fn tag(&self) -> ViewTag {
        ViewTag {
            scope: self.scope,
            request: self.request,
            runner: self.runner,
            read_only: self.read_only,
            handoff: self.handoff,
        }
    }

    /// Device address of the first element (host address on `sim`), aligned
    /// to the domain's alignment.
    pub fn device_address(&self) -> u64 {
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

    /// Whether work may only read it: a handoff its reader received
    /// ([`RunnerCapture::receive`](crate::RunnerCapture::receive)). A
    /// consumer's views are read-only too, by their consumer's kind.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// The runner that owns it (for a handoff, the runner whose capture
    /// took it).
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

    /// The largest power of two (up to its domain's alignment) its address
    /// is a multiple of: the domain's alignment for a view a capture handed
    /// out, possibly less for a sub-view.
    pub fn alignment(&self) -> u64 {
        let domain = self.request.domain.alignment();
        if self.addr == 0 {
            return domain;
        }
        (1u64 << self.addr.trailing_zeros()).min(domain)
    }

    /// Elements `range` of this view, as a view of its own: same dtype,
    /// domain, runner and closure (so the same fence), at the address of
    /// element `range.start` (a flat bucket cut into per-parameter pieces,
    /// as a bucketed reduce-scatter does).
    ///
    /// # Errors
    ///
    /// [`SliceError`] for an empty or reversed range, or one past the end.
    ///
    /// ```
    /// use replay_arena::{Discovering, PlanConfig, Policy, Request, Domain, DType, RunnerId};
    /// let q = Request::new(Domain::Device, DType::BF16, 1000);
    /// let mut capturing = Discovering::from_runners(PlanConfig::new(), [(RunnerId(0), [q])])?
    ///     .plan(Policy::Generations(1))?
    ///     .allocate(replay_arena::sim::Device::new())?;
    /// let cap = capturing.capture(RunnerId(0))?;
    /// let bucket = cap.take(q)?;
    /// let (w1, w2) = bucket.split_at(384)?;
    /// assert_eq!((w1.len(), w2.len()), (384, 616));
    /// assert_eq!(w2.device_address(), bucket.device_address() + 768);
    /// assert_eq!(w2.alignment(), 256);
    /// assert!(bucket.slice(900..1001).is_err());
    /// # Ok::<(), replay_arena::Error>(())
    /// ```
    pub fn slice(&self, range: std::ops::Range<usize>) -> Result<View<'a>, SliceError> {
        let len = self.len();
        if range.start >= range.end || range.end > len {
            return Err(SliceError {
                start: range.start,
                end: range.end,
                len,
            });
        }
        let skip = range.start as u64 * self.request.dtype.size_bytes();
        let mut request = self.request;
        request.elements = (range.end - range.start) as u64;
        Ok(View {
            addr: self.addr + skip,
            offset: self.offset + skip,
            request,
            ..*self
        })
    }

    /// The first `mid` elements and the rest, as two views (see
    /// [`View::slice`]).
    ///
    /// # Errors
    ///
    /// [`SliceError`] unless `0 < mid < len`.
    pub fn split_at(&self, mid: usize) -> Result<(View<'a>, View<'a>), SliceError> {
        Ok((self.slice(0..mid)?, self.slice(mid..self.len())?))
    }
}

/// A sub-view outside its view ([`View::slice`], [`View::split_at`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("elements {start}..{end} of a view of {len} elements: a sub-view must be a non-empty range inside the view")]
#[non_exhaustive]
pub struct SliceError {
    /// First element asked for.
    pub start: usize,
    /// One past the last element asked for.
    pub end: usize,
    /// Elements of the view.
    pub len: usize,
}

/// Finding views by what they are for, in the slice a consumer (or
/// [`Replayable::views`](crate::Replayable::views)) hands out, without
/// positional indices and without allocating.
pub trait ViewsExt<'a> {
    /// The first view that answers `request` (domain, dtype, elements,
    /// purpose and parameter all equal).
    fn find(&self, request: &Request) -> Option<View<'a>>;
    /// The views of one purpose, in request order.
    fn with_purpose(&self, purpose: Purpose) -> impl Iterator<Item = View<'a>> + '_;
    /// The views of one parameter, in request order.
    fn of_param(&self, param: ParamId) -> impl Iterator<Item = View<'a>> + '_;
}

impl<'a> ViewsExt<'a> for [View<'a>] {
    fn find(&self, request: &Request) -> Option<View<'a>> {
        self.iter().find(|v| v.request == *request).copied()
    }

    fn with_purpose(&self, purpose: Purpose) -> impl Iterator<Item = View<'a>> + '_ {
        self.iter()
            .filter(move |v| v.request.purpose == purpose)
            .copied()
    }

    fn of_param(&self, param: ParamId) -> impl Iterator<Item = View<'a>> + '_ {
        self.iter()
            .filter(move |v| v.request.param == Some(param))
            .copied()
    }
}
