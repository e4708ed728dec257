//! Reading a stream, sans-I/O: bytes in as they arrive, each record out once it is complete
//! and verified.

use xxhash_rust::xxh3::Xxh3Default;

use super::error::{StreamError, StreamErrorKind};
use super::layout::*;
use super::rules::{check_begin, check_name, DataFields, Rules, Violation};
use super::{
    DataRecord, StreamBegin, StreamChecksum, StreamFeatures, StreamRecord, STREAM_VERSION,
    STREAM_VERSION_MIN,
};
use crate::{checksum, Checksum, ChecksumType, Compression, Guid, Txg, VolumeId};

/// What one [`StreamDecoder::decode`] call did.
#[derive(Debug)]
pub struct Decoded<'a> {
    /// Input bytes used (all of them unless a record completed before the end).
    pub consumed_bytes: usize,
    /// The record completed by these bytes, if one was.
    pub record: Option<StreamRecord<'a>>,
}

/// Where the payload of a record that just completed is.
#[derive(Clone, Copy, Debug)]
enum PayloadIn {
    /// In `StreamDecoder::payload` (it arrived in pieces, or there is none).
    Buffer,
    /// The first bytes of the input of the call that completed it (it arrived whole there):
    /// verified in place, never copied.
    Input,
}

/// A record whose header is verified (its payload may still be arriving), without the
/// payload bytes, which are in `StreamDecoder::payload`.
#[derive(Clone, Copy, Debug)]
enum Current {
    Begin,
    Data(DataFields),
    Free {
        offset_bytes: u64,
        length_bytes: u64,
    },
    SetSize {
        volsize_bytes: u64,
    },
    End {
        toguid: Guid,
        checksum: StreamChecksum,
    },
}

#[derive(Clone, Copy, Debug)]
enum Phase {
    /// Gathering a record header into `StreamDecoder::header`.
    Header,
    /// Gathering `payload_bytes` of the current record's payload into
    /// `StreamDecoder::payload`.
    Payload {
        payload_bytes: usize,
        payload_checksum: u128,
        /// Stream offset of the payload's first byte.
        payload_at: u64,
    },
    /// END was read.
    Done,
}

/// Decodes one send stream incrementally.
///
/// Feed it the stream's bytes in order, in pieces of any size: [`StreamDecoder::decode`]
/// uses bytes until a record completes (and returns it) or the input runs out. At the end of
/// the input, [`StreamDecoder::finish`] says whether the stream was complete. A record is
/// handed out only once everything in it is verified: its header against the running
/// checksum, its payload against its payload checksum, a DATA block against its block
/// checksum, every field against the rules of `docs/format.md`. The first error is final:
/// later calls return it again.
///
/// Memory: a 128-byte header and one payload buffer, which grows with the payload bytes that
/// actually arrive (never by a length read from the stream) up to the record type's bound
/// (`STREAM_BLOCK_BYTES_MAX` for a block) and is reused for every record. A payload that
/// arrives whole in one `decode` call (its input holds all of it) is verified where it lies
/// and handed out borrowing the input: no copy. A caller that reads the stream itself can
/// arrange that for every payload: after a header, [`StreamDecoder::payload_pending_bytes`]
/// says how many bytes the payload has, which the caller reads into a buffer of its own
/// (say, one it then writes to a device) and hands over in one call.
///
/// Versions: [`STREAM_VERSION_MIN`] to [`STREAM_VERSION`] (`docs/format.md`); the first
/// hashes every byte into the running checksum, the second only the headers. Either way
/// each payload is hashed once: a DATA block whose checksum type is xxh3-128 is checked
/// against the payload checksum already computed (the same function of the same bytes).
///
/// ```
/// use oxpool_format::{StreamDecoder, StreamRecord};
///
/// fn count_blocks(stream: &[u8]) -> Result<u64, oxpool_format::StreamError> {
///     let mut decoder = StreamDecoder::new();
///     let mut blocks = 0;
///     let mut rest = stream;
///     while !rest.is_empty() {
///         let decoded = decoder.decode(rest)?;
///         if let Some(StreamRecord::Data(_)) = decoded.record {
///             blocks += 1;
///         }
///         rest = &rest[decoded.consumed_bytes..];
///     }
///     decoder.finish()?;
///     Ok(blocks)
/// }
/// assert!(count_blocks(b"not a stream").is_err());
/// ```
pub struct StreamDecoder {
    phase: Phase,
    header: RecordHeader,
    header_filled_bytes: usize,
    /// The current record, once its header is verified.
    current: Option<Current>,
    payload: Vec<u8>,
    hasher: Xxh3Default,
    /// BEGIN's version once its header is read (0 before).
    version: u32,
    /// Stream bytes consumed so far.
    position_bytes: u64,
    /// Stream offset of the current record.
    record_at: u64,
    /// BEGIN's fields (its name once its payload is in); `None` before.
    begin: Option<StreamBegin>,
    /// The rules the records after BEGIN obey; `None` before BEGIN.
    rules: Option<Rules>,
    /// The first error, returned again by every later call.
    failed: Option<StreamError>,
    /// Records handed out.
    records: u64,
}

