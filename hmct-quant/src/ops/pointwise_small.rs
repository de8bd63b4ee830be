//! Pointwise (1x1) f32 convs on small planes with AVX-512: output channels in the
//! vector lanes.
//!
//! The other conv kernels put positions in the lanes: a 7x7 plane's 49 positions fill
//! 64 lanes (a 32-wide tile and a 17-wide tail), and ResNet-50's 2048->512 at 7x7 ran
//! at two thirds of the FMA peak; the packed GEMM also copies its input into panels.
//! Here a register tile is 12 positions × 32 output channels: per input channel, two
//! vectors of transposed weights (packed once per weight) and twelve inputs broadcast
//! from where they lie, 24 multiply-adds. Each finished tile is transposed back and
//! stored as runs of twelve positions per channel.
//!
//! Each output is `bias + Σ_c w·x` summed over input channels in order with fused
//! multiply-adds: the sums of the other conv kernels, bit for bit.

use rayon::prelude::*;

use super::gemm_util::SendPtr;
use super::window::Win3;

/// Positions and output channels of a register tile.
const PR: usize = 12;
const CR: usize = 32;
/// Multiply-adds below which a conv runs on the calling thread.
const SERIAL_WORK: usize = 1 << 20;
/// Positions per task (whole tiles), so that large planes with few output channels
/// still split into tasks. Fixed, so tasks never depend on threads.
const TASK_POSITIONS: usize = 32 * PR;

/// Whether [`conv`] runs this conv here: AVX-512 (and the conv ISA is not forced to
/// AVX2), a pointwise conv (1x1, stride 1, no pads) with 32 or more output channels
/// per group and 16 or more input channels, on a plane of fewer than 1024 positions or
/// with 128 or more input channels.
///
/// `kernel_table` (least of 20 runs, % of the FMA peak, packed GEMM -> here), ResNet-50:
/// 2048->512 at 7x7 65 -> 95, 1024->256 at 14x14 72 -> 99, 512->128 at 28x28 82 -> 97,
/// 256->512 stride 2 (gathered to 28x28) 77 -> 88, 256->64 at 56x56 85 -> 95; but
/// 64->256 at 56x56 89 -> 85 (with few input channels, a tile's transposes and stores
/// weigh more than its sums).
pub(crate) fn fits(g: &Win3, mg: usize, cg: usize) -> bool {
    let pointwise = g.k_vol() == 1 && g.stride == [1; 3] && g.pad == [0; 3] && g.out == g.input;
    super::packed_gemm::available()
        && pointwise
        && mg >= CR
        && cg >= 16
        && (g.out_vol() < 1024 || cg >= 128)
}

/// Weights `[m, cg]` transposed per block of [`CR`] output channels of a group into
/// `[cg, CR]` panels (zeros in the padding channels), each read in order by its
/// tiles. (Transposed whole, `[cg, mg]`, a panel's rows lay a power of two apart and
/// shared a few cache sets: ResNet-50's 2048->512 at 7x7 ran at half speed.)
pub(crate) fn pack_weights(w: &[f32], m: usize, group: usize, cg: usize) -> Vec<f32> {
    let mg = m / group;
    let blocks = mg.div_ceil(CR);
    let mut out = vec![0.0; group * blocks * cg * CR];
    for gi in 0..group {
        for o in 0..mg {
            let panel = (gi * blocks + o / CR) * cg;
            for c in 0..cg {
                out[(panel + c) * CR + o % CR] = w[(gi * mg + o) * cg + c];
            }
        }
    }
    out
}

