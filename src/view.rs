//! Views into arenas, and the marker that keeps an open capture on its
//! thread. A leaf module: phases and backends both use it.

use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;

#[cfg(feature = "nccl")]
use crate::vocab::GroupId;
use crate::vocab::{DType, Domain, Key, ParamId, Purpose, Request, RunnerId};

/// Makes a type `!Send` and `!Sync` without naming a backend's types (so
/// compile-fail diagnostics name this crate's types only).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct NotSend(PhantomData<*const ()>);

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::ReadWrite {}
    impl Sealed for super::ReadOnly {}
}

/// What work may do with a [`View`], in its type: [`ReadWrite`] (the
/// default: a capture's own requests and the handoffs it writes, a
/// `consume_mut` consumer's views) or [`ReadOnly`] (a received handoff, a
/// `consume` or `consume_many` consumer's views). Sealed: these two are all.
pub trait Access: sealed::Sealed + Copy + fmt::Debug + Eq + Hash + Send + Sync + 'static {
    /// Whether work may only read a view of this access.
    const READ_ONLY: bool;
}

/// The access of a view work may read and write: the default of [`View`].
/// Its typed cudarc form implements `DevicePtrMut` as well as `DevicePtr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReadWrite {}

/// The access of a view work may only read: what scopes that only read
/// hand out ([`RunnerCapture::receive`](crate::RunnerCapture::receive),
/// [`Replayable::consume`](crate::Replayable::consume),
/// [`Replayable::consume_many`](crate::Replayable::consume_many) and their
/// [`StepBuilder`](crate::StepBuilder) forms). Its typed cudarc form
/// implements `DevicePtr` only, so writing it through cudarc does not
/// compile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReadOnly {}

impl Access for ReadWrite {
    const READ_ONLY: bool = false;
}

impl Access for ReadOnly {
    const READ_ONLY: bool = true;
}

/// The accesses that allow writes: [`ReadWrite`]. A bound on the calls that
/// write a view (`cuda::ViewExt::copy_from`, `with_cudarc_mut`).
#[diagnostic::on_unimplemented(
    message = "a `{Self}` view may only be read",
    label = "this call writes the view",
    note = "received handoffs and the views of `consume` and `consume_many` are read-only: write a runner's views in its graph, or in `consume_mut`"
)]
pub trait Writable: Access {}

impl Writable for ReadWrite {}

/// A fixed-address, aligned view into a runner's arena. It borrows the
/// capture (or the [`Replayable`](crate::Replayable)) that handed it out, so
/// it cannot outlive the memory it points at.
///
/// Its [`Access`] says in the type whether work may write it: `View<'a>`
/// is `View<'a, ReadWrite>`; scopes that only read hand out
/// `View<'a, ReadOnly>`, whose typed cudarc form cannot be written
/// (cudarc's `CudaView` / `CudaViewMut` distinction). A writable view
/// narrows to a read-only one with [`View::read_only`].
///
/// Device work can be put on a view only inside the work closure of the
/// capture or consumer that handed it out, on that closure's stream
/// ([`RunnerCapture::stream_capture`](crate::RunnerCapture::stream_capture),
/// [`Replayable::consume`](crate::Replayable::consume)): there the fence
/// orders it. Elsewhere (another plan's capture, another stream, after the
/// closure returned) every backend refuses it with a typed error; see
/// `docs/safety.md`.
// `repr(C)`: views of either access have one layout (the access is a
// zero-sized marker), so a slice of one converts to a slice of the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct View<'a, A: Access = ReadWrite> {
    pub(crate) addr: u64,
    pub(crate) arena: usize,
    pub(crate) offset: u64,
    pub(crate) request: Request,
    pub(crate) runner: RunnerId,
    /// The capture or consumer whose closure may use it on the device (0:
    /// none, a view for reading addresses only).
    pub(crate) scope: u64,
    /// The handoff it is, if any: unusable once its writer marked it ready.
    pub(crate) handoff: Option<u32>,
    pub(crate) _owner: PhantomData<(&'a (), A)>,
}

