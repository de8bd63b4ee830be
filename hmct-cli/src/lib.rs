//! Library side of the `hmct-debugger` binary: pieces of the command line that are
//! worth testing and fuzzing on their own (list-argument parsing, data folders).

pub mod listarg;
