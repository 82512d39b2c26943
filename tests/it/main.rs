//! All integration tests of this crate in one binary: each test binary links DataFusion, so one
//! binary instead of one per file saves most of the test build's link time. Add a test file as a
//! module here.
mod agd;
mod attacks;
mod boundary;
mod budget;
mod cli;
mod common;
mod durability;
mod fuzz;
mod guarantee;
mod ledger;
mod models;
mod onboard;
mod owner;
mod refusals;
mod serve;
mod session;
mod sqllogictest;
mod tutorial;
mod units;