/// What a backend needs to check a view's use: its scope, and what to name
/// in the error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ViewTag {
    pub(crate) scope: u64,
    pub(crate) request: Request,
    pub(crate) runner: RunnerId,
    /// The view's [`Access::READ_ONLY`]: the type-erased form of its access.
    pub(crate) read_only: bool,
    pub(crate) handoff: Option<u32>,
}

impl<'a> View<'a, ReadWrite> {
    /// The same view, read-only (as a reader is handed it).
    pub fn read_only(&self) -> View<'a, ReadOnly> {
        self.with_access()
    }
}

impl<'a, A: Access> View<'a, A> {
    /// The one place a view is built: `request`'s elements at `addr`, byte
    /// `offset` of arena `arena`, owned by `runner`, usable on the device in
    /// scope `scope` (0: none), the handoff `handoff` if it is one.
    pub(crate) fn new(
        addr: u64,
        arena: usize,
        offset: u64,
        request: Request,
        runner: RunnerId,
        scope: u64,
        handoff: Option<u32>,
    ) -> Self {
        View {
            addr,
            arena,
            offset,
            request,
            runner,
            scope,
            handoff,
            _owner: PhantomData,
        }
    }

    /// The same view with another access: crate-internal, where the scope
    /// it is handed to decides.
    pub(crate) fn with_access<B: Access>(self) -> View<'a, B> {
        self.in_scope(self.scope)
    }

    /// The same view in scope `scope`, with access `B` (a consumer's copy).
    pub(crate) fn in_scope<B: Access>(self, scope: u64) -> View<'a, B> {
        View::new(
            self.addr,
            self.arena,
            self.offset,
            self.request,
            self.runner,
            scope,
            self.handoff,
        )
    }

    /// `views` with another access, without copying them.
    pub(crate) fn slice_with_access<'s, B: Access>(views: &'s [View<'a, A>]) -> &'s [View<'a, B>] {
        // SAFETY: `View` is `repr(C)` and its access is a zero-sized
        // marker in its last field (`PhantomData`, alignment 1): views of
        // either access have the same size, alignment and field offsets,
        // and every value of one is a valid value of the other. The slice
        // keeps its length and lifetime.
        unsafe { std::slice::from_raw_parts(views.as_ptr().cast::<View<'a, B>>(), views.len()) }
    }

    /// Its scope and names, for backends' checks.
    pub(crate) fn tag(&self) -> ViewTag {
        ViewTag {
            scope: self.scope,
            request: self.request,
            runner: self.runner,
            read_only: A::READ_ONLY,
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

    /// Whether work may only read it: a [`ReadOnly`] view (a handoff its
    /// reader received with
    /// [`RunnerCapture::receive`](crate::RunnerCapture::receive), a
    /// consumer's view, a view narrowed with [`View::read_only`]). The
    /// access type says it; this is the same answer at run time.
    pub fn is_read_only(&self) -> bool {
        A::READ_ONLY
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
    pub fn slice(&self, range: std::ops::Range<usize>) -> Result<View<'a, A>, SliceError> {
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
        Ok(View::new(
            self.addr + skip,
            self.arena,
            self.offset + skip,
            request,
            self.runner,
            self.scope,
            self.handoff,
        ))
    }

    /// The first `mid` elements and the rest, as two views (see
    /// [`View::slice`]).
    ///
    /// # Errors
    ///
    /// [`SliceError`] unless `0 < mid < len`.
    pub fn split_at(&self, mid: usize) -> Result<(View<'a, A>, View<'a, A>), SliceError> {
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

/// Why a view's use on the device was refused: the reason in
/// [`CaptureError::ViewOutOfScope`](crate::CaptureError::ViewOutOfScope),
/// [`ConsumeError::ViewOutOfScope`](crate::ConsumeError::ViewOutOfScope) and
/// [`BackendError::InvalidView`](crate::BackendError::InvalidView).
///
/// A view works on the device only inside the work closure of the capture
/// or consumer that handed it out, on that closure's stream, and is written
/// only where its kind allows (`docs/safety.md`). The variants that name a
/// view carry its [`Request`] and [`RunnerId`] (for a handoff, the runner
/// whose capture took it).
///
/// ```
/// use replay_arena::{Discovering, Misuse, PlanConfig, Policy, Request, Domain, DType, RunnerId};
/// use replay_arena::{sim, BackendError};
/// let q = Request::new(Domain::Device, DType::F32, 64);
/// let sim = sim::Device::new();
/// let mut capturing = Discovering::from_runners(PlanConfig::new(), [(RunnerId(0), [q])])?
///     .plan(Policy::Generations(1))?
///     .allocate(sim.clone())?;
/// let cap = capturing.capture(RunnerId(0))?;
/// let view = cap.take(q)?;
/// // Outside its `stream_capture` closure, the view is refused.
/// let err = sim.launch(&sim.new_stream(), sim::Kernel::fill(&view, 1.0), 1).unwrap_err();
/// assert!(matches!(
///     err,
///     BackendError::InvalidView { reason: Misuse::OutsideClosure { runner: RunnerId(0), .. } }
/// ));
/// # Ok::<(), replay_arena::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Misuse {
    /// The view was not handed out by a capture or consumer: one from
    /// [`Replayable::views`](crate::Replayable::views), for reading
    /// addresses only.
    #[error("{request} of {runner} was not handed out by a capture or consumer (views from `Replayable::views` are for reading addresses; put device work on them inside `Replayable::consume`)")]
    NoScope {
        /// The view's request.
        request: Request,
        /// The view's runner.
        runner: RunnerId,
    },
    /// The view was used outside the work closure of the capture or
    /// consumer that handed it out (after it returned, or on another
    /// thread).
    #[error("{request} of {runner} is used outside the work closure of the capture or consumer that handed it out (a view works only inside its own `stream_capture` or `consume` closure)")]
    OutsideClosure {
        /// The view's request.
        request: Request,
        /// The view's runner.
        runner: RunnerId,
    },
    /// The view was used while its closure runs, but on another stream
    /// than the closure's, or on that stream while a capture or consumer
    /// opened inside the closure works there.
    #[error("{request} of {runner} is used on another stream than its {} runs on (a view works on the stream of its own `stream_capture` or `consume` closure)", if *.capture { "capture" } else { "consumer" })]
    OtherStream {
        /// The view's request.
        request: Request,
        /// The view's runner.
        runner: RunnerId,
        /// Whether the closure is a capture's (else a consumer's).
        capture: bool,
    },
    /// A view its closure may only read was written: a consumer's view, or
    /// a handoff its reader received.
    #[error("{request} of {runner} is {}", if *.handoff { READ_ONLY_HANDOFF } else { READ_ONLY_CONSUMER })]
    ReadOnly {
        /// The view's request.
        request: Request,
        /// The view's runner.
        runner: RunnerId,
        /// Whether it is a handoff its reader received (else a consumer's
        /// view).
        handoff: bool,
    },
    /// A handoff was used by its writer's capture after the capture marked
    /// it ready: from that point of the graph on, its readers and the next
    /// writer may use it.
    #[error("{request} of {runner} is a handoff its capture marked ready; after that point of the graph, readers and the next writer may use it, so the writer's graph leaves it alone")]
    Retired {
        /// The view's request.
        request: Request,
        /// The view's runner.
        runner: RunnerId,
    },
    /// A typed cudarc view ([`cuda::TypedView`](crate::cuda::TypedView))
    /// was handed to cudarc for work on another stream than its closure's,
    /// or after its closure returned; cudarc got address 0.
    #[cfg(feature = "cuda")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
    #[error("a typed view of {} elements at {address:#x} was handed to cudarc {}; it works only on the stream of its own closure, while that closure runs", .request.elements, if *.returned { "after its closure returned" } else { "on another stream" })]
    TypedViewElsewhere {
        /// The view's request.
        request: Request,
        /// The view's runner.
        runner: RunnerId,
        /// The view's device address.
        address: u64,
        /// Whether its closure had returned (else the work was for another
        /// stream while it ran).
        returned: bool,
    },
    /// A reduce-scatter was given a send and a receive view of different
    /// dtypes.
    #[cfg(feature = "nccl")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nccl")))]
    #[error("reduce-scatter from {send} into {recv}: dtypes differ")]
    DTypesDiffer {
        /// The send view's dtype.
        send: DType,
        /// The receive view's dtype.
        recv: DType,
    },
    /// A reduce-scatter's send view is not of its communicator's symmetric
    /// domain.
    #[cfg(feature = "nccl")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nccl")))]
    #[error("reduce-scatter on {group} needs a view of symmetric({group}), got one of {domain}")]
    NotSymmetric {
        /// The communicator's group.
        group: GroupId,
        /// The send view's domain.
        domain: Domain,
    },
    /// A reduce-scatter's send view lies in none of the windows registered
    /// on its communicator.
    #[cfg(feature = "nccl")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nccl")))]
    #[error(
        "the send view at {address:#x} lies in no window registered on {group}'s communicator"
    )]
    OutsideWindows {
        /// The send view's device address.
        address: u64,
        /// The communicator's group.
        group: GroupId,
    },
    /// A reduce-scatter's send view does not hold `ranks` times the
    /// receive length.
    #[cfg(feature = "nccl")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nccl")))]
    #[error("reduce-scatter over {ranks} ranks into {recv} elements needs {} send elements, the view has {send}", .recv.saturating_mul(*.ranks))]
    SendLength {
        /// The communicator's ranks.
        ranks: usize,
        /// Elements received per rank.
        recv: usize,
        /// Elements of the send view.
        send: usize,
    },
}

/// [`Misuse::ReadOnly`] of a handoff, after "{request} of {runner} is".
const READ_ONLY_HANDOFF: &str = "a handoff it received, which it reads (the writer's next replay \
     and other readers rely on that); write handoffs in their writer's graph";

/// [`Misuse::ReadOnly`] of a consumer's view, after "{request} of {runner}
/// is".
const READ_ONLY_CONSUMER: &str = "a consumer's view, which it reads (consumers on other streams \
     may read it at the same time); write a runner's views in its graph, or in `consume_mut`";

/// Finding views by what they are for, in the slice a consumer (or
/// [`Replayable::views`](crate::Replayable::views)) hands out, without
/// positional indices and without allocating.
pub trait ViewsExt<'a, A: Access = ReadWrite> {
    /// The first view that answers `request` (domain, dtype, elements,
    /// purpose and parameter all equal).
    fn find(&self, request: &Request) -> Option<View<'a, A>>;
    /// The views of one purpose, in request order.
    fn with_purpose(&self, purpose: Purpose) -> impl Iterator<Item = View<'a, A>> + '_;
    /// The views of one parameter, in request order.
    fn of_param(&self, param: ParamId) -> impl Iterator<Item = View<'a, A>> + '_;
}

impl<'a, A: Access> ViewsExt<'a, A> for [View<'a, A>] {
    fn find(&self, request: &Request) -> Option<View<'a, A>> {
        self.iter().find(|v| v.request == *request).copied()
    }

    fn with_purpose(&self, purpose: Purpose) -> impl Iterator<Item = View<'a, A>> + '_ {
        self.iter()
            .filter(move |v| v.request.purpose == purpose)
            .copied()
    }

    fn of_param(&self, param: ParamId) -> impl Iterator<Item = View<'a, A>> + '_ {
        self.iter()
            .filter(move |v| v.request.param == Some(param))
            .copied()
    }
}
