//! Errors of features built on the kernel.

/// An error of a feature built on the kernel (a trigger source's, an
/// automation's), carried by the kernel's error as it is: its stable reason
/// code and its detail as the API shows it. The feature that made it finds
/// it again by its type (`Error::extension::<T>()` in the kernel).
pub trait ExtensionError: std::error::Error + Send + Sync + 'static {
    /// The stable reason code (`trigger_not_found`, `not_found`, ...).
    fn reason_code(&self) -> &'static str;
    /// The error as the API shows it: `code`, `message` and fields of its
    /// own.
    fn to_json(&self) -> serde_json::Value;
    /// Itself, to be found again by its type.
    fn as_any(&self) -> &dyn std::any::Any;
}
