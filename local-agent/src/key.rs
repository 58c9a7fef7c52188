//! The key of an origin object, shared by the reflectors, the outbox, pods, tokens and events.

/// A local object: namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    /// Local namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}
