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
pub mod accounting;
pub mod catalog;
pub mod cli;
pub mod demo;
#[cfg(feature = "distributed")]
pub mod distributed;
pub mod error;
pub mod files;
pub mod guard;
pub mod ledger_report;
pub mod owner;
pub mod repl;
pub mod serve;
pub mod session;
pub mod statements;

/// The DataFusion this crate is built on (use it instead of pinning `datafusion` yourself).
pub use datafusion;
/// Arrow, as DataFusion re-exports it.
pub use datafusion::arrow;
pub use dpfusion_udfs;
pub use error::Error;
pub use session::{AnalystFiles, PrivateSession, QueryResult, Registration, SessionOptions};
