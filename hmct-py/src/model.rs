//! `_native.Model`: a loaded model and the node-level reads and edits the seeds' IR
//! snippets use. Nodes are addressed by their index in the graph (stable under the
//! attribute edits offered here); the Python classes of `hmct_rs.ir` wrap them.

use hmct_ir::{Edit, IrError, Model, NodeId, QType};
use numpy::PyReadonlyArrayDyn;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::{to_py, value_error};

#[pyclass(name = "Model", module = "hmct_rs._native")]
pub(crate) struct PyModel {
    pub(crate) model: Model,
}

fn ir(e: IrError) -> PyErr {
    // Only the edits' own checks (bad thresholds, unknown qtypes, names) are the
    // caller's mistakes; reading and writing files are not.
    let usage = matches!(
        e,
        IrError::InvalidCalibration { .. }
            | IrError::UnknownNode { .. }
            | IrError::NotCalibration { .. }
    );
    to_py(&e, usage)
}

impl PyModel {
    fn node_checked(&self, id: NodeId) -> PyResult<&hmct_proto::onnx::NodeProto> {
        self.model
            .nodes()
            .get(id)
            .ok_or_else(|| value_error(format!("no node with index {id}")))
    }

    fn calibration(&self, id: NodeId) -> PyResult<hmct_ir::CalibrationNode<'_>> {
        let node = self.node_checked(id)?;
        self.model.calibration(id).ok_or_else(|| {
            value_error(format!(
                "node '{}' is not an HzCalibration node",
                node.name()
            ))
        })
    }

    fn calibration_mut(&mut self, id: NodeId) -> PyResult<hmct_ir::CalibrationNodeMut<'_>> {
        self.calibration(id)?;
        Ok(self.model.calibration_mut(id).expect("checked above"))
    }
}

#[pymethods]
impl PyModel {
    /// Reads a model file (ONNX, calibrated or QDQ).
    #[staticmethod]
    fn load(py: Python<'_>, path: std::path::PathBuf) -> PyResult<PyModel> {
        let model = py.detach(|| hmct_ir::load_model(&path)).map_err(ir)?;
        Ok(PyModel { model })
    }

    /// Reads a model from the bytes of an ONNX file.
    #[staticmethod]
    fn from_bytes(py: Python<'_>, data: &[u8]) -> PyResult<PyModel> {
        let model = py
            .detach(|| hmct_ir::load_model_from_bytes(data))
            .map_err(|e| to_py(&e, !matches!(e, IrError::Io { .. })))?;
        Ok(PyModel { model })
    }

