//! The one error type of xTensor: a kind (so the binding can choose an exception) and a
//! message that names what is wrong (so a user can act on it).

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XtErrorKind {
    /// Zero/negative/oversized sizes, bad device kinds, out-of-range offsets.
    InvalidArgument,
    /// The pool (or a region's reserved range) cannot supply the pages asked for.
    Exhausted,
    /// An owner, segment or region that does not exist (or was already freed).
    Unknown,
    /// The mapping backend failed or its library is missing.
    Backend,
    /// The pool was closed.
    Closed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XtError {
    pub kind: XtErrorKind,
    pub message: String,
}

impl XtError {
    pub fn new(kind: XtErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(XtErrorKind::InvalidArgument, message)
    }
    pub fn exhausted(message: impl Into<String>) -> Self {
        Self::new(XtErrorKind::Exhausted, message)
    }
    pub fn unknown(message: impl Into<String>) -> Self {
        Self::new(XtErrorKind::Unknown, message)
    }
    pub fn backend(message: impl Into<String>) -> Self {
        Self::new(XtErrorKind::Backend, message)
    }
}

impl fmt::Display for XtError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for XtError {}

pub type XtResult<T> = Result<T, XtError>;
