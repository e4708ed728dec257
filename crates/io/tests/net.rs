//! Sockets on the ring: echo over unix and TCP, cancellation of a dropped recv.

use std::future::Future;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::pin::Pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::Duration;

use oxpool_io::rt::net::{Listener, Stream};
use oxpool_io::rt::{block_on, ops_in_flight, sleep, spawn_local, LocalExecutor};
use oxpool_io::{IoBuf, Scatter};

/// Echoes everything until EOF.
async fn echo(stream: Stream) {
    let mut buf = IoBuf::zeroed(64 * 1024);
    for _ in 0..1_000_000 {
        let (back, n) = stream.recv(buf, 0).await.unwrap();
        if n == 0 {
            stream.shutdown();
            return;
        }
        buf = stream.send_all(back, n).await.unwrap();
    }
    panic!("echo loop bound reached");
}

/// Sends `total` bytes and checks they come back, from a plain blocking client.
fn client(
    mut conn: impl Read + Write + Send + 'static,
    total: usize,
    seed: u8,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let data: Vec<u8> = (0..total).map(|i| (i as u8).wrapping_add(seed)).collect();
        let mut back = vec![0u8; total];
        let mut sent = 0;
        let mut got = 0;
        // Interleave sends and receives so neither side's socket buffer fills up.
        while got < total {
            if sent < total {
                let n = (total - sent).min(10_000);
                conn.write_all(&data[sent..sent + n]).unwrap();
                sent += n;
            }
            let n = conn.read(&mut back[got..sent]).unwrap();
            assert!(n > 0, "early EOF");
            got += n;
        }
        assert_eq!(back, data);
    })
}

#[test]
fn unix_echo() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("echo.sock");
    let listener = Listener::unix(UnixListener::bind(&path).unwrap());
    let clients: Vec<_> = (0..3u8)
        .map(|i| {
            client(
                UnixStream::connect(&path).unwrap(),
                300_000 + i as usize * 777,
                i,
            )
        })
        .collect();
    let exec = LocalExecutor::new();
    exec.run_until(async {
        let mut tasks = Vec::new();
        for _ in 0..3 {
            let stream = listener.accept().await.unwrap();
            let done = Rc::new(std::cell::Cell::new(false));
            let flag = done.clone();
            spawn_local(async move {
                echo(stream).await;
                flag.set(true);
            });
            tasks.push(done);
        }
        while !tasks.iter().all(|t| t.get()) {
            sleep(Duration::from_millis(1)).await;
        }
    });
    for c in clients {
        c.join().unwrap();
    }
}

#[test]
fn tcp_echo() {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = std_listener.local_addr().unwrap();
    let listener = Listener::tcp(std_listener);
    let c = client(std::net::TcpStream::connect(addr).unwrap(), 1 << 20, 9);
    block_on(async {
        let stream = listener.accept().await.unwrap();
        echo(stream).await;
    });
    c.join().unwrap();
}

#[test]
fn recv_and_send_argument_checks() {
    let (a, _b) = UnixStream::pair().unwrap();
    let stream = Stream::from_unix(a);
    block_on(async {
        assert!(stream.recv(IoBuf::zeroed(16), 16).await.is_err());
        assert!(stream.send_all(IoBuf::zeroed(16), 17).await.is_err());
        assert_eq!(
            stream.send_all(IoBuf::zeroed(16), 0).await.unwrap().len(),
            16
        );
    });
}

#[test]
fn dropped_recv_is_cancelled() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let stream = Stream::from_unix(a);
    block_on(async {
        {
            // Nobody sends: this recv would wait forever.
            let mut recv = Box::pin(stream.recv(IoBuf::zeroed(4096), 0));
            let polled = std::future::poll_fn(|cx| {
                Poll::Ready(Pin::new(&mut recv).as_mut().poll(cx).is_ready())
            })
            .await;
            assert!(!polled);
            sleep(Duration::from_millis(1)).await;
            assert_eq!(ops_in_flight(), 1);
        }
        for _ in 0..10_000 {
            if ops_in_flight() == 0 {
                break;
            }
            sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(ops_in_flight(), 0);
        // The stream still works: the cancelled recv consumed nothing.
        b.write_all(b"hello").unwrap();
        let (buf, n) = stream.recv(IoBuf::zeroed(16), 3).await.unwrap();
        assert_eq!(&buf[3..3 + n], b"hello");
    });
}

