//! Helpers shared by the integration tests. Each test binary includes only
//! what it uses.
#![allow(dead_code)]

pub mod alloc_counter;
pub mod ganesha;
pub mod linux_guest;
pub mod roce_pair;
pub mod worker_harness;
