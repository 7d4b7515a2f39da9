//! [`Timing`] for [`Device`]: marks are times on the deterministic clock,
//! one tick read as one microsecond; a node mark is an event, whose record
//! inside a composed graph keeps the time its node ended.

use super::device::Device;
use super::streams::{Event, Stream};
use super::{sim_error, Result, FOREIGN_EVENT};
use crate::backend::{Streams, Timing};

impl Timing for Device {
    /// A time on the clock, in ticks.
    type Mark = u64;

    fn new_mark(&self) -> Result<u64> {
        Ok(0)
    }

    /// When work enqueued on `stream` now would start: the end of
    /// everything before it, the events it waited for included.
    fn take_mark(&self, mark: &mut u64, stream: &Stream) -> Result<()> {
        let id = self.own(stream, "sim mark")?;
        *mark = self.state().streams[id].tail;
        Ok(())
    }

    /// The clock's zero: a trace's times are the clock's own.
    fn origin(&self) -> Result<u64> {
        Ok(0)
    }

    /// A time on the clock is known when it is taken.
    fn wait_mark(&self, _: &u64) -> Result<()> {
        Ok(())
    }

    fn elapsed_us(&self, origin: &u64, mark: &u64) -> Result<f64> {
        Ok(*mark as f64 - *origin as f64)
    }

    fn times_graph_nodes(&self) -> bool {
        true
    }

    /// An event ([`Streams::create_event`], which fault injection counts
    /// as [`Call::CreateEvent`](super::Call::CreateEvent)).
    #[track_caller]
    fn new_node_mark(&self) -> Result<Event> {
        self.create_event()
    }

    /// The clock's time at the event's latest record.
    fn node_mark_us(&self, origin: &u64, event: &Event) -> Result<f64> {
        let id = self.own_event(event, "sim node mark")?;
        let time = self
            .state()
            .events
            .get(id)
            .map(|e| e.time)
            .ok_or_else(|| sim_error("sim node mark", FOREIGN_EVENT))?;
        Ok(time as f64 - *origin as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::Kernel;

    #[test]
    fn a_mark_is_the_streams_tail_on_the_clock() {
        let sim = Device::new();
        let (a, b) = (sim.new_stream(), sim.new_stream());
        let buf = sim.alloc_f32(4).unwrap();
        sim.launch(&a, Kernel::fill(&buf, 1.0), 7).unwrap();
        let origin = sim.origin().unwrap();
        let (mut at_a, mut at_b) = (sim.new_mark().unwrap(), sim.new_mark().unwrap());
        sim.take_mark(&mut at_a, &a).unwrap();
        sim.take_mark(&mut at_b, &b).unwrap();
        assert_eq!(sim.elapsed_us(&origin, &at_a).unwrap(), 7.0);
        assert_eq!(sim.elapsed_us(&origin, &at_b).unwrap(), 0.0);
    }

    #[test]
    fn a_node_mark_reads_the_time_of_its_latest_record() {
        let sim = Device::new();
        let a = sim.new_stream();
        let buf = sim.alloc_f32(4).unwrap();
        let origin = sim.origin().unwrap();
        let mark = sim.new_node_mark().unwrap();
        sim.launch(&a, Kernel::fill(&buf, 1.0), 5).unwrap();
        sim.record_event(&a, &mark).unwrap();
        assert_eq!(sim.node_mark_us(&origin, &mark).unwrap(), 5.0);
        assert!(sim
            .node_mark_us(&origin, &Device::new().new_node_mark().unwrap())
            .is_err());
    }
}
