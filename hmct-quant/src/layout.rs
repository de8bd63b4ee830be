//! Which values of a plan a session keeps channel-blocked (see [`crate::ops::blocked`]).
//!
//! Blocked values form groups joined by layout-free nodes: activation calibration
//! nodes, and element-wise nodes (activations, Clip, Add/Sub/Mul/Div) whose other
//! inputs are in the same group or single constants, which compute each value alone
//! and so keep whatever layout their inputs have (a SiLU split by calibration nodes,
//! `x · σ(x)`, is one group). A group is kept blocked when each of its values comes
//! from a conv that can store it blocked (depthwise or pointwise,
//! [`Kernel::blocked_conv`](crate::ops::Kernel::blocked_conv), with a multiple of 16
//! output channels) or from a layout-free node of the group; every node that reads it
//! is a conv reading it as data or a layout-free node of the group; none of it is a
//! graph output; and a depthwise conv reads or writes it, whose kernel otherwise
//! transposes both ways (between pointwise convs alone the transposes cost little).
//! A group whose conv readers are all depthwise convs of stride 2 or with 25 taps or
//! more is `wide`: its convs store it blocked on planes up to 28x28, not only 20x20.
//!
//! This is a preference: the executor converts a blocked value back whenever a node
//! that does not take it reads it (a per-channel calibration, a layout-free node whose
//! inputs came in different layouts), and a conv whose kernel cannot store a blocked
//! output stores NCHW. Kernels give the same bits in either layout, so where values
//! end up blocked changes no result.

use crate::fusion::Chains;
use crate::ops::blocked::{BLOCK, BlockedConv};
use crate::plan::{NodeOp, Plan, Slot};
use hmct_tensor::Tensor;

/// Per slot: whether a conv writing it stores it blocked (`write`), and whether a
/// value held there may be blocked (`may`: those, and what layout-free nodes write
/// from them).
pub(crate) struct Blocked {
    pub write: Vec<bool>,
    pub may: Vec<bool>,
    /// Per slot: every conv that reads the slot's group is a depthwise conv with
    /// `reads_wide`, so a conv writing it may store it blocked on planes up to
    /// [`WIDE_PLANE`](crate::ops::blocked::WIDE_PLANE) (`Layouts::wide`).
    pub wide: Vec<bool>,
    /// Per node: a conv that reads blocked values (run with `Kernel::run_blocked`).
    pub convs: Vec<bool>,
    /// Per node: a layout-free element-wise kernel (not a calibration node).
    pub layout_free: Vec<bool>,
}