    /// The bytes of the model as `save` would write them.
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let bytes = py.detach(|| hmct_ir::model_to_bytes(&self.model));
        PyBytes::new(py, &bytes)
    }

    /// Writes the model atomically (a temporary file, then a rename).
    fn save(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        py.detach(|| hmct_ir::save_model(&self.model, &path))
            .map_err(ir)
    }

    /// An independent copy.
    fn copy(&self) -> PyModel {
        PyModel {
            model: self.model.clone(),
        }
    }

    /// Where the model was read from (`<memory>` for bytes).
    #[getter]
    fn file(&self) -> String {
        self.model.file().to_string()
    }

    /// The graph inputs the data feeds (initializers excluded).
    #[getter]
    fn inputs(&self) -> Vec<String> {
        self.model.inputs().to_vec()
    }

    #[getter]
    fn outputs(&self) -> Vec<String> {
        self.model.outputs().to_vec()
    }

    fn node_count(&self) -> usize {
        self.model.nodes().len()
    }

    /// `(name, op_type, domain, inputs, outputs)` of every node, in graph order.
    #[allow(clippy::type_complexity)]
    fn node_table(&self) -> Vec<(String, String, String, Vec<String>, Vec<String>)> {
        self.model
            .nodes()
            .iter()
            .map(|n| {
                (
                    n.name().to_string(),
                    n.op_type().to_string(),
                    n.domain().to_string(),
                    n.input.clone(),
                    n.output.clone(),
                )
            })
            .collect()
    }

    /// The index of the node called `name`, or None.
    fn node_index(&self, name: &str) -> Option<NodeId> {
        self.model.node_mappings().get(name).copied()
    }

    /// Node names close to `name`, for error messages.
    fn suggestions(&self, name: &str) -> Vec<String> {
        hmct_ir::close_matches(name, self.model.nodes().iter().map(|n| n.name()))
    }

    /// The calibration node quantizing input `index` of node `id` (any input when
    /// None), searched upwards through skippable ops (HZCALIBRATION.md §5).
    #[pyo3(signature = (id, index=None))]
    fn find_input_calibration(&self, id: NodeId, index: Option<usize>) -> PyResult<Option<NodeId>> {
        self.node_checked(id)?;
        Ok(hmct_ir::find_input_calibration(&self.model, id, index))
    }

    /// The first calibration node reading output `index` of node `id` (any output
    /// when None), through skippable ops.
    #[pyo3(signature = (id, index=None))]
    fn find_output_calibration(
        &self,
        id: NodeId,
        index: Option<usize>,
    ) -> PyResult<Option<NodeId>> {
        self.node_checked(id)?;
        Ok(hmct_ir::find_output_calibration(&self.model, id, index))
    }

    fn is_calibration(&self, id: NodeId) -> bool {
        self.model.is_calibration(id)
    }

    fn qtype(&self, id: NodeId) -> PyResult<String> {
        Ok(self.calibration(id)?.qtype().to_string())
    }

    fn thresholds(&self, id: NodeId) -> PyResult<Vec<f32>> {
        Ok(self.calibration(id)?.thresholds())
    }

    fn scales(&self, id: NodeId) -> PyResult<Vec<f32>> {
        Ok(self.calibration(id)?.scales())
    }

    fn zero_point(&self, id: NodeId) -> PyResult<Vec<i64>> {
        Ok(self.calibration(id)?.zero_point())
    }

    fn axis(&self, id: NodeId) -> PyResult<Option<i64>> {
        Ok(self.calibration(id)?.axis())
    }

    fn tensor_type(&self, id: NodeId) -> PyResult<String> {
        Ok(self.calibration(id)?.tensor_type().as_str().to_string())
    }

    fn switch_on(&self, id: NodeId) -> PyResult<bool> {
        Ok(self.calibration(id)?.switch_on())
    }

    fn set_qtype(&mut self, id: NodeId, qtype: &str) -> PyResult<()> {
        let q = QType::from_name(qtype);
        if !q.is_known() {
            return Err(value_error(format!(
                "qtype '{qtype}' is not supported; use int8, int16, float16 or float32 (or uint8, uint16, int4)"
            )));
        }
        self.calibration_mut(id)?.set_qtype(q).map_err(ir)
    }

    /// Takes a float32 array of any shape (read in order).
    fn set_thresholds(
        &mut self,
        id: NodeId,
        thresholds: PyReadonlyArrayDyn<'_, f32>,
    ) -> PyResult<()> {
        let values: Vec<f32> = thresholds.as_array().iter().copied().collect();
        self.calibration_mut(id)?.set_thresholds(values).map_err(ir)
    }

    fn set_switch(&mut self, id: NodeId, on: bool) -> PyResult<()> {
        self.calibration_mut(id)?.set_switch(on);
        Ok(())
    }

    /// Sets the activation input calibration nodes of these regular nodes to `qtype`
    /// (Horizon's `node_config` meaning); returns the calibration nodes changed.
    fn promote(&mut self, nodes: Vec<String>, qtype: &str) -> PyResult<Vec<String>> {
        let q = QType::from_name(qtype);
        let edit = Edit::NodesQType { nodes, qtype: q };
        let report = hmct_ir::apply_edits(&mut self.model, &[edit]).map_err(|e| to_py(&e, true))?;
        Ok(report.changes.iter().map(|c| c.node.clone()).collect())
    }

    /// The model as standard QuantizeLinear/DequantizeLinear ONNX: (model, domain,
    /// calibration nodes written as Q/DQ). `domain`: None (standard when the opset
    /// allows, else com.microsoft), "standard" or "com.microsoft".
    #[pyo3(signature = (domain=None))]
    fn export_qdq(
        &self,
        py: Python<'_>,
        domain: Option<&str>,
    ) -> PyResult<(PyModel, String, usize)> {
        use hmct_ir::{QdqDomain, QdqOptions};
        let domain = match domain.map(|d| d.trim().to_ascii_lowercase()) {
            None => None,
            Some(d) if d == "standard" || d.is_empty() || d == "ai.onnx" => {
                Some(QdqDomain::Standard)
            }
            Some(d) if d == "com.microsoft" || d == "microsoft" => Some(QdqDomain::Microsoft),
            Some(d) => {
                return Err(value_error(format!(
                    "domain '{d}' is not 'standard' or 'com.microsoft'"
                )));
            }
        };
        let out = py
            .detach(|| hmct_ir::export_qdq(&self.model, &QdqOptions { domain }))
            .map_err(|e| to_py(&e, true))?;
        let name = match out.domain {
            QdqDomain::Standard => "standard",
            QdqDomain::Microsoft => "com.microsoft",
        };
        Ok((
            PyModel { model: out.model },
            name.to_string(),
            out.quantized,
        ))
    }

    fn __repr__(&self) -> String {
        format!(
            "<hmct_rs Model {} ({} nodes, {} calibration nodes)>",
            self.model.file(),
            self.model.nodes().len(),
            self.model.calibration_nodes().len()
        )
    }
}
