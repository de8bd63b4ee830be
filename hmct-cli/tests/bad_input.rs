//! The bad-input matrix: every way a model, a data folder, a node name, a list
//! argument or an output path can be wrong, through the built binary. Each case must
//! end with exit status 2 (usage) or 1 (runtime), exactly one line on stderr that
//! starts `error: ` and names the file or argument at fault, no panic, and nothing
//! written where the command was told to write.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;

use hmct_ir::testing::build::{float_value, model, node};
use hmct_proto::Message;
use hmct_proto::onnx::NodeProto;
use hmct_tensor::Tensor;

const USAGE: i32 = 2;
const RUNTIME: i32 = 1;

fn example(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/tiny_cnn")
        .join(file)
}

fn calibrated() -> PathBuf {
    example("calibrated_model.onnx")
}

fn float_model() -> PathBuf {
    example("float_model.onnx")
}

fn good_data() -> PathBuf {
    example("calibration_data")
}

/// What a run left: its exit code and stderr.
struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn run(args: &[OsString]) -> Outcome {
    let out = Command::new(env!("CARGO_BIN_EXE_hmct-debugger"))
        .args(args)
        // A panic would print its backtrace: the checks below would see it.
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    Outcome {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn os(items: &[&dyn AsRef<OsStr>]) -> Vec<OsString> {
    items.iter().map(|s| s.as_ref().to_os_string()).collect()
}

/// The files and folders under `dir`, relative, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            found.push(p.strip_prefix(dir).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    found.sort();
    found
}

/// Runs `args` and checks the failure contract: `out` must look the same (names and
/// contents) afterwards. Returns what broke the contract, if anything.
fn check_failure(
    label: &str,
    args: &[OsString],
    status: i32,
    names: &str,
    out: &Path,
) -> Result<(), String> {
    let snapshot = || -> Vec<(String, Option<Vec<u8>>)> {
        listing(out)
            .into_iter()
            .map(|f| {
                let bytes = std::fs::read(out.join(&f)).ok();
                (f, bytes)
            })
            .collect()
    };
    let before = snapshot();
    let r = run(args);
    let context = format!(
        "{label}: status {:?}, stderr: {}",
        r.code,
        r.stderr.trim_end()
    );
    if r.code != Some(status) {
        return Err(format!("{context}\n  expected status {status}"));
    }
    if r.stderr.contains("panicked") || r.stderr.contains("backtrace") {
        return Err(format!("{context}\n  a panic"));
    }
    let lines: Vec<&str> = r.stderr.lines().collect();
    if lines.len() != 1 || !lines[0].starts_with("error: ") {
        return Err(format!("{context}\n  not one `error: ` line"));
    }
    if !lines[0].contains(names) {
        return Err(format!("{context}\n  does not name `{names}`"));
    }
    if let Some(part) = repeated_part(&lines[0]["error: ".len()..]) {
        return Err(format!("{context}\n  says `{part}` twice"));
    }
    if lines[0].contains(".hmct-save-") || lines[0].contains(".hmct-plot-") {
        return Err(format!("{context}\n  names a temporary file"));
    }
    if snapshot() != before {
        return Err(format!(
            "{context}\n  the output folder changed: {:?}",
            listing(out)
        ));
    }
    Ok(())
}

/// A `: `-separated part of a message that an earlier part already said (an error
/// chain that quotes its cause and then prints it again).
fn repeated_part(message: &str) -> Option<&str> {
    let parts: Vec<&str> = message.split(": ").collect();
    parts.iter().enumerate().find_map(|(j, later)| {
        (later.len() > 3 && parts[..j].iter().any(|earlier| earlier.ends_with(later)))
            .then_some(*later)
    })
}

/// Collects the failures of a matrix so one run shows all of them.
#[derive(Default)]
struct Failures(Vec<String>);

impl Failures {
    fn check(&mut self, label: &str, args: &[OsString], status: i32, names: &str, out: &Path) {
        if let Err(e) = check_failure(label, args, status, names, out) {
            self.0.push(e);
        }
    }

    #[track_caller]
    fn assert_none(self) {
        assert!(self.0.is_empty(), "{}", self.0.join("\n"));
    }
}

/// Every command of the matrix, reading `model` (and `data`), writing under `out`.
/// Calibrate is given a float model when `model` is the good calibrated one.
fn commands(model: &Path, data: &Path, out: &Path) -> Vec<(&'static str, Vec<OsString>)> {
    let calibrate_model = if model == calibrated() {
        float_model()
    } else {
        model.to_path_buf()
    };
    vec![
        (
            "summary",
            os(&[&"summary", &model, &"--json", &out.join("s.json")]),
        ),
        (
            "get-sensitivity-of-nodes",
            os(&[
                &"get-sensitivity-of-nodes",
                &model,
                &data,
                &"-s",
                &out.join("sens"),
                &"--json",
                &out.join("sens.json"),
            ]),
        ),
        (
            "calibrate",
            os(&[
                &"calibrate",
                &calibrate_model,
                &data,
                &"-o",
                &out.join("c.onnx"),
                &"--json",
                &out.join("c.json"),
            ]),
        ),
        (
            "info",
            os(&[&"info", &model, &data, &"--json", &out.join("i.json")]),
        ),
        (
            "runall",
            os(&[&"runall", &model, &data, &"-s", &out.join("runall")]),
        ),
        (
            "modify",
            os(&[
                &"modify",
                &model,
                &"-o",
                &out.join("m.onnx"),
                &"--all-activations",
                &"int16",
            ]),
        ),
        (
            "export-qdq",
            os(&[&"export-qdq", &model, &"-o", &out.join("q.onnx")]),
        ),
        (
            "plot-distribution",
            os(&[
                &"plot-distribution",
                &model,
                &data,
                &"-n",
                &"[stem_conv]",
                &"-s",
                &out.join("dist"),
                &"--json",
                &out.join("d.json"),
            ]),
        ),
    ]
}

fn commands_reading_data(
    model: &Path,
    data: &Path,
    out: &Path,
) -> Vec<(&'static str, Vec<OsString>)> {
    commands(model, data, out)
        .into_iter()
        .filter(|(c, _)| !matches!(*c, "summary" | "modify" | "export-qdq"))
        .collect()
}

/// A well-formed message around `nodes`: opset 17, float [1,3,32,32] values.
fn model_bytes(inputs: &[&str], nodes: Vec<NodeProto>, outputs: &[&str]) -> Vec<u8> {
    let value = |n: &&str| float_value(n, &[1, 3, 32, 32]);
    model(
        inputs.iter().map(value).collect(),
        nodes,
        Vec::new(),
        outputs.iter().map(value).collect(),
    )
    .encode_to_vec()
}

/// Bytes that look random but are the same on every run.
fn noise(len: usize) -> Vec<u8> {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) as u8
        })
        .collect()
}

