//! [`MemoryBackend`]: a sparse in-memory device.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::buf::IoBuf;
use crate::{Backend, IoFuture, IoResult};

/// Allocation unit of the memory device: chunks never written read as zeros and cost nothing.
const CHUNK_BYTES: usize = 64 * 1024;

type Chunks = HashMap<u64, Box<[u8]>>;

/// A sparse in-memory device: 64 KiB chunks allocated on first write, so a mostly empty 1 GiB
/// device costs little. `Clone` shares the same storage; [`MemoryBackend::snapshot`] copies it.
/// Every operation completes immediately.
#[derive(Clone, Debug)]
pub struct MemoryBackend {
    name: Arc<str>,
    size_bytes: u64,
    chunks: Arc<RwLock<Chunks>>,
}

impl MemoryBackend {
    /// An all-zero device of `size_bytes` called `name`.
    pub fn new(name: &str, size_bytes: u64) -> MemoryBackend {
        MemoryBackend {
            name: Arc::from(name),
            size_bytes,
            chunks: Arc::new(RwLock::new(HashMap::new())),
        }
    }

    /// A deep copy: a new device with the same name and contents, independent from now on.
    pub fn snapshot(&self) -> MemoryBackend {
        let copy = self.read_chunks().clone();
        MemoryBackend {
            name: self.name.clone(),
            size_bytes: self.size_bytes,
            chunks: Arc::new(RwLock::new(copy)),
        }
    }

    /// Flips 1..=8 distinct random bits within `[offset_bytes, offset_bytes + len)`, chosen
    /// by a PRNG seeded with `seed` (for tests: the same seed flips the same bits).
    pub fn corrupt(&self, offset_bytes: u64, len: usize, seed: u64) {
        assert!(
            offset_bytes
                .checked_add(len as u64)
                .is_some_and(|end| end <= self.size_bytes),
            "corrupt range outside the device"
        );
        if len == 0 {
            return;
        }
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut data = vec![0u8; len];
        self.copy_out(offset_bytes, &mut data);
        flip_random_bits(&mut data, &mut rng);
        self.copy_in(offset_bytes, &data);
    }

    /// Bytes of memory the device currently holds (allocated chunks).
    pub fn allocated_bytes(&self) -> u64 {
        (self.read_chunks().len() * CHUNK_BYTES) as u64
    }

    fn read_chunks(&self) -> RwLockReadGuard<'_, Chunks> {
        // A panic while holding the lock leaves chunk contents as valid bytes.
        self.chunks
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write_chunks(&self) -> RwLockWriteGuard<'_, Chunks> {
        self.chunks
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn check_range(&self, offset_bytes: u64, len: usize, what: &str) -> IoResult<()> {
        crate::check_range(&self.name, self.size_bytes, offset_bytes, len as u64, what)
    }

    fn copy_out(&self, offset_bytes: u64, out: &mut [u8]) {
        let chunks = self.read_chunks();
        for_each_piece(offset_bytes, out.len(), |index, within, pos, len| {
            let dest = &mut out[pos..pos + len];
            match chunks.get(&index) {
                Some(chunk) => dest.copy_from_slice(&chunk[within..within + len]),
                None => dest.fill(0),
            }
        });
    }

    fn copy_in(&self, offset_bytes: u64, data: &[u8]) {
        let mut chunks = self.write_chunks();
        for_each_piece(offset_bytes, data.len(), |index, within, pos, len| {
            let chunk = chunks
                .entry(index)
                .or_insert_with(|| vec![0u8; CHUNK_BYTES].into_boxed_slice());
            chunk[within..within + len].copy_from_slice(&data[pos..pos + len]);
        });
    }

