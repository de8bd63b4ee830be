//! Fake quantization (quantize then dequantize) as HZCALIBRATION.md §3 defines it.
//!
//! The integer path reproduces onnxruntime's `QuantizeLinear` → `DequantizeLinear` bit
//! for bit: `q = round_half_even(clamp(x / s, qmin - zp, qmax - zp))`, `y = q * s`, with a
//! true IEEE division, NaN mapped to `qmin` (onnxruntime clamps with `max(x, lo)`, which
//! yields `lo` for NaN), ±inf saturated, and a zero result always `+0.0` (onnxruntime
//! goes through an integer). The hot loop runs on AVX2 when the CPU has it, with a
//! portable fallback that gives the same bits.

use rayon::prelude::*;

/// Why fake-quant parameters are rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FakeQuantError {
    #[error("scale #{index} is {value}: scales must be finite and positive")]
    BadScale { index: usize, value: f32 },
    #[error("threshold #{index} is {value}: thresholds must be finite and positive")]
    BadThreshold { index: usize, value: f32 },
    #[error("asymmetric range [{min}, {max}] is empty or not finite")]
    BadRange { min: f32, max: f32 },
    #[error(
        "integer range [{qmin}, {qmax}] is not supported (need qmin < qmax, both within ±2^16)"
    )]
    BadIntRange { qmin: i32, qmax: i32 },
    #[error("zero point {zero_point} lies outside [{qmin}, {qmax}]")]
    BadZeroPoint {
        zero_point: i32,
        qmin: i32,
        qmax: i32,
    },
    #[error("{scales} scales but {zero_points} zero points")]
    ZeroPointCount { scales: usize, zero_points: usize },
    #[error("per-tensor quantization takes one scale, got {0}")]
    PerTensorScales(usize),
    #[error("no scale given")]
    NoScale,
    #[error("axis {axis} out of range for a tensor of rank {rank}")]
    Axis { axis: usize, rank: usize },
    #[error("{scales} per-channel scales for {channels} channels along axis {axis}")]
    ChannelCount {
        scales: usize,
        channels: usize,
        axis: usize,
    },
    #[error(
        "{scales} scales for a ConvTranspose weight of shape {shape:?} in {groups} groups \
         (need groups * shape[1] scales and shape[0] divisible by groups)"
    )]
    GroupedChannelCount {
        scales: usize,
        groups: usize,
        shape: Vec<usize>,
    },
    #[error("a grouped ConvTranspose weight is per-channel along axis 1, not axis {axis}")]
    GroupedAxis { axis: usize },
    #[error("shape {shape:?} holds {expected} elements, data has {actual}")]
    DataLength {
        shape: Vec<usize>,
        expected: usize,
        actual: usize,
    },
    #[error("unknown quantization type '{0}'")]
    UnknownQType(String),
    #[error("{0} bits are not supported for integer fake quantization (2..=16)")]
    Bits(u32),
    #[error("quantization type {0} has no integer range")]
    NotInteger(QType),
}

/// The target type of a calibration node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QType {
    /// `intN` (`signed`) or `uintN`.
    Int {
        bits: u32,
        signed: bool,
    },
    Float16,
    Float32,
}

impl QType {
    /// The integer range `[qmin, qmax]`.
    pub fn int_range(self) -> Result<(i32, i32), FakeQuantError> {
        match self {
            QType::Int { bits, signed } => {
                if !(2..=16).contains(&bits) {
                    return Err(FakeQuantError::Bits(bits));
                }
                Ok(if signed {
                    (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
                } else {
                    (0, (1 << bits) - 1)
                })
            }
            other => Err(FakeQuantError::NotInteger(other)),
        }
    }
}

impl std::str::FromStr for QType {
    type Err = FakeQuantError;

    /// Parses `int8`, `uint16`, `int4`, ..., `float16`, `float32`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let unknown = || FakeQuantError::UnknownQType(s.to_string());
        match s {
            "float16" => return Ok(QType::Float16),
            "float32" => return Ok(QType::Float32),
            _ => {}
        }
        let (signed, digits) = if let Some(d) = s.strip_prefix("uint") {
            (false, d)
        } else if let Some(d) = s.strip_prefix("int") {
            (true, d)
        } else {
            return Err(unknown());
        };
        let bits: u32 = digits.parse().map_err(|_| unknown())?;
        let q = QType::Int { bits, signed };
        q.int_range()?;
        Ok(q)
    }
}