#[test]
fn peer_close_is_eof() {
    let (a, b) = UnixStream::pair().unwrap();
    let stream = Stream::from_unix(a);
    drop(b);
    let (_, n) = block_on(stream.recv(IoBuf::zeroed(16), 0)).unwrap();
    assert_eq!(n, 0);
}

/// A vectored receive fills the buffers back to back, in pieces as the bytes arrive (the
/// sender writes in uneven bursts, so receives start mid-buffer), and never reads past `end`:
/// the bytes after it stay on the socket for the next receive.
#[test]
fn recv_scatter_fills_buffers_in_order_and_stops_at_end() {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = std_listener.local_addr().unwrap();
    let listener = Listener::tcp(std_listener);
    let total = 5 * 4096 + 100;
    let data: Vec<u8> = (0..total).map(|i| (i * 7 + i / 251) as u8).collect();
    let sent = data.clone();
    let sender = std::thread::spawn(move || {
        let mut conn = std::net::TcpStream::connect(addr).unwrap();
        for piece in sent.chunks(3001) {
            conn.write_all(piece).unwrap();
            std::thread::sleep(Duration::from_millis(2));
        }
    });
    block_on(async {
        let stream = listener.accept().await.unwrap();
        let mut scatter = Scatter::with_capacity(5);
        for _ in 0..5 {
            scatter.push(IoBuf::zeroed(4096));
        }
        let end = 5 * 4096 - 10;
        let mut filled = 0;
        for _ in 0..10_000 {
            if filled == end {
                break;
            }
            let (back, n) = stream.recv_scatter(scatter, end).await.unwrap();
            assert!(n > 0, "early EOF");
            scatter = back;
            filled += n;
            assert!(filled <= end);
            assert_eq!(scatter.filled_bytes(), filled);
        }
        assert_eq!(filled, end);
        let got: Vec<u8> = scatter
            .bufs_mut()
            .iter()
            .flat_map(|b| b.iter().copied())
            .collect();
        assert_eq!(&got[..end], &data[..end]);
        assert!(got[end..].iter().all(|&b| b == 0), "wrote past end");
        // The rest is still there, for an ordinary receive.
        let mut rest = Vec::new();
        let mut buf = IoBuf::zeroed(4096);
        while rest.len() < total - end {
            let (back, n) = stream.recv(buf, 0).await.unwrap();
            assert!(n > 0, "early EOF");
            rest.extend_from_slice(&back[..n]);
            buf = back;
        }
        assert_eq!(&rest[..], &data[end..]);
        // Buffers allocated for the receive (not zeroed first), filled whole.
        let (mut tx, rx) = std::os::unix::net::UnixStream::pair().unwrap();
        let rx = Stream::from_unix(rx);
        tx.write_all(&data[..3 * 4096]).unwrap();
        let mut fresh = Scatter::with_capacity(3);
        for _ in 0..3 {
            fresh.push_for_receive(4096);
        }
        for _ in 0..10_000 {
            if fresh.filled_bytes() == 3 * 4096 {
                break;
            }
            let (back, n) = rx.recv_scatter(fresh, 3 * 4096).await.unwrap();
            assert!(n > 0, "early EOF");
            fresh = back;
        }
        let got: Vec<u8> = fresh
            .bufs_mut()
            .iter()
            .flat_map(|b| b.iter().copied())
            .collect();
        assert_eq!(&got[..], &data[..3 * 4096]);
        assert!(stream
            .recv_scatter(Scatter::with_capacity(0), 1)
            .await
            .is_err());
    });
    sender.join().unwrap();
}
