//! All integration tests of this crate in one binary: each test binary links DataFusion, so one
//! binary instead of one per file saves most of the test build's link time. Add a test file as a
//! module here.
mod agd_extremes;
mod aggregates;
mod audit;
mod imports;
mod kernels;
mod linreg;
mod pld_extremes;
mod rgm;
mod sgd;
mod sgd_accounting;
mod units;