impl std::fmt::Debug for StreamDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamDecoder")
            .field("phase", &self.phase)
            .field("position_bytes", &self.position_bytes)
            .field("records", &self.records)
            .field("failed", &self.failed)
            .finish()
    }
}

impl Default for StreamDecoder {
    fn default() -> Self {
        StreamDecoder::new()
    }
}

impl StreamDecoder {
    /// A decoder at the start of a stream.
    pub fn new() -> StreamDecoder {
        StreamDecoder {
            phase: Phase::Header,
            header: [0; RECORD_HEADER_BYTES],
            header_filled_bytes: 0,
            current: None,
            payload: Vec::new(),
            hasher: Xxh3Default::new(),
            version: 0,
            position_bytes: 0,
            record_at: 0,
            begin: None,
            rules: None,
            failed: None,
            records: 0,
        }
    }

    /// Stream bytes consumed so far.
    pub fn position_bytes(&self) -> u64 {
        self.position_bytes
    }

    /// Records handed out so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// The stream's format version, once BEGIN's header is read: before the BEGIN record is
    /// handed out (which takes a later `decode` call, since BEGIN's payload is never empty).
    pub fn version(&self) -> Option<u32> {
        (self.version != 0).then_some(self.version)
    }

    /// Bytes of the current record's payload still to come: 0 between records (and after
    /// END); after a header that announces a payload, its whole length (until some of it is
    /// fed). Bounded by the record type (checked before the header is accepted), so a caller
    /// may size a buffer by it.
    pub fn payload_pending_bytes(&self) -> usize {
        match self.phase {
            Phase::Payload { payload_bytes, .. } => {
                payload_bytes.saturating_sub(self.payload.len())
            }
            Phase::Header | Phase::Done => 0,
        }
    }

    /// The stream's BEGIN record, once it was handed out.
    pub fn begin(&self) -> Option<&StreamBegin> {
        self.begin.as_ref().filter(|_| self.records > 0)
    }

    /// Whether END was read: the stream is complete.
    pub fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// Where the next DATA or FREE record may start: after the last one read (or at the
    /// resume offset). A receiver that applied every record so far resumes here.
    pub fn cursor_bytes(&self) -> u64 {
        self.rules.as_ref().map_or(0, Rules::cursor_bytes)
    }

