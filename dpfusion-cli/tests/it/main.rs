//! All integration tests of `dpfusion-cli` in one binary (each test binary links DataFusion):
//! the ones that run the `dpfusion` binary (CARGO_BIN_EXE_dpfusion) or use the command line's
//! modules (the demo tables, the script splitter). Add a test file as a module here. The
//! library's own tests are in the root's tests/it; the helpers are shared with it.
mod agd;
mod cli;
#[path = "../../../tests/it/common.rs"]
mod common;
mod durability;
mod ledger;
mod library;
mod models;
mod onboard;
mod owner_policy;
mod receipts;
mod refusals;
mod serve;
mod tutorial;
