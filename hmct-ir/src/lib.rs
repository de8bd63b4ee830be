//! The model API: load, inspect, edit and save calibrated ONNX models.
//!
//! A [`Model`] owns the ONNX protobuf message and an index of its main graph (node
//! names, producers, consumers, op types). Loading validates the graph (no cycles,
//! no dangling inputs, every value produced once), names unnamed nodes and sorts
//! the nodes topologically; nothing else in the message is changed, so a model
//! that is loaded and saved untouched comes back byte for byte when the input was
//! canonically encoded. HzCalibration nodes are read through [`CalibrationNode`] and
//! edited through [`CalibrationNodeMut`], and §5 of HZCALIBRATION.md (which
//! calibration nodes belong to which regular node) lives in [`find_input_calibration`]
//! and its siblings.
//!
//! A standard QDQ model (QuantizeLinear/DequantizeLinear, no calibration node) is
//! turned into a calibrated model as it is loaded ([`import_qdq`]), so every analysis
//! works on it unchanged; [`Model::imported_from_qdq`] tells.

mod attr;
mod calibration;
mod constant;
mod edit;
mod error;
mod external;
mod model;
mod opset;
mod qdq;
mod qdq_import;
mod qtype;
mod search;
mod suggest;
#[cfg(feature = "testing")]
pub mod testing;

pub use calibration::{
    CALIBRATION_DOMAIN, CALIBRATION_OP, CalibrationInsert, CalibrationNode, CalibrationNodeMut,
    CalibrationSpec, is_calibration_node,
};
pub use edit::{Change, Edit, EditError, EditReport, apply_edits, resolve, subgraph_nodes};
pub use error::{IrError, error_chain};
pub use model::{
    Dim, Model, NodeId, ValueType, load_model, load_model_from_bytes, model_to_bytes, save_model,
    save_model_with_external_data, write_atomic,
};
pub use opset::{OLDEST_RAISABLE_OPSET, OpsetError, RaisedOpset, raise_opset};
pub use qdq::{QdqDomain, QdqError, QdqExport, QdqOptions, export_qdq};
pub use qdq_import::{QdqImport, QdqImportError, import_qdq};
pub use qtype::{QType, TensorType};
pub use search::{
    SKIPPABLE_OPS, consumer_label, conv_transpose_groups, find_input_calibration,
    find_output_calibration, input_calibrations, is_quantized, is_skippable, quantized_consumers,
    quantized_nodes,
};
pub use suggest::{close_matches, did_you_mean, quote_list};
