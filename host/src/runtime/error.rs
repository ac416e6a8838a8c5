//! Why a subtask or a job stopped. Failures are wrapped with the subtask's identity once,
//! at the task boundary.

use thiserror::Error;

use crate::ids::TaskId;
use crate::job::JobError;
use crate::job::bind::BindError;
use crate::sandbox::instance::{GuestError, LoadError};

/// Why a subtask failed.
#[derive(Debug, Error)]
pub enum TaskFailure {
    /// The guest trapped or returned an error.
    #[error("subtask {task}: {source}")]
    Guest {
        /// The subtask.
        task: TaskId,
        /// What the guest did.
        source: GuestError,
    },
    /// A source or sink failed (I/O, bad input).
    #[error("subtask {task}: {message}")]
    Connector {
        /// The subtask.
        task: TaskId,
        /// What failed.
        message: String,
    },
    /// An external system (a database, a broker) could not be reached. The restart strategy
    /// retries it like any failure, but an outage repeating the same message is not a
    /// deterministic bug: it never stops the job as a repeated failure.
    #[error("subtask {task}: {message}")]
    Unavailable {
        /// The subtask.
        task: TaskId,
        /// What could not be reached.
        message: String,
    },
    /// A host resource limit of the job was exceeded (not inside a guest call).
    #[error("subtask {task}: {message}")]
    Limit {
        /// The subtask.
        task: TaskId,
        /// Which limit, its value, and what to do.
        message: String,
    },
    /// A neighbour stopped: a consequence of another failure, not a cause.
    #[error("subtask {task}: a neighbouring subtask stopped")]
    Disconnected {
        /// The subtask.
        task: TaskId,
    },
    /// The job was cancelled.
    #[error("subtask {task}: cancelled")]
    Cancelled {
        /// The subtask.
        task: TaskId,
    },
    /// A subtask on another worker failed (as that worker reported it), or its worker was
    /// lost.
    #[error("subtask {task} on worker {worker}: {message}")]
    Remote {
        /// The subtask.
        task: TaskId,
        /// The worker (its name and address).
        worker: String,
        /// What happened there.
        message: String,
        /// Caused by another failure (a neighbour gone, a cancel).
        secondary: bool,
        /// Likely to pass on a retry (an unreachable service, a lost worker).
        transient: bool,
    },
    /// The checkpoint the subtask restores from could not be read as it restored (a file
    /// damaged or changed since the checkpoint was loaded): not the operator's fault.
    #[error("subtask {task}: {message}")]
    Checkpoint {
        /// The subtask.
        task: TaskId,
        /// The file and what is wrong with it, and what to do.
        message: String,
    },
    /// The subtask's thread panicked (a host bug).
    #[error("subtask {task}: internal error (thread panicked: {message})")]
    Panicked {
        /// The subtask.
        task: TaskId,
        /// Panic payload.
        message: String,
    },
}

impl TaskFailure {
    /// The guest ran into its CPU time limit.
    pub fn is_cpu_limit(&self) -> bool {
        matches!(self, TaskFailure::Guest { source: GuestError::Trap { message, .. }, .. }
            if message.starts_with("exceeded its CPU time limit"))
    }