#[test]
fn bad_models_fail_cleanly_in_every_command() {
    let mut failures = Failures::default();
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(calibrated()).unwrap();
    let mut models: Vec<(&str, PathBuf, &str)> = Vec::new();
    let mut add = |label: &'static str, file: &str, bytes: Option<Vec<u8>>, names: &'static str| {
        let path = dir.path().join(file);
        if let Some(bytes) = bytes {
            std::fs::write(&path, bytes).unwrap();
        }
        models.push((label, path, names));
    };
    add("missing", "missing.onnx", None, "missing.onnx");
    add("empty", "empty.onnx", Some(Vec::new()), "empty.onnx");
    add(
        "truncated",
        "truncated.onnx",
        Some(good[..good.len() / 2].to_vec()),
        "truncated.onnx",
    );
    add(
        "random bytes",
        "random.onnx",
        Some(noise(4096)),
        "random.onnx",
    );
    add(
        "cycle",
        "cycle.onnx",
        Some(model_bytes(
            &["x"],
            vec![
                node("n1", "Add", &["x", "b"], &["a"]),
                node("n2", "Relu", &["a"], &["b"]),
                node("n3", "Relu", &["b"], &["y"]),
            ],
            &["y"],
        )),
        "cycle.onnx: the graph has a cycle",
    );
    add(
        "dangling input",
        "dangling.onnx",
        Some(model_bytes(
            &["x"],
            vec![node("n1", "Relu", &["nowhere"], &["y"])],
            &["y"],
        )),
        "'nowhere'",
    );
    add(
        "duplicate output",
        "duplicate.onnx",
        Some(model_bytes(
            &["x"],
            vec![
                node("n1", "Relu", &["x"], &["y"]),
                node("n2", "Relu", &["x"], &["y"]),
            ],
            &["y"],
        )),
        "'y' is produced more than once",
    );
    let out = tempfile::tempdir().unwrap();
    for (label, model, names) in &models {
        for (command, args) in commands(model, &good_data(), out.path()) {
            failures.check(
                &format!("{command} on a {label} model"),
                &args,
                RUNTIME,
                names,
                out.path(),
            );
        }
    }
    failures.assert_none();
}

