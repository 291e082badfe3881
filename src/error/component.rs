//! A component's failure ([`ComponentError`]): which one, and its own error.

/// A component's failure to start or to take a reload: which component,
/// and what failed (its own typed error).
#[derive(Debug, thiserror::Error)]
#[error("{source}")]
pub struct ComponentError {
    /// The component's name in the `features!` list (`crate::features`).
    pub component: &'static str,
    pub source: Box<dyn std::error::Error + Send + Sync>,
}
