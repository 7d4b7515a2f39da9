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

/// A shape bucket of one discovery (a batch size, a sequence length):
/// declared by [`Discovering::bucket`](crate::Discovering::bucket), counted
/// from 0 in declaration order. Every runner belongs to exactly one; a
/// discovery that declares none has the one bucket `BucketId(0)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BucketId(pub u32);

impl fmt::Display for BucketId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bucket {}", self.0)
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
///
/// With the `serde` feature it is `"device"` or `{"symmetric": 0}` (the
/// group's id), as the workload format spells it (there with the group's
/// name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
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

    /// How reports and workload files spell [`Domain::Device`].
    pub(crate) const DEVICE_NAME: &'static str = "device";

    /// How reports and workload files spell [`Domain::Symmetric`] (with its
    /// group: `symmetric(gtp)`, `{"symmetric": "gtp"}`).
    pub(crate) const SYMMETRIC_NAME: &'static str = "symmetric";
}

/// Alignment of views in [`Domain::Device`].
pub const DEVICE_ALIGNMENT: u64 = 256;
/// Alignment of views in [`Domain::Symmetric`] (NCCL's required window alignment).
pub const SYMMETRIC_ALIGNMENT: u64 = 4096;

impl fmt::Display for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Domain::Device => f.write_str(Domain::DEVICE_NAME),
            Domain::Symmetric(g) => write!(f, "{}({g})", Domain::SYMMETRIC_NAME),
        }
    }
}

/// Element type of a request.
///
/// With the `serde` feature it is its [`DType::name`] (`"bf16"`), as in
/// workload files and reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
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
///
/// With the `serde` feature it is its [`Purpose::name`]
/// (`"wgrad_rs_input"`), as in workload files.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Purpose {
    /// Input of a weight-gradient reduce-scatter.
    WgradRsInput,
    /// Output of a reduce-scatter.
    RsOutput,
    /// FP32 reduce-scatter all-to-all scratch.
    Fp32RsScratch,
    /// FP32 accumulation scratch.
    Fp32AccumScratch,
    /// An input the program stages before each replay (token ids,
    /// positions, lengths of a shape bucket's graph): written by a
    /// [`Replayable::consume_mut`](crate::Replayable::consume_mut) before
    /// the runner's first replay and before any later one, fenced like
    /// every other user of those bytes (the write waits for the replays
    /// and consumers still using them, the replay waits for the write).
    Input,
    /// Anything else.
    #[default]
    Other,
}

impl Purpose {
    /// Every purpose, in declaration order.
    pub const ALL: [Purpose; 6] = [
        Purpose::WgradRsInput,
        Purpose::RsOutput,
        Purpose::Fp32RsScratch,
        Purpose::Fp32AccumScratch,
        Purpose::Input,
        Purpose::Other,
    ];

