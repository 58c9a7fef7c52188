//! Ending a peering from the origin: what an operator asks (`local-agent unpeer` or
//! `refractctl unpeer`, [`command`]), how the request is written on the virtual node
//! ([`Mode`]), and what is removed from the origin ([`origin`]), which the local agent runs
//! too when it has drained its node.

pub mod command;
pub mod origin;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use refract_core::keys::UNPEER_ANNOTATION;

/// How an operator asked to unpeer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Drain, remove the tenant on the provider, then clean up the origin.
    Graceful,
    /// Clean up the origin only, without calling the provider.
    Forced,
}

impl Mode {
    /// The annotation's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Graceful => "graceful",
            Mode::Forced => "forced",
        }
    }

    /// The mode a node's annotations ask for, if any; an unknown value asks for nothing (and is
    /// reported once by the caller).
    pub fn requested(node: &Node) -> Result<Option<Mode>, String> {
        match node
            .annotations()
            .get(UNPEER_ANNOTATION)
            .map(String::as_str)
        {
            None => Ok(None),
            Some("graceful") => Ok(Some(Mode::Graceful)),
            Some("forced") => Ok(Some(Mode::Forced)),
            Some(other) => Err(format!(
                "{UNPEER_ANNOTATION}={other:?} is neither \"graceful\" nor \"forced\""
            )),
        }
    }
}
