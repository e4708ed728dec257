//! Small helpers for tasks on one reactor thread: a two-way select, a parked-waker cell, and a
//! wrapper that keeps a panicking task from taking the reactor (and every other client on it)
//! down.

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::{pin, Pin};
use std::task::{Context, Poll, Waker};

/// The output of [`select`]: which future finished first.
pub(crate) enum Either<A, B> {
    /// The first future.
    Left(A),
    /// The second future.
    Right(B),
}

/// Polls both futures and returns the output of the first one ready; the other is dropped
/// (a dropped socket operation is cancelled by the ring driver).
pub(crate) async fn select<A: Future, B: Future>(a: A, b: B) -> Either<A::Output, B::Output> {
    let mut a = pin!(a);
    let mut b = pin!(b);
    poll_fn(|cx| {
        if let Poll::Ready(out) = a.as_mut().poll(cx) {
            return Poll::Ready(Either::Left(out));
        }
        if let Poll::Ready(out) = b.as_mut().poll(cx) {
            return Poll::Ready(Either::Right(out));
        }
        Poll::Pending
    })
    .await
}

/// The waker of one task waiting for a condition on this thread. One slot, replaced at each
/// registration, so it never grows however often the task is polled.
#[derive(Default)]
pub(crate) struct WakerCell(Cell<Option<Waker>>);

impl WakerCell {
    /// Parks `waker` (keeping the old one if it wakes the same task).
    pub(crate) fn register(&self, waker: &Waker) {
        let old = self.0.take();
        match old {
            Some(old) if old.will_wake(waker) => self.0.set(Some(old)),
            _ => self.0.set(Some(waker.clone())),
        }
    }

    /// Wakes the parked task, if any.
    pub(crate) fn wake(&self) {
        if let Some(waker) = self.0.take() {
            waker.wake();
        }
    }
}

/// Waits until `condition` holds, parking the task in `cell` meanwhile. Whoever changes what
/// the condition reads must wake `cell`.
pub(crate) async fn wait_until(cell: &WakerCell, mut condition: impl FnMut() -> bool) {
    poll_fn(|cx| {
        if condition() {
            return Poll::Ready(());
        }
        cell.register(cx.waker());
        // Checked again: the condition may read state another thread changes (a stop
        // flag), and its waker may have fired between the first check and the registration.
        if condition() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await
}

/// Runs a task's future, turning a panic into the end of that task only.
///
/// The panic is still printed by the panic hook; the task's drop guards (slot release,
/// connection registry) run while unwinding, so its connection is torn down cleanly.
pub(crate) struct CatchUnwind<F> {
    future: Pin<Box<F>>,
    what: &'static str,
}

impl<F: Future<Output = ()>> CatchUnwind<F> {
    /// Wraps `future`; `what` names the task in the log line.
    pub(crate) fn new(what: &'static str, future: F) -> Self {
        CatchUnwind {
            future: Box::pin(future),
            what,
        }
    }
}

impl<F: Future<Output = ()>> Future for CatchUnwind<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let future = &mut this.future;
        match catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(poll) => poll,
            Err(_) => {
                tracing::error!(task = this.what, "nbd: task panicked; its connection ends");
                Poll::Ready(())
            }
        }
    }
}
