//! The generation loop.