impl std::fmt::Display for QType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QType::Int { bits, signed: true } => write!(f, "int{bits}"),
            QType::Int {
                bits,
                signed: false,
            } => write!(f, "uint{bits}"),
            QType::Float16 => f.write_str("float16"),
            QType::Float32 => f.write_str("float32"),
        }
    }
}

/// Validated integer quantization parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct IntQuant {
    qmin: i32,
    qmax: i32,
    scales: Vec<f32>,
    zero_points: Vec<i32>,
    axis: Option<usize>,
    /// Groups of a grouped ConvTranspose weight `[C_in, C_out/g, ...]` (HZCALIBRATION
    /// §3): its output channels are not one axis of the tensor, so element
    /// `[i, j, ...]` takes scale `(i / (C_in/g)) * (C_out/g) + j`. 1 otherwise.
    groups: usize,
}

impl IntQuant {
    pub fn qmin(&self) -> i32 {
        self.qmin
    }
    pub fn qmax(&self) -> i32 {
        self.qmax
    }
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }
    pub fn zero_points(&self) -> &[i32] {
        &self.zero_points
    }
    /// `Some(axis)` for per-channel parameters.
    pub fn axis(&self) -> Option<usize> {
        self.axis
    }
    /// The ConvTranspose group count the channels are regrouped by (1: no regrouping).
    pub fn groups(&self) -> usize {
        self.groups
    }

    /// The channel of the scale the run at (`outer`, `local`) takes, where `outer`
    /// indexes the dimensions before the axis (`outers` of them) and `local` the axis.
    fn channel(&self, outer: usize, outers: usize, local: usize, channels: usize) -> usize {
        if self.groups > 1 {
            (outer / (outers / self.groups)) * channels + local
        } else {
            local
        }
    }
}

/// What a calibration node does to its tensor.
#[derive(Debug, Clone, PartialEq)]
pub enum FakeQuant {
    Identity,
    /// Round to the nearest float16 (ties to even) and back.
    Float16,
    Int(IntQuant),
}

impl FakeQuant {
    /// Integer fake quantization from explicit scales and zero points (`zero_points`
    /// empty means all zero). `axis: None` is per-tensor and takes exactly one scale.
    pub fn int(
        qmin: i32,
        qmax: i32,
        scales: Vec<f32>,
        zero_points: Vec<i32>,
        axis: Option<usize>,
    ) -> Result<FakeQuant, FakeQuantError> {
        const LIMIT: i32 = 1 << 16;
        if qmin >= qmax || qmin < -LIMIT || qmax > LIMIT {
            return Err(FakeQuantError::BadIntRange { qmin, qmax });
        }
        if scales.is_empty() {
            return Err(FakeQuantError::NoScale);
        }
        if axis.is_none() && scales.len() != 1 {
            return Err(FakeQuantError::PerTensorScales(scales.len()));
        }
        if let Some((index, &value)) = scales
            .iter()
            .enumerate()
            .find(|(_, s)| !(s.is_finite() && **s > 0.0))
        {
            return Err(FakeQuantError::BadScale { index, value });
        }
        let zero_points = if zero_points.is_empty() {
            vec![0; scales.len()]
        } else {
            zero_points
        };
        if zero_points.len() != scales.len() {
            return Err(FakeQuantError::ZeroPointCount {
                scales: scales.len(),
                zero_points: zero_points.len(),
            });
        }
        if let Some(&zero_point) = zero_points.iter().find(|z| !(qmin..=qmax).contains(*z)) {
            return Err(FakeQuantError::BadZeroPoint {
                zero_point,
                qmin,
                qmax,
            });
        }
        Ok(FakeQuant::Int(IntQuant {
            qmin,
            qmax,
            scales,
            zero_points,
            axis,
            groups: 1,
        }))
    }

    /// The same parameters for the weight of a ConvTranspose with `groups` groups:
    /// per-channel scales along axis 1 count the output channels of every group
    /// (`groups * C_out/g`). Identity, float16 and per-tensor parameters are unchanged.
    pub fn regrouped(self, groups: usize) -> Result<FakeQuant, FakeQuantError> {
        match self {
            FakeQuant::Int(mut p) if groups > 1 && p.axis.is_some() && p.scales.len() > 1 => {
                if p.axis != Some(1) {
                    return Err(FakeQuantError::GroupedAxis {
                        axis: p.axis.unwrap_or_default(),
                    });
                }
                p.groups = groups;
                Ok(FakeQuant::Int(p))
            }
            other => Ok(other),
        }
    }

