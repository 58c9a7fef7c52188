//! Tenants that went away: [`expiry`] removes a tenant whose origin has not connected for
//! `--tenant-expiry`. The removal itself (`refract_admin::tenant`) is shared with
//! `remote-agent remove-tenant` and `refractctl unpeer`.

pub mod expiry;

pub use expiry::{spawn_collector, Served};
pub use refract_admin::tenant::remove;
