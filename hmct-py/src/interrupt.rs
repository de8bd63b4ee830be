//! Running a long computation interruptibly: the work runs on a scoped worker thread
//! with the GIL released; the calling thread wakes every few milliseconds to forward
//! progress to a Python callback and to check for signals (Ctrl-C). On a signal it
//! raises the engine's cancel flag, which stops the work before the next node it runs,
//! waits for the worker and re-raises the signal's exception.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::ScopedJoinHandle;
use std::time::{Duration, Instant};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// How often the calling thread looks at signals and progress.
const TICK: Duration = Duration::from_millis(50);

/// Progress of the work: (stage, done, total), and whether it changed since read.
#[derive(Default)]
pub(crate) struct Progress {
    state: Mutex<Option<(String, usize, usize)>>,
}

impl Progress {
    pub(crate) fn set(&self, stage: &str, done: usize, total: usize) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        *s = Some((stage.to_string(), done, total));
    }

    fn take(&self) -> Option<(String, usize, usize)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// Runs `work` on a worker thread; see the module docs. `callback(stage, done,
/// total)` is called from this thread, holding the GIL, when progress changed.
pub(crate) fn run<T: Send>(
    py: Python<'_>,
    cancel: &AtomicBool,
    callback: Option<&Bound<'_, PyAny>>,
    work: impl FnOnce(&Progress) -> T + Send,
) -> PyResult<T> {
    cancel.store(false, Ordering::Relaxed);
    let progress = Progress::default();
    std::thread::scope(|scope| {
        let handle = scope.spawn(|| work(&progress));
        loop {
            let finished = py.detach(|| wait(&handle, TICK));
            let mut failure = None;
            if let (Some(cb), Some((stage, done, total))) = (callback, progress.take())
                && let Err(e) = cb.call1((stage, done, total))
            {
                failure = Some(e);
            }
            if finished && failure.is_none() {
                break;
            }
            if failure.is_none()
                && let Err(e) = py.check_signals()
            {
                failure = Some(e);
            }
            if let Some(e) = failure {
                cancel.store(true, Ordering::Relaxed);
                // The worker stops at its next check; its result is dropped.
                let _ = py.detach(|| handle.join());
                return Err(e);
            }
        }
        py.detach(|| handle.join()).map_err(|panic| {
            let text = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("unknown panic");
            PyRuntimeError::new_err(format!("internal error in hmct-rs (please report): {text}"))
        })
    })
}

/// True once the worker has finished, else false after `tick`.
fn wait<T>(handle: &ScopedJoinHandle<'_, T>, tick: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < tick {
        if handle.is_finished() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    handle.is_finished()
}
