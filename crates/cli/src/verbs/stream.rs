//! The send stream verbs: `oxpool stream dump [FILE]` (as `zstream dump`). No pool: the
//! stream is read from a file or standard input and decoded with the format crate's decoder,
//! which checks everything a receiver would (checksums, fields, order) without applying it.

use crate::args::StreamCommand;
use crate::console::Console;
use anyhow::{anyhow, bail, Result};
use oxpool_format::{ChecksumType, StreamBegin, StreamDecoder, StreamRecord};
use std::fmt::Write as _;
use std::io::{ErrorKind, Read};
use std::path::PathBuf;

/// Bytes read per step: memory stays bounded whatever the stream's size.
const READ_CHUNK_BYTES: usize = 1 << 20;

/// Runs one `oxpool stream` verb.
pub fn run(con: &mut dyn Console, command: StreamCommand) -> Result<()> {
    match command {
        StreamCommand::Dump { file } => {
            let file = file.filter(|f| f.as_os_str() != "-");
            let source = match file {
                Some(path) => {
                    let path = con.path(&path);
                    let file = std::fs::File::open(&path)
                        .map_err(|e| anyhow!("cannot open {}: {e}", path.display()))?;
                    Source::File(file, path)
                }
                None => Source::Stdin,
            };
            dump(con, source)
        }
    }
}

/// Where the stream comes from.
enum Source {
    File(std::fs::File, PathBuf),
    /// The console's standard input.
    Stdin,
}

impl Source {
    fn read(&mut self, con: &mut dyn Console, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Source::File(file, _) => file.read(buf),
            Source::Stdin => con.input().read(buf),
        }
    }

    fn name(&self) -> String {
        match self {
            Source::File(_, path) => path.display().to_string(),
            Source::Stdin => "standard input".to_string(),
        }
    }
}

/// Counts for the totals line.
#[derive(Default)]
struct Totals {
    records: u64,
    begin: u64,
    data: u64,
    data_logical_bytes: u64,
    data_stored_bytes: u64,
    free: u64,
    free_bytes: u64,
    set_size: u64,
    end: u64,
}

/// Prints every record of the stream (or streams, one after the other, as `send -I` writes
/// them) read from `source`, then the totals; an error names the byte where the stream went
/// wrong (counted from the start of its own stream).
fn dump(con: &mut dyn Console, mut source: Source) -> Result<()> {
    let mut decoder = StreamDecoder::new();
    let mut earlier_streams_bytes = 0u64;
    let mut totals = Totals::default();
    let mut buf = vec![0u8; READ_CHUNK_BYTES];
    let mut lines = String::new();
    // Bounded by the input: each pass reads more of it or ends.
    loop {
        let count = match source.read(con, &mut buf) {
            Ok(0) => break,
            Ok(count) => count,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => bail!("cannot read {}: {e}", source.name()),
        };
        let mut rest = &buf[..count];
        let mut failure = None;
        // Bounded: every pass consumes input (a record completes only with its last byte).
        while !rest.is_empty() {
            // Streams one after the other (`send -I`): a new one starts after an END with
            // the magic (anything else after END is the decoder's `TrailingBytes`).
            let magic = oxpool_format::stream::STREAM_MAGIC.to_le_bytes();
            let n = rest.len().min(magic.len());
            if decoder.is_done() && rest[..n] == magic[..n] {
                earlier_streams_bytes += decoder.position_bytes();
                decoder = StreamDecoder::new();
            }
            // Known once BEGIN's header is in, before the BEGIN record is handed out.
            let version = decoder.version().unwrap_or(0);
            match decoder.decode(rest) {
                Ok(decoded) => {
                    if let Some(record) = &decoded.record {
                        describe(record, version, &mut totals, &mut lines);
                    }
                    rest = &rest[decoded.consumed_bytes..];
                }
                Err(err) => {
                    failure = Some(err);
                    break;
                }
            }
        }
        // What decoded before an error is printed first: it shows where the stream broke.
        con.out().write_all(lines.as_bytes())?;
        lines.clear();
        if let Some(err) = failure {
            bail!("bad stream: {err}");
        }
    }
    decoder
        .finish()
        .map_err(|err| anyhow!("bad stream: {err}"))?;
    writeln!(
        con.out(),
        "totals records={} stream_bytes={} begin={} data={} data_logical_bytes={} \
         data_stored_bytes={} free={} free_bytes={} set_size={} end={}",
        totals.records,
        earlier_streams_bytes + decoder.position_bytes(),
        totals.begin,
        totals.data,
        totals.data_logical_bytes,
        totals.data_stored_bytes,
        totals.free,
        totals.free_bytes,
        totals.set_size,
        totals.end,
    )?;
    Ok(())
}

/// One line for `record` (of a stream of format `version`), counted in `totals`.
fn describe(record: &StreamRecord<'_>, version: u32, totals: &mut Totals, out: &mut String) {
    totals.records += 1;
    // Writing to a String cannot fail.
    let _ = match record {
        StreamRecord::Begin(begin) => {
            totals.begin += 1;
            describe_begin(begin, version, out)
        }
        StreamRecord::Data(data) => {
            totals.data += 1;
            totals.data_logical_bytes += u64::from(data.lsize_bytes);
            totals.data_stored_bytes += data.payload.len() as u64;
            // xxh3-128 fills half of the checksum field; the other half is zero.
            let sum = data.checksum.to_string();
            let sum = match data.checksum_type {
                ChecksumType::Xxh3_128 => &sum[..32],
                ChecksumType::Blake3 => &sum[..],
            };
            writeln!(
                out,
                "DATA offset={} lsize={} psize={} compression={} checksum={}:{sum}",
                data.offset_bytes,
                data.lsize_bytes,
                data.payload.len(),
                data.compression,
                data.checksum_type,
            )
        }
        StreamRecord::Free {
            offset_bytes,
            length_bytes,
        } => {
            totals.free += 1;
            totals.free_bytes += length_bytes;
            writeln!(out, "FREE offset={offset_bytes} length={length_bytes}")
        }
        StreamRecord::SetSize { volsize_bytes } => {
            totals.set_size += 1;
            writeln!(out, "SET_SIZE volsize={volsize_bytes}")
        }
        StreamRecord::End { toguid, checksum } => {
            totals.end += 1;
            writeln!(out, "END toguid={toguid} checksum={checksum}")
        }
    };
}

fn describe_begin(begin: &StreamBegin, version: u32, out: &mut String) -> std::fmt::Result {
    let from = match begin.fromguid {
        Some(guid) => format!("{guid} (incremental)"),
        None => "0 (full)".to_string(),
    };
    writeln!(
        out,
        "BEGIN name={} toguid={} fromguid={from} volsize={} volblocksize={} features={} \
         creation_txg={} creation_time_ns={} pool_guid={} volume_id={} resume_offset={} \
         version={}",
        begin.name,
        begin.toguid,
        begin.volsize_bytes,
        begin.volblocksize_bytes,
        begin.features,
        begin.creation_txg,
        begin.creation_time_ns,
        begin.pool_guid,
        begin.volume_id,
        begin.resume_offset_bytes,
        version,
    )
}
