//! `error_chain`, the one line the CLI and the Python package print for an error: each
//! cause once, in order, joined with ": ".

use hmct_ir::{IrError, error_chain};
use hmct_tensor::TensorError;

fn io(text: &str) -> std::io::Error {
    std::io::Error::other(text.to_string())
}

#[test]
fn every_cause_is_printed_once_in_order() {
    let e = TensorError::Io {
        path: "w.bin".into(),
        source: io("permission denied"),
    };
    assert_eq!(e.to_string(), "w.bin");
    assert_eq!(error_chain(&e), "w.bin: permission denied");

    // IrError quotes its tensor error in its message, causes included.
    let e = IrError::Tensor {
        file: "m.onnx".into(),
        value: "w".into(),
        error: TensorError::Io {
            path: "w.bin".into(),
            source: io("permission denied"),
        },
    };
    assert_eq!(e.to_string(), "m.onnx: value 'w': w.bin: permission denied");
    assert_eq!(error_chain(&e), e.to_string());
}

/// An error that still ends its message with its cause.
#[derive(Debug, thiserror::Error)]
#[error("cannot save: {source}")]
struct Quoting {
    source: std::io::Error,
}

#[test]
fn a_cause_the_line_already_ends_with_is_not_repeated_and_lines_are_joined() {
    let e = Quoting {
        source: io("disk full"),
    };
    assert_eq!(error_chain(&e), "cannot save: disk full");
    let e = Quoting {
        source: io("two\nlines"),
    };
    assert_eq!(error_chain(&e), "cannot save: two lines");
}