/// The first good sample of the example.
fn sample() -> Tensor {
    hmct_tensor::read_npy(&good_data().join("input/0.npy")).unwrap()
}

/// A data folder `root/name/input/{0..n}.npy` holding `bytes` in each file.
fn data_folder(root: &Path, name: &str, samples: &[Vec<u8>]) -> PathBuf {
    let folder = root.join(name);
    let sub = folder.join("input");
    std::fs::create_dir_all(&sub).unwrap();
    for (i, bytes) in samples.iter().enumerate() {
        std::fs::write(sub.join(format!("{i}.npy")), bytes).unwrap();
    }
    folder
}

/// An `.npy` header (version 1.0) padded as numpy pads it.
fn npy_header(descr: &str, fortran: bool, shape: &[usize]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let mut dict = format!(
        "{{'descr': '{descr}', 'fortran_order': {}, 'shape': ({}), }}",
        if fortran { "True" } else { "False" },
        dims.join(", ") + if shape.len() == 1 { "," } else { "" }
    );
    while (10 + dict.len() + 1) % 64 != 0 {
        dict.push(' ');
    }
    dict.push('\n');
    let mut h = b"\x93NUMPY\x01\x00".to_vec();
    h.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    h.extend_from_slice(dict.as_bytes());
    h
}

#[test]
fn bad_samples_fail_cleanly_in_every_command_reading_data() {
    let mut failures = Failures::default();
    let root = tempfile::tempdir().unwrap();
    let t = sample();
    let a = t.as_f32().unwrap();
    let good = hmct_tensor::write_npy_bytes(&t).unwrap();
    let f64_bytes = hmct_tensor::write_npy_bytes(&Tensor::F64(a.mapv(f64::from))).unwrap();
    let narrow = hmct_tensor::write_npy_bytes(
        &Tensor::from_f32(
            &[1, 3, 16, 32],
            a.iter().copied().take(3 * 16 * 32).collect(),
        )
        .unwrap(),
    )
    .unwrap();
    let empty =
        hmct_tensor::write_npy_bytes(&Tensor::from_f32(&[0, 3, 32, 32], vec![]).unwrap()).unwrap();
    let cases: Vec<(&str, PathBuf, String)> = vec![
        (
            "wrong dtype",
            data_folder(root.path(), "f64", &[f64_bytes.clone(), f64_bytes]),
            "f64/input/0.npy: dtype double".into(),
        ),
        (
            "wrong shape",
            data_folder(root.path(), "narrow", &[narrow.clone(), narrow]),
            "narrow/input/0.npy: shape [1, 3, 16, 32]".into(),
        ),
        (
            "truncated sample",
            data_folder(
                root.path(),
                "cut",
                &[
                    good[..good.len() - 100].to_vec(),
                    good[..good.len() - 100].to_vec(),
                ],
            ),
            "cut/input/0.npy: truncated".into(),
        ),
        (
            "truncated header",
            data_folder(root.path(), "cuthead", &[good[..30].to_vec()]),
            "cuthead/input/0.npy".into(),
        ),
        (
            "not npy",
            data_folder(root.path(), "noise", &[noise(500)]),
            "noise/input/0.npy".into(),
        ),
        (
            "a sample with no rows",
            data_folder(root.path(), "norows", &[empty]),
            "norows/input/0.npy".into(),
        ),
        (
            "no samples",
            data_folder(root.path(), "nosamples", &[]),
            "nosamples/input: no .npy samples".into(),
        ),
        (
            "sub-folder matching no input",
            {
                let f = root.path().join("othername");
                std::fs::create_dir_all(f.join("pixels")).unwrap();
                std::fs::write(f.join("pixels/0.npy"), &good).unwrap();
                f
            },
            "othername: no sub-folder for model input 'input'".into(),
        ),
        (
            "missing folder",
            root.path().join("absent"),
            "absent".into(),
        ),
    ];
    let out = tempfile::tempdir().unwrap();
    for (label, data, names) in &cases {
        for (command, args) in commands_reading_data(&calibrated(), data, out.path()) {
            failures.check(
                &format!("{command} with {label}"),
                &args,
                RUNTIME,
                names,
                out.path(),
            );
        }
    }
    failures.assert_none();
}

