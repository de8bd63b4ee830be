//! Calibration-data folders (HZCALIBRATION.md §6): one sub-folder per model input,
//! named like the input (`/` and `:` may be written `_`), each holding one `.npy` per
//! sample, ordered by the number in the file name. A single-input model may also be
//! given a folder of `.npy` files directly.

use std::path::{Path, PathBuf};

use crate::{DType, Tensor, TensorError, read_npy, write_npy_bytes};

/// What a model expects of one input.
#[derive(Clone, Debug)]
pub struct InputSpec {
    pub name: String,
    pub dtype: Option<DType>,
    /// `None` for an unknown rank; `None` entries are symbolic dimensions.
    pub dims: Option<Vec<Option<usize>>>,
}

/// The sample files of a data folder, matched to the model's inputs; tensors are read
/// on demand so memory does not grow with the number of samples. A dataset may also
/// hold its samples in memory ([`Dataset::from_tensors`]); `files` then holds labels.
#[derive(Clone, Debug)]
pub struct Dataset {
    inputs: Vec<InputSpec>,
    /// `files[input][sample]`.
    files: Vec<Vec<PathBuf>>,
    /// `memory[input][sample]`, for datasets built from tensors.
    memory: Option<std::sync::Arc<Vec<Vec<Tensor>>>>,
}

/// The name an input may have on disk.
pub fn sanitize_name(name: &str) -> String {
    name.replace(['/', ':', '\\'], "_")
}

impl Dataset {
    /// Matches `dir` to `inputs`. Errors name the folder or file at fault.
    pub fn open(dir: &Path, inputs: &[InputSpec]) -> Result<Dataset, TensorError> {
        let ctx = dir.display().to_string();
        if dir.is_file() {
            let swapped = if dir
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
            {
                " (the model comes first, then the data folder)"
            } else {
                ""
            };
            return Err(TensorError::invalid(
                &ctx,
                format!("a file; a calibration-data folder was expected{swapped}"),
            ));
        }
        if !dir.is_dir() {
            return Err(TensorError::invalid(&ctx, "data folder not found"));
        }
        if inputs.is_empty() {
            return Err(TensorError::invalid(
                &ctx,
                "the model has no inputs to feed",
            ));
        }
        let direct = npy_files(dir)?;
        let mut files = Vec::new();
        if inputs.len() == 1 && !direct.is_empty() && find_input_dir(dir, &inputs[0].name).is_none()
        {
            files.push(direct);
        } else {
            for input in inputs {
                let sub = find_input_dir(dir, &input.name).ok_or_else(|| {
                    let present: Vec<String> = std::fs::read_dir(dir)
                        .map(|rd| {
                            rd.flatten()
                                .filter(|e| e.path().is_dir())
                                .map(|e| e.file_name().to_string_lossy().into_owned())
                                .collect()
                        })
                        .unwrap_or_default();
                    TensorError::invalid(
                        &ctx,
                        format!(
                            "no sub-folder for model input '{}' (found: {})",
                            input.name,
                            if present.is_empty() {
                                "none".to_string()
                            } else {
                                present.join(", ")
                            }
                        ),
                    )
                })?;
                let f = npy_files(&sub)?;
                if f.is_empty() {
                    return Err(TensorError::invalid(
                        sub.display().to_string(),
                        "no .npy samples",
                    ));
                }
                files.push(f);
            }
        }
        let counts: Vec<usize> = files.iter().map(Vec::len).collect();
        check_counts(&ctx, inputs, &counts)?;
        if counts[0] == 0 {
            return Err(TensorError::invalid(&ctx, "no .npy samples"));
        }
        Ok(Dataset {
            inputs: inputs.to_vec(),
            files,
            memory: None,
        })
    }

