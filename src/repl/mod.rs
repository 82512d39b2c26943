//! The command line: output formats now; the interactive REPL grows here.
pub mod format;
