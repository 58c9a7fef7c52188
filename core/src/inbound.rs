//! What the local agent accepts from a provider, checked before it reaches the origin.
//!
//! The origin trusts a provider no more than the provider trusts it: every address, quantity
//! and label that comes back is parsed with bounds, checked against what the operator allowed,
//! and refused with a reason when it does not fit. These rules are pure; the agent logs and
//! counts what they refuse.
//!
//! - [`address`]: provider pod IPs, remapped into the origin's view or refused.
//! - [`capacity`]: the provider's free resources, bounded and capped, as the virtual node's.
//! - [`labels`]: the node labels a provider suggests, validated and filtered.

pub mod address;
pub mod capacity;
pub mod labels;

/// Text from the other side, cut for a log line or a refusal reason.
pub fn excerpt(text: &str) -> String {
    const MAX: usize = 80;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}
