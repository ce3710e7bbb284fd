//! Serving many requests at once: the KV block manager with its prefix cache,
//! and the continuous-batching scheduler that drives an [`crate::generate::Engine`].

pub mod blocks;
pub mod disk_tier;
mod flight;
mod rewarm;
pub mod scheduler;
mod seq;
pub mod solo;
mod spec;
pub mod state_slots;
pub mod windows;

pub use blocks::{BlockManager, BlockStats};
pub use scheduler::{Scheduler, SchedulerConfig, SchedulerStats, SeqHooks, SeqOutcome, Submission};