    /// Symmetric quantization: `scale_c = threshold_c / qmax`, zero point 0.
    pub fn symmetric(
        qtype: QType,
        thresholds: &[f32],
        axis: Option<usize>,
    ) -> Result<FakeQuant, FakeQuantError> {
        let (qmin, qmax) = qtype.int_range()?;
        let mut scales = Vec::with_capacity(thresholds.len());
        for (index, &t) in thresholds.iter().enumerate() {
            if !(t.is_finite() && t > 0.0) {
                return Err(FakeQuantError::BadThreshold { index, value: t });
            }
            scales.push(t / qmax as f32);
        }
        FakeQuant::int(qmin, qmax, scales, Vec::new(), axis)
    }

    /// Asymmetric per-tensor quantization of `[fmin, fmax]`:
    /// `s = (fmax - fmin) / (qmax - qmin)`, `zp = qmax - round_half_even(fmax / s)`.
    pub fn asymmetric(qtype: QType, fmin: f32, fmax: f32) -> Result<FakeQuant, FakeQuantError> {
        let (qmin, qmax) = qtype.int_range()?;
        if !(fmin.is_finite() && fmax.is_finite() && fmax > fmin) {
            return Err(FakeQuantError::BadRange {
                min: fmin,
                max: fmax,
            });
        }
        let s = (fmax - fmin) / (qmax - qmin) as f32;
        let zp = qmax as f32 - (fmax / s).round_ties_even();
        // A range far from zero puts the zero point outside the integer range; clamp
        // like the reference tools do rather than reject a usable range.
        let zp = zp.clamp(qmin as f32, qmax as f32) as i32;
        FakeQuant::int(qmin, qmax, vec![s], vec![zp], None)
    }

    /// Parameters from calibration thresholds: identity for `float32`, `Float16` for
    /// `float16`; signed integers are symmetric; unsigned integers with exactly two
    /// per-tensor thresholds are the asymmetric `[min, max]` form, otherwise symmetric
    /// over `[0, qmax]`.
    pub fn from_thresholds(
        qtype: QType,
        thresholds: &[f32],
        axis: Option<usize>,
    ) -> Result<FakeQuant, FakeQuantError> {
        match qtype {
            QType::Float32 => Ok(FakeQuant::Identity),
            QType::Float16 => Ok(FakeQuant::Float16),
            QType::Int { signed: false, .. } if axis.is_none() && thresholds.len() == 2 => {
                FakeQuant::asymmetric(qtype, thresholds[0], thresholds[1])
            }
            QType::Int { .. } => FakeQuant::symmetric(qtype, thresholds, axis),
        }
    }

    /// Parameters from stored scales (`constant == 2`): zero points default to 0.
    pub fn from_scales(
        qtype: QType,
        scales: Vec<f32>,
        zero_points: Vec<i32>,
        axis: Option<usize>,
    ) -> Result<FakeQuant, FakeQuantError> {
        match qtype {
            QType::Float32 => Ok(FakeQuant::Identity),
            QType::Float16 => Ok(FakeQuant::Float16),
            QType::Int { .. } => {
                let (qmin, qmax) = qtype.int_range()?;
                FakeQuant::int(qmin, qmax, scales, zero_points, axis)
            }
        }
    }

    /// Checks that these parameters fit a tensor of `shape`.
    /// Whether every element is quantized alike, whatever its position (no per-channel
    /// scales or zero points), so that the tensor's layout does not matter.
    pub fn is_elementwise(&self) -> bool {
        match self {
            FakeQuant::Int(p) => {
                p.axis.is_none() || p.groups == 1 && p.scales.len() == 1 && p.zero_points.len() <= 1
            }
            FakeQuant::Identity | FakeQuant::Float16 => true,
        }
    }

