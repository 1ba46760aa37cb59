//! poolgate's integration tests, in one binary (as wasmtime's `tests/all`):
//! one link of wasmtime and the gateway instead of one per suite, and the
//! helpers compiled once, each used by some suite (no `allow(dead_code)`).
//!
//! Each suite is a module named as its file; nextest filters by the module
//! path, e.g. `cargo nextest run -E 'test(/^failover::/)'`. The helpers:
//! `support` (start the real binary, clients, hostile components, Redis),
//! `bounded` (a child process with a time limit), `common` (policy-level
//! fixtures), `example_plugins` (the example plugins, built once).

mod bounded;
mod common;
mod example_plugins;
mod support;

mod alert_rules;
mod builtin_fixtures;
mod chain_order;
mod chaos;
mod chat_completions;
mod claude_code;
mod clients;
mod config_check;
mod demo;
mod failover;
mod fallback;
mod fuzz_corpus;
mod gateway_e2e;
mod gateway_routes;
mod hot_swap;
mod key_limits;
mod languages;
mod layers;
mod ledger_postgres;
mod load_limits;
mod logs;
mod lowering;
mod mixed_gateway;
mod neurolink_precedence;
mod oauth;
mod plugin_cli;
mod properties;
mod replicas;
mod request_edges;
mod routing;
mod runtime_faults;
mod runtime_keys;
mod sdk_client;
mod serve_faults;
mod simulate;
mod traces;
mod ui;
mod unified_pool;
mod unserved;
mod usage_ledger;
mod walkthrough;
