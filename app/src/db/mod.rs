//! TODO

pub mod local;
