//! Kafka in and out, through librdkafka (`rdkafka`): a source whose offsets live in
//! checkpoints, and a sink that writes in Kafka transactions committed when checkpoints
//! complete. The pure parts (which subtask owns a partition, per-partition watermarks, the
//! sink's transaction protocol) are separate from the client calls.

pub mod assign;
pub mod sink;
pub mod source;
pub mod watermarks;

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError as RdError, RDKafkaErrorCode};

/// How long a metadata, offset or transaction request may take before the connector calls
/// the broker unreachable.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A Kafka connector's failure; `transient` when the broker could not be reached (an outage,
/// retried by the restart strategy without counting as a fault of the job).
#[derive(Debug)]
pub struct KafkaError {
    /// What failed, naming the broker, topic or partition, and what to do.
    pub message: String,
    /// The broker was unreachable.
    pub transient: bool,
}

impl std::fmt::Display for KafkaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl KafkaError {
    /// A failure that retrying will not fix.
    pub fn fatal(message: impl Into<String>) -> Self {
        KafkaError { message: message.into(), transient: false }
    }

    /// `what` failed with `e` talking to `bootstrap`.
    pub fn from_client(what: &str, bootstrap: &str, e: &RdError) -> Self {
        let transient = is_outage(e);
        let hint = if transient { "; check bootstrap_servers and that the broker is up" } else { "" };
        KafkaError { message: format!("{what} failed at broker {bootstrap}: {e}{hint}"), transient }
    }
}

/// Whether `e` means the broker could not be reached (rather than refused the request).
pub fn is_outage(e: &RdError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::BrokerTransportFailure
                | C::AllBrokersDown
                | C::OperationTimedOut
                | C::RequestTimedOut
                | C::NetworkException
                | C::Resolve
                | C::CoordinatorNotAvailable
                | C::NotCoordinator
                | C::CoordinatorLoadInProgress
                | C::LeaderNotAvailable
                | C::NotLeaderForPartition
                | C::BrokerNotAvailable
        )
    ) || matches!(e, RdError::MetadataFetch(_))
        && e.rdkafka_error_code().is_none_or(|c| matches!(c, C::OperationTimedOut | C::AllBrokersDown))
}

/// A client configuration for `bootstrap` with librdkafka's own logging quiet (its errors
/// reach the connector as results) and reconnects bounded.
pub fn client_config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("log_level", "0")
        .set("socket.connection.setup.timeout.ms", "5000")
        .set("reconnect.backoff.max.ms", "1000");
    c
}
