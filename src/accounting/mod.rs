//! accounting
