//! Unit test of the places a self-heal rewrites (`HealGuard`): while the heal lives, the sync
//! does not release their deferred frees, however many txgs pass, so the place cannot be
//! reused under the rewrite. It needs a whole pool (the guard is the pool's, the block a
//! volume's).

use crate::props::PoolProps;
use crate::vdev::alloc::DEFER_TXGS;
use crate::vdev::queue::IoClass;
use crate::zio::{read_data_block, HealGuard};
use crate::{Pool, TopSpec};
use oxpool_format::DATA_START_BYTES;
use oxpool_io::rt::block_on;
use oxpool_io::{Backend, IoBuf, IoFuture, MemoryBackend};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

#[test]
fn a_place_being_healed_is_not_released_until_the_heal_ends() {
    let mut props = PoolProps::default();
    props.set("txg_timeout", "3600").unwrap();
    let dev: Arc<dyn Backend> = Arc::new(MemoryBackend::new("d0", 64 << 20));
    let pool = Pool::create("tank", vec![TopSpec::single(dev)], props, false).unwrap();
    let vol = pool
        .create_volume("v", 1 << 20, &[("compression".into(), "off".into())])
        .unwrap();
    let bs = vol.block_size_bytes() as usize;
    block_on(vol.write(0, &vec![1u8; bs], false)).unwrap();
    pool.sync().unwrap();
    let old = block_on(vol.block_pointer(0)).unwrap();
    let dva = old.dvas()[0];
    // The level-1 block above it, freed in the same txg when the block is replaced.
    let old_l1 = vol
        .vol
        .data()
        .tree
        .lock()
        .unwrap()
        .pointer_to_block(1, 0)
        .unwrap();
    let is_allocated = |d: &oxpool_format::Dva| {
        let s = pool.spa.state.lock().unwrap();
        s.alloc.map(d.vdev).is_allocated(d)
    };
    let allocated = || is_allocated(&dva);
    let guard = HealGuard::new(&pool.spa.zio, old.dvas()).unwrap();
    // The block is replaced: its old place is freed, deferred, and past the deferral.
    block_on(vol.write(0, &vec![2u8; bs], false)).unwrap();
    for _ in 0..DEFER_TXGS + 3 {
        pool.sync().unwrap();
    }
    assert!(allocated(), "a place being healed was released");
    // Only that place waits: the other frees of its txg are released.
    assert!(
        old_l1.dvas().iter().all(|d| !is_allocated(d)),
        "a heal held back the other frees of its txg"
    );
    drop(guard);
    for _ in 0..DEFER_TXGS + 2 {
        pool.sync().unwrap();
    }
    assert!(!allocated(), "the place stayed allocated after the heal");
    assert!(pool.audit().unwrap().is_clean());
    drop(vol);
    pool.export().unwrap();
}

/// A device whose write at one offset, once asked for, stays in flight until the test lets it
/// go, whether or not its future is dropped: as a write the kernel has (io_uring does not
/// cancel a disk write whose future is dropped; the driver keeps its buffer until it ends).
struct HeldWrite {
    inner: MemoryBackend,
    at_bytes: u64,
    held: Mutex<Vec<Arc<IoBuf>>>,
}

impl HeldWrite {
    /// Lets the held writes reach the device.
    fn release(&self) {
        for buf in self.held.lock().unwrap().drain(..) {
            block_on(self.inner.write(self.at_bytes, IoBuf::from_slice(&buf))).unwrap();
        }
    }
}

impl Backend for HeldWrite {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read(&self, offset_bytes: u64, buf: IoBuf) -> IoFuture<IoBuf> {
        self.inner.read(offset_bytes, buf)
    }
    fn write(&self, offset_bytes: u64, buf: IoBuf) -> IoFuture<IoBuf> {
        assert_ne!(
            offset_bytes, self.at_bytes,
            "the heal writes from a shared buffer"
        );
        self.inner.write(offset_bytes, buf)
    }
    fn write_shared(&self, offset_bytes: u64, buf: Arc<IoBuf>) -> IoFuture<()> {
        if offset_bytes != self.at_bytes {
            return self.inner.write_shared(offset_bytes, buf);
        }
        self.held.lock().unwrap().push(buf);
        IoFuture::boxed(std::future::pending())
    }
    fn write_gather(&self, offset_bytes: u64, bufs: Vec<Arc<IoBuf>>) -> IoFuture<()> {
        self.inner.write_gather(offset_bytes, bufs)
    }
    fn write_durable(&self, offset_bytes: u64, buf: IoBuf) -> IoFuture<IoBuf> {
        self.inner.write_durable(offset_bytes, buf)
    }
    fn flush(&self) -> IoFuture<()> {
        self.inner.flush()
    }
    fn discard(&self, offset_bytes: u64, length_bytes: u64) -> IoFuture<()> {
        self.inner.discard(offset_bytes, length_bytes)
    }
}

