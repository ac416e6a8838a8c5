//! Event-time windows: assignment ([`Tumbling`], [`Sliding`], [`Sessions`]) as pure functions,
//! and [`Windows`], which keeps each key's open windows in keyed state with host timers, fires
//! them when the watermark passes their end, takes late records within an allowed lateness
//! (or sends them to a side output) and cleans up after.

mod assign;
mod book;
mod windows;

pub use assign::{Assigner, Sessions, Sliding, Tumbling, Window, WindowError, window_start};
pub use windows::Windows;
