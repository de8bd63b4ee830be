//! Fake quantization against onnxruntime's QuantizeLinear → DequantizeLinear
//! (fixtures/fake_quant_ort.json, made by fixtures/gen_fake_quant_fixtures.py), and
//! the AVX2 kernels against the portable ones.

use hmct_quant::fake_quant::{FakeQuant, QType, kernels};
use proptest::prelude::*;

fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|b| f32::from_bits(b.as_u64().unwrap() as u32))
        .collect()
}

#[test]
fn matches_onnxruntime_qdq_bit_for_bit() {
    let text = include_str!("fixtures/fake_quant_ort.json");
    let doc: serde_json::Value = serde_json::from_str(text).unwrap();
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 18);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let scales = floats(&case["scales"]);
        let zps: Vec<i32> = case["zero_points"]
            .as_array()
            .unwrap()
            .iter()
            .map(|z| z.as_i64().unwrap() as i32)
            .collect();
        let axis = case["axis"].as_u64().map(|a| a as usize);
        let shape: Vec<usize> = case["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        let fq = FakeQuant::int(
            case["qmin"].as_i64().unwrap() as i32,
            case["qmax"].as_i64().unwrap() as i32,
            scales,
            zps,
            axis,
        )
        .unwrap();
        let x = floats(&case["x"]);
        let want = floats(&case["y"]);
        let got = fq.apply(&x, &shape).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{name}[{i}]: x={:e} got {g:e} want {w:e}",
                x[i]
            );
        }
    }
}

#[test]
fn symmetric_thresholds_give_onnxruntime_scales() {
    // The fixtures' "int8_per_tensor_s0.02126" case was made with scale 2.7/127.
    let fq = FakeQuant::symmetric(
        QType::Int {
            bits: 8,
            signed: true,
        },
        &[2.7],
        None,
    )
    .unwrap();
    let FakeQuant::Int(p) = fq else {
        panic!("int expected")
    };
    assert_eq!(p.scales(), &[2.7f32 / 127.0]);
    assert_eq!((p.qmin(), p.qmax()), (-128, 127));
}

#[test]
fn large_tensors_split_across_threads_match_the_scalar_kernel() {
    let n = 300_001;
    let x: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.001).sin() * 3.0).collect();
    let fq = FakeQuant::symmetric(
        QType::Int {
            bits: 8,
            signed: true,
        },
        &[2.5],
        None,
    )
    .unwrap();
    let s = 2.5f32 / 127.0;
    let y = fq.apply(&x, &[n]).unwrap();
    for (a, b) in x.iter().zip(&y) {
        assert_eq!(
            b.to_bits(),
            kernels::int_scalar(*a, s, -128.0, 127.0).to_bits()
        );
    }
    let pc = FakeQuant::symmetric(
        QType::Int {
            bits: 16,
            signed: true,
        },
        &[1.0, 2.0, 3.0],
        Some(0),
    )
    .unwrap();
    let y = pc.apply(&x[..300_000], &[3, 100_000]).unwrap();
    for (i, (a, b)) in x.iter().zip(&y).enumerate() {
        let s = (1 + i / 100_000) as f32 / 32767.0;
        assert_eq!(
            b.to_bits(),
            kernels::int_scalar(*a, s, -32768.0, 32767.0).to_bits()
        );
    }
}

fn any_f32() -> impl Strategy<Value = f32> {
    prop_oneof![
        any::<u32>().prop_map(f32::from_bits),
        (-400.0f32..400.0),
        (-300i32..300).prop_map(|k| k as f32 * 0.5),
    ]
}

proptest! {
    #[test]
    fn simd_equals_portable_uniform(
        x in prop::collection::vec(any_f32(), 0..70),
        s in 1e-6f32..100.0,
        zp in -20i32..20,
    ) {
        let (lo, hi) = ((-128 - zp) as f32, (127 - zp) as f32);
        let mut a = x.clone();
        let mut b = x.clone();
        kernels::int_uniform(&mut a, s, lo, hi);
        kernels::int_uniform_portable(&mut b, s, lo, hi);
        for (p, q) in a.iter().zip(&b) {
            prop_assert_eq!(p.to_bits(), q.to_bits());
        }
    }

    #[test]
    fn simd_equals_portable_per_element(
        xs in prop::collection::vec((any_f32(), 1e-4f32..10.0), 0..70),
    ) {
        let mut a: Vec<f32> = xs.iter().map(|p| p.0).collect();
        let mut b = a.clone();
        let s: Vec<f32> = xs.iter().map(|p| p.1).collect();
        let lo = vec![-32768.0; s.len()];
        let hi = vec![32767.0; s.len()];
        kernels::int_per_element(&mut a, &s, &lo, &hi);
        kernels::int_per_element_portable(&mut b, &s, &lo, &hi);
        for (p, q) in a.iter().zip(&b) {
            prop_assert_eq!(p.to_bits(), q.to_bits());
        }
    }

    #[test]
    fn simd_equals_portable_float16(x in prop::collection::vec(any_f32(), 0..70)) {
        let mut a = x.clone();
        let mut b = x.clone();
        kernels::f16_round_trip(&mut a);
        kernels::f16_round_trip_portable(&mut b);
        for (p, q) in a.iter().zip(&b) {
            prop_assert_eq!(p.to_bits(), q.to_bits());
        }
    }
}