    pub fn check_shape(&self, shape: &[usize]) -> Result<(), FakeQuantError> {
        if let FakeQuant::Int(p) = self
            && let Some(axis) = p.axis
        {
            if axis >= shape.len() {
                return Err(FakeQuantError::Axis {
                    axis,
                    rank: shape.len(),
                });
            }
            if p.groups > 1 {
                if shape[0] % p.groups != 0 || p.scales.len() != p.groups * shape[axis] {
                    return Err(FakeQuantError::GroupedChannelCount {
                        scales: p.scales.len(),
                        groups: p.groups,
                        shape: shape.to_vec(),
                    });
                }
                return Ok(());
            }
            // One scale broadcast over all channels is what a per-channel node with a
            // single threshold means; anything else must match the channel count.
            if p.scales.len() != 1 && p.scales.len() != shape[axis] {
                return Err(FakeQuantError::ChannelCount {
                    scales: p.scales.len(),
                    channels: shape[axis],
                    axis,
                });
            }
        }
        Ok(())
    }

    /// Fake-quantizes `data` (row-major, of `shape`) in place.
    pub fn apply_in_place(&self, data: &mut [f32], shape: &[usize]) -> Result<(), FakeQuantError> {
        let expected: usize = shape.iter().product();
        if expected != data.len() {
            return Err(FakeQuantError::DataLength {
                shape: shape.to_vec(),
                expected,
                actual: data.len(),
            });
        }
        self.check_shape(shape)?;
        match self {
            FakeQuant::Identity => {}
            FakeQuant::Float16 => par_chunks(data, |c| kernels::f16_round_trip(c)),
            FakeQuant::Int(p) => apply_int(p, data, shape),
        }
        Ok(())
    }

    /// Like [`apply_in_place`](Self::apply_in_place), returning a new buffer.
    pub fn apply(&self, data: &[f32], shape: &[usize]) -> Result<Vec<f32>, FakeQuantError> {
        let mut out = data.to_vec();
        self.apply_in_place(&mut out, shape)?;
        Ok(out)
    }
}

/// Elements per parallel task: big enough that rayon's overhead is noise.
const PAR_CHUNK: usize = 1 << 15;

fn par_chunks(data: &mut [f32], f: impl Fn(&mut [f32]) + Sync + Send) {
    if data.len() <= PAR_CHUNK || !crate::par::enabled() {
        f(data);
    } else {
        data.par_chunks_mut(PAR_CHUNK).for_each(f);
    }
}

/// Clamp bounds of `x / s` for zero point `zp` (see the module doc).
fn bounds(p: &IntQuant, zp: i32) -> (f32, f32) {
    ((p.qmin - zp) as f32, (p.qmax - zp) as f32)
}

impl IntQuant {
    /// The scale and clamp bounds every element takes when the parameters are not
    /// per channel (what [`kernels::int_uniform`] runs with), else `None`.
    pub(crate) fn uniform(&self) -> Option<(f32, f32, f32)> {
        if self.axis.is_some() && self.scales.len() > 1 {
            return None;
        }
        let (lo, hi) = bounds(self, self.zero_points[0]);
        Some((self.scales[0], lo, hi))
    }
}

fn apply_int(p: &IntQuant, data: &mut [f32], shape: &[usize]) {
    if let Some((s, lo, hi)) = p.uniform() {
        par_chunks(data, |c| kernels::int_uniform(c, s, lo, hi));
        return;
    }
    let axis = p.axis.expect("per-channel parameters have an axis");
    let channels = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let outers: usize = shape[..axis].iter().product();
    if data.is_empty() {
        return;
    }
    if inner >= 64 {
        // One contiguous run of `inner` elements per (outer, channel).
        let one = |(i, run): (usize, &mut [f32])| {
            let c = p.channel(i / channels, outers, i % channels, channels);
            let (lo, hi) = bounds(p, p.zero_points[c]);
            kernels::int_uniform(run, p.scales[c], lo, hi);
        };
        if data.len() <= PAR_CHUNK || !crate::par::enabled() {
            data.chunks_mut(inner).enumerate().for_each(one);
        } else {
            let min_len = (PAR_CHUNK / inner).max(1);
            data.par_chunks_mut(inner)
                .with_min_len(min_len)
                .enumerate()
                .for_each(one);
        }
    } else {
        // Channels change every few elements: expand the parameters over one row of
        // `channels * inner` elements (one row per group) and run the element-wise
        // kernel row by row.
        let row = channels * inner;
        let groups = p.groups.max(1);
        let mut s = Vec::with_capacity(groups * row);
        let mut lo = Vec::with_capacity(groups * row);
        let mut hi = Vec::with_capacity(groups * row);
        for c in 0..groups * channels {
            let (l, h) = bounds(p, p.zero_points[c]);
            for _ in 0..inner {
                s.push(p.scales[c]);
                lo.push(l);
                hi.push(h);
            }
        }
        let rows_per_group = outers / groups;
        let one = |(outer, r): (usize, &mut [f32])| {
            let at = (outer / rows_per_group) * row;
            let range = at..at + row;
            kernels::int_per_element(r, &s[range.clone()], &lo[range.clone()], &hi[range]);
        };
        if data.len() <= PAR_CHUNK || !crate::par::enabled() {
            data.chunks_mut(row).enumerate().for_each(one);
        } else {
            let min_len = (PAR_CHUNK / row).max(1);
            data.par_chunks_mut(row)
                .with_min_len(min_len)
                .enumerate()
                .for_each(one);
        }
    }
}

