//! The process's runtime for network and object-store I/O of threads that are not async
//! themselves (subtasks, the checkpoint writer and coordinator): two worker threads, started
//! on first use and shared, so each client or link does not bring threads of its own.

use std::sync::OnceLock;

/// The shared I/O runtime.
pub fn io_runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("weir-io")
            .enable_all()
            .build()
            .expect("starting the I/O runtime")
    })
}
