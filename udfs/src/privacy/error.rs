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
    /// `value` as the message shows it: a number in [`literal_text`]'s form, whatever the
    /// caller passed (round 52: `{}` printed a subnormal argument with 330 digits).
    pub fn invalid(name: &str, value: impl std::fmt::Display, expected: &str) -> Self {
        let value = value.to_string();
        let value = match value.parse::<f64>() {
            Ok(v) if value.len() > 24 => literal_text(v),
            _ => value,
        };
        PrivacyError::InvalidParameter {
            name: name.to_string(),
            value,
            expected: expected.to_string(),
        }
    }
}

/// A number as a message shows it (round 52, review "extremes", minor): Rust's shortest
/// round-trip digits, in exponent form outside [10⁻⁴, 10¹⁶) (`{}` printed 5e-324 with 324
/// digits).
pub fn literal_text(v: f64) -> String {
    if v == 0.0 || !v.is_finite() || (1e-4..1e16).contains(&v.abs()) {
        format!("{v}")
    } else {
        format!("{v:e}")
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Round 52 (review "extremes"): a subnormal or huge argument is shown in exponent form,
    /// whatever the caller formatted; other values as given.
    #[test]
    fn numbers_in_messages_are_short() {
        let shown = |v: f64| PrivacyError::invalid("clip", v, "x").to_string();
        assert_eq!(
            shown(1e-320),
            "invalid argument 'clip': got 1e-320, expected x"
        );
        assert_eq!(
            shown(f64::MAX),
            "invalid argument 'clip': got 1.7976931348623157e308, expected x"
        );
        assert_eq!(shown(0.5), "invalid argument 'clip': got 0.5, expected x");
        assert_eq!(
            PrivacyError::invalid("m", "gaussian", "x").to_string(),
            "invalid argument 'm': got gaussian, expected x"
        );
    }
}