/// Fortran order and big-endian data are valid numpy files: read as the same values.
#[test]
fn fortran_order_and_big_endian_samples_read_as_the_same_values() {
    let root = tempfile::tempdir().unwrap();
    let t = sample();
    let a = t.as_f32().unwrap();
    let shape = a.shape().to_vec();
    let mut fortran = npy_header("<f4", true, &shape);
    for v in a.t().iter() {
        fortran.extend_from_slice(&v.to_le_bytes());
    }
    let mut big = npy_header(">f4", false, &shape);
    for v in a.iter() {
        big.extend_from_slice(&v.to_be_bytes());
    }
    let reference = data_folder(
        root.path(),
        "reference",
        &[hmct_tensor::write_npy_bytes(&t).unwrap()],
    );
    let info = |data: &Path| {
        let r = run(&os(&[&"info", &calibrated(), &data]));
        assert_eq!(r.code, Some(0), "{}", r.stderr);
        r.stdout
    };
    let expected = info(&reference);
    for (name, bytes) in [("fortran", fortran), ("big_endian", big)] {
        let data = data_folder(root.path(), name, &[bytes]);
        assert_eq!(info(&data), expected, "{name}");
    }
}

/// A two-input model whose input folders hold different numbers of samples.
#[test]
fn mismatched_sample_counts_fail_before_anything_is_written() {
    let mut failures = Failures::default();
    let root = tempfile::tempdir().unwrap();
    let model = root.path().join("two_inputs.onnx");
    std::fs::write(
        &model,
        model_bytes(
            &["a", "b"],
            vec![node("add", "Add", &["a", "b"], &["y"])],
            &["y"],
        ),
    )
    .unwrap();
    let good = hmct_tensor::write_npy_bytes(&sample()).unwrap();
    let data = root.path().join("data");
    for (input, n) in [("a", 3), ("b", 2)] {
        std::fs::create_dir_all(data.join(input)).unwrap();
        for i in 0..n {
            std::fs::write(data.join(input).join(format!("{i}.npy")), &good).unwrap();
        }
    }
    let out = tempfile::tempdir().unwrap();
    let args = os(&[
        &"calibrate",
        &model,
        &data,
        &"-o",
        &out.path().join("c.onnx"),
    ]);
    failures.check(
        "calibrate with 3 and 2 samples",
        &args,
        RUNTIME,
        "different sample counts ('a': 3, 'b': 2)",
        out.path(),
    );
    failures.assert_none();
}

