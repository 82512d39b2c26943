//! # dpfusion
//!
//! Differential privacy for Apache DataFusion SQL. A [`PrivateSession`] wraps a DataFusion
//! context: private tables can only be read through DP aggregate functions, every release is
//! charged to a per-table budget in a durable ledger before any row is read, and a query is
//! refused once a table's budget would be exceeded. See README.md, docs/PRIVACY.md, docs/SQL.md
//! and docs/ARCHITECTURE.md.
//!
//! The smallest complete program (`examples/embed.rs`, run as this crate's doc test):
//!
#![doc = concat!("```rust\n", include_str!("../examples/embed.rs"), "\n```")]
//!
//! This crate is the library an embedder depends on: no terminal or gRPC dependency. The
//! command line (`dpfusion`: the REPL, `--connect`, the ledger commands, the demo tables) is the
//! workspace member `dpfusion-cli`; the Flight SQL server ([`serve`]) is behind the cargo
//! feature `serve` (off by default; `dpfusion-cli` turns it on), Ballista behind `distributed`.
pub mod accounting;
pub mod auth;
pub mod catalog;
#[cfg(feature = "distributed")]
pub mod distributed;
pub mod error;
pub mod files;
pub mod guard;
pub mod owner;
#[cfg(feature = "serve")]
pub mod serve;
pub mod session;
pub mod statements;
#[cfg(test)]
mod testdir;

/// The DataFusion this crate is built on (use it instead of pinning `datafusion` yourself).
pub use datafusion;
/// Arrow, as DataFusion re-exports it.
pub use datafusion::arrow;
pub use dpfusion_udfs;
pub use error::Error;
pub use session::{AnalystFiles, PrivateSession, QueryResult, Registration, SessionOptions};