/// `y = conv(x, w) + bias` for f32 NCHW data, with `wt` from [`pack_weights`]; `y` is
/// written in full. Tasks are (image, group, block of [`CR`] output channels, chunk of
/// [`TASK_POSITIONS`] positions). The caller checks [`fits`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv(
    wt: &[f32],
    x: &[f32],
    bias: Option<&[f32]>,
    y: &mut [f32],
    n: usize,
    c: usize,
    m: usize,
    group: usize,
    g: &Win3,
) {
    let (cg, mg) = (c / group, m / group);
    assert!(fits(g, mg, cg));
    let plane = g.out_vol();
    let blocks = mg.div_ceil(CR);
    assert!(wt.len() == group * blocks * cg * CR);
    assert!(x.len() >= n * c * plane && y.len() >= n * m * plane);
    let chunks = plane.div_ceil(TASK_POSITIONS);
    let tasks = n * group * blocks * chunks;
    let yp = SendPtr(y.as_mut_ptr());
    let task = |t: usize| {
        let chunk = t % chunks;
        let blk = t / chunks % blocks;
        let (b, gi) = (t / chunks / blocks / group, t / chunks / blocks % group);
        let positions = chunk * TASK_POSITIONS..((chunk + 1) * TASK_POSITIONS).min(plane);
        let m0 = blk * CR;
        let chans = CR.min(mg - m0);
        let xg = &x[(b * c + gi * cg) * plane..][..cg * plane];
        let wg = &wt[(gi * blocks + blk) * cg * CR..][..cg * CR];
        let mut start = [0.0f32; CR];
        if let Some(bias) = bias {
            start[..chans].copy_from_slice(&bias[gi * mg + m0..][..chans]);
        }
        let yp = &yp;
        // SAFETY: AVX-512 was checked by `fits`; the task writes `positions` of
        // channels `gi·mg + m0 ..` (`chans` of them) of image `b`, which no other task
        // writes, inside `y` (checked above); `wg` holds the block's `cg` rows of `CR`.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            let yb = yp.0.add((b * m + gi * mg + m0) * plane);
            for p0 in positions.clone().step_by(PR) {
                let rows = PR.min(positions.end - p0);
                avx512::tile(xg, plane, p0, rows, cg, wg, &start, yb, chans);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (xg, wg, start, yp, positions);
            unreachable!("`fits` holds only with AVX-512");
        }
    };
    if tasks == 1 || n * m * plane * cg < SERIAL_WORK || !crate::par::enabled() {
        (0..tasks).for_each(task);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{CR, PR};
    use crate::ops::conv_dw::transpose16;

    /// Positions `p0 .. p0 + rows` × the block's `chans` output channels: sums over
    /// `cg` input channels (`x` row `c` at `c·plane`, weights row `c` at `c·CR`),
    /// stored to `y` (channel `o` at `o·plane`).
    ///
    /// # Safety
    /// The CPU has AVX-512F; `wg` holds `cg` rows of `CR`; `y` points to `chans`
    /// planes of `plane` values that nothing else accesses during the call.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile(
        x: &[f32],
        plane: usize,
        p0: usize,
        rows: usize,
        cg: usize,
        wg: &[f32],
        start: &[f32; CR],
        y: *mut f32,
        chans: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); 2]; PR];
        // SAFETY (whole body): reads of `x` are positions below `p0 + rows <= plane`
        // of its `cg` rows; reads of `wg` stay in its `cg` rows of `CR`; stores
        // write `rows` positions of channels below `chans`.
        unsafe {
            let s0 = _mm512_loadu_ps(start.as_ptr());
            let s1 = _mm512_loadu_ps(start.as_ptr().add(16));
            for a in acc.iter_mut() {
                *a = [s0, s1];
            }
            let (xp, wp) = (x.as_ptr().add(p0), wg.as_ptr());
            // Literal row counts keep the accumulators in registers.
            macro_rules! sums {
                ($r:literal) => {
                    for ci in 0..cg {
                        let w0 = _mm512_loadu_ps(wp.add(ci * CR));
                        let w1 = _mm512_loadu_ps(wp.add(ci * CR + 16));
                        let xr = xp.add(ci * plane);
                        for (i, a) in acc.iter_mut().enumerate().take($r) {
                            let xv = _mm512_set1_ps(*xr.add(i));
                            a[0] = _mm512_fmadd_ps(w0, xv, a[0]);
                            a[1] = _mm512_fmadd_ps(w1, xv, a[1]);
                        }
                    }
                };
            }
            match rows {
                12 => sums!(12),
                11 => sums!(11),
                10 => sums!(10),
                9 => sums!(9),
                8 => sums!(8),
                7 => sums!(7),
                6 => sums!(6),
                5 => sums!(5),
                4 => sums!(4),
                3 => sums!(3),
                2 => sums!(2),
                _ => sums!(1),
            }
            let keep = ((1u32 << rows) - 1) as __mmask16;
            for v in 0..2 {
                // Rows are positions, lanes channels: transposed, rows are channels.
                let mut t = [_mm512_setzero_ps(); 16];
                for (t, a) in t.iter_mut().zip(&acc) {
                    *t = a[v];
                }
                transpose16(&mut t);
                for (o, &t) in t.iter().enumerate().take(chans.saturating_sub(16 * v)) {
                    _mm512_mask_storeu_ps(y.add((16 * v + o) * plane + p0), keep, t);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::Isa;

    /// Same bits as the direct conv, on planes with a partial position tile, channel
    /// counts with a partial block, groups and batches, with and without a bias.
    #[test]
    fn same_bits_as_the_direct_conv() {
        if !super::super::packed_gemm::available() {
            return;
        }
        let values = super::super::conv_direct::tests::values;
        // (images, input channels, output channels, groups, rows, columns)
        let cases = [
            (1, 64, 32, 1, 7, 7),
            (2, 40, 70, 1, 5, 5),
            (1, 96, 232, 1, 7, 7),
            (1, 32, 96, 2, 9, 14),
            (2, 17, 33, 1, 1, 12),
            // Several chunks of positions, the last one partial.
            (1, 128, 40, 1, 30, 31),
        ];
        for (i, &(n, c, m, group, h, w)) in cases.iter().enumerate() {
            let g = Win3 {
                input: [1, h, w],
                out: [1, h, w],
                kernel: [1; 3],
                stride: [1; 3],
                dil: [1; 3],
                pad: [0; 3],
            };
            assert!(fits(&g, m / group, c / group), "case {i} should run here");
            let x = values(n * c * h * w, 5 * i as u64);
            let wv = values(m * c / group, 5 * i as u64 + 1);
            let bias = values(m, 5 * i as u64 + 2);
            let packed = pack_weights(&wv, m, group, c / group);
            for b in [None, Some(&bias[..])] {
                let mut want = vec![0.0f32; n * m * h * w];
                super::super::conv_direct::conv(
                    Isa::Avx512,
                    &x,
                    &wv,
                    b,
                    &mut want,
                    n,
                    c,
                    m,
                    group,
                    &g,
                );
                let mut got = vec![f32::NAN; want.len()];
                conv(&packed, &x, b, &mut got, n, c, m, group, &g);
                for (j, (a, e)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(a.to_bits(), e.to_bits(), "case {i}, output {j}: {a} vs {e}");
                }
            }
        }
    }
}
