//! Which values of a plan a session keeps channel-blocked (see [`crate::ops::blocked`]).
//!
//! A value is stored blocked when a conv that can store it so writes it and every
//! node that reads it takes it blocked: convs that read blocked inputs (depthwise and
//! pointwise, [`Kernel::blocked_conv`](crate::ops::Kernel::blocked_conv)), or
//! activation calibration nodes, which quantize element by element and pass the
//! layout on, when the values they write are read the same way. It must also gain:
//! the writer or a reader is a depthwise conv, whose kernel otherwise transposes
//! both ways. Graph outputs are never blocked.
//!
//! This is a preference: the executor converts a blocked value back whenever a node
//! that does not take it reads it (a per-channel calibration, a run that keeps a
//! tail's intermediate values), and a conv whose kernel cannot store a blocked
//! output stores NCHW. Kernels give the same bits in either layout, so where values
//! end up blocked changes no result.

use crate::fusion::Chains;
use crate::ops::blocked::{BLOCK, BlockedConv};
use crate::plan::{NodeOp, Plan, Slot};
use hmct_tensor::Tensor;

/// Per slot: whether a conv writing it stores it blocked (`write`), and whether a
/// value held there may be blocked (`may`: those, and what calibration nodes write
/// from them).
pub(crate) struct Blocked {
    pub write: Vec<bool>,
    pub may: Vec<bool>,
    /// Per node: a conv that reads blocked values (run with `Kernel::run_blocked`).
    pub convs: Vec<bool>,
}

impl Blocked {
    /// The slots of `plan` to keep blocked, with `chains` the session's element-wise
    /// chains (a conv with a tail writes the tail's output).
    pub fn find(plan: &Plan, chains: &Chains) -> Blocked {
        let n = plan.num_values();
        let mut readers: Vec<Vec<(usize, usize)>> = vec![Vec::new(); n];
        for (i, node) in plan.nodes().iter().enumerate() {
            for (j, s) in node.inputs.iter().enumerate() {
                if let Some(s) = s {
                    readers[*s].push((i, j));
                }
            }
        }
        let is_output = |s: Slot| plan.outputs().contains(&s);
        let kinds: Vec<Option<BlockedConv>> = (0..plan.nodes().len())
            .map(|i| conv_kind(plan, i))
            .collect();
        // The convs that read `s` (through calibration nodes), or `None` when another
        // node reads it or a value on the way is a graph output.
        fn conv_readers(
            plan: &Plan,
            readers: &[Vec<(usize, usize)>],
            kinds: &[Option<BlockedConv>],
            is_output: &dyn Fn(Slot) -> bool,
            s: Slot,
            found: &mut Vec<usize>,
        ) -> bool {
            if is_output(s) {
                return false;
            }
            readers[s].iter().all(|&(r, j)| {
                let node = &plan.nodes()[r];
                match &node.op {
                    NodeOp::Calibration(c) if !plan.calibrations()[*c].is_weight => {
                        conv_readers(plan, readers, kinds, is_output, node.outputs[0], found)
                    }
                    _ if kinds[r].is_some() && j == 0 => {
                        found.push(r);
                        // Read once, as the data input.
                        node.inputs.iter().filter(|&&t| t == Some(s)).count() == 1
                    }
                    _ => false,
                }
            })
        }
        let mut write = vec![false; n];
        for (p, node) in plan.nodes().iter().enumerate() {
            let Some(kind) = kinds[p] else { continue };
            let Some(m) = weight_shape(plan, p).map(|w| w[0]) else {
                continue;
            };
            if m % BLOCK != 0 {
                continue;
            }
            let written =
                std::iter::once(node.outputs[0]).chain(chains.tail_of(p).map(|c| c.output));
            for s in written {
                let mut found = Vec::new();
                let all_convs = conv_readers(plan, &readers, &kinds, &is_output, s, &mut found);
                let gains = kind == BlockedConv::Depthwise
                    || found
                        .iter()
                        .any(|&r| kinds[r] == Some(BlockedConv::Depthwise));
                write[s] = all_convs && !found.is_empty() && gains;
            }
        }
        // Calibration nodes pass the layout on (nodes are in topological order).
        let mut may = write.clone();
        for node in plan.nodes() {
            if let NodeOp::Calibration(c) = &node.op
                && !plan.calibrations()[*c].is_weight
                && node.inputs[0].is_some_and(|s| may[s])
            {
                may[node.outputs[0]] = true;
            }
        }
        let convs = kinds.iter().map(Option::is_some).collect();
        Blocked { write, may, convs }
    }

    /// A conv's outputs written to `slot`, with the first converted back to NCHW if
    /// it came blocked where no blocked value may be held (which the conv kernel
    /// avoids; this keeps a slot's layout readable by its rank whatever a kernel did).
    pub fn settle(&self, slot: Slot, mut out: Vec<Tensor>) -> Vec<Tensor> {
        if !self.may[slot]
            && let Some(first) = out.first_mut()
            && let Some(plain) = crate::ops::blocked::unblock(first)
        {
            *first = plain;
        }
        out
    }
}

/// The weight's shape of node `i`: a constant, or a weight calibration node's output.
fn weight_shape(plan: &Plan, i: usize) -> Option<Vec<usize>> {
    let s = plan.nodes()[i].inputs.get(1).copied().flatten()?;
    if let Some(w) = plan.constant(s) {
        return Some(w.shape().to_vec());
    }
    let p = plan.producer(s)?;
    match plan.nodes()[p].op {
        NodeOp::Calibration(c) if plan.calibrations()[c].is_weight => {
            let input = plan.calibrations()[c].input;
            plan.constant(input).map(|w| w.shape().to_vec())
        }
        _ => None,
    }
}

/// What kind of blocked-capable conv node `i` is, if any.
fn conv_kind(plan: &Plan, i: usize) -> Option<BlockedConv> {
    let kernel = plan.nodes()[i].kernel()?;
    kernel.blocked_conv(&weight_shape(plan, i)?)
}