    /// At the end of the input: `Ok` if the stream was complete (END read), else the error
    /// saying where it was cut (or the error already returned).
    pub fn finish(&self) -> Result<(), StreamError> {
        if let Some(err) = &self.failed {
            return Err(err.clone());
        }
        // A few bytes that are no start of the magic (junk after a stream, or a file
        // shorter than the magic) are not a stream cut short.
        let filled = self.header_filled_bytes.min(8);
        if matches!(self.phase, Phase::Header)
            && filled > 0
            && self.header[..filled] != STREAM_MAGIC.to_le_bytes()[..filled]
        {
            let kind = if self.rules.is_none() {
                StreamErrorKind::NotAStream
            } else {
                StreamErrorKind::BadMagic
            };
            let record_at = self.position_bytes - self.header_filled_bytes as u64;
            return Err(StreamError::new(record_at + MAGIC_AT as u64, kind));
        }
        let inside = match self.phase {
            Phase::Done => return Ok(()),
            Phase::Payload { .. } => "in a record payload",
            Phase::Header if self.header_filled_bytes > 0 => "in a record header",
            Phase::Header if self.records == 0 => "before its BEGIN record",
            Phase::Header => "before its END record",
        };
        Err(StreamError::new(
            self.position_bytes,
            StreamErrorKind::Truncated { inside },
        ))
    }