impl Blocked {
    /// The slots of `plan` to keep blocked, with `chains` the session's element-wise
    /// chains (a conv with a tail writes the tail's output).
    pub fn find(plan: &Plan, chains: &Chains) -> Blocked {
        let nodes = plan.nodes();
        let n = plan.num_values();
        let mut readers: Vec<Vec<(usize, usize)>> = vec![Vec::new(); n];
        for (i, node) in nodes.iter().enumerate() {
            for (j, s) in node.inputs.iter().enumerate() {
                if let Some(s) = s {
                    readers[*s].push((i, j));
                }
            }
        }
        let weights: Vec<Option<Vec<usize>>> =
            (0..nodes.len()).map(|i| weight_shape(plan, i)).collect();
        // What kind of blocked-capable conv each node is, if any.
        let kinds: Vec<Option<BlockedConv>> = nodes
            .iter()
            .zip(&weights)
            .map(|(node, w)| node.kernel()?.blocked_conv(w.as_deref()?))
            .collect();
        let is_calibration = |i: usize| matches!(nodes[i].op, NodeOp::Calibration(c) if !plan.calibrations()[c].is_weight);
        let layout_free: Vec<bool> = nodes
            .iter()
            .map(|node| {
                node.outputs.len() == 1 && node.kernel().is_some_and(|k| k.element_step().is_some())
            })
            .collect();
        let passes_on = |i: usize| layout_free[i] || is_calibration(i);
        let single = |s: Slot| single_constant(plan, s);

        let mut cand = vec![false; n];
        for (p, node) in nodes.iter().enumerate() {
            let stores = kinds[p].is_some()
                && weights[p]
                    .as_ref()
                    .is_some_and(|w| w[0].is_multiple_of(BLOCK));
            if stores || passes_on(p) {
                cand[node.outputs[0]] = true;
            }
        }
        loop {
            let mut changed = false;
            for s in 0..n {
                if !cand[s] {
                    continue;
                }
                let read_well = !plan.outputs().contains(&s)
                    && readers[s].iter().all(|&(r, j)| {
                        let node = &nodes[r];
                        if kinds[r].is_some() {
                            j == 0 && node.inputs.iter().filter(|&&t| t == Some(s)).count() == 1
                        } else {
                            passes_on(r) && cand[node.outputs[0]]
                        }
                    });
                if !read_well {
                    cand[s] = false;
                    changed = true;
                }
            }
            for (i, node) in nodes.iter().enumerate() {
                let out = node.outputs[0];
                if !passes_on(i) || !cand[out] {
                    continue;
                }
                let inputs = node.inputs.iter().flatten();
                let fed = inputs.clone().all(|&s| cand[s] || single(s))
                    && inputs.clone().any(|&s| cand[s]);
                if !fed {
                    cand[out] = false;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }

        // Groups: values joined by layout-free nodes. Keep those a depthwise conv
        // reads or writes.
        let mut group: Vec<usize> = (0..n).collect();
        fn root(group: &mut [usize], mut s: usize) -> usize {
            while group[s] != s {
                group[s] = group[group[s]];
                s = group[s];
            }
            s
        }
        for (i, node) in nodes.iter().enumerate() {
            if passes_on(i) && cand[node.outputs[0]] {
                for &s in node.inputs.iter().flatten().filter(|&&s| cand[s]) {
                    let (a, b) = (root(&mut group, s), root(&mut group, node.outputs[0]));
                    group[a] = b;
                }
            }
        }
        let mut gains = vec![false; n];
        for (i, node) in nodes.iter().enumerate() {
            if !matches!(kinds[i], Some(BlockedConv::Depthwise { .. })) {
                continue;
            }
            for s in node.inputs[..1].iter().flatten().chain(&node.outputs[..1]) {
                if cand[*s] {
                    let r = root(&mut group, *s);
                    gains[r] = true;
                }
            }
        }
        for s in 0..n {
            if cand[s] && !gains[root(&mut group, s)] {
                cand[s] = false;
            }
        }

        // Groups whose conv readers all take a wide blocked input.
        let mut narrow = vec![false; n];
        for (i, node) in nodes.iter().enumerate() {
            let Some(kind) = kinds[i] else { continue };
            if let Some(s) = node.inputs[0].filter(|&s| cand[s])
                && !matches!(kind, BlockedConv::Depthwise { reads_wide: true })
            {
                let r = root(&mut group, s);
                narrow[r] = true;
            }
        }
        let wide = (0..n)
            .map(|s| cand[s] && !narrow[root(&mut group, s)])
            .collect();

        // Convs store blocked what they write: their output, or their tail's.
        let mut write = vec![false; n];
        for (p, node) in nodes.iter().enumerate() {
            if kinds[p].is_none() {
                continue;
            }
            let written =
                std::iter::once(node.outputs[0]).chain(chains.tail_of(p).map(|c| c.output));
            for s in written {
                write[s] = cand[s];
            }
        }
        let convs = kinds.iter().map(Option::is_some).collect();
        Blocked {
            write,
            may: cand,
            wide,
            convs,
            layout_free,
        }
    }

    /// Checks (in debug builds) that a conv's outputs written to `slot` are blocked
    /// only where a blocked value may be held: `conv_nd` stores blocked only what it
    /// was asked to, and never when the tail it was given did not run.
    pub fn check_written(&self, slot: Slot, out: &[Tensor]) {
        debug_assert!(
            self.may[slot] || !out.first().is_some_and(crate::ops::blocked::is_blocked),
            "a blocked output where none may be held"
        );
    }
}

/// Whether `s` holds a single constant value of rank 4 at most, which broadcasts to a
/// 5-D blocked value without growing it.
pub(crate) fn single_constant(plan: &Plan, s: Slot) -> bool {
    plan.constant(s)
        .is_some_and(|t| t.len() == 1 && t.shape().len() <= 4)
}

/// The shape of node `i`'s f32 weight: a constant, or a weight calibration node's
/// output (blocked values are f32 only).
fn weight_shape(plan: &Plan, i: usize) -> Option<Vec<usize>> {
    let s = plan.nodes()[i].inputs.get(1).copied().flatten()?;
    let weight = match plan.constant(s) {
        Some(w) => w,
        None => match plan.nodes()[plan.producer(s)?].op {
            NodeOp::Calibration(c) if plan.calibrations()[c].is_weight => {
                plan.constant(plan.calibrations()[c].input)?
            }
            _ => return None,
        },
    };
    matches!(**weight, Tensor::F32(_)).then(|| weight.shape().to_vec())
}
