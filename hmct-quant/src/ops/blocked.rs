//! Channel-blocked activations: a 4-D f32 value `[n, c, h, w]` with `c` a multiple of
//! [`BLOCK`] kept as `[n, c/16, h, w, 16]`, sixteen channels of one position side by
//! side, as onnxruntime's NCHWc layout keeps them.
//!
//! The depthwise and pointwise conv kernels hold one position of sixteen channels per
//! AVX-512 vector; on NCHW data they transposed each tile in and out, which on the
//! small planes of mobile nets cost as much as the sums. Between two such convs the
//! value now stays blocked. Which values may be blocked is decided once per session
//! (see `exec`), every kernel that reads a blocked value natively gives the same bits
//! as on NCHW data, and every other reader gets the value converted back first, so a
//! value's layout never changes a result.

use hmct_tensor::Tensor;
use hmct_tensor::ndarray::{ArrayD, IxDyn};

/// Channels per block: one AVX-512 vector of f32.
pub(crate) const BLOCK: usize = 16;

/// How a conv's input is laid out and how it should store its output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Layouts {
    /// The input (data, input 0) is blocked.
    pub input: bool,
    /// The output should be blocked (a request: kernels without a blocked store, or
    /// whose tail has per-channel operands, store NCHW).
    pub output: bool,
    /// Every conv that reads the output is a depthwise conv that runs on the band
    /// kernel from planes up to [`WIDE_PLANE`] (see [`BlockedConv::Depthwise`]), so a
    /// blocked output may be that large.
    pub wide: bool,
}

/// The most positions per channel of a blocked value whose conv readers are all
/// depthwise convs with `reads_wide` (see [`BlockedConv::Depthwise`]); other blocked
/// values stop at a 20x20 plane (`conv`'s `BLOCKED_PLANE`).
pub(crate) const WIDE_PLANE: usize = 28 * 28;

/// The convs that read blocked values natively (with AVX-512): depthwise (one channel
/// per group, stride 1 or 2) and pointwise (1x1, one group, no stride or padding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockedConv {
    /// `reads_wide`: stride 2, or a kernel of 25 taps or more. From an NCHW input of
    /// up to 28x28 such a conv runs on `conv_dw`'s band kernel, which transposes its
    /// input in; a blocked input is copied in as it is. Stride 1 with a smaller
    /// kernel runs on `dw_rows` from NCHW there, faster than the band kernel.
    Depthwise {
        reads_wide: bool,
    },
    Pointwise,
}

/// The NCHW data of a blocked input of `n` images of `c` channels of `plane`
/// positions (the conv paths that do not read blocked values).
pub(crate) fn unblock_slice<T: Clone + Default + 'static>(
    x: &[T],
    n: usize,
    c: usize,
    plane: usize,
) -> Vec<T> {
    // Per block, `[plane, 16]` to `[16, plane]`: the Transpose op's tiled copy.
    super::arrays::permute_data(x, &[n, c / BLOCK, plane, BLOCK], &[0, 1, 3, 2])
}

/// Whether a tensor held in a slot that may be blocked is blocked: its natural value
/// is 4-D, so a 5-D one is the blocked form.
pub(crate) fn is_blocked(t: &Tensor) -> bool {
    matches!(t, Tensor::F32(a) if a.ndim() == 5 && a.shape()[4] == BLOCK)
}

#[cfg(test)]
/// `[n, c, h, w]` to `[n, c/16, h, w, 16]`; `None` unless f32, 4-D with `c` a
/// multiple of [`BLOCK`].
pub(crate) fn block(t: &Tensor) -> Option<Tensor> {
    let Tensor::F32(a) = t else { return None };
    let &[n, c, h, w] = a.shape() else {
        return None;
    };
    if !c.is_multiple_of(BLOCK) {
        return None;
    }
    let dst = block_slice(a.as_slice()?, n, c, h * w);
    let shape = IxDyn(&[n, c / BLOCK, h, w, BLOCK]);
    Some(Tensor::F32(
        ArrayD::from_shape_vec(shape, dst).expect("same length"),
    ))
}

/// The blocked data of NCHW `x`: `n` images of `c` channels (a multiple of
/// [`BLOCK`]) of `plane` positions.
#[cfg(test)]
pub(crate) fn block_slice(x: &[f32], n: usize, c: usize, plane: usize) -> Vec<f32> {
    super::arrays::permute_data(x, &[n, c / BLOCK, BLOCK, plane], &[0, 1, 3, 2])
}

/// `[n, c/16, h, w, 16]` back to `[n, c, h, w]`; the tensor itself when it is not
/// blocked.
pub(crate) fn unblock(t: &Tensor) -> Option<Tensor> {
    if !is_blocked(t) {
        return None;
    }
    let Tensor::F32(a) = t else { return None };
    let &[n, cb, h, w, _] = a.shape() else {
        return None;
    };
    let dst = unblock_slice(a.as_slice()?, n, cb * BLOCK, h * w);
    let shape = IxDyn(&[n, cb * BLOCK, h, w]);
    Some(Tensor::F32(
        ArrayD::from_shape_vec(shape, dst).expect("same length"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_then_unblock_is_the_identity_and_puts_channels_in_lanes() {
        let (n, c, h, w) = (2, 32, 3, 5);
        let v: Vec<f32> = (0..n * c * h * w).map(|i| i as f32).collect();
        let t = Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[n, c, h, w]), v.clone()).unwrap());
        let b = block(&t).unwrap();
        assert!(is_blocked(&b) && !is_blocked(&t));
        let Tensor::F32(ba) = &b else { unreachable!() };
        assert_eq!(ba.shape(), &[n, c / 16, h, w, 16]);
        // Image 1, channel 17 (block 1, lane 1), row 2, column 3.
        let at = |i: usize, ch: usize, y: usize, x: usize| ((i * c + ch) * h + y) * w + x;
        assert_eq!(ba[[1, 1, 2, 3, 1]], v[at(1, 17, 2, 3)]);
        let back = unblock(&b).unwrap();
        let Tensor::F32(back) = back else {
            unreachable!()
        };
        assert_eq!(back.shape(), &[n, c, h, w]);
        assert_eq!(back.as_slice().unwrap(), &v[..]);
        // Channels not a multiple of 16 stay as they are.
        let odd = Tensor::F32(ArrayD::zeros(IxDyn(&[1, 24, 2, 2])));
        assert!(block(&odd).is_none() && unblock(&odd).is_none());
    }
}
