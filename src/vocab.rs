//! The shared vocabulary: runners, dtypes, domains, keys and requests.

use std::fmt;

/// One capturable region (for example one layer's backward graph).
///
/// Runners are ordered by the order in which they were first armed for
/// discovery; that order is the *capture order* the planner works with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RunnerId(pub u32);

impl fmt::Display for RunnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "runner {}", self.0)
    }
}

/// A buffer one runner writes and later runners read (a layer's input
/// gradient, which the next layer's backward reads), declared at discovery
/// by [`ArmedRunner::hand_off`](crate::ArmedRunner::hand_off), read by
/// [`ArmedRunner::receive`](crate::ArmedRunner::receive). Ids count from 0
/// in declaration order within one discovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct HandoffId(pub u32);

impl fmt::Display for HandoffId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "handoff {}", self.0)
    }
}

/// A communicator group (for example dense GTP or expert GTP) whose
/// NCCL-registered memory backs a [`Domain::Symmetric`] domain.
///
/// Groups must be registered in the [`PlanConfig`](crate::PlanConfig) before a
/// request names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct GroupId(pub u32);

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "group {}", self.0)
    }
}

/// Where the memory of a request comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Domain {
    /// Plain device memory, allocated outside every graph memory pool.
    Device,
    /// Memory from `ncclMemAlloc`, registered as a symmetric window on exactly
    /// this group's communicator.
    Symmetric(GroupId),
}

impl Domain {
    /// Byte alignment of every view (and every capacity) in this domain: 256
    /// bytes for device memory, 4096 bytes (NCCL's window alignment) for
    /// symmetric memory.
    pub const fn alignment(self) -> u64 {
        match self {
            Domain::Device => DEVICE_ALIGNMENT,
            Domain::Symmetric(_) => SYMMETRIC_ALIGNMENT,
        }
    }
}

/// Alignment of views in [`Domain::Device`].
pub const DEVICE_ALIGNMENT: u64 = 256;
/// Alignment of views in [`Domain::Symmetric`] (NCCL's required window alignment).
pub const SYMMETRIC_ALIGNMENT: u64 = 4096;

impl fmt::Display for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Domain::Device => f.write_str("device"),
            Domain::Symmetric(g) => write!(f, "symmetric({g})"),
        }
    }
}

/// Element type of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum DType {
    /// 64-bit float.
    F64,
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// 8-bit float, 4 exponent bits.
    F8E4M3,
    /// 8-bit float, 5 exponent bits.
    F8E5M2,
    /// 64-bit signed integer.
    I64,
    /// 32-bit signed integer.
    I32,
    /// 8-bit signed integer.
    I8,
    /// 8-bit unsigned integer.
    U8,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 10] = [
        DType::F64,
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F8E4M3,
        DType::F8E5M2,
        DType::I64,
        DType::I32,
        DType::I8,
        DType::U8,
    ];

    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> u64 {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F8E4M3 | DType::F8E5M2 | DType::I8 | DType::U8 => 1,
        }
    }

    /// The short lower-case name used in reports and workload files.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F8E4M3 => "f8e4m3",
            DType::F8E5M2 => "f8e5m2",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::I8 => "i8",
            DType::U8 => "u8",
        }
    }

    /// Parses [`DType::name`].
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Capacities, arenas and errors are per key: a (domain, dtype) pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Key {
    /// Where the memory comes from.
    pub domain: Domain,
    /// Element type.
    pub dtype: DType,
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} in {}", self.dtype, self.domain)
    }
}

/// What a request is for. Part of the request: capture compares it with
/// discovery's like every other field. Reports and errors show it, and the
/// report uses it to compute what the old per-parameter wgrad ring would have
/// cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Purpose {
    /// Input of a weight-gradient reduce-scatter.
    WgradRsInput,
    /// Output of a reduce-scatter.
    RsOutput,
    /// FP32 reduce-scatter all-to-all scratch.
    Fp32RsScratch,
    /// FP32 accumulation scratch.
    Fp32AccumScratch,
    /// Anything else.
    #[default]
    Other,
}

impl Purpose {
    /// The snake-case name used in reports and workload files.
    pub const fn name(self) -> &'static str {
        match self {
            Purpose::WgradRsInput => "wgrad_rs_input",
            Purpose::RsOutput => "rs_output",
            Purpose::Fp32RsScratch => "fp32_rs_scratch",
            Purpose::Fp32AccumScratch => "fp32_accum_scratch",
            Purpose::Other => "other",
        }
    }

    /// Parses [`Purpose::name`].
    pub fn from_name(name: &str) -> Option<Purpose> {
        [
            Purpose::WgradRsInput,
            Purpose::RsOutput,
            Purpose::Fp32RsScratch,
            Purpose::Fp32AccumScratch,
            Purpose::Other,
        ]
        .into_iter()
        .find(|p| p.name() == name)
    }
}

impl fmt::Display for Purpose {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Identifies the parameter a wgrad request belongs to. Only used to compute
/// what the per-parameter ring would have cost; repeated use of one parameter
/// in one graph (MTP) still gets distinct views.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ParamId(pub u64);

/// One buffer a runner needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Request {
    /// Where the memory comes from.
    pub domain: Domain,
    /// Element type.
    pub dtype: DType,
    /// Number of elements (must be at least one).
    pub elements: u64,
    /// What the buffer is for.
    pub purpose: Purpose,
    /// The parameter a wgrad buffer belongs to, if known.
    pub param: Option<ParamId>,
}

impl Request {
    /// A request of `elements` elements of `dtype` in `domain`, purpose
    /// [`Purpose::Other`].
    pub const fn new(domain: Domain, dtype: DType, elements: u64) -> Request {
        Request {
            domain,
            dtype,
            elements,
            purpose: Purpose::Other,
            param: None,
        }
    }

    /// Sets the purpose tag.
    pub const fn purpose(mut self, purpose: Purpose) -> Request {
        self.purpose = purpose;
        self
    }

    /// Names the parameter this buffer belongs to.
    pub const fn param(mut self, param: ParamId) -> Request {
        self.param = Some(param);
        self
    }

    /// The (domain, dtype) key.
    pub const fn key(&self) -> Key {
        Key {
            domain: self.domain,
            dtype: self.dtype,
        }
    }

    /// Size in bytes before alignment, or `None` on overflow.
    pub fn bytes(&self) -> Option<u64> {
        self.elements.checked_mul(self.dtype.size_bytes())
    }

    /// Size in bytes rounded up to the domain's alignment, or `None` on
    /// overflow.
    pub fn aligned_bytes(&self) -> Option<u64> {
        align_up(self.bytes()?, self.domain.alignment())
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} x {} in {} ({})",
            self.elements, self.dtype, self.domain, self.purpose
        )
    }
}

/// Rounds `value` up to a multiple of `align` (a power of two), or `None` on
/// overflow.
pub(crate) fn align_up(value: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    Some(value.checked_add(align - 1)? & !(align - 1))
}
