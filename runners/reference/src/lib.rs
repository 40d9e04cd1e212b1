//! OrbiTE's reference runner: a native engine runner that honours the runner contract
//! (docs/runner-contract.md, protocol `orbite-installed-host-v4`) for `installed-host` and
//! `installed-rail-accounting` on real verbs: whatever `libibverbs.so.1` the case names (pinned by
//! sha256) or the system one. It is what an engine's own fixture must do to be a runner, shown in
//! the smallest form that passes the gate's verifier with no special case.
//!
//! No dependency from any registry: JSON, SHA-256 and SHAKE128 are implemented here, and the verbs
//! calls go through a small C shim (shim/verbs_shim.c) built against rdma-core's headers.

// A typed error is the cold path of every call and is moved once, into the ledger.
#![allow(clippy::result_large_err)]

pub mod case;
pub mod content;
pub mod engine;
pub mod hash;
pub mod json;
pub mod runner;
pub mod sysfs;
mod verbs;
pub mod wire;

pub use runner::main_with_args;
