//! Event-time windows: assignment ([`Tumbling`], [`Sliding`], [`Sessions`]) as pure functions,
//! and [`Windows`], which keeps each key's open windows in keyed state with host timers, fires
//! them when the watermark passes their end, takes late records within an allowed lateness
//! (or sends them to a side output) and cleans up after. Joins of two inputs on the same
//! machinery: [`WindowJoin`] (both sides of a window together) and [`IntervalJoin`] (a left
//! record with every right one within a time interval of it).

mod assign;
mod book;
mod interval;
mod join;
mod windows;

pub use assign::{Assigner, Sessions, Sliding, Tumbling, Window, WindowError, window_start};
pub use interval::{Buffers, IntervalJoin, IntervalRules};
pub use join::{Sides, WindowJoin};
pub use windows::Windows;