/// The element kernels, public so tests can compare the SIMD and portable paths.
#[doc(hidden)]
pub mod kernels {
    /// `1.5 * 2^23`: adding and subtracting it rounds an f32 of magnitude below 2^22 to
    /// an integer, ties to even, in the default rounding mode.
    const ROUND_MAGIC: f32 = 12_582_912.0;

    /// One element, portable. `lo`/`hi` are integers of magnitude at most 2^17.
    #[inline(always)]
    pub fn int_scalar(x: f32, s: f32, lo: f32, hi: f32) -> f32 {
        let v = x / s;
        // Written so NaN compares false and becomes `lo`, like `maxps(v, lo)`.
        let v = if v >= lo { v } else { lo };
        let v = if v <= hi { v } else { hi };
        // `+ 0.0` turns a -0.0 into +0.0, as an integer round trip would.
        let q = ((v + ROUND_MAGIC) - ROUND_MAGIC) + 0.0;
        q * s
    }

    pub fn int_uniform_portable(data: &mut [f32], s: f32, lo: f32, hi: f32) {
        for x in data {
            *x = int_scalar(*x, s, lo, hi);
        }
    }

    pub fn int_per_element_portable(data: &mut [f32], s: &[f32], lo: &[f32], hi: &[f32]) {
        for (((x, &s), &lo), &hi) in data.iter_mut().zip(s).zip(lo).zip(hi) {
            *x = int_scalar(*x, s, lo, hi);
        }
    }

    pub fn f16_round_trip_portable(data: &mut [f32]) {
        for x in data {
            *x = half::f16::from_f32(*x).to_f32();
        }
    }

    pub fn int_uniform(data: &mut [f32], s: f32, lo: f32, hi: f32) {
        #[cfg(target_arch = "x86_64")]
        if avx2::available() {
            // SAFETY: the CPU supports AVX2 (checked just above).
            unsafe { avx2::int_uniform(data, s, lo, hi) };
            return;
        }
        int_uniform_portable(data, s, lo, hi)
    }

    pub fn int_per_element(data: &mut [f32], s: &[f32], lo: &[f32], hi: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if avx2::available() {
            // SAFETY: the CPU supports AVX2 (checked just above).
            unsafe { avx2::int_per_element(data, s, lo, hi) };
            return;
        }
        int_per_element_portable(data, s, lo, hi)
    }

    pub fn f16_round_trip(data: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if avx2::available_f16c() {
            // SAFETY: the CPU supports AVX and F16C (checked just above).
            unsafe { avx2::f16_round_trip(data) };
            return;
        }
        f16_round_trip_portable(data)
    }

    #[cfg(target_arch = "x86_64")]
    mod avx2 {
        use std::arch::x86_64::*;

        pub fn available() -> bool {
            crate::cpu::features().avx2
        }

        pub fn available_f16c() -> bool {
            let f = crate::cpu::features();
            f.avx && f.f16c
        }

        /// `maxps(v, lo)` returns its second operand when `v` is NaN; that is the
        /// onnxruntime behaviour this reproduces.
        #[inline]
        #[target_feature(enable = "avx2")]
        fn quant8(x: __m256, s: __m256, lo: __m256, hi: __m256) -> __m256 {
            let v = _mm256_div_ps(x, s);
            let v = _mm256_max_ps(v, lo);
            let v = _mm256_min_ps(v, hi);
            let q = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
            let q = _mm256_add_ps(q, _mm256_setzero_ps());
            _mm256_mul_ps(q, s)
        }