    fn zero_range(&self, offset_bytes: u64, length_bytes: u64) {
        let mut chunks = self.write_chunks();
        let mut pos = offset_bytes;
        let end = offset_bytes + length_bytes;
        // Bounded by the number of chunks in the range.
        while pos < end {
            let index = pos / CHUNK_BYTES as u64;
            let within = (pos % CHUNK_BYTES as u64) as usize;
            let len = ((end - pos) as usize).min(CHUNK_BYTES - within);
            if len == CHUNK_BYTES {
                chunks.remove(&index);
            } else if let Some(chunk) = chunks.get_mut(&index) {
                chunk[within..within + len].fill(0);
            }
            pos += len as u64;
        }
    }
}

/// Calls `f(chunk_index, offset_within_chunk, position_in_data, len)` for each chunk-sized
/// piece of `[offset_bytes, offset_bytes + len)`.
fn for_each_piece(offset_bytes: u64, len: usize, mut f: impl FnMut(u64, usize, usize, usize)) {
    let mut pos = 0usize;
    // Bounded: each iteration advances by at least one byte, at most `len` in total.
    while pos < len {
        let abs = offset_bytes + pos as u64;
        let index = abs / CHUNK_BYTES as u64;
        let within = (abs % CHUNK_BYTES as u64) as usize;
        let piece = (len - pos).min(CHUNK_BYTES - within);
        f(index, within, pos, piece);
        pos += piece;
    }
}

/// Flips 1..=8 distinct random bits of `data` (fewer if it has fewer bits). Distinct, so the
/// data always changes.
pub(crate) fn flip_random_bits(data: &mut [u8], rng: &mut SmallRng) -> u32 {
    let total_bits = data.len() as u64 * 8;
    if total_bits == 0 {
        return 0;
    }
    let want = rng.random_range(1..=8u64).min(total_bits) as usize;
    let mut chosen = [u64::MAX; 8];
    let mut flipped = 0usize;
    // Bounded: 64 draws are plenty to find up to 8 distinct bits (or give up on a few).
    for _ in 0..64 {
        if flipped == want {
            break;
        }
        let bit = rng.random_range(0..total_bits);
        if chosen[..flipped].contains(&bit) {
            continue;
        }
        chosen[flipped] = bit;
        flipped += 1;
        data[(bit / 8) as usize] ^= 1 << (bit % 8);
    }
    debug_assert!(flipped >= 1);
    flipped as u32
}

impl Backend for MemoryBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read(&self, offset_bytes: u64, mut buf: IoBuf) -> IoFuture<IoBuf> {
        if let Err(err) = self.check_range(offset_bytes, buf.len(), "read") {
            return IoFuture::ready(Err(err));
        }
        self.copy_out(offset_bytes, &mut buf);
        IoFuture::ready(Ok(buf))
    }

    fn write(&self, offset_bytes: u64, buf: IoBuf) -> IoFuture<IoBuf> {
        if let Err(err) = self.check_range(offset_bytes, buf.len(), "write") {
            return IoFuture::ready(Err(err));
        }
        self.copy_in(offset_bytes, &buf);
        IoFuture::ready(Ok(buf))
    }

    fn write_shared(&self, offset_bytes: u64, buf: Arc<IoBuf>) -> IoFuture<()> {
        if let Err(err) = self.check_range(offset_bytes, buf.len(), "write") {
            return IoFuture::ready(Err(err));
        }
        self.copy_in(offset_bytes, &buf);
        IoFuture::ready(Ok(()))
    }

    /// Memory has no volatile cache: every completed write is as durable as it gets.
    fn write_durable(&self, offset_bytes: u64, buf: IoBuf) -> IoFuture<IoBuf> {
        self.write(offset_bytes, buf)
    }

    fn flush(&self) -> IoFuture<()> {
        IoFuture::ready(Ok(()))
    }

    fn discard(&self, offset_bytes: u64, length_bytes: u64) -> IoFuture<()> {
        let Ok(length) = usize::try_from(length_bytes) else {
            return IoFuture::ready(Err(io::Error::from(io::ErrorKind::InvalidInput)));
        };
        if let Err(err) = self.check_range(offset_bytes, length, "discard") {
            return IoFuture::ready(Err(err));
        }
        self.zero_range(offset_bytes, length_bytes);
        IoFuture::ready(Ok(()))
    }
}
