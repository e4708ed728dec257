#![no_main]
//! The NBD request decoder and validator on arbitrary client bytes: never panics, decodes
//! the same requests in any split, and validation never accepts a range outside the export.
//!
//! Input: byte 0 picks the piece size (1..=64) and the negotiation (structured replies,
//! meta context, read-only export); the rest is the client's byte stream after the handshake.

use libfuzzer_sys::fuzz_target;
use oxpool_nbd::proto::{
    validate, Command, EnteredBy, ExportCaps, ExportInfo, Negotiated, ProtocolError, Request,
    RequestDecoder, SelectedContext, TransmissionFlags,
};

const EXPORT_BYTES: u64 = 1 << 20;

/// Decodes `stream` in pieces of `piece` bytes, taking WRITE payloads the way a server loop
/// does; returns the requests with their payload lengths, and the fatal error if any.
fn drive(stream: &[u8], piece: usize) -> (Vec<(Request, usize)>, Option<ProtocolError>) {
    let mut decoder = RequestDecoder::new();
    let mut requests: Vec<(Request, usize)> = Vec::new();
    for chunk in stream.chunks(piece) {
        let mut used = 0;
        while used < chunk.len() {
            if decoder.payload_remaining_bytes() > 0 {
                let taken = decoder.take_payload(&chunk[used..]).len();
                used += taken;
                requests.last_mut().expect("a write").1 += taken;
                continue;
            }
            match decoder.decode(&chunk[used..]) {
                Err(error) => return (requests, Some(error)),
                Ok((consumed, request)) => {
                    assert!(consumed > 0 && consumed <= chunk.len() - used);
                    used += consumed;
                    if let Some(request) = request {
                        assert_eq!(decoder.payload_remaining_bytes(), request.payload_bytes());
                        requests.push((request, 0));
                    }
                }
            }
        }
    }
    (requests, None)
}

fuzz_target!(|data: &[u8]| {
    let Some((&control, stream)) = data.split_first() else {
        return;
    };
    let piece = usize::from(control & 0x3f) + 1;
    let structured = control & 0x40 != 0;
    let read_only = control & 0x80 != 0;
    let export = ExportInfo {
        name: "vol0".into(),
        description: String::new(),
        size_bytes: EXPORT_BYTES,
        preferred_block_bytes: 4096,
        read_only,
        caps: ExportCaps::default(),
    };
    let negotiated = Negotiated {
        export_index: 0,
        structured_replies: structured,
        meta_contexts: if structured {
            vec![SelectedContext::base_allocation()]
        } else {
            Vec::new()
        },
        transmission_flags: TransmissionFlags::for_export(&export, structured),
        entered_by: EnteredBy::Go,
    };

    let (whole, whole_error) = drive(stream, stream.len().max(1));
    let (split, split_error) = drive(stream, piece);
    assert_eq!(whole_error, split_error);
    // The whole-input run may claim more payload for the last write in one go; the headers
    // must match exactly.
    assert_eq!(whole.len(), split.len());
    for ((a, a_payload), (b, b_payload)) in whole.iter().zip(&split) {
        assert_eq!(a, b);
        assert_eq!(a_payload, b_payload);
        assert!(*a_payload <= a.payload_bytes() as usize);
    }

    for (request, _) in &whole {
        if validate(request, &export, &negotiated).is_err() {
            continue;
        }
        match request.command {
            Command::Disconnect => {}
            Command::Flush => assert!(request.offset_bytes == 0 && request.length_bytes == 0),
            Command::Unknown(_) => panic!("unknown command accepted"),
            command => {
                assert!(request.length_bytes > 0);
                let end = u128::from(request.offset_bytes) + u128::from(request.length_bytes);
                assert!(end <= u128::from(EXPORT_BYTES));
                assert!(!(command.is_mutating() && read_only));
            }
        }
    }
});
