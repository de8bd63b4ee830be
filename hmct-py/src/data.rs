//! Calibration data from Python: a folder path, or a mapping input name → sequence
//! of numpy arrays (one per sample); and tensors back to numpy.

use std::sync::Arc;

use hmct_tensor::{Dataset, InputSpec, Tensor, sanitize_name};
use numpy::{IntoPyArray, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{to_py, value_error};

/// Where the samples come from.
pub(crate) enum DataSource {
    Folder(std::path::PathBuf),
    /// `samples[input][sample]`, inputs in the model's order.
    Memory(Vec<Vec<Tensor>>),
}

impl DataSource {
    /// `data` is a path (str or os.PathLike) or a dict of lists of arrays; `inputs`
    /// are the model's inputs the dict keys must name (sanitized names are accepted
    /// too, as for folders).
    pub(crate) fn from_py(data: &Bound<'_, PyAny>, inputs: &[InputSpec]) -> PyResult<DataSource> {
        if let Ok(path) = data.extract::<std::path::PathBuf>() {
            return Ok(DataSource::Folder(path));
        }
        let dict = data.cast::<PyDict>().map_err(|_| {
            value_error("calibrated_data must be a folder path or a dict of input name -> list of numpy arrays")
        })?;
        let known: Vec<&str> = inputs.iter().map(|i| i.name.as_str()).collect();
        let mut samples: Vec<Option<Vec<Tensor>>> = inputs.iter().map(|_| None).collect();
        for (key, value) in dict.iter() {
            let key: String = key
                .extract()
                .map_err(|_| value_error("calibrated_data keys must be input names (str)"))?;
            let Some(k) = inputs
                .iter()
                .position(|i| i.name == key || sanitize_name(&i.name) == key)
            else {
                let hint =
                    hmct_ir::did_you_mean(&hmct_ir::close_matches(&key, known.iter().copied()));
                return Err(value_error(format!(
                    "calibrated_data: '{key}' is not a model input{hint}; the inputs are {}",
                    hmct_ir::quote_list(&known.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                )));
            };
            let arrays: Vec<Bound<'_, PyAny>> = value
                .try_iter()
                .and_then(|it| it.collect::<PyResult<Vec<_>>>())
                .map_err(|_| {
                    value_error(format!(
                        "calibrated_data['{key}'] must be a list of numpy arrays"
                    ))
                })?;
            let tensors = arrays
                .iter()
                .enumerate()
                .map(|(i, a)| {
                    to_tensor(a)
                        .map_err(|m| value_error(format!("calibrated_data['{key}'][{i}]: {m}")))
                })
                .collect::<PyResult<Vec<Tensor>>>()?;
            samples[k] = Some(tensors);
        }
        let mut out = Vec::with_capacity(inputs.len());
        for (spec, s) in inputs.iter().zip(samples) {
            out.push(s.ok_or_else(|| {
                value_error(format!(
                    "calibrated_data has no samples for model input '{}'",
                    spec.name
                ))
            })?);
        }
        Ok(DataSource::Memory(out))
    }

    pub(crate) fn dataset(self, inputs: &[InputSpec]) -> PyResult<Dataset> {
        match self {
            DataSource::Folder(dir) => Dataset::open(&dir, inputs).map_err(|e| data_err(&e, &dir)),
            DataSource::Memory(samples) => {
                Dataset::from_tensors(inputs, samples).map_err(|e| to_py(&e, true))
            }
        }
    }
}

/// A folder that is missing or unreadable is a file problem; a folder whose files do
/// not fit the model is a mistake in the arguments, as in the CLI.
fn data_err(e: &hmct_tensor::TensorError, dir: &std::path::Path) -> PyErr {
    if !dir.is_dir() {
        return pyo3::exceptions::PyFileNotFoundError::new_err(format!(
            "{}: calibration-data folder not found",
            dir.display()
        ));
    }
    to_py(e, !matches!(e, hmct_tensor::TensorError::Io { .. }))
}

/// A numpy array (any supported dtype, any layout) as a tensor in standard layout:
/// one copy, straight into the tensor.
fn to_tensor(a: &Bound<'_, PyAny>) -> Result<Tensor, String> {
    macro_rules! try_types {
        ($($t:ty),*) => {$(
            if let Ok(arr) = a.cast::<PyArrayDyn<$t>>() {
                let ro = arr.readonly();
                let view = ro.as_array();
                return Ok(Tensor::from(view.as_standard_layout().into_owned()));
            }
        )*};
    }
    try_types!(f32, f64, i64, i32, i16, i8, u8, u16, u32, u64, bool);
    if let Ok(arr) = a.cast::<numpy::PyUntypedArray>() {
        return Err(format!("unsupported dtype {}", arr.dtype()));
    }
    Err(format!(
        "expected a numpy array, got {}",
        a.get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default()
    ))
}

/// A tensor as a numpy array; a tensor nobody else holds is moved, not copied.
pub(crate) fn to_numpy<'py>(py: Python<'py>, t: Arc<Tensor>) -> PyResult<Bound<'py, PyAny>> {
    let t = Arc::try_unwrap(t).unwrap_or_else(|shared| (*shared).clone());
    macro_rules! out {
        ($($v:ident),*) => {
            match t {
                $(Tensor::$v(a) => Ok(a.into_pyarray(py).into_any()),)*
                other => Err(value_error(format!("cannot hand a {} tensor to numpy", other.dtype()))),
            }
        };
    }
    out!(F32, F64, I8, I16, I32, I64, U8, U16, U32, U64, Bool)
}
