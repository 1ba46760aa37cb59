//! The HTTP surface: what a client connection meets before and after the
//! request's phases (`super::request`).
//!
//! - [`server`]: the listener, the connection limit, hyper per connection and
//!   the staged shutdown (drain, then cut).
//! - [`conn`]: what one connection may hold — head and idle timers, head
//!   limits checked as the bytes arrive, refusals written without hyper.
//! - [`handlers`]: what the route handlers share (their state, the admin
//!   gate, a JSON answer).
//! - [`routes`]: the API routes (client key, body read once, then
//!   `request::forward`), health, status and admin.
//! - [`scrape`]: `/metrics`, with the gauges read from the live state.
//!
//! The OpenAI dialect the routes translate a request from lives with the
//! phases (`request::dialect`): its answers are translated before the
//! request finishes.
//! - [`sd_notify`]: tells systemd the gateway is ready, reloading or
//!   stopping.
//! - [`signals`]: SIGTERM and SIGINT, and the shutdown each asks for.
//! - [`keys`]: `/admin/keys`, client keys managed at run time.
//! - [`usage`]: the usage ledger's answers — a key's own usage, an
//!   operator's reports.

pub mod conn;
pub mod handlers;
pub mod keys;
pub mod routes;
pub mod scrape;
pub mod sd_notify;
pub mod server;
pub mod signals;
pub mod ui;
pub mod usage;