    /// Uses bytes of `input` until a record completes or the input runs out; returns how
    /// many it used and the record (whose payload borrows `input` when it arrived whole in
    /// it, else the decoder). Call again with the rest of the input.
    pub fn decode<'a>(&'a mut self, input: &'a [u8]) -> Result<Decoded<'a>, StreamError> {
        if let Some(err) = &self.failed {
            return Err(err.clone());
        }
        match self.step(input) {
            Ok((consumed_bytes, None)) => Ok(Decoded {
                consumed_bytes,
                record: None,
            }),
            Ok((consumed_bytes, Some(payload_in))) => {
                self.records += 1;
                let payload: &'a [u8] = match payload_in {
                    PayloadIn::Buffer => &self.payload,
                    PayloadIn::Input => &input[..consumed_bytes],
                };
                Ok(Decoded {
                    consumed_bytes,
                    record: self.completed_record(payload),
                })
            }
            Err(err) => {
                self.failed = Some(err.clone());
                Err(err)
            }
        }
    }

    /// Consumes input; `Some` (where its payload is) when the current record completed.
    fn step(&mut self, input: &[u8]) -> Result<(usize, Option<PayloadIn>), StreamError> {
        match self.phase {
            Phase::Done if input.is_empty() => Ok((0, None)),
            Phase::Done => Err(StreamError::new(
                self.position_bytes,
                StreamErrorKind::TrailingBytes,
            )),
            Phase::Header => {
                let filled = self.header_filled_bytes;
                let take = (RECORD_HEADER_BYTES - filled).min(input.len());
                self.header[filled..filled + take].copy_from_slice(&input[..take]);
                self.header_filled_bytes += take;
                self.position_bytes += take as u64;
                if filled < 8 && self.header_filled_bytes >= 8 {
                    // The magic as soon as it is in: a file that is not a stream at all is
                    // told so even when it is shorter than a header.
                    self.record_at = self.position_bytes - self.header_filled_bytes as u64;
                    self.check_magic()?;
                }
                if self.header_filled_bytes < RECORD_HEADER_BYTES {
                    return Ok((take, None));
                }
                self.header_filled_bytes = 0;
                self.record_at = self.position_bytes - RECORD_HEADER_BYTES as u64;
                let complete = self.read_header()?;
                Ok((take, complete.then_some(PayloadIn::Buffer)))
            }
            Phase::Payload {
                payload_bytes,
                payload_checksum: expected,
                payload_at,
            } => {
                if self.payload.is_empty() && input.len() >= payload_bytes {
                    // All of it is here: verified where it lies, not copied.
                    let payload = &input[..payload_bytes];
                    self.position_bytes += payload_bytes as u64;
                    self.phase = Phase::Header;
                    self.check_payload(payload, expected, payload_at)?;
                    return Ok((payload_bytes, Some(PayloadIn::Input)));
                }
                let take = (payload_bytes - self.payload.len()).min(input.len());
                // Grows with the bytes that arrived, up to `payload_bytes`, which was bounded
                // by the record type before this phase began.
                self.payload.extend_from_slice(&input[..take]);
                self.position_bytes += take as u64;
                if self.payload.len() < payload_bytes {
                    return Ok((take, None));
                }
                self.phase = Phase::Header;
                let payload = std::mem::take(&mut self.payload);
                let checked = self.check_payload(&payload, expected, payload_at);
                self.payload = payload;
                checked?;
                Ok((take, Some(PayloadIn::Buffer)))
            }
        }
    }

    /// An error at `offset` bytes into the current record's header.
    fn error_at(&self, offset: usize, kind: StreamErrorKind) -> StreamError {
        StreamError::new(self.record_at + offset as u64, kind)
    }

    /// Checks the header just read and starts its payload; `true` if the record is complete
    /// (it has no payload).
    fn read_header(&mut self) -> Result<bool, StreamError> {
        let header = self.header;
        let first = self.rules.is_none();
        self.check_magic()?;
        if first {
            // Type and version before the checksum, as for the on-disk structures: a stream
            // of another version may lay out the rest of its header differently.
            if get_u32(&header, TYPE_AT) != RecordType::Begin as u32 {
                let rule = "a stream starts with BEGIN";
                return Err(self.error_at(TYPE_AT, StreamErrorKind::OutOfOrder { rule }));
            }
            let found = get_u32(&header, BEGIN_VERSION_AT);
            if !(STREAM_VERSION_MIN..=STREAM_VERSION).contains(&found) {
                let kind = StreamErrorKind::UnsupportedVersion { found };
                return Err(self.error_at(BEGIN_VERSION_AT, kind));
            }
            self.version = found;
        }
        self.hasher.update(&header[..STREAM_CHECKSUM_AT]);
        let running = self.hasher.digest128();
        if get_u128(&header, STREAM_CHECKSUM_AT) != running {
            return Err(self.error_at(0, StreamErrorKind::HeaderChecksum));
        }
        self.hasher.update(&header[STREAM_CHECKSUM_AT..]);

        let found = get_u32(&header, TYPE_AT);
        let Some(kind) = RecordType::from_wire(found) else {
            return Err(self.error_at(TYPE_AT, StreamErrorKind::UnknownRecordType { found }));
        };
        if kind == RecordType::Begin && !first {
            let rule = "one BEGIN per stream";
            return Err(self.error_at(TYPE_AT, StreamErrorKind::OutOfOrder { rule }));
        }
        reserved_zero(&header, kind.fields_end(), FIELDS_END)
            .map_err(|at| self.reserved_error(at))?;
        let payload_bytes = get_u32(&header, PAYLOAD_BYTES_AT);
        let max_bytes = match &self.rules {
            Some(rules) => rules.payload_max_bytes(kind),
            None => super::STREAM_NAME_BYTES_MAX as u32,
        };
        if payload_bytes > max_bytes {
            let kind = StreamErrorKind::PayloadTooLarge {
                record: kind.name(),
                payload_bytes,
                max_bytes,
            };
            return Err(self.error_at(PAYLOAD_BYTES_AT, kind));
        }
        let payload_checksum = get_u128(&header, PAYLOAD_CHECKSUM_AT);

        let current = match kind {
            RecordType::Begin => {
                let begin = begin_fields(&header);
                check_begin(&begin).map_err(|v| self.violation(v))?;
                self.rules = Some(Rules::new(&begin));
                self.begin = Some(begin);
                Current::Begin
            }
            RecordType::Data => {
                let fields = self.data_fields(&header, payload_bytes)?;
                self.rules_mut()?
                    .data(&fields)
                    .map_err(|v| self.violation(v))?;
                Current::Data(fields)
            }
            RecordType::Free => {
                let offset_bytes = get_u64(&header, FREE_OFFSET_AT);
                let length_bytes = get_u64(&header, FREE_LENGTH_AT);
                self.rules_mut()?
                    .free(offset_bytes, length_bytes)
                    .map_err(|v| self.violation(v))?;
                Current::Free {
                    offset_bytes,
                    length_bytes,
                }
            }
            RecordType::SetSize => {
                let volsize_bytes = get_u64(&header, SET_SIZE_VOLSIZE_AT);
                self.rules_mut()?
                    .set_size(volsize_bytes)
                    .map_err(|v| self.violation(v))?;
                Current::SetSize { volsize_bytes }
            }
            RecordType::End => {
                let toguid = Guid(get_u64(&header, END_TOGUID_AT));
                self.rules_mut()?
                    .end(toguid)
                    .map_err(|v| self.violation(v))?;
                Current::End {
                    toguid,
                    checksum: StreamChecksum(running),
                }
            }
        };
        self.current = Some(current);
        self.payload.clear();
        let payload_at = self.position_bytes;
        if payload_bytes == 0 {
            self.check_payload(&[], payload_checksum, payload_at)?;
            if kind == RecordType::End {
                self.phase = Phase::Done;
            }
            return Ok(true);
        }
        self.phase = Phase::Payload {
            payload_bytes: payload_bytes as usize,
            payload_checksum,
            payload_at,
        };
        Ok(false)
    }

    /// The current header starts with the stream magic (its first 8 bytes are in).
    fn check_magic(&self) -> Result<(), StreamError> {
        if get_u64(&self.header, MAGIC_AT) == STREAM_MAGIC {
            return Ok(());
        }
        let kind = if self.rules.is_none() {
            StreamErrorKind::NotAStream
        } else {
            StreamErrorKind::BadMagic
        };
        Err(self.error_at(MAGIC_AT, kind))
    }

    /// A DATA header's fields, with their enums checked.
    fn data_fields(
        &self,
        header: &RecordHeader,
        psize_bytes: u32,
    ) -> Result<DataFields, StreamError> {
        let raw = get_u8(header, DATA_COMPRESSION_AT);
        let compression = Compression::try_from(raw).map_err(|_| {
            let kind = StreamErrorKind::BadField {
                field: "compression",
                value: u64::from(raw),
            };
            self.error_at(DATA_COMPRESSION_AT, kind)
        })?;
        let raw = get_u8(header, DATA_CHECKSUM_TYPE_AT);
        let checksum_type = ChecksumType::try_from(raw).map_err(|_| {
            let kind = StreamErrorKind::BadField {
                field: "checksum_type",
                value: u64::from(raw),
            };
            self.error_at(DATA_CHECKSUM_TYPE_AT, kind)
        })?;
        reserved_zero(header, DATA_CHECKSUM_TYPE_AT + 1, DATA_CHECKSUM_AT)
            .map_err(|at| self.reserved_error(at))?;
        Ok(DataFields {
            offset_bytes: get_u64(header, DATA_OFFSET_AT),
            lsize_bytes: get_u32(header, DATA_LSIZE_AT),
            compression,
            checksum_type,
            checksum: Checksum(get_bytes(header, DATA_CHECKSUM_AT)),
            psize_bytes,
        })
    }

    fn reserved_error(&self, at: usize) -> StreamError {
        let kind = StreamErrorKind::BadField {
            field: "reserved",
            value: u64::from(self.header[at]),
        };
        self.error_at(at, kind)
    }

    fn violation(&self, violation: Violation) -> StreamError {
        self.error_at(violation.at, violation.kind)
    }

    /// The rules of a stream past its BEGIN (which the checks require first).
    fn rules_mut(&mut self) -> Result<&mut Rules, StreamError> {
        let rule = "a stream starts with BEGIN";
        let error = self.error_at(TYPE_AT, StreamErrorKind::OutOfOrder { rule });
        self.rules.as_mut().ok_or(error)
    }

    /// The current record's payload is all in: verifies it (hashing it once), and runs a
    /// version 1 stream's running checksum over it.
    fn check_payload(
        &mut self,
        payload: &[u8],
        expected: u128,
        payload_at: u64,
    ) -> Result<(), StreamError> {
        if self.version == 1 {
            self.hasher.update(payload);
        }
        let sum = payload_checksum(payload);
        if sum != expected {
            let at = if payload.is_empty() {
                self.record_at + PAYLOAD_CHECKSUM_AT as u64
            } else {
                payload_at
            };
            return Err(StreamError::new(at, StreamErrorKind::PayloadChecksum));
        }
        match self.current {
            Some(Current::Begin) => {
                let name = check_name(payload).map_err(|reason| {
                    StreamError::new(payload_at, StreamErrorKind::BadName { reason })
                })?;
                let name = name.to_owned();
                if let Some(begin) = self.begin.as_mut() {
                    begin.name = name;
                }
            }
            Some(Current::Data(fields)) => {
                let matches = match fields.checksum_type {
                    // The same function of the same bytes as the payload checksum just
                    // computed (the rules made sure the unused half of the field is zero).
                    ChecksumType::Xxh3_128 => fields.checksum.0[..16] == sum.to_le_bytes(),
                    other => checksum(other, payload) == fields.checksum,
                };
                if !matches {
                    return Err(StreamError::new(payload_at, StreamErrorKind::BlockChecksum));
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The record that just completed, with its payload.
    fn completed_record<'a>(&'a self, payload: &'a [u8]) -> Option<StreamRecord<'a>> {
        Some(match self.current? {
            Current::Begin => StreamRecord::Begin(self.begin.as_ref()?),
            Current::Data(fields) => StreamRecord::Data(DataRecord {
                offset_bytes: fields.offset_bytes,
                lsize_bytes: fields.lsize_bytes,
                compression: fields.compression,
                checksum_type: fields.checksum_type,
                checksum: fields.checksum,
                payload,
            }),
            Current::Free {
                offset_bytes,
                length_bytes,
            } => StreamRecord::Free {
                offset_bytes,
                length_bytes,
            },
            Current::SetSize { volsize_bytes } => StreamRecord::SetSize { volsize_bytes },
            Current::End { toguid, checksum } => StreamRecord::End { toguid, checksum },
        })
    }
}

/// `Err(offset)` of the first non-zero byte of `header[start..end]`.
fn reserved_zero(header: &RecordHeader, start: usize, end: usize) -> Result<(), usize> {
    match (start..end).find(|&i| header[i] != 0) {
        Some(at) => Err(at),
        None => Ok(()),
    }
}

/// BEGIN's header fields (the name comes with the payload).
fn begin_fields(header: &RecordHeader) -> StreamBegin {
    let fromguid = get_u64(header, BEGIN_FROMGUID_AT);
    StreamBegin {
        features: StreamFeatures(get_u64(header, BEGIN_FEATURES_AT)),
        volsize_bytes: get_u64(header, BEGIN_VOLSIZE_AT),
        volblocksize_bytes: get_u32(header, BEGIN_VOLBLOCKSIZE_AT),
        pool_guid: Guid(get_u64(header, BEGIN_POOL_GUID_AT)),
        volume_id: VolumeId(get_u64(header, BEGIN_VOLUME_ID_AT)),
        toguid: Guid(get_u64(header, BEGIN_TOGUID_AT)),
        fromguid: (fromguid != 0).then_some(Guid(fromguid)),
        creation_txg: Txg(get_u64(header, BEGIN_CREATION_TXG_AT)),
        creation_time_ns: get_u64(header, BEGIN_CREATION_TIME_AT),
        resume_offset_bytes: get_u64(header, BEGIN_RESUME_OFFSET_AT),
        name: String::new(),
    }
}
