//! Writing a stream: one record header at a time, the caller sending each header and then
//! its payload (so a block goes from the read buffer to the socket without a copy here).

use xxhash_rust::xxh3::Xxh3Default;

use super::layout::*;
use super::rules::{check_begin, check_name, DataFields, Rules, Violation};
use super::{DataRecord, StreamBegin, StreamChecksum, STREAM_VERSION, STREAM_VERSION_MIN};
use crate::{ChecksumType, Guid};

/// Writes the records of one stream and keeps its running checksum.
///
/// Each method returns the record's header; the caller writes it, then the record's payload
/// (BEGIN: `begin.name`, DATA: `record.payload`, nothing for the others), in call order.
/// A record the decoder would refuse (a block out of order, a name that is not
/// `POOL/VOL@SNAP`, ...) panics: it is a bug of the sender, and a stream that no receiver
/// accepts must not leave the machine. The one exception is a DATA block whose bytes do not
/// match its checksum: checking that would hash every block once more (the sender's read
/// has just verified it), so it is only a debug assertion; the receiver refuses such a block
/// (`BlockChecksum` or `PayloadChecksum`).
///
/// Each payload is hashed at most once here: not at all for an xxh3-128 DATA block, whose
/// payload checksum is its block checksum (version 2; version 1 also runs the stream
/// checksum over every payload byte).
#[derive(Clone)]
pub struct StreamEncoder {
    hasher: Xxh3Default,
    rules: Rules,
    written_bytes: u64,
    toguid: Guid,
    /// The format version written (`STREAM_VERSION_MIN..=STREAM_VERSION`).
    version: u32,
}

impl std::fmt::Debug for StreamEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamEncoder")
            .field("written_bytes", &self.written_bytes)
            .field("cursor_bytes", &self.rules.cursor_bytes())
            .finish()
    }
}

fn expect_ok<T>(result: Result<T, Violation>, record: RecordType) -> T {
    match result {
        Ok(value) => value,
        Err(violation) => panic!(
            "invalid {} record (header byte {}): {}",
            record.name(),
            violation.at,
            violation.kind
        ),
    }
}

impl StreamEncoder {
    /// Starts a stream with `begin`: the encoder and BEGIN's header (its payload is
    /// `begin.name`).
    pub fn new(begin: &StreamBegin) -> (StreamEncoder, RecordHeader) {
        StreamEncoder::with_version(begin, STREAM_VERSION)
    }

    /// [`StreamEncoder::new`] writing format `version` (an older one, for a receiver that
    /// reads no newer, and for tests of old streams). Panics on a version this build cannot
    /// write (outside `STREAM_VERSION_MIN..=STREAM_VERSION`).
    pub fn with_version(begin: &StreamBegin, version: u32) -> (StreamEncoder, RecordHeader) {
        assert!(
            (STREAM_VERSION_MIN..=STREAM_VERSION).contains(&version),
            "stream version {version} is not one this build writes"
        );
        expect_ok(check_begin(begin), RecordType::Begin);
        if let Err(reason) = check_name(begin.name.as_bytes()) {
            panic!(
                "invalid BEGIN record: bad snapshot name {:?}: {reason}",
                begin.name
            );
        }
        let name = begin.name.as_bytes();
        let mut header = new_header(RecordType::Begin, name.len() as u32);
        put_u32(&mut header, BEGIN_VERSION_AT, version);
        put_u32(&mut header, BEGIN_VOLBLOCKSIZE_AT, begin.volblocksize_bytes);
        put_u64(&mut header, BEGIN_FEATURES_AT, begin.features.0);
        put_u64(&mut header, BEGIN_VOLSIZE_AT, begin.volsize_bytes);
        put_u64(&mut header, BEGIN_POOL_GUID_AT, begin.pool_guid.0);
        put_u64(&mut header, BEGIN_VOLUME_ID_AT, begin.volume_id.0);
        put_u64(&mut header, BEGIN_TOGUID_AT, begin.toguid.0);
        put_u64(
            &mut header,
            BEGIN_FROMGUID_AT,
            begin.fromguid.map_or(0, |g| g.0),
        );
        put_u64(&mut header, BEGIN_CREATION_TXG_AT, begin.creation_txg.0);
        put_u64(&mut header, BEGIN_CREATION_TIME_AT, begin.creation_time_ns);
        put_u64(
            &mut header,
            BEGIN_RESUME_OFFSET_AT,
            begin.resume_offset_bytes,
        );
        let mut encoder = StreamEncoder {
            hasher: Xxh3Default::new(),
            rules: Rules::new(begin),
            written_bytes: 0,
            toguid: begin.toguid,
            version,
        };
        encoder.seal(&mut header, payload_checksum(name), name);
        (encoder, header)
    }

