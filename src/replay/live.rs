//! Each shape bucket's state at run time, and the budget of captured
//! buckets (`buckets.rs` joins and releases them).

use crate::vocab::BucketId;

/// What the plan holds of its buckets at run time: per bucket its state,
/// and the budget.
#[derive(Debug, Default)]
pub(crate) struct Live {
    pub(crate) buckets: Vec<BucketLive>,
    /// The most buckets whose graphs are held (`None`: no limit).
    pub(crate) budget: Option<usize>,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct BucketLive {
    pub(crate) captured: bool,
    /// Captures of it so far (a kept step graph knows the one it was
    /// built from).
    pub(crate) serial: u64,
    /// The fence epoch of its latest kept step graph launch.
    pub(crate) stepped: u64,
}

impl Live {
    /// `count` buckets, every one captured once.
    pub(crate) fn new(count: usize) -> Live {
        Live {
            buckets: vec![
                BucketLive {
                    captured: true,
                    serial: 1,
                    stepped: 0,
                };
                count
            ],
            budget: None,
        }
    }

    /// Each of `buckets` with the capture it has now.
    pub(crate) fn captures(
        &self,
        buckets: impl IntoIterator<Item = BucketId>,
    ) -> Vec<(BucketId, u64)> {
        let mut out: Vec<(BucketId, u64)> = Vec::new();
        for b in buckets {
            // Mostly one bucket's runners, one after another.
            if out.last().is_some_and(|(x, _)| *x == b) {
                continue;
            }
            if !out.iter().any(|(x, _)| *x == b) {
                let serial = self.buckets.get(b.0 as usize).map_or(0, |s| s.serial);
                out.push((b, serial));
            }
        }
        out
    }

    /// The first of `captures` (bucket, capture) whose capture is gone.
    pub(crate) fn released_of(&self, captures: &[(BucketId, u64)]) -> Option<BucketId> {
        captures.iter().find_map(|&(b, serial)| {
            let live = self.buckets.get(b.0 as usize)?;
            (!live.captured || live.serial != serial).then_some(b)
        })
    }

    /// A kept step graph of `captures` launched at fence epoch `epoch`.
    pub(crate) fn stepped(&mut self, captures: &[(BucketId, u64)], epoch: u64) {
        for &(b, _) in captures {
            if let Some(live) = self.buckets.get_mut(b.0 as usize) {
                live.stepped = epoch;
            }
        }
    }

    pub(crate) fn captured(&self) -> usize {
        self.buckets.iter().filter(|b| b.captured).count()
    }
}
