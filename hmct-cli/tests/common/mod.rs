//! What the CLI tests on the calibrated P-Net share: the fixture (model saved in a
//! temporary folder, the calibration data of ../shared/models) and the checks of a
//! finished run.

// Each test binary uses its own part of this module.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub model: PathBuf,
    pub data: PathBuf,
}

/// The calibrated P-Net in a temporary folder, or `None` (the test reported skipped)
/// without ../shared/models.
pub fn fixture() -> Option<Fixture> {
    let model = hmct_ir::testing::calibrated_pnet().unwrap()?;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("calibrated_model.onnx");
    hmct_ir::save_model(&model, &path).unwrap();
    let data = hmct_ir::testing::shared_dir()
        .unwrap()
        .join("models/mtcnn_pnet/calibration_data");
    Some(Fixture {
        dir,
        model: path,
        data,
    })
}

impl Fixture {
    /// `<command> MODEL DATA args...`, run in the fixture folder (so the default
    /// `./debug_result/` lands there).
    pub fn run(&self, command: &str, args: &[&str]) -> Output {
        let mut all: Vec<&OsStr> = vec![
            command.as_ref(),
            self.model.as_os_str(),
            self.data.as_os_str(),
        ];
        all.extend(args.iter().map(|a| OsStr::new(*a)));
        Command::new(env!("CARGO_BIN_EXE_hmct-debugger"))
            .args(&all)
            .current_dir(self.dir.path())
            .output()
            .unwrap()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn path_str(&self, name: &str) -> String {
        self.path(name).to_str().unwrap().to_string()
    }
}

/// The stdout of a run that must have succeeded.
pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "status {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

pub fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}
