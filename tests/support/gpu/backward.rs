//! A framework-shaped backward over a chain of layers (`support::ops`):
//! every op allocates its output and drops its intermediates (inside a
//! capture, graph memory nodes), and each layer's input gradient goes to the
//! next layer, through a handoff in a plan. Layer `l` is runner `l`.

use replay_arena::cuda::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use replay_arena::cuda::{self, ViewExt};
use replay_arena::{Discovering, HandoffId, PlanConfig, Planned, Replayable, Request, RunnerId};

use crate::support::ops::{Framework, Layers, OpResult};

/// Where a layer frees the op output it hands off (`dx`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Free {
    /// Before its ready point: no temporary spans a cut.
    BeforeReady,
    /// After it, as a framework's autograd does: the temporary spans the cut.
    AfterReady,
}

/// How each layer's graph is captured.
#[derive(Clone, Copy, Debug)]
pub enum Capture {
    /// `stream_capture`, no ready point marked.
    Once,
    /// `stream_capture_repeatable` with this many step copies, the handoff
    /// marked ready right after the dgrad; with `cut_across`, the copies
    /// cut there even where a temporary lives across
    /// (`RunnerCapture::cut_across_temporaries`).
    Repeatable {
        step_copies: usize,
        cut_across: bool,
    },
}

/// The framework on the first GPU and the layers' tensors.
pub struct Model {
    pub fw: Framework,
    pub layers: Layers,
    /// Values per tensor.
    pub n: usize,
}

impl Model {
    /// `layers` layers of `n` values, with an input per layer where asked
    /// for (the wgrad reads it; else the weight).
    pub fn new(layers: usize, n: usize, inputs: bool) -> Model {
        let fw = Framework::new();
        let layers = Layers::new(&fw, layers, n, inputs);
        Model { fw, layers, n }
    }

    /// The number of layers.
    pub fn depth(&self) -> usize {
        self.layers.weights.len()
    }

    /// `count` zeroed tensors of `n` values, ready when this returns.
    pub fn zeros(&self, count: usize) -> Vec<CudaSlice<i32>> {
        let acc = (0..count)
            .map(|_| self.fw.io.cudarc().alloc_zeros(self.n).unwrap())
            .collect();
        self.fw.io.synchronize().unwrap();
        acc
    }

    /// Host copies of `tensors`, read on `io`.
    pub fn read(&self, tensors: &[CudaSlice<i32>]) -> Vec<Vec<i32>> {
        tensors
            .iter()
            .map(|a| self.fw.io.cudarc().clone_dtoh(a).unwrap())
            .collect()
    }

    /// Layer `l`'s backward, as a framework writes it: every op allocates
    /// its output (`t1`, `dx`, `t3`); the input gradient goes into `dx_out`
    /// (the next layer's input), `dx` is freed where `free` says around
    /// `ready`, then the wgrad is computed into `wgrad`.
    #[allow(clippy::too_many_arguments)]
    pub fn layer<O: DevicePtrMut<i32>>(
        &self,
        s: &cuda::Stream,
        l: usize,
        g_in: &impl DevicePtr<i32>,
        dx_out: Option<&mut O>,
        wgrad: &mut impl DevicePtrMut<i32>,
        free: Free,
        ready: impl FnOnce(&cuda::Stream) -> OpResult<()>,
    ) -> OpResult<()> {
        let w = &self.layers.weights[l];
        let x = self.layers.inputs.get(l).unwrap_or(w);
        let t1 = self.fw.ops.mix2(s, g_in, w, 1)?;
        let dx = self.fw.ops.mix2(s, &t1, w, 2)?;
        drop(t1);
        if let Some(out) = dx_out {
            self.fw.ops.copy_into(s, &dx, out)?;
        }
        let dx = match free {
            Free::BeforeReady => {
                drop(dx);
                None
            }
            Free::AfterReady => Some(dx),
        };
        ready(s)?;
        // Freed after the ready point: in a step copy cut there, the
        // allocation is in the first part and the free in the second.
        drop(dx);
        let t3 = self.fw.ops.mix2(s, g_in, x, 3)?;
        self.fw.ops.mix2_into(s, wgrad, &t3, x, 4)?;
        drop(t3);
        Ok(())
    }