#[test]
fn unknown_node_names_are_usage_errors() {
    let mut failures = Failures::default();
    let out = tempfile::tempdir().unwrap();
    let o = out.path();
    let m = calibrated();
    let d = good_data();
    let cases: Vec<(&str, Vec<OsString>, &str)> = vec![
        (
            "sensitivity -i",
            os(&[
                &"get-sensitivity-of-nodes",
                &m,
                &d,
                &"-i",
                &"[nosuch_node]",
                &"-s",
                &o.join("s"),
            ]),
            "nosuch_node",
        ),
        (
            "sensitivity -n",
            os(&[
                &"get-sensitivity-of-nodes",
                &m,
                &d,
                &"-n",
                &"nosuch_type",
                &"-s",
                &o.join("s"),
            ]),
            "nosuch_type",
        ),
        (
            "sensitivity -o",
            os(&[
                &"get-sensitivity-of-nodes",
                &m,
                &d,
                &"-o",
                &"nosuch_node",
                &"--json",
                &o.join("s.json"),
            ]),
            "nosuch_node",
        ),
        (
            "runall -nt",
            os(&[
                &"runall",
                &m,
                &d,
                &"-nt",
                &"nosuch_type",
                &"-s",
                &o.join("r"),
            ]),
            "nosuch_type",
        ),
        (
            "runall -i",
            os(&[
                &"runall",
                &m,
                &d,
                &"-i",
                &"['nosuch_node']",
                &"-s",
                &o.join("r"),
            ]),
            "nosuch_node",
        ),
        (
            "runall -dnl",
            os(&[
                &"runall",
                &m,
                &d,
                &"-dnl",
                &"[stem_conv,nosuch_node]",
                &"-s",
                &o.join("r"),
            ]),
            "nosuch_node",
        ),
        (
            "plot-distribution -n",
            os(&[
                &"plot-distribution",
                &m,
                &d,
                &"-n",
                &"[nosuch_node]",
                &"-s",
                &o.join("p"),
            ]),
            "nosuch_node",
        ),
        (
            "modify --nodes",
            os(&[
                &"modify",
                &m,
                &"-o",
                &o.join("m.onnx"),
                &"--qtype",
                &"int16",
                &"--nodes",
                &"[nosuch_node]",
            ]),
            "nosuch_node",
        ),
        (
            "calibrate --skip-nodes",
            os(&[
                &"calibrate",
                &float_model(),
                &d,
                &"-o",
                &o.join("c.onnx"),
                &"--skip-nodes",
                &"[nosuch_node]",
            ]),
            "nosuch_node",
        ),
    ];
    for (label, args, names) in cases {
        failures.check(label, &args, USAGE, names, o);
    }
    failures.assert_none();
}

#[test]
fn malformed_lists_are_usage_errors() {
    let mut failures = Failures::default();
    let out = tempfile::tempdir().unwrap();
    let o = out.path();
    let m = calibrated();
    let d = good_data();
    let bad = "[a,[b";
    let cases: Vec<(&str, Vec<OsString>)> = vec![
        (
            "sensitivity -i",
            os(&[
                &"get-sensitivity-of-nodes",
                &m,
                &d,
                &"-i",
                &bad,
                &"-s",
                &o.join("s"),
            ]),
        ),
        (
            "sensitivity -m",
            os(&[
                &"get-sensitivity-of-nodes",
                &m,
                &d,
                &"-m",
                &bad,
                &"-s",
                &o.join("s"),
            ]),
        ),
        (
            "runall -i",
            os(&[&"runall", &m, &d, &"-i", &bad, &"-s", &o.join("r")]),
        ),
        (
            "runall -dnl",
            os(&[&"runall", &m, &d, &"-dnl", &bad, &"-s", &o.join("r")]),
        ),
        (
            "runall -qn",
            os(&[&"runall", &m, &d, &"-qn", &bad, &"-s", &o.join("r")]),
        ),
        (
            "plot-distribution -n",
            os(&[
                &"plot-distribution",
                &m,
                &d,
                &"-n",
                &bad,
                &"-s",
                &o.join("p"),
            ]),
        ),
        (
            "modify --nodes",
            os(&[
                &"modify",
                &m,
                &"-o",
                &o.join("m.onnx"),
                &"--qtype",
                &"int16",
                &"--nodes",
                &bad,
            ]),
        ),
        (
            "calibrate --skip-nodes",
            os(&[
                &"calibrate",
                &float_model(),
                &d,
                &"-o",
                &o.join("c.onnx"),
                &"--skip-nodes",
                &bad,
            ]),
        ),
    ];
    for (label, args) in cases {
        failures.check(label, &args, USAGE, bad, o);
    }
    failures.assert_none();
}