    /// The sandbox limit this failure ran into (`cpu_time`, `memory`, `stack`, `tables`,
    /// `emit`, `timers`, `snapshot_size`, `state_value`, `in_flight`), if it was one.
    pub fn limit(&self) -> Option<&'static str> {
        const BY_MESSAGE: [(&str, &str); 9] = [
            ("exceeded its CPU time limit", "cpu_time"),
            ("exceeded its memory limit", "memory"),
            ("exhausted its call stack", "stack"),
            ("exceeded its table limit", "tables"),
            ("(limit max_emit_mb)", "emit"),
            ("exceeded its timer limit", "timers"),
            ("exceeded its snapshot size limit", "snapshot_size"),
            ("exceeded its state value limit", "state_value"),
            ("exceeded the in-flight limit", "in_flight"),
        ];
        let message = match self {
            TaskFailure::Guest { source: GuestError::Trap { message, .. }, .. } => message,
            TaskFailure::Limit { message, .. } => message,
            TaskFailure::Remote { message, .. } => message,
            _ => return None,
        };
        BY_MESSAGE.iter().find(|(m, _)| message.contains(m)).map(|(_, l)| *l)
    }

    /// An outage of an external system, not a fault of the job.
    pub fn is_transient(&self) -> bool {
        matches!(self, TaskFailure::Unavailable { .. } | TaskFailure::Remote { transient: true, .. })
    }

    /// The subtask that failed.
    pub fn task(&self) -> &TaskId {
        match self {
            TaskFailure::Guest { task, .. }
            | TaskFailure::Connector { task, .. }
            | TaskFailure::Unavailable { task, .. }
            | TaskFailure::Limit { task, .. }
            | TaskFailure::Disconnected { task }
            | TaskFailure::Cancelled { task }
            | TaskFailure::Remote { task, .. }
            | TaskFailure::Checkpoint { task, .. }
            | TaskFailure::Panicked { task, .. } => task,
        }
    }

    /// A consequence of another failure rather than a root cause.
    pub fn is_secondary(&self) -> bool {
        matches!(
            self,
            TaskFailure::Disconnected { .. }
                | TaskFailure::Cancelled { .. }
                | TaskFailure::Remote { secondary: true, .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trap(message: &str) -> TaskFailure {
        let task = TaskId { node: crate::ids::NodeId::new("op"), subtask: crate::ids::SubtaskIndex(0) };
        TaskFailure::Guest { task, source: GuestError::Trap { call: "process", message: message.into(), detail: None } }
    }

    #[test]
    fn failures_name_the_limit_they_ran_into() {
        assert_eq!(trap("exceeded its CPU time limit: the call ran longer than ...").limit(), Some("cpu_time"));
        assert_eq!(trap("exceeded its memory limit: linear memory ...").limit(), Some("memory"));
        assert_eq!(trap("exhausted its call stack (unbounded recursion?)").limit(), Some("stack"));
        assert_eq!(trap("op/x#0: emitted more than 5 bytes in one call (limit max_emit_mb)").limit(), Some("emit"));
        assert_eq!(trap("wasm trap: unreachable").limit(), None);
        let task = TaskId { node: crate::ids::NodeId::new("op"), subtask: crate::ids::SubtaskIndex(0) };
        let l = TaskFailure::Limit { task, message: "exceeded the in-flight limit of the job's loops".into() };
        assert_eq!(l.limit(), Some("in_flight"));
    }
}

/// Why a job could not run or stopped.
#[derive(Debug, Error)]
pub enum RunError {
    /// The job file is invalid for its components.
    #[error(transparent)]
    Job(#[from] JobError),
    /// A component cannot be used.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A subtask failed and the restart strategy gave up.
    #[error("job `{job}` failed after {attempts} attempt(s): {cause}")]
    Failed {
        /// Job name.
        job: String,
        /// Attempts made.
        attempts: u32,
        /// The root cause.
        cause: TaskFailure,
    },
    /// The same failure came from the same restore point several times in a row.
    #[error(
        "job `{job}` stopped after {attempts} attempt(s): it failed the same way each time from the same restore \
         point ({from}), so restarting cannot help: a record in the input or the operator itself is at fault. \
         Fix the operator or the input, then restore the job: {cause}"
    )]
    Repeated {
        /// Job name.
        job: String,
        /// Attempts made.
        attempts: u32,
        /// Where each attempt started: `checkpoint N` or `the beginning`.
        from: String,
        /// The root cause.
        cause: Box<TaskFailure>,
    },
    /// The restored state cannot go into the job's components (refused before starting).
    #[error("job `{job}` refused to start: {message}")]
    Incompatible {
        /// Job name.
        job: String,
        /// Which operator, which versions, what to do.
        message: String,
    },
    /// Cancelled by a user.
    #[error("job `{job}` was cancelled")]
    Cancelled {
        /// Job name.
        job: String,
    },
    /// Setting up the job failed (e.g. the sink directory).
    #[error("job `{job}`: {message}")]
    Setup {
        /// Job name.
        job: String,
        /// What failed.
        message: String,
    },
}

impl From<BindError> for RunError {
    fn from(e: BindError) -> Self {
        match e {
            BindError::Job(e) => RunError::Job(e),
            BindError::Load(e) => RunError::Load(e),
        }
    }
}
