//! Subscription seats that stay alive: OAuth credentials the gateway owns
//! ([`store`]), the token endpoint ([`token`]), each seat's token and its
//! single-flight refresh ([`seat`]), and what a refresh shared between
//! replicas needs ([`share`]). A leaf: it takes plain values (a metrics
//! handle, a clock reading) and imports nothing from the gateway; the task
//! that refreshes seats ahead of expiry, heals them at start and polls their
//! usage is the gateway's (`gateway::seat_keeper`), and the usage endpoint's
//! answer is a quota reading (`learned::usage`).
//!
//! Access tokens live hours and refresh tokens are single-use, so a pool of
//! static tokens dies the same day and a refresh that is lost, or two that
//! race, loses a seat for good. The references (dario, neurolink, CortexKit)
//! all refresh ahead of expiry, on a 401, and at start, one refresh per seat at
//! a time; so does this module. Settings: `[oauth]` ([`settings`]).

pub mod seat;
pub mod settings;
pub mod share;
pub mod store;
pub mod token;

pub use seat::{Refreshed, Seat, SeatError, SeatStatus, Why};
pub use settings::OAuthConfig;
pub use share::{CredentialShare, SharedLock};
pub use store::{Identity, StoredCredential};
pub use token::{Carrier, TokenClient, TokenError};
