//! `hmct-debugger`: the command-line front end.
fn main() {}
