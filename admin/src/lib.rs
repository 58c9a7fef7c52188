//! What an operator does to one cluster, shared by the agents and `refractctl`, so that the
//! command-line tool links neither agent.
//!
//! - [`crd`]: the NamespaceOffloading custom resource, which selects namespaces for offloading
//!   at the origin.
//! - [`unpeer`]: ending a peering from the origin, gracefully through its local agent or forced.
//! - [`tenant`]: removing everything a provider holds for one origin.
//!
//! Each runs against one cluster with its own kubeconfig: nothing here reaches the other side.

pub mod crd;
pub mod tenant;
pub mod unpeer;