    /// A DATA record's header; its payload is `record.payload`.
    pub fn data(&mut self, record: &DataRecord<'_>) -> RecordHeader {
        // Bounded below: at most `volblocksize` (the rules), else it panics there.
        let psize_bytes = u32::try_from(record.payload.len()).unwrap_or(u32::MAX);
        let fields = DataFields {
            offset_bytes: record.offset_bytes,
            lsize_bytes: record.lsize_bytes,
            compression: record.compression,
            checksum_type: record.checksum_type,
            checksum: record.checksum,
            psize_bytes,
        };
        expect_ok(self.rules.data(&fields), RecordType::Data);
        debug_assert!(
            crate::checksum(record.checksum_type, record.payload) == record.checksum,
            "invalid DATA record at offset {}: the block does not match its checksum",
            record.offset_bytes
        );
        let sum = match record.checksum_type {
            // xxh3-128 of the payload is the block checksum (its first 16 bytes; the rules
            // checked that the rest is zero): not hashed again.
            ChecksumType::Xxh3_128 => {
                let mut low = [0u8; 16];
                low.copy_from_slice(&record.checksum.0[..16]);
                u128::from_le_bytes(low)
            }
            ChecksumType::Blake3 => payload_checksum(record.payload),
        };
        let mut header = new_header(RecordType::Data, psize_bytes);
        put_u64(&mut header, DATA_OFFSET_AT, record.offset_bytes);
        put_u32(&mut header, DATA_LSIZE_AT, record.lsize_bytes);
        put_u8(&mut header, DATA_COMPRESSION_AT, record.compression as u8);
        put_u8(
            &mut header,
            DATA_CHECKSUM_TYPE_AT,
            record.checksum_type as u8,
        );
        put_bytes(&mut header, DATA_CHECKSUM_AT, &record.checksum.0);
        self.seal(&mut header, sum, record.payload);
        header
    }

    /// A FREE record's header: `[offset_bytes, offset_bytes + length_bytes)` reads as zeros.
    pub fn free(&mut self, offset_bytes: u64, length_bytes: u64) -> RecordHeader {
        expect_ok(
            self.rules.free(offset_bytes, length_bytes),
            RecordType::Free,
        );
        let mut header = new_header(RecordType::Free, 0);
        put_u64(&mut header, FREE_OFFSET_AT, offset_bytes);
        put_u64(&mut header, FREE_LENGTH_AT, length_bytes);
        self.seal(&mut header, payload_checksum(&[]), &[]);
        header
    }

    /// A SET_SIZE record's header (incremental streams whose volume was resized since the
    /// base; before any DATA or FREE; `volsize_bytes` is BEGIN's).
    pub fn set_size(&mut self, volsize_bytes: u64) -> RecordHeader {
        expect_ok(self.rules.set_size(volsize_bytes), RecordType::SetSize);
        let mut header = new_header(RecordType::SetSize, 0);
        put_u64(&mut header, SET_SIZE_VOLSIZE_AT, volsize_bytes);
        self.seal(&mut header, payload_checksum(&[]), &[]);
        header
    }

    /// The END record's header, and the stream's checksum (the one END carries).
    pub fn end(mut self) -> (RecordHeader, StreamChecksum) {
        let mut header = new_header(RecordType::End, 0);
        put_u64(&mut header, END_TOGUID_AT, self.toguid.0);
        let sum = self.seal(&mut header, payload_checksum(&[]), &[]);
        (header, sum)
    }

    /// Bytes of the stream so far (headers and payloads).
    pub fn written_bytes(&self) -> u64 {
        self.written_bytes
    }

    /// Where the next DATA or FREE record may start: the end of the last one (a receiver
    /// that applied everything so far resumes here).
    pub fn cursor_bytes(&self) -> u64 {
        self.rules.cursor_bytes()
    }

    /// Fills in the header's checksums (`payload_sum`: the payload's) and runs the stream's
    /// checksum over the header (and, in version 1, `payload`); returns the running checksum
    /// the header carries.
    fn seal(
        &mut self,
        header: &mut RecordHeader,
        payload_sum: u128,
        payload: &[u8],
    ) -> StreamChecksum {
        put_u128(header, PAYLOAD_CHECKSUM_AT, payload_sum);
        self.hasher.update(&header[..STREAM_CHECKSUM_AT]);
        let running = self.hasher.digest128();
        put_u128(header, STREAM_CHECKSUM_AT, running);
        self.hasher.update(&header[STREAM_CHECKSUM_AT..]);
        if self.version == 1 {
            self.hasher.update(payload);
        }
        self.written_bytes += (RECORD_HEADER_BYTES + payload.len()) as u64;
        StreamChecksum(running)
    }
}
