//! The Rust element types a typed view may have, FP8 bytes included.

use cudarc::driver::DeviceRepr;

use crate::vocab::DType;

mod sealed {
    pub trait Sealed {}
}

/// A Rust element type with a [`DType`]: what a [`TypedView`](super::TypedView) may be typed
/// as. Implemented for `f32`, `f64`, `i32`, `i64`, `i8`, `u8`, [`F8E4M3`], [`F8E5M2`], and, with the
/// `f16` feature (cudarc's `f16`), `half::bf16` and `half::f16`. Sealed.
#[diagnostic::on_unimplemented(
    message = "a view cannot be typed as `{Self}`",
    note = "typed views are `f32`, `f64`, `i32`, `i64`, `i8`, `u8`, `cuda::F8E4M3`, `cuda::F8E5M2`, and with the `f16` feature `half::bf16`, `half::f16`; use the element type of the view's dtype"
)]
pub trait Element: DeviceRepr + sealed::Sealed {
    /// The dtype of a view of this type.
    const DTYPE: DType;
}

macro_rules! elements {
    ($($(#[$attr:meta])* $t:ty => $d:ident),* $(,)?) => {$(
        $(#[$attr])*
        impl sealed::Sealed for $t {}
        $(#[$attr])*
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}

/// One byte of an FP8 E4M3 value (`__nv_fp8_e4m3`), for typed views of
/// [`DType::F8E4M3`]; the bits are the program's to interpret.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct F8E4M3(pub u8);

/// One byte of an FP8 E5M2 value (`__nv_fp8_e5m2`), for typed views of
/// [`DType::F8E5M2`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct F8E5M2(pub u8);

// SAFETY: one `u8` (`repr(transparent)`), valid for every bit pattern.
unsafe impl DeviceRepr for F8E4M3 {}
// SAFETY: as above.
unsafe impl DeviceRepr for F8E5M2 {}

elements! {
    f32 => F32,
    f64 => F64,
    i32 => I32,
    i64 => I64,
    i8 => I8,
    u8 => U8,
    F8E4M3 => F8E4M3,
    F8E5M2 => F8E5M2,
    #[cfg(feature = "f16")]
    #[cfg_attr(docsrs, doc(cfg(feature = "f16")))]
    half::bf16 => BF16,
    #[cfg(feature = "f16")]
    #[cfg_attr(docsrs, doc(cfg(feature = "f16")))]
    half::f16 => F16,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_types_map_to_their_dtypes() {
        assert_eq!(f32::DTYPE, DType::F32);
        assert_eq!(f64::DTYPE, DType::F64);
        assert_eq!(i32::DTYPE, DType::I32);
        assert_eq!(i64::DTYPE, DType::I64);
        assert_eq!(i8::DTYPE, DType::I8);
        assert_eq!(u8::DTYPE, DType::U8);
        for dtype in [
            f32::DTYPE,
            f64::DTYPE,
            i32::DTYPE,
            i64::DTYPE,
            i8::DTYPE,
            u8::DTYPE,
        ] {
            let size = match dtype {
                DType::F32 => std::mem::size_of::<f32>(),
                DType::F64 => std::mem::size_of::<f64>(),
                DType::I32 => std::mem::size_of::<i32>(),
                DType::I64 => std::mem::size_of::<i64>(),
                DType::I8 => std::mem::size_of::<i8>(),
                _ => std::mem::size_of::<u8>(),
            };
            assert_eq!(dtype.size_bytes(), size as u64, "{dtype}");
        }
    }

    #[cfg(feature = "f16")]
    #[test]
    fn half_types_map_to_bf16_and_f16() {
        assert_eq!(half::bf16::DTYPE, DType::BF16);
        assert_eq!(half::f16::DTYPE, DType::F16);
    }

    #[test]
    // Without `f16` the list is only built: the check needs bf16 and f16.
    #[cfg_attr(
        not(feature = "f16"),
        allow(unused_mut, unused_variables, clippy::useless_vec)
    )]
    fn every_dtype_has_an_element_type() {
        let mut covered = vec![
            f32::DTYPE,
            f64::DTYPE,
            i32::DTYPE,
            i64::DTYPE,
            i8::DTYPE,
            u8::DTYPE,
            F8E4M3::DTYPE,
            F8E5M2::DTYPE,
        ];
        #[cfg(feature = "f16")]
        covered.extend([half::bf16::DTYPE, half::f16::DTYPE]);
        #[cfg(feature = "f16")]
        assert!(
            DType::ALL.iter().all(|d| covered.contains(d)),
            "{covered:?}"
        );
        assert_eq!(
            std::mem::size_of::<F8E4M3>() as u64,
            DType::F8E4M3.size_bytes()
        );
        assert_eq!(
            std::mem::size_of::<F8E5M2>() as u64,
            DType::F8E5M2.size_bytes()
        );
    }
}
