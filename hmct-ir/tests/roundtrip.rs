//! Load → save of every real model and every ONNX conformance model in ../shared.

use std::path::{Path, PathBuf};

use hmct_ir::{IrError, load_model, model_to_bytes, save_model, testing::shared_dir};
use hmct_proto::Message;
use hmct_proto::onnx::ModelProto;

fn onnx_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            onnx_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "onnx") {
            out.push(p);
        }
    }
}

/// Checks one file: the saved message is the original with only the allowed load
/// changes (names for unnamed nodes), and bytes are identical where the original is
/// canonically encoded. Returns whether the file was byte-identical.
fn check(path: &Path) -> bool {
    let bytes = std::fs::read(path).unwrap();
    let original = ModelProto::decode(bytes.as_slice()).unwrap();
    let model = match load_model(path) {
        // The QuantizeLinear/DequantizeLinear operators' own cases are lone nodes,
        // which the loader refuses as a QDQ model (qdq_import.rs); a model it imports
        // is rewritten, so neither is a load → save round trip.
        Err(IrError::QdqImport { error, .. }) => {
            eprintln!("{}: not round-tripped: {error}", path.display());
            return false;
        }
        Ok(m) if m.imported_from_qdq().is_some() => return false,
        other => other.unwrap_or_else(|e| panic!("{e}")),
    };
    let saved = model_to_bytes(&model);
    let reloaded = ModelProto::decode(saved.as_slice()).unwrap();

    // Corpus files are already topologically sorted, so node order must not change;
    // only empty names may have been filled, with `<op_type>_<n>`, all unique.
    let mut expected = original.clone();
    let orig_nodes = &original.graph.as_ref().unwrap().node;
    let new_nodes = &model.proto().graph.as_ref().unwrap().node;
    assert_eq!(orig_nodes.len(), new_nodes.len(), "{}", path.display());
    let mut names = std::collections::HashSet::new();
    for (i, (o, n)) in orig_nodes.iter().zip(new_nodes).enumerate() {
        assert!(
            names.insert(n.name().to_string()),
            "{}: duplicate {}",
            path.display(),
            n.name()
        );
        if o.name().is_empty() {
            let suffix = n.name().strip_prefix(&format!("{}_", o.op_type()));
            assert!(
                suffix.is_some_and(|s| s.parse::<usize>().is_ok()),
                "{}: node {i} named {}",
                path.display(),
                n.name()
            );
            expected.graph.as_mut().unwrap().node[i].name = n.name.clone();
        }
    }
    // Compared through prost's deterministic encoding: PartialEq would call
    // messages holding NaN attributes unequal to themselves.
    assert!(
        reloaded.encode_to_vec() == expected.encode_to_vec(),
        "{}: saved message differs",
        path.display()
    );
    // Where the original is canonical, the saved bytes are those of the expected
    // message: byte-identical to the file when no name had to be added.
    let canonical = original.encode_to_vec() == bytes;
    if canonical {
        assert!(
            saved == expected.encode_to_vec(),
            "{}: bytes differ",
            path.display()
        );
    }
    // Saving is idempotent: a saved model loads and saves to the same bytes.
    let again = hmct_ir::load_model_from_bytes(&saved).unwrap();
    assert!(
        model_to_bytes(&again) == saved,
        "{}: second save differs",
        path.display()
    );
    canonical && orig_nodes.iter().all(|n| !n.name().is_empty())
}

#[test]
fn real_models_round_trip() {
    let Some(shared) = shared_dir() else {
        return;
    };
    let mut files = Vec::new();
    onnx_files(&shared.join("models"), &mut files);
    assert_eq!(files.len(), 5, "models in ../shared/models");
    let mut identical = 0;
    for f in &files {
        identical += check(f) as usize;
    }
    // The three MTCNN models name every node and are canonical: byte-identical.
    assert!(identical >= 3, "{identical} byte-identical");

    // And through a file, as a user would.
    let dir = tempfile::tempdir().unwrap();
    let src = shared.join("models/mtcnn_pnet/pnet.onnx");
    let dst = dir.path().join("copy.onnx");
    save_model(&load_model(&src).unwrap(), &dst).unwrap();
    assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&dst).unwrap());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
    assert_eq!(leftovers.len(), 1, "no temporary files left behind");
}

#[test]
fn conformance_models_round_trip() {
    let Some(shared) = shared_dir() else {
        return;
    };
    let mut files = Vec::new();
    onnx_files(&shared.join("onnx-node-tests"), &mut files);
    assert!(
        files.len() > 2000,
        "only {} conformance models",
        files.len()
    );
    let identical: usize = files.iter().map(|f| check(f) as usize).sum();
    eprintln!(
        "{} conformance models round-tripped, {identical} byte-identical as files",
        files.len()
    );
}