/// The "folder" is a regular file, which stops root as well as anyone else.
#[test]
fn an_output_folder_under_a_file_is_an_error() {
    let mut failures = Failures::default();
    let out = tempfile::tempdir().unwrap();
    let blocker = out.path().join("a_file");
    std::fs::write(&blocker, b"keep me").unwrap();
    let under = blocker.join("sub");
    for (command, args) in commands(&calibrated(), &good_data(), &under) {
        // calibrate checks its -o folder before loading anything: a usage error.
        let status = if command == "calibrate" {
            USAGE
        } else {
            RUNTIME
        };
        failures.check(
            &format!("{command} writing under a file"),
            &args,
            status,
            "a_file/sub",
            out.path(),
        );
    }
    failures.assert_none();
}

#[cfg(unix)]
#[test]
fn a_read_only_output_folder_is_an_error() {
    let mut failures = Failures::default();
    use std::os::unix::fs::PermissionsExt;
    let out = tempfile::tempdir().unwrap();
    let locked = out.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o555)).unwrap();
    if std::fs::write(locked.join("probe"), b"").is_ok() {
        // Root writes through permission bits; the file-as-folder test covers this.
        hmct_ir::testing::skip("the read-only folder case (root writes through permission bits)");
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
        return;
    }
    for (command, args) in commands(&calibrated(), &good_data(), &locked.join("sub")) {
        failures.check(
            &format!("{command} writing into a read-only folder"),
            &args,
            RUNTIME,
            "locked",
            &locked,
        );
    }
    for (command, args) in commands(&calibrated(), &good_data(), &locked) {
        failures.check(
            &format!("{command} writing into a read-only folder"),
            &args,
            RUNTIME,
            "locked",
            &locked,
        );
    }
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
    failures.assert_none();
}

#[cfg(target_os = "linux")]
fn is_full_device() -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata("/dev/full").is_ok_and(|m| m.file_type().is_char_device())
}

/// A temporary folder holding `full`, a link to `/dev/full` (so that a writer
/// renaming over its target replaces the link, not the device); `None` with a note
/// where there is no such device.
#[cfg(target_os = "linux")]
fn full_disk() -> Option<(tempfile::TempDir, PathBuf)> {
    if !is_full_device() {
        hmct_ir::testing::skip("the full-disk cases (no /dev/full device)");
        return None;
    }
    let out = tempfile::tempdir().unwrap();
    let full = out.path().join("full");
    std::os::unix::fs::symlink("/dev/full", &full).unwrap();
    Some((out, full))
}

/// A full disk for the commands that write one file.
#[cfg(target_os = "linux")]
#[test]
fn a_full_disk_is_an_error_and_leaves_no_temporary_file() {
    let Some((out, full)) = full_disk() else {
        return;
    };
    let m = calibrated();
    let d = good_data();
    let cases: Vec<(&str, Vec<OsString>)> = vec![
        (
            "calibrate -o",
            os(&[&"calibrate", &float_model(), &d, &"-o", &full]),
        ),
        ("export-qdq -o", os(&[&"export-qdq", &m, &"-o", &full])),
        (
            "modify -o",
            os(&[&"modify", &m, &"-o", &full, &"--all-activations", &"int16"]),
        ),
        ("summary --json", os(&[&"summary", &m, &"--json", &full])),
        ("info --json", os(&[&"info", &m, &d, &"--json", &full])),
        (
            "get-sensitivity-of-nodes --json",
            os(&[
                &"get-sensitivity-of-nodes",
                &m,
                &d,
                &"-d",
                &"2",
                &"--json",
                &full,
            ]),
        ),
    ];
    for (label, args) in cases {
        let r = run(&args);
        let context = format!("{label}: status {:?}, stderr: {}", r.code, r.stderr);
        assert_eq!(r.code, Some(RUNTIME), "{context}");
        let lines: Vec<&str> = r.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{context}");
        assert!(lines[0].starts_with("error: "), "{context}");
        assert!(lines[0].contains("No space left on device"), "{context}");
        assert!(lines[0].contains(&full.display().to_string()), "{context}");
        assert!(
            std::fs::symlink_metadata(&full)
                .unwrap()
                .file_type()
                .is_symlink(),
            "{context}: the link was replaced by a file"
        );
        assert!(
            is_full_device(),
            "{context}: /dev/full is no longer a device"
        );
        assert_eq!(listing(out.path()), ["full"], "{context}");
    }
}

