//! Weir's own log: `tracing` events with fields (`job`, `operator`, `subtask`, `checkpoint`),
//! written to stderr as text for people or as JSON lines for machines (`--log-format json`),
//! filtered by `WEIR_LOG` (an `EnvFilter` directive; default `info`).
//!
//! Guest log lines are events too, with the same fields plus `guest = true`: escaped (a
//! newline cannot forge another line) and rate-limited per instance (`sandbox/host.rs`).
//! Invariant: the library only emits events; the binary chooses the format once, at start
//! (a library user without a subscriber gets no output, as with any `tracing` library).

use tracing_subscriber::EnvFilter;

/// How the log is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `fields.message` and the event's fields.
    Json,
}

/// Installs the process's subscriber (once; later calls do nothing).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_env("WEIR_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only on a terminal (never in files, pipes or CI logs).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(ansi);
    let _ = match format {
        LogFormat::Text => builder.without_time().try_init(),
        LogFormat::Json => builder.json().with_current_span(false).with_span_list(false).try_init(),
    };
}
