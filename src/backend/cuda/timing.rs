//! [`Timing`] for every handle of a CUDA device ([`AsDevice`]): a mark is
//! a CUDA event with timing on, created ahead and recorded when taken;
//! times come from `cuEventElapsedTime`. A node mark is an [`Event`] with
//! timing on, which a composed graph records after a node (an event record
//! node).

use super::backend::AsDevice;
use super::device::{Event, Stream};
use super::result;
use super::{driver_error, sys, Result};
use crate::backend::Timing;

/// A timing mark: an event created with timing on (unlike the fence's own,
/// `CU_EVENT_DISABLE_TIMING`).
#[derive(Debug)]
pub struct Mark {
    inner: cudarc::driver::CudaEvent,
}

impl<D: AsDevice> Timing for D {
    type Mark = Mark;

    /// `cuEventCreate` with timing on.
    fn new_mark(&self) -> Result<Mark> {
        let inner = self
            .as_device()
            .inner
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| driver_error("cuEventCreate", e))?;
        Ok(Mark { inner })
    }

    /// `cuEventRecord` on `stream`.
    fn take_mark(&self, mark: &mut Mark, stream: &Stream) -> Result<()> {
        let raw = stream.raw("cuEventRecord")?;
        self.as_device().bind()?;
        // SAFETY: both handles are live objects of this context.
        Ok(unsafe { result::event::record(mark.inner.cu_event(), raw) }?)
    }

    /// Recorded now on the backend's internal stream.
    fn origin(&self) -> Result<Mark> {
        let mark = self.new_mark()?;
        mark.inner
            .record(&self.as_device().inner.internal)
            .map_err(|e| driver_error("cuEventRecord", e))?;
        Ok(mark)
    }

    /// `cuEventSynchronize`.
    fn wait_mark(&self, mark: &Mark) -> Result<()> {
        self.as_device().bind()?;
        // SAFETY: the event is a live object of this context.
        Ok(unsafe { result::event::synchronize(mark.inner.cu_event()) }?)
    }

    /// `cuEventElapsedTime` (milliseconds as `f32`, about half a
    /// microsecond of resolution).
    fn elapsed_us(&self, origin: &Mark, mark: &Mark) -> Result<f64> {
        self.as_device().bind()?;
        // SAFETY: both events are live objects of this context.
        let ms = unsafe {
            cudarc::driver::result::event::elapsed(origin.inner.cu_event(), mark.inner.cu_event())
        }
        .map_err(|e| driver_error("cuEventElapsedTime", e))?;
        Ok(f64::from(ms) * 1000.0)
    }

    fn times_graph_nodes(&self) -> bool {
        true
    }

    /// `cuEventCreate` with timing on (not recorded: a composed graph's
    /// event record node records it at each launch).
    fn new_node_mark(&self) -> Result<Event> {
        Ok(Event {
            inner: self.new_mark()?.inner,
        })
    }

    /// `cuEventElapsedTime` from the origin to the event's latest record.
    fn node_mark_us(&self, origin: &Mark, event: &Event) -> Result<f64> {
        self.as_device().bind()?;
        // SAFETY: both events are live objects of this context.
        let ms = unsafe {
            cudarc::driver::result::event::elapsed(origin.inner.cu_event(), event.cu_event())
        }
        .map_err(|e| driver_error("cuEventElapsedTime", e))?;
        Ok(f64::from(ms) * 1000.0)
    }
}