        #[target_feature(enable = "avx2")]
        pub fn int_uniform(data: &mut [f32], s: f32, lo: f32, hi: f32) {
            let (vs, vlo, vhi) = (_mm256_set1_ps(s), _mm256_set1_ps(lo), _mm256_set1_ps(hi));
            let mut chunks = data.chunks_exact_mut(8);
            for c in &mut chunks {
                // SAFETY: `c` holds exactly 8 f32; unaligned loads/stores.
                unsafe {
                    let x = _mm256_loadu_ps(c.as_ptr());
                    _mm256_storeu_ps(c.as_mut_ptr(), quant8(x, vs, vlo, vhi));
                }
            }
            for x in chunks.into_remainder() {
                *x = super::int_scalar(*x, s, lo, hi);
            }
        }

        #[target_feature(enable = "avx2")]
        pub fn int_per_element(data: &mut [f32], s: &[f32], lo: &[f32], hi: &[f32]) {
            let n = data.len().min(s.len()).min(lo.len()).min(hi.len());
            let mut i = 0;
            while i + 8 <= n {
                // SAFETY: `i + 8 <= n` and every slice holds at least `n` elements.
                unsafe {
                    let x = _mm256_loadu_ps(data.as_ptr().add(i));
                    let vs = _mm256_loadu_ps(s.as_ptr().add(i));
                    let vlo = _mm256_loadu_ps(lo.as_ptr().add(i));
                    let vhi = _mm256_loadu_ps(hi.as_ptr().add(i));
                    _mm256_storeu_ps(data.as_mut_ptr().add(i), quant8(x, vs, vlo, vhi));
                }
                i += 8;
            }
            for j in i..n {
                data[j] = super::int_scalar(data[j], s[j], lo[j], hi[j]);
            }
        }

