//! All integration tests of this crate in one binary: each test binary links DataFusion, so one
//! binary instead of one per file saves most of the test build's link time. Add a test file as a
//! module here. The tests that run the `dpfusion` binary or use the command line's modules
//! are dpfusion-cli's (dpfusion-cli/tests/it).
mod attacks;
mod boundary;
mod budget;
mod common;
mod fuzz;
mod guarantee;
mod owner;
mod readers;
mod session;
mod sqllogictest;
mod units;