    /// `steps` eager backwards on `io`, the ops allocating and freeing as
    /// they go: layer `l` reads the gradient layer `l - 1` computed
    /// (`chained`; else, as the first layer, the loss gradient), and
    /// `each(l, wgrad)` runs after it.
    pub fn eager(
        &self,
        steps: usize,
        chained: bool,
        free: Free,
        mut each: impl FnMut(usize, &CudaSlice<i32>),
    ) {
        let s = &self.fw.io;
        let layers = self.depth();
        let mut grads: Vec<CudaSlice<i32>> = (0..layers)
            .map(|_| s.cudarc().alloc_zeros(self.n).unwrap())
            .collect();
        for _ in 0..steps {
            for l in 0..layers {
                let mut wgrad: CudaSlice<i32> = s.cudarc().alloc_zeros(self.n).unwrap();
                let (before, rest) = grads.split_at_mut(l);
                let dx = (chained && l + 1 < layers).then_some(&mut rest[0]);
                let ok = |_: &cuda::Stream| Ok(());
                match before.last().filter(|_| chained) {
                    None => self.layer(s, l, &self.layers.loss, dx, &mut wgrad, free, ok),
                    Some(g_in) => self.layer(s, l, g_in, dx, &mut wgrad, free, ok),
                }
                .unwrap();
                each(l, &wgrad);
            }
        }
    }

    /// `planned` (of [`discover`]) allocated, every layer captured on a new
    /// stream and sealed: layer `l` takes its view of `wgrad`, receives
    /// `handoffs[l - 1]` and hands off `handoffs[l]` where there are such
    /// (with none, it reads the loss gradient), and records
    /// [`Model::layer`].
    pub fn sealed(
        &self,
        planned: Planned,
        wgrad: Request,
        handoffs: &[HandoffId],
        free: Free,
        how: Capture,
    ) -> Replayable<cuda::Device> {
        let b = &self.fw.backend;
        let mut capturing = planned.allocate(b.clone()).unwrap();
        let stream = b.new_stream().unwrap();
        for l in 0..self.depth() {
            let cap = capturing.capture(RunnerId(l as u32)).unwrap();
            let view = cap.take(wgrad).unwrap();
            let input = l
                .checked_sub(1)
                .and_then(|k| handoffs.get(k))
                .map(|&h| cap.receive(h).unwrap());
            let output = handoffs.get(l).map(|&h| (h, cap.hand_off(h).unwrap()));
            let work = |s: &cuda::Stream| {
                let mut wgrad = view.as_cuda::<i32>(s).map_err(|e| e.to_string())?;
                let mut out = output
                    .map(|(_, v)| v.as_cuda::<i32>(s))
                    .transpose()
                    .map_err(|e| e.to_string())?;
                let ready = |s: &cuda::Stream| match (how, output) {
                    (Capture::Repeatable { .. }, Some((h, _))) => {
                        cap.ready(h, s).map_err(|e| e.to_string())
                    }
                    _ => Ok(()),
                };
                match input {
                    None => self.layer(
                        s,
                        l,
                        &self.layers.loss,
                        out.as_mut(),
                        &mut wgrad,
                        free,
                        ready,
                    ),
                    Some(v) => {
                        let g_in = v.as_cuda::<i32>(s).map_err(|e| e.to_string())?;
                        self.layer(s, l, &g_in, out.as_mut(), &mut wgrad, free, ready)
                    }
                }
            };
            match how {
                Capture::Once => cap.stream_capture(&stream, work),
                Capture::Repeatable {
                    step_copies,
                    cut_across,
                } => {
                    cap.step_copies(step_copies);
                    if cut_across {
                        cap.cut_across_temporaries();
                    }
                    cap.stream_capture_repeatable(&stream, work)
                }
            }
            .unwrap();
            cap.finish().unwrap();
        }
        capturing.seal().unwrap()
    }
}

/// Discovery of a chain of `layers` layers: layer `l` (named `layer{l}.bwd`)
/// records `wgrad`, then (with a `grad`) receives the gradient layer `l - 1`
/// handed off and hands its own off to layer `l + 1`, then records `aux`.
pub fn discover(
    layers: usize,
    wgrad: Request,
    grad: Option<Request>,
    aux: Option<Request>,
) -> (Discovering, Vec<HandoffId>) {
    let mut d = Discovering::new(PlanConfig::new());
    let mut handoffs = Vec::new();
    for l in 0..layers {
        let mut armed = d
            .arm_named(RunnerId(l as u32), format!("layer{l}.bwd"))
            .unwrap();
        armed.record(wgrad).unwrap();
        if let Some(grad) = grad {
            if l > 0 {
                armed.receive(handoffs[l - 1]).unwrap();
            }
            if l + 1 < layers {
                handoffs.push(armed.hand_off(grad).unwrap());
            }
        }
        if let Some(aux) = aux {
            armed.record(aux).unwrap();
        }
    }
    (d, handoffs)
}

/// The elements of `got` that differ from `want`, tensor by tensor.
pub fn differing(got: &[Vec<i32>], want: &[Vec<i32>]) -> usize {
    got.iter()
        .zip(want)
        .map(|(g, w)| g.iter().zip(w).filter(|(a, b)| a != b).count())
        .sum()
}
