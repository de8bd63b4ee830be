//! Fake quantization (quantize then dequantize) as HZCALIBRATION.md §3 defines it.