    /// A dataset of samples already in memory: `samples[input]` holds the tensors of
    /// `inputs[input]`, one per sample. Every tensor is checked against its input like
    /// a file would be; errors name it as `'<input>'[<sample>]`.
    pub fn from_tensors(
        inputs: &[InputSpec],
        samples: Vec<Vec<Tensor>>,
    ) -> Result<Dataset, TensorError> {
        let ctx = "calibration data";
        if inputs.is_empty() {
            return Err(TensorError::invalid(ctx, "the model has no inputs to feed"));
        }
        if samples.len() != inputs.len() {
            return Err(TensorError::invalid(
                ctx,
                format!(
                    "{} input(s) given for a model with {}",
                    samples.len(),
                    inputs.len()
                ),
            ));
        }
        let counts: Vec<usize> = samples.iter().map(Vec::len).collect();
        check_counts(ctx, inputs, &counts)?;
        if counts[0] == 0 {
            return Err(TensorError::invalid(ctx, "no samples"));
        }
        let mut files = Vec::with_capacity(inputs.len());
        for (spec, tensors) in inputs.iter().zip(&samples) {
            let labels: Vec<PathBuf> = (0..tensors.len())
                .map(|i| PathBuf::from(format!("'{}'[{i}]", spec.name)))
                .collect();
            for (t, label) in tensors.iter().zip(&labels) {
                check(spec, t, label)?;
            }
            files.push(labels);
        }
        Ok(Dataset {
            inputs: inputs.to_vec(),
            files,
            memory: Some(std::sync::Arc::new(samples)),
        })
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.files[0].len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The file of `input` for `sample` (a label for in-memory datasets).
    pub fn file(&self, input: usize, sample: usize) -> &Path {
        &self.files[input][sample]
    }

    /// How reports name sample `i`: its file(s) for a folder, `sample i` for samples
    /// held in memory.
    pub fn sample_label(&self, i: usize) -> String {
        if self.memory.is_some() {
            return format!("sample {i}");
        }
        self.files
            .iter()
            .map(|files| files[i].display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `input` of `sample` as `.npy` bytes: the file's own, or for an in-memory
    /// dataset the tensor written as `.npy` (what a digest of the data hashes).
    pub fn npy_bytes(&self, input: usize, sample: usize) -> Result<Vec<u8>, TensorError> {
        if let Some(memory) = &self.memory {
            return write_npy_bytes(&memory[input][sample]);
        }
        let path = &self.files[input][sample];
        std::fs::read(path).map_err(|source| TensorError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    /// Reads sample `i`: one checked tensor per input, in input order.
    pub fn sample(&self, i: usize) -> Result<Vec<(String, Tensor)>, TensorError> {
        let mut out = Vec::with_capacity(self.inputs.len());
        if let Some(memory) = &self.memory {
            for (k, spec) in self.inputs.iter().enumerate() {
                out.push((spec.name.clone(), memory[k][i].clone()));
            }
            return Ok(out);
        }
        for (k, spec) in self.inputs.iter().enumerate() {
            let path = &self.files[k][i];
            let t = read_npy(path)?;
            check(spec, &t, path)?;
            out.push((spec.name.clone(), t));
        }
        Ok(out)
    }
}

/// Every input must have the same number of samples.
fn check_counts(ctx: &str, inputs: &[InputSpec], counts: &[usize]) -> Result<(), TensorError> {
    if counts.iter().all(|&c| c == counts[0]) {
        return Ok(());
    }
    let detail: Vec<String> = inputs
        .iter()
        .zip(counts)
        .map(|(i, c)| format!("'{}': {c}", i.name))
        .collect();
    Err(TensorError::invalid(
        ctx,
        format!(
            "inputs have different sample counts ({})",
            detail.join(", ")
        ),
    ))
}

fn check(spec: &InputSpec, t: &Tensor, path: &Path) -> Result<(), TensorError> {
    let ctx = path.display().to_string();
    if let Some(dt) = spec.dtype
        && dt != t.dtype()
    {
        return Err(TensorError::invalid(
            ctx,
            format!(
                "dtype {} does not match model input '{}' ({dt})",
                t.dtype(),
                spec.name
            ),
        ));
    }
    if let Some(dims) = &spec.dims {
        let ok = dims.len() == t.shape().len()
            && dims
                .iter()
                .zip(t.shape())
                .all(|(d, &s)| d.is_none_or(|d| d == s));
        if !ok {
            let want: Vec<String> = dims
                .iter()
                .map(|d| d.map_or("?".into(), |d| d.to_string()))
                .collect();
            return Err(TensorError::invalid(
                ctx,
                format!(
                    "shape {:?} does not match model input '{}' [{}]",
                    t.shape(),
                    spec.name,
                    want.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

fn find_input_dir(dir: &Path, name: &str) -> Option<PathBuf> {
    [name.to_string(), sanitize_name(name)]
        .into_iter()
        .filter(|n| !n.is_empty() && !n.contains(['/', '\\']) && n != "." && n != "..")
        .map(|n| dir.join(n))
        .find(|p| p.is_dir())
}

/// `.npy` files of a folder ordered by the number in their name (0, 1, 2, ..., 10),
/// then by name.
fn npy_files(dir: &Path) -> Result<Vec<PathBuf>, TensorError> {
    let rd = std::fs::read_dir(dir).map_err(|source| TensorError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let mut files: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "npy"))
        .collect();
    files.sort_by_key(|p| {
        let stem = p
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let digits: String = stem.chars().filter(|c| c.is_ascii_digit()).collect();
        (digits.parse::<u128>().ok(), stem)
    });
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write_npy;

    fn spec(name: &str) -> InputSpec {
        InputSpec {
            name: name.into(),
            dtype: Some(DType::F32),
            dims: Some(vec![None, Some(2)]),
        }
    }

    #[test]
    fn orders_numerically_and_matches_sanitized_names() {
        let d = tempfile::tempdir().unwrap();
        let sub = d.path().join("input_1");
        std::fs::create_dir(&sub).unwrap();
        for i in [10, 2, 0, 1] {
            write_npy(
                &sub.join(format!("{i}.npy")),
                &Tensor::from_f32(&[1, 2], vec![i as f32, 0.]).unwrap(),
            )
            .unwrap();
        }
        let ds = Dataset::open(d.path(), &[spec("input:1")]).unwrap();
        assert_eq!(ds.len(), 4);
        let firsts: Vec<f32> = (0..4)
            .map(|i| ds.sample(i).unwrap()[0].1.as_f32().unwrap()[[0, 0]])
            .collect();
        assert_eq!(firsts, vec![0., 1., 2., 10.]);
    }

    #[test]
    fn in_memory_samples_are_checked_and_served() {
        let t = |v: f32| Tensor::from_f32(&[1, 2], vec![v, 0.]).unwrap();
        let ds = Dataset::from_tensors(&[spec("x")], vec![vec![t(1.), t(2.)]]).unwrap();
        assert_eq!(ds.len(), 2);
        assert_eq!(ds.sample(1).unwrap()[0].1, t(2.));
        let bad = Tensor::from_f32(&[1, 3], vec![0.; 3]).unwrap();
        let e = Dataset::from_tensors(&[spec("x")], vec![vec![t(1.), bad]])
            .unwrap_err()
            .to_string();
        assert!(e.contains("'x'[1]") && e.contains("shape"), "{e}");
        let e = Dataset::from_tensors(&[spec("a"), spec("b")], vec![vec![t(1.)], vec![]])
            .unwrap_err()
            .to_string();
        assert!(e.contains("different sample counts"), "{e}");
    }

    #[test]
    fn mismatches_name_the_file() {
        let d = tempfile::tempdir().unwrap();
        write_npy(
            &d.path().join("0.npy"),
            &Tensor::from_f32(&[1, 3], vec![0.; 3]).unwrap(),
        )
        .unwrap();
        let ds = Dataset::open(d.path(), &[spec("x")]).unwrap();
        let e = ds.sample(0).unwrap_err().to_string();
        assert!(e.contains("0.npy") && e.contains("shape"), "{e}");
        let e = Dataset::open(d.path(), &[spec("a"), spec("b")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("no sub-folder for model input 'a'"), "{e}");
    }
}
