//! # dpfusion-cli
//!
//! The `dpfusion` command line over the [`dpfusion`] library, as datafusion-cli is to
//! DataFusion: the REPL ([`repl`], one REPL over a local session or a `dpfusion serve` reached
//! with `--connect`), the `-c`/`-f` scripts and flags ([`cli`]), the demo tables ([`demo`]), and
//! the `ledger` commands ([`ledger_cmd`], [`ledger_report`]). `dpfusion serve` and `dpfusion
//! token` are the library's [`dpfusion::serve::cmd`] (its `serve` feature, on here).
pub mod cli;
pub mod demo;
pub mod ledger_cmd;
pub mod ledger_report;
pub mod repl;