        #[target_feature(enable = "avx,f16c")]
        pub fn f16_round_trip(data: &mut [f32]) {
            let mut chunks = data.chunks_exact_mut(8);
            for c in &mut chunks {
                // SAFETY: `c` holds exactly 8 f32; unaligned loads/stores.
                unsafe {
                    let x = _mm256_loadu_ps(c.as_ptr());
                    let h = _mm256_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(x);
                    _mm256_storeu_ps(c.as_mut_ptr(), _mm256_cvtph_ps(h));
                }
            }
            super::f16_round_trip_portable(chunks.into_remainder());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_qtypes() {
        assert_eq!(
            "int8".parse::<QType>().unwrap().int_range().unwrap(),
            (-128, 127)
        );
        assert_eq!(
            "uint16".parse::<QType>().unwrap().int_range().unwrap(),
            (0, 65535)
        );
        assert_eq!(
            "int4".parse::<QType>().unwrap().int_range().unwrap(),
            (-8, 7)
        );
        assert_eq!("float16".parse::<QType>().unwrap(), QType::Float16);
        assert!("int32".parse::<QType>().is_err());
        assert!("fp8".parse::<QType>().is_err());
        assert_eq!("uint4".parse::<QType>().unwrap().to_string(), "uint4");
    }

    /// A grouped ConvTranspose weight `[C_in, C_out/g, k]`: element `[i, j, ..]` takes
    /// scale `(i / (C_in/g)) * (C_out/g) + j`, on both the run path (long kernels)
    /// and the row path (short kernels).
    #[test]
    fn regrouped_weights_take_the_output_channel_scale() {
        let int8: QType = "int8".parse().unwrap();
        for kernel in [1usize, 3, 100] {
            let (c_in, per_group, groups) = (6usize, 2usize, 3usize);
            let shape = [c_in, per_group, kernel];
            let thresholds: Vec<f32> = (0..groups * per_group).map(|c| 0.5 + c as f32).collect();
            let data: Vec<f32> = (0..c_in * per_group * kernel)
                .map(|k| ((k * 7919) % 1000) as f32 / 97.0 - 5.0)
                .collect();
            let fq = FakeQuant::symmetric(int8, &thresholds, Some(1))
                .unwrap()
                .regrouped(groups)
                .unwrap();
            let got = fq.apply(&data, &shape).unwrap();
            for i in 0..c_in {
                for j in 0..per_group {
                    let c = (i / (c_in / groups)) * per_group + j;
                    let one = FakeQuant::symmetric(int8, &thresholds[c..=c], None).unwrap();
                    let at = (i * per_group + j) * kernel;
                    let want = one.apply(&data[at..at + kernel], &[kernel]).unwrap();
                    assert_eq!(got[at..at + kernel], want[..], "kernel {kernel} [{i}, {j}]");
                }
            }
            // The ungrouped reading of the same tensor has per_group channels only.
            let plain = FakeQuant::symmetric(int8, &thresholds, Some(1)).unwrap();
            assert!(plain.apply(&data, &shape).is_err());
        }
        let bad = FakeQuant::symmetric(int8, &[1.0, 2.0, 3.0], Some(1))
            .unwrap()
            .regrouped(2)
            .unwrap();
        assert!(
            bad.apply(&[0.0; 12], &[4, 3, 1]).is_err(),
            "3 scales cannot be 2 groups of 3"
        );
        let axis0 = FakeQuant::symmetric(int8, &[1.0, 2.0], Some(0)).unwrap();
        assert!(axis0.regrouped(2).is_err());
    }

    #[test]
    fn rejects_bad_parameters() {
        let int8: QType = "int8".parse().unwrap();
        assert!(FakeQuant::symmetric(int8, &[0.0], None).is_err());
        assert!(FakeQuant::symmetric(int8, &[-1.0], None).is_err());
        assert!(FakeQuant::symmetric(int8, &[f32::NAN], None).is_err());
        assert!(FakeQuant::symmetric(int8, &[1.0, 2.0], None).is_err());
        assert!(FakeQuant::int(-128, 127, vec![f32::INFINITY], vec![], None).is_err());
        assert!(FakeQuant::int(0, 255, vec![1.0], vec![300], None).is_err());
        let fq = FakeQuant::symmetric(int8, &[1.0, 2.0], Some(1)).unwrap();
        let mut d = vec![0.0; 6];
        assert!(fq.apply_in_place(&mut d, &[2, 3]).is_err());
        assert!(fq.apply_in_place(&mut d, &[3, 2]).is_ok());
        assert!(fq.apply_in_place(&mut d, &[6]).is_err());
        assert!(fq.apply_in_place(&mut d[..5], &[3, 2]).is_err());
    }

    #[test]
    fn symmetric_int8_rounds_half_even_and_saturates() {
        let fq = FakeQuant::symmetric("int8".parse().unwrap(), &[63.5], None).unwrap();
        // scale 0.5
        let x = [
            0.25,
            0.75,
            -0.25,
            1.25,
            100.0,
            -100.0,
            f32::NAN,
            f32::INFINITY,
        ];
        let y = fq.apply(&x, &[x.len()]).unwrap();
        assert_eq!(y, [0.0, 1.0, 0.0, 1.0, 63.5, -64.0, -64.0, 63.5]);
        assert!(y[2].is_sign_positive());
    }

    #[test]
    fn asymmetric_uint8() {
        let fq = FakeQuant::asymmetric("uint8".parse().unwrap(), -1.0, 3.0).unwrap();
        let FakeQuant::Int(p) = &fq else { panic!() };
        assert_eq!(p.scales(), &[4.0 / 255.0]);
        assert_eq!(
            p.zero_points(),
            &[255 - (3.0f32 / (4.0 / 255.0)).round_ties_even() as i32]
        );
        let y = fq.apply(&[-5.0, 10.0, 0.0], &[3]).unwrap();
        let s = 4.0f32 / 255.0;
        let zp = p.zero_points()[0];
        assert_eq!(y, [(-zp) as f32 * s, (255 - zp) as f32 * s, 0.0]);
    }

    #[test]
    fn per_channel_last_axis_and_leading_axis_agree_with_scalar() {
        let scales = [0.1f32, 0.2, 0.3];
        for (shape, axis) in [
            (vec![4usize, 3], 1usize),
            (vec![3usize, 100], 0),
            (vec![2, 3, 70], 1),
        ] {
            let fq = FakeQuant::int(-128, 127, scales.to_vec(), vec![], Some(axis)).unwrap();
            let n: usize = shape.iter().product();
            let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 20.0).collect();
            let y = fq.apply(&x, &shape).unwrap();
            let inner: usize = shape[axis + 1..].iter().product();
            for i in 0..n {
                let c = (i / inner) % shape[axis];
                assert_eq!(y[i], kernels::int_scalar(x[i], scales[c], -128.0, 127.0));
            }
        }
    }

    #[test]
    fn float16_round_trip() {
        let y = FakeQuant::Float16
            .apply(&[1.0 + 1.0 / 4096.0, 65520.0, 1e-8], &[3])
            .unwrap();
        assert_eq!(y, [1.0, f32::INFINITY, 0.0]);
    }
}
