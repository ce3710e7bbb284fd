//! Sampling (filled in by the engine work).
