//! Host memory: a plan's arenas, the program's buffers and graph
//! temporaries, at stable addresses, and the checks that keep ops inside
//! live allocations and raw spans out of arenas.

use std::sync::{Arc, Mutex};

use super::ops::{AsSpan, Kernel, Node, Span};
use super::{lock, sim_error, Result, SimState};
use crate::backend::{self, BackendError};
use crate::scope::check_use;

/// A simulated arena; dropping it frees its host memory.
#[derive(Debug)]
pub struct Arena {
    pub(super) state: Arc<Mutex<SimState>>,
    pub(super) base: u64,
    pub(super) bytes: u64,
}

impl backend::Arena for Arena {
    fn base(&self) -> u64 {
        self.base
    }

    fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // As a stream-ordered free: pending ops on it end first.
        let mut s = lock(&self.state);
        s.synchronize();
        s.free(self.base);
    }
}

/// A host buffer of `f32`s outside the plan (consumer outputs, say).
#[derive(Debug)]
pub struct HostBuffer {
    pub(super) state: Arc<Mutex<SimState>>,
    pub(super) base: u64,
    pub(super) len: usize,
}

impl AsSpan for HostBuffer {
    fn span(&self) -> Span {
        Span::new(self.base, self.len)
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // As a stream-ordered free: pending ops on it end first, so freed
        // memory is never written.
        let mut s = lock(&self.state);
        s.synchronize();
        s.free(self.base);
    }
}

pub(super) struct Allocation {
    data: Vec<u8>,
    pad: usize,
    bytes: u64,
    /// A plan's arena (only views may touch it), not a buffer.
    arena: bool,
    /// A graph allocation node's memory (a temporary of one graph).
    temporary: bool,
}

impl SimState {
    pub(super) fn alloc(
        &mut self,
        bytes: u64,
        align: u64,
        arena: bool,
    ) -> std::result::Result<u64, String> {
        if let Some(left) = self.allocations_left.as_mut() {
            if *left == 0 {
                return Err("injected allocation failure".into());
            }
            *left -= 1;
        }
        let len = usize::try_from(bytes.checked_add(align).ok_or("size overflows")?)
            .map_err(|_| "size exceeds the address space")?;
        // Fallible: an arena the host cannot hold is an error, not a panic
        // (`vec!` panics past `isize::MAX` and aborts when the allocator fails).
        let mut data = Vec::new();
        data.try_reserve_exact(len).map_err(|e| e.to_string())?;
        data.resize(len, 0u8);
        let ptr = data.as_ptr() as u64;
        let pad = ((align - ptr % align) % align) as usize;
        let base = ptr + pad as u64;
        self.allocs.insert(
            base,
            Allocation {
                data,
                pad,
                bytes,
                arena,
                temporary: false,
            },
        );
        self.allocations += 1;
        Ok(base)
    }

    /// Marks the allocation at `base` as a graph allocation node's.
    pub(super) fn mark_temporary(&mut self, base: u64) {
        if let Some(a) = self.allocs.get_mut(&base) {
            a.temporary = true;
        }
    }

    /// The base of the graph temporary `span` lies in, if it does.
    pub(super) fn temporary_of(&self, span: &Span) -> Option<u64> {
        self.find(span)
            .and_then(|(base, a)| a.temporary.then_some(base))
    }

    /// Frees a graph allocation node's memory.
    pub(super) fn free_graph_memory(&mut self, base: u64) {
        if let Some(a) = self.allocs.get(&base) {
            self.graph_bytes = self.graph_bytes.saturating_sub(a.bytes);
        }
        self.free(base);
    }

    fn free(&mut self, base: u64) {
        if self.allocs.remove(&base).is_some() {
            self.frees += 1;
        }
    }

    /// The allocation holding the whole span, as (base, allocation).
    fn find(&self, span: &Span) -> Option<(u64, &Allocation)> {
        let end = span.end()?;
        let (&base, a) = self.allocs.range(..=span.addr).next_back()?;
        (end <= base + a.bytes).then_some((base, a))
    }

    /// The bytes of a span inside its allocation's buffer.
    fn range(&self, span: &Span) -> Option<(u64, std::ops::Range<usize>)> {
        let (base, a) = self.find(span)?;
        let start = a.pad + usize::try_from(span.addr - base).ok()?;
        // `find` checked that the span ends inside the allocation.
        Some((base, start..start + 4 * span.len))
    }

    pub(super) fn read(&self, span: &Span) -> Option<Vec<f32>> {
        let (base, range) = self.range(span)?;
        let a = self.allocs.get(&base)?;
        Some(
            a.data[range]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        )
    }

    pub(super) fn write(&mut self, span: &Span, values: &[f32]) -> Option<()> {
        let (base, range) = self.range(span)?;
        let a = self.allocs.get_mut(&base)?;
        for (chunk, v) in a.data[range].chunks_exact_mut(4).zip(values) {
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        Some(())
    }

    /// The byte ranges (start, end, written?) a node touches, each inside a
    /// live allocation.
    pub(super) fn ranges(&self, op: &Node) -> Result<Vec<((u64, u64), bool)>> {
        let accesses = op.accesses();
        let mut ranges = Vec::with_capacity(accesses.len());
        for (span, write) in &accesses {
            match (self.find(span), span.end()) {
                (Some(_), Some(end)) => ranges.push(((span.addr, end), *write)),
                _ => {
                    return Err(sim_error(
                        "sim launch",
                        format!(
                            "{} f32 at {:#x} lie outside every live allocation",
                            span.len, span.addr
                        ),
                    ))
                }
            }
        }
        Ok(ranges)
    }

    /// Refuses an op that touches a plan's arena where the fence cannot
    /// order it: through a view outside its closure or on another stream,
    /// or through a raw span.
    pub(super) fn check_scope(&self, sid: u64, op: &Kernel) -> Result<()> {
        for (span, write) in op.accesses() {
            match &span.view {
                Some(tag) => {
                    check_use(tag, sid, write)
                        .map_err(|reason| BackendError::InvalidView { reason })?;
                }
                None => self.check_raw(&span)?,
            }
        }
        Ok(())
    }

    /// Refuses a raw span that lies in a plan's arena.
    pub(super) fn check_raw(&self, span: &Span) -> Result<()> {
        if span.view.is_none() && self.find(span).is_some_and(|(_, a)| a.arena) {
            return Err(sim_error(
                "sim launch",
                format!(
                    "{} f32 at {:#x} lie in a plan's arena: reach arena memory through the \
                     views a capture or consumer hands out",
                    span.len, span.addr
                ),
            ));
        }
        Ok(())
    }
}