/// The plotting commands write their figures, then `--json`: when the JSON cannot be
/// written (a full disk), the figures go again and so does the folder they made.
#[cfg(target_os = "linux")]
#[test]
fn a_json_that_cannot_be_written_takes_the_figures_with_it() {
    let Some((out, full)) = full_disk() else {
        return;
    };
    let m = calibrated();
    let d = good_data();
    let figures = out.path().join("figures");
    // (command, its save-folder flag, its other arguments)
    let cases: Vec<(&str, &str, Vec<OsString>)> = vec![
        (
            "plot-distribution",
            "-s",
            os(&[&"plot-distribution", &m, &d, &"-n", &"[stem_conv]"]),
        ),
        (
            "get-channelwise-data-distribution",
            "-s",
            os(&[
                &"get-channelwise-data-distribution",
                &m,
                &d,
                &"-n",
                &"[down_conv.weight_HzCalibration]",
            ]),
        ),
        (
            "plot-acc-error",
            "-s",
            os(&[&"plot-acc-error", &m, &d, &"-q", &"[down_conv]"]),
        ),
        (
            "sensitivity-analysis",
            "-sd",
            os(&[&"sensitivity-analysis", &m, &d, &"-sn", &"[down_conv]"]),
        ),
    ];
    for (label, save_flag, mut args) in cases {
        args.extend(os(&[&save_flag, &figures, &"--json", &full]));
        let r = run(&args);
        let context = format!("{label}: status {:?}, stderr: {}", r.code, r.stderr);
        assert_eq!(r.code, Some(RUNTIME), "{context}");
        assert_eq!(r.stderr.lines().count(), 1, "{context}");
        assert!(r.stderr.contains("No space left on device"), "{context}");
        assert_eq!(listing(out.path()), ["full"], "{context}");
    }
}

#[test]
fn swapped_model_and_data_say_what_was_expected() {
    let mut failures = Failures::default();
    let out = tempfile::tempdir().unwrap();
    let (m, d) = (calibrated(), good_data());
    // The data folder where the model goes: every command says a model file was
    // expected, naming the folder once.
    for (command, args) in commands(&d, &m, out.path()) {
        failures.check(
            &format!("{command} with the data folder as the model"),
            &args,
            RUNTIME,
            "calibration_data: not an ONNX model: a folder; a .onnx model file was expected",
            out.path(),
        );
    }
    // A model file where the data folder goes (with a good model first): the file is
    // named once, not after the model's name as well.
    for (command, args) in commands_reading_data(&m, &m, out.path()) {
        failures.check(
            &format!("{command} with the model as the data folder"),
            &args,
            RUNTIME,
            "calibrated_model.onnx: a file; a calibration-data folder was expected (the model comes first",
            out.path(),
        );
    }
    failures.assert_none();
}

#[test]
fn a_tensor_given_as_a_node_points_to_its_producer() {
    let out = tempfile::tempdir().unwrap();
    let model = hmct_ir::load_model(calibrated()).unwrap();
    let output = model.proto().graph.as_ref().unwrap().output[0]
        .name()
        .to_string();
    let producer = model
        .node_name(model.producer(&output).unwrap())
        .to_string();
    let args = os(&[
        &"get-sensitivity-of-nodes",
        &calibrated(),
        &good_data(),
        &"-o",
        &output,
        &"--json",
        &out.path().join("s.json"),
    ]);
    let expected =
        format!("'{output}' (a tensor, not a node: it is the output of node '{producer}')");
    check_failure("sensitivity -o TENSOR", &args, USAGE, &expected, out.path()).unwrap();
}
