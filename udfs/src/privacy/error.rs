//! Errors of the privacy arithmetic.

/// A parameter outside its accepted range. The message names the argument and the range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PrivacyError {
    #[error("invalid argument '{name}': got {value}, expected {expected}")]
    InvalidParameter {
        name: String,
        value: String,
        expected: String,
    },
    #[error("infeasible: {0}")]
    Infeasible(String),
}

impl PrivacyError {
    pub fn invalid(name: &str, value: impl std::fmt::Display, expected: &str) -> Self {
        PrivacyError::InvalidParameter {
            name: name.to_string(),
            value: value.to_string(),
            expected: expected.to_string(),
        }
    }
}

/// `epsilon` must be finite and > 0.
pub fn check_epsilon(name: &str, v: f64) -> Result<f64, PrivacyError> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(PrivacyError::invalid(name, v, "a finite number > 0"))
    }
}

/// `delta` must be in the open interval (0, 1).
pub fn check_delta(name: &str, v: f64) -> Result<f64, PrivacyError> {
    if v.is_finite() && v > 0.0 && v < 1.0 {
        Ok(v)
    } else {
        Err(PrivacyError::invalid(
            name,
            v,
            "a number in the open interval (0, 1)",
        ))
    }
}

/// A scale (sensitivity, noise multiplier, rho) must be finite and > 0.
pub fn check_positive(name: &str, v: f64) -> Result<f64, PrivacyError> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(PrivacyError::invalid(name, v, "a finite number > 0"))
    }
}
