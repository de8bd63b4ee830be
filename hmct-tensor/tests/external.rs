//! Tensors stored as ONNX external data: read from a side file at an offset, small
//! ones through a read, large ones (1 MiB and up) through a memory map. Both paths
//! must give the same values, at offsets that are not page-aligned too, and refuse
//! ranges that leave the file.

use std::path::Path;

use hmct_proto::onnx::{StringStringEntryProto, TensorProto, tensor_proto::DataLocation};
use hmct_tensor::{Tensor, tensor_from_proto};

fn external(name: &str, dims: &[i64], location: &str, offset: u64, length: u64) -> TensorProto {
    let entry = |key: &str, value: String| StringStringEntryProto {
        key: Some(key.into()),
        value: Some(value),
    };
    TensorProto {
        name: Some(name.into()),
        data_type: Some(1), // FLOAT
        dims: dims.to_vec(),
        data_location: Some(DataLocation::External as i32),
        external_data: vec![
            entry("location", location.into()),
            entry("offset", offset.to_string()),
            entry("length", length.to_string()),
        ],
        ..TensorProto::default()
    }
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2654435761) ^ seed) as f32 / 1e6 - 2000.0)
        .collect()
}

fn le_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn read(t: &TensorProto, dir: &Path) -> Vec<f32> {
    match tensor_from_proto(t, Some(dir)).unwrap() {
        Tensor::F32(a) => a.iter().copied().collect(),
        other => panic!("expected f32, got {:?}", other.dtype()),
    }
}

#[test]
fn small_and_mapped_tensors_read_back_at_unaligned_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let small = values(1000, 1);
    // 3 * 2^18 floats = 3 MiB: above the mapping threshold.
    let big = values(3 << 18, 2);
    // A 13-byte header puts both tensors at offsets no page or float is aligned to.
    let mut file = vec![0xAAu8; 13];
    let small_at = file.len() as u64;
    file.extend(le_bytes(&small));
    let big_at = file.len() as u64;
    file.extend(le_bytes(&big));
    file.extend([0x55u8; 7]);
    std::fs::write(dir.path().join("w.bin"), &file).unwrap();

    let t = external("small", &[10, 100], "w.bin", small_at, 4000);
    assert_eq!(read(&t, dir.path()), small);
    let t = external(
        "big",
        &[3, 1 << 18],
        "w.bin",
        big_at,
        (big.len() * 4) as u64,
    );
    let got = read(&t, dir.path());
    assert!(
        got.iter()
            .zip(&big)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
    assert_eq!(got.len(), big.len());
}

#[test]
fn a_mapped_range_past_the_end_of_the_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let big = values(1 << 18, 3);
    std::fs::write(dir.path().join("w.bin"), le_bytes(&big)).unwrap();
    // One float more than the file holds.
    let t = external("big", &[(1 << 18) + 1], "w.bin", 0, ((1 << 18) + 1) * 4);
    let err = tensor_from_proto(&t, Some(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("exceeds file size"), "{err}");
    // The right length at an offset that pushes it past the end.
    let t = external("big", &[1 << 18], "w.bin", 4, (1 << 18) * 4);
    let err = tensor_from_proto(&t, Some(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("exceeds file size"), "{err}");
}