/// A reader dropped while its heal write is in flight (a client gone mid-read) does not end
/// the hold on the place: the write still lands, so the place is not released until it has.
#[test]
fn a_heal_write_outliving_its_reader_keeps_its_place_held() {
    heal_write_outlives_its_reader(Reader::Volume);
}

/// The same for a reader whose pointer is stable only while it lives (a send's, holding its
/// snapshot), which heals without a currency check.
#[test]
fn a_heal_write_outliving_a_plain_block_read_keeps_its_place_held() {
    heal_write_outlives_its_reader(Reader::Block);
}

/// Who reads the damaged block.
enum Reader {
    /// The volume's read path (`heal_if_current`).
    Volume,
    /// `zio::read_data_block`, which heals at once.
    Block,
}

fn heal_write_outlives_its_reader(reader: Reader) {
    let mut props = PoolProps::default();
    props.set("txg_timeout", "3600").unwrap();
    let mem = MemoryBackend::new("d0", 64 << 20);
    let pool = Pool::create(
        "tank",
        vec![TopSpec::single(Arc::new(mem.clone()))],
        props,
        false,
    )
    .unwrap();
    let vol = pool
        .create_volume(
            "v",
            1 << 20,
            &[
                ("compression".into(), "off".into()),
                ("copies".into(), "2".into()),
            ],
        )
        .unwrap();
    let bs = vol.block_size_bytes() as usize;
    block_on(vol.write(0, &vec![1u8; bs], false)).unwrap();
    pool.sync().unwrap();
    drop(vol);
    pool.export().unwrap();
    let old = {
        let pool = Pool::import(vec![Arc::new(mem.clone()) as Arc<dyn Backend>], None).unwrap();
        let bp = block_on(pool.volume("v").unwrap().block_pointer(0)).unwrap();
        pool.export().unwrap();
        bp
    };
    assert_eq!(old.dvas().len(), 2, "copies=2 gives two places");
    let first = old.dvas()[0];
    let at_bytes = DATA_START_BYTES + first.offset_bytes;
    // The first copy is read first; damaged, it is read from the second and healed.
    mem.corrupt(at_bytes, 64, 7);
    let dev = Arc::new(HeldWrite {
        inner: mem.clone(),
        at_bytes,
        held: Mutex::new(Vec::new()),
    });
    let pool = Pool::import(vec![dev.clone() as Arc<dyn Backend>], None).unwrap();
    let vol = pool.volume("v").unwrap();
    {
        let mut out = vec![0u8; bs];
        let mut read: std::pin::Pin<Box<dyn Future<Output = ()> + '_>> = match reader {
            Reader::Volume => Box::pin(async { vol.read(0, &mut out).await.unwrap() }),
            Reader::Block => Box::pin(async {
                let zio = &pool.spa.zio;
                read_data_block(zio, IoClass::SyncRead, &old, bs, "the block")
                    .await
                    .unwrap();
            }),
        };
        let mut cx = Context::from_waker(Waker::noop());
        // Bounded: the read reaches its heal within a few polls; a second at most.
        for _ in 0..1000 {
            if !dev.held.lock().unwrap().is_empty() {
                break;
            }
            if let Poll::Ready(r) = read.as_mut().poll(&mut cx) {
                panic!("the read ended without a heal write: {r:?}");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(dev.held.lock().unwrap().len(), 1, "no heal write started");
        // The reader goes; its write does not.
    }
    let is_allocated = |d: &oxpool_format::Dva| {
        let s = pool.spa.state.lock().unwrap();
        s.alloc.map(d.vdev).is_allocated(d)
    };
    block_on(vol.write(0, &vec![2u8; bs], false)).unwrap();
    for _ in 0..DEFER_TXGS + 3 {
        pool.sync().unwrap();
    }
    assert!(
        is_allocated(&first),
        "a place was released while a heal write to it was in flight"
    );
    dev.release();
    for _ in 0..DEFER_TXGS + 2 {
        pool.sync().unwrap();
    }
    assert!(
        !is_allocated(&first),
        "the place stayed allocated after the heal write ended"
    );
    assert!(pool.audit().unwrap().is_clean());
    drop(vol);
    pool.export().unwrap();
}
