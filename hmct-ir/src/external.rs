//! Saving models whose weights live outside the protobuf: ONNX external data.
//!
//! Two cases need a side file. A model whose tensors are already external, saved into
//! another folder: the relative locations would point at nothing there. And a model
//! too big for one protobuf message (2 GiB): it cannot be encoded at all. Then every
//! external tensor, and every initializer of at least [`EXTERNAL_MIN_BYTES`], is
//! written to `<model file name>.data` beside the model, and the message references it.

use std::io::Write;
use std::path::{Path, PathBuf};

use hmct_proto::onnx::{
    ModelProto, StringStringEntryProto, TensorProto, tensor_proto::DataLocation,
};
use prost::Message;

use crate::IrError;

/// Protobuf messages cannot exceed 2 GiB.
const PROTOBUF_LIMIT: usize = (1 << 31) - 1;

/// Initializers smaller than this stay inside the message (as onnx's own saver does).
pub const EXTERNAL_MIN_BYTES: usize = 1024;

/// Whether `proto`, saved at `path` from a model read in `base_dir`, needs a data file.
pub(crate) fn needs_data_file(proto: &ModelProto, base_dir: Option<&Path>, path: &Path) -> bool {
    let has_external = proto
        .graph
        .iter()
        .flat_map(|g| &g.initializer)
        .any(is_external);
    (has_external && !same_folder(base_dir, path)) || proto.encoded_len() > PROTOBUF_LIMIT
}

/// Moves every external tensor and every initializer of at least
/// [`EXTERNAL_MIN_BYTES`] of `proto` into one data file beside `path`, written through
/// a temporary file and a rename. Returns the data file's path.
pub(crate) fn write_data_file(
    proto: &mut ModelProto,
    base_dir: Option<&Path>,
    path: &Path,
    min_bytes: usize,
) -> Result<PathBuf, IrError> {
    let data_path = data_file_path(path);
    let file_name = data_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let io = |error| IrError::Io {
        file: data_path.display().to_string(),
        error,
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".hmct-save-")
        .tempfile_in(dir)
        .map_err(io)?;
    let mut writer = std::io::BufWriter::new(tmp.as_file_mut());
    let mut offset = 0u64;
    if let Some(graph) = proto.graph.as_mut() {
        for t in &mut graph.initializer {
            let external = is_external(t);
            let raw = if external {
                // Read through the tensor reader, which checks the location and bounds.
                let tensor = hmct_tensor::tensor_from_proto(t, base_dir).map_err(|error| {
                    IrError::Tensor {
                        file: path.display().to_string(),
                        value: t.name().to_string(),
                        error,
                    }
                })?;
                hmct_tensor::tensor_to_proto(&tensor, t.name())
                    .raw_data
                    .unwrap_or_default()
            } else {
                match numeric_raw_data(t) {
                    Some(raw) if raw.len() >= min_bytes => raw,
                    _ => continue,
                }
            };
            writer.write_all(&raw).map_err(io)?;
            let entry = |key: &str, value: String| StringStringEntryProto {
                key: Some(key.into()),
                value: Some(value),
            };
            t.external_data = vec![
                entry("location", file_name.clone()),
                entry("offset", offset.to_string()),
                entry("length", raw.len().to_string()),
            ];
            t.set_data_location(DataLocation::External);
            clear_values(t);
            offset += raw.len() as u64;
        }
    }
    writer.flush().map_err(io)?;
    drop(writer);
    tmp.as_file().sync_all().map_err(io)?;
    tmp.persist(&data_path).map_err(|e| io(e.error))?;
    Ok(data_path)
}

/// `<file name>.data` beside `path`.
pub(crate) fn data_file_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| format!("{}.data", n.to_string_lossy()))
        .unwrap_or_else(|| "model.onnx.data".into());
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.join(name),
        _ => PathBuf::from(name),
    }
}

fn is_external(t: &TensorProto) -> bool {
    t.data_location() == DataLocation::External
}

/// The little-endian bytes of a numeric tensor held in the message (strings stay).
fn numeric_raw_data(t: &TensorProto) -> Option<Vec<u8>> {
    if t.data_type() == hmct_proto::onnx::tensor_proto::DataType::String as i32 {
        return None;
    }
    if let Some(raw) = &t.raw_data {
        return Some(raw.clone());
    }
    let tensor = hmct_tensor::tensor_from_proto(t, None).ok()?;
    hmct_tensor::tensor_to_proto(&tensor, t.name()).raw_data
}

fn clear_values(t: &mut TensorProto) {
    t.raw_data = None;
    t.float_data.clear();
    t.int32_data.clear();
    t.int64_data.clear();
    t.double_data.clear();
    t.uint64_data.clear();
}

fn same_folder(base_dir: Option<&Path>, path: &Path) -> bool {
    let target = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    match (
        base_dir.map(std::fs::canonicalize),
        std::fs::canonicalize(target),
    ) {
        (Some(Ok(a)), Ok(b)) => a == b,
        _ => false,
    }
}
