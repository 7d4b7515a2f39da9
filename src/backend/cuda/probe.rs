//! Whether a usable driver and device exist, asked without panicking in any
//! of cudarc's linking modes: `libcuda` and every entry point this backend
//! calls are looked up by the names cudarc's dynamic loading tries first.

use std::ffi::c_int;
use std::fmt;

use super::library::{missing_symbols, open_library};
use super::result;
use super::{sys, unavailable, Result};

/// Driver entry points this backend (and the parts of cudarc it uses) calls.
/// [`probe_device`] checks they all resolve before anything is called, so a
/// too-old driver is an error rather than a panic inside cudarc.
const REQUIRED_SYMBOLS: [&str; 47] = [
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuStreamIsCapturing",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemsetD8Async",
    "cuMemGetInfo_v2",
    "cuGraphInstantiateWithFlags",
    "cuGraphUpload",
    "cuGraphLaunch",
    "cuGraphGetNodes",
    "cuGraphNodeGetType",
    "cuGraphChildGraphNodeGetGraph",
    "cuGraphMemAllocNodeGetParams",
    "cuGraphClone",
    "cuGraphCreate",
    "cuGraphAddChildGraphNode",
    "cuGraphNodeFindInClone",
    "cuGraphDestroyNode",
    "cuGraphEventRecordNodeGetEvent",
    "cuGraphExecEventRecordNodeSetEvent",
    "cuDeviceGetGraphMemAttribute",
    "cuGraphMemFreeNodeGetParams",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
];

/// What [`probe_device`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceInfo {
    /// The device's ordinal.
    pub ordinal: usize,
    /// Devices the driver sees.
    pub device_count: usize,
    /// The device's name ("NVIDIA H200").
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Total device memory in bytes.
    pub total_memory: u64,
    /// The driver's CUDA version as `1000 * major + 10 * minor` (13000 is 13.0).
    pub driver_version: i32,
}

impl fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (device {} of {}, sm_{}{}, {:.1} GiB, CUDA driver {}.{})",
            self.name,
            self.ordinal,
            self.device_count,
            self.compute_capability.0,
            self.compute_capability.1,
            self.total_memory as f64 / (1u64 << 30) as f64,
            self.driver_version / 1000,
            self.driver_version % 1000 / 10
        )
    }
}

/// Whether `libcuda` loads and has every entry point in
/// [`REQUIRED_SYMBOLS`] (cudarc panics on a missing library or symbol).
fn check_library() -> Result<()> {
    let Some(lib) = open_library(&["cuda", "nvcuda"]) else {
        return Err(unavailable(
            "the CUDA driver library (libcuda) was not found by the dynamic loader",
        ));
    };
    let missing = missing_symbols(&lib, &REQUIRED_SYMBOLS);
    if missing.is_empty() {
        Ok(())
    } else {
        Err(unavailable(format!(
            "the CUDA driver library lacks {}; a CUDA 12 or newer driver is needed",
            missing.join(", ")
        )))
    }
}

/// Whether a usable CUDA driver and device 0 exist; never panics.
///
/// `Err(BackendError::Unavailable { .. })` when `libcuda` is missing, lacks an
/// entry point this backend needs, fails to initialize, or sees no device.
pub fn probe() -> Result<DeviceInfo> {
    probe_device(0)
}

/// Like [`probe`], for the device with this ordinal.
///
/// It first checks that `libcuda` loads and has every entry point this
/// backend calls, whichever linking mode cudarc was built with (cudarc's
/// default features load the library at run time and panic without it).
pub fn probe_device(ordinal: usize) -> Result<DeviceInfo> {
    check_library()?;
    // Every entry point called below was resolved above.
    if let Err(e) = result::init() {
        return Err(unavailable(format!("cuInit returned {:?}", e.code)));
    }
    let driver_version = result::driver_version()?;
    let count = result::device::count()
        .map_err(|e| unavailable(format!("cuDeviceGetCount returned {:?}", e.code)))?;
    let device_count = usize::try_from(count).unwrap_or(0);
    if ordinal >= device_count {
        return Err(unavailable(format!(
            "CUDA device {ordinal} does not exist: the driver sees {device_count} device(s)"
        )));
    }
    let device = result::device::get(ordinal as c_int)?;
    let name = result::device::name(device)?;
    let attribute = |attribute| result::device::attribute(device, attribute);
    let major = attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let total = result::device::total_memory(device)?;
    Ok(DeviceInfo {
        ordinal,
        device_count,
        name,
        compute_capability: (major, minor),
        total_memory: total as u64,
        driver_version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_info_displays_name_capability_memory_and_driver() {
        let info = DeviceInfo {
            ordinal: 0,
            device_count: 1,
            name: "NVIDIA H200".into(),
            compute_capability: (9, 0),
            total_memory: 150 << 30,
            driver_version: 13000,
        };
        assert_eq!(
            info.to_string(),
            "NVIDIA H200 (device 0 of 1, sm_90, 150.0 GiB, CUDA driver 13.0)"
        );
    }
}