    /// The snake-case name used in reports and workload files.
    pub const fn name(self) -> &'static str {
        match self {
            Purpose::WgradRsInput => "wgrad_rs_input",
            Purpose::RsOutput => "rs_output",
            Purpose::Fp32RsScratch => "fp32_rs_scratch",
            Purpose::Fp32AccumScratch => "fp32_accum_scratch",
            Purpose::Input => "input",
            Purpose::Other => "other",
        }
    }

    /// Parses [`Purpose::name`].
    pub fn from_name(name: &str) -> Option<Purpose> {
        Purpose::ALL.into_iter().find(|p| p.name() == name)
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

/// The vocabulary's one serialized form (feature `serde`): every name is the
/// one [`Display`](fmt::Display), reports and workload files use.
#[cfg(feature = "serde")]
pub(crate) mod names {
    use std::fmt;
    use std::marker::PhantomData;

    use serde::de::{self, Deserializer, MapAccess, Visitor};
    use serde::ser::{SerializeMap, Serializer};
    use serde::{Deserialize, Serialize};

    use super::{DType, Domain, GroupId, Purpose};

    /// A value read from one of its names, with an error that lists them
    /// (`unknown dtype "bf17" (expected one of: f64, ...)`).
    pub(crate) struct ByName<T> {
        /// What the value is, for errors ("dtype").
        pub(crate) what: &'static str,
        /// The type's own parser of its names.
        pub(crate) parse: fn(&str) -> Option<T>,
        /// Every name, for errors.
        pub(crate) names: fn() -> Vec<String>,
    }

    impl<T> Visitor<'_> for ByName<T> {
        type Value = T;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
            (self.parse)(v).ok_or_else(|| {
                E::custom(format_args!(
                    "unknown {} {v:?} (expected one of: {})",
                    self.what,
                    (self.names)().join(", ")
                ))
            })
        }
    }

    /// `Serialize` and `Deserialize` for a type by its `name()` and
    /// `from_name`, errors listing the names of its `ALL`.
    macro_rules! by_name {
        ($($t:ty => $what:literal),* $(,)?) => {$(
            impl serde::Serialize for $t {
                fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                    serializer.serialize_str(self.name())
                }
            }

            impl<'de> serde::Deserialize<'de> for $t {
                fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<$t, D::Error> {
                    deserializer.deserialize_str($crate::vocab::names::ByName {
                        what: $what,
                        parse: <$t>::from_name,
                        names: || <$t>::ALL.iter().map(|x| x.name().into()).collect(),
                    })
                }
            }
        )*};
    }
    pub(crate) use by_name;

    by_name! {
        DType => "dtype",
        Purpose => "purpose",
    }

    /// `"device"` or `{"symmetric": 0}`.
    impl Serialize for Domain {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            match self {
                Domain::Device => serializer.serialize_str(Domain::DEVICE_NAME),
                Domain::Symmetric(group) => serialize_symmetric(group, serializer),
            }
        }
    }

    impl<'de> Deserialize<'de> for Domain {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Domain, D::Error> {
            let group = deserialize_domain::<D, GroupId>(deserializer, "GROUP_ID")?;
            Ok(group.map_or(Domain::Device, Domain::Symmetric))
        }
    }

    /// `{"symmetric": group}`: a symmetric domain's object form, with its
    /// group as an id (reports) or a name (workload files).
    pub(crate) fn serialize_symmetric<S: Serializer>(
        group: &impl Serialize,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(1))?;
        map.serialize_entry(Domain::SYMMETRIC_NAME, group)?;
        map.end()
    }

    /// Reads `"device"` (`None`) or `{"symmetric": group}` (`Some(group)`),
    /// where `placeholder` names the group in errors (`"device" or
    /// {"symmetric": GROUP}`).
    pub(crate) fn deserialize_domain<'de, D, G>(
        deserializer: D,
        placeholder: &'static str,
    ) -> Result<Option<G>, D::Error>
    where
        D: Deserializer<'de>,
        G: Deserialize<'de>,
    {
        struct DomainVisitor<G> {
            placeholder: &'static str,
            group: PhantomData<G>,
        }

        impl<'de, G: Deserialize<'de>> Visitor<'de> for DomainVisitor<G> {
            type Value = Option<G>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(
                    f,
                    r#""{}" or {{"{}": {}}}"#,
                    Domain::DEVICE_NAME,
                    Domain::SYMMETRIC_NAME,
                    self.placeholder
                )
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<G>, E> {
                if v == Domain::DEVICE_NAME {
                    Ok(None)
                } else {
                    Err(E::custom(format_args!(
                        "unknown domain {v:?} (expected {})",
                        &self as &dyn de::Expected
                    )))
                }
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<G>, A::Error> {
                let mut group = None;
                while map.next_key::<SymmetricKey>()?.is_some() {
                    if group.is_some() {
                        return Err(de::Error::duplicate_field(Domain::SYMMETRIC_NAME));
                    }
                    group = Some(map.next_value()?);
                }
                group
                    .map(Some)
                    .ok_or_else(|| de::Error::missing_field(Domain::SYMMETRIC_NAME))
            }
        }

        deserializer.deserialize_any(DomainVisitor {
            placeholder,
            group: PhantomData,
        })
    }

    /// The one key of a symmetric domain's object form; any other is an
    /// unknown field.
    struct SymmetricKey;

    impl<'de> Deserialize<'de> for SymmetricKey {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<SymmetricKey, D::Error> {
            const FIELDS: &[&str] = &[Domain::SYMMETRIC_NAME];

            struct KeyVisitor;

            impl Visitor<'_> for KeyVisitor {
                type Value = SymmetricKey;

                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("field identifier")
                }

                fn visit_str<E: de::Error>(self, v: &str) -> Result<SymmetricKey, E> {
                    if v == Domain::SYMMETRIC_NAME {
                        Ok(SymmetricKey)
                    } else {
                        Err(E::unknown_field(v, FIELDS))
                    }
                }
            }

            deserializer.deserialize_identifier(KeyVisitor)
        }
    }
}

/// What one layer hands to the next: returned by
/// [`BufferSource::hand_off`](crate::BufferSource::hand_off), given to [`BufferSource::receive`](crate::BufferSource::receive) in the
/// readers and to [`BufferSource::ready`](crate::BufferSource::ready) in the writer. It is `Copy` and
/// borrows nothing, so it outlives the capture that handed it out and
/// passes from one runner's capture to the next one's.
///
/// A plain run's ticket names no handoff; discovery's and capture's name
/// the plan's ([`HandoffTicket::id`]): the same id in both, since capture
/// hands out the runner's handoffs in the order discovery declared them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandoffTicket {
    pub(crate) id: Option<HandoffId>,
    pub(crate) writer: Option<RunnerId>,
    pub(crate) request: Request,
}

impl HandoffTicket {
    /// The plan's handoff, or `None` for a plain run's ticket.
    pub fn id(&self) -> Option<HandoffId> {
        self.id
    }

    /// The runner that hands it off, or `None` for a plain run's ticket.
    pub fn writer(&self) -> Option<RunnerId> {
        self.writer
    }

    /// What it holds.
    pub fn request(&self) -> Request {
        self.request
    }
}

impl std::fmt::Display for HandoffTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.id, self.writer) {
            (Some(id), Some(writer)) => {
                write!(f, "the ticket of {id} from {writer} ({})", self.request)
            }
            _ => write!(f, "a plain run's ticket ({})", self.request),
        }
    }
}

/// Whether a bucket's graphs are held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum BucketState {
    /// Its runners' graphs are captured: it replays.
    Captured,
    /// Its graphs were released ([`Replayable::release_bucket`](crate::Replayable::release_bucket), or the
    /// budget): capture it again to replay it.
    Released,
}

impl fmt::Display for BucketState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BucketState::Captured => "captured",
            BucketState::Released => "released",
        })
    }
}
