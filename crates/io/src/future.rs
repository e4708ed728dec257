//! [`IoFuture`]: the future every [`Backend`](crate::Backend) operation returns.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::driver::{RingOp, RingOutput};

/// Result of an I/O.
pub type IoResult<T> = std::io::Result<T>;

/// The future every `Backend` operation returns. Not `Send`: a ring operation belongs to the
/// op table of the thread that polls it, so it must be created, polled and dropped there.
///
/// Ring operations are submitted at the first poll; drive the future with
/// [`rt::block_on`](crate::rt::block_on) or a [`LocalExecutor`](crate::rt::LocalExecutor)
/// (another executor would not turn this thread's ring). Dropping it before completion is
/// safe: the buffer stays with the op table until the kernel is done with it.
#[must_use = "futures do nothing unless polled"]
pub struct IoFuture<T> {
    inner: Inner<T>,
    _not_send: PhantomData<*const ()>,
}

enum Inner<T> {
    /// Already complete; `None` once taken.
    Ready(Option<IoResult<T>>),
    /// A wrapper's future (fault backend).
    Boxed(Pin<Box<dyn Future<Output = IoResult<T>>>>),
    /// An operation on this thread's ring, and how to turn its output into a `T`.
    Ring(RingOp, fn(RingOutput) -> T),
}

impl<T> IoFuture<T> {
    /// A future that is already complete (the memory backend, argument errors).
    pub fn ready(result: IoResult<T>) -> IoFuture<T> {
        IoFuture {
            inner: Inner::Ready(Some(result)),
            _not_send: PhantomData,
        }
    }

    /// Wraps any future (for wrapping backends such as the fault backend); allocates.
    pub fn boxed(fut: impl Future<Output = IoResult<T>> + 'static) -> IoFuture<T> {
        IoFuture {
            inner: Inner::Boxed(Box::pin(fut)),
            _not_send: PhantomData,
        }
    }

    /// An operation on the current thread's ring; `map` extracts the result from its output.
    pub(crate) fn ring(op: RingOp, map: fn(RingOutput) -> T) -> IoFuture<T> {
        IoFuture {
            inner: Inner::Ring(op, map),
            _not_send: PhantomData,
        }
    }
}

// The `T` is only ever moved out, never pinned in place, and the boxed future is pinned on
// the heap, so `IoFuture` can be `Unpin` whatever `T` is.
impl<T> Unpin for IoFuture<T> {}

impl<T> Future for IoFuture<T> {
    type Output = IoResult<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<IoResult<T>> {
        match &mut self.get_mut().inner {
            Inner::Ready(result) => Poll::Ready(
                result
                    .take()
                    .expect("oxpool-io: IoFuture polled after completion"),
            ),
            Inner::Boxed(fut) => fut.as_mut().poll(cx),
            Inner::Ring(op, map) => Pin::new(op).poll(cx).map(|r| r.map(*map)),
        }
    }
}

impl<T> fmt::Debug for IoFuture<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.inner {
            Inner::Ready(Some(_)) => "ready",
            Inner::Ready(None) => "taken",
            Inner::Boxed(_) => "boxed",
            Inner::Ring(..) => "ring",
        };
        f.debug_struct("IoFuture").field("kind", &kind).finish()
    }
}
