#![no_main]
//! LabelConfig::decode on raw bytes and on sealed labels whose postcard payload is fuzzed.

use libfuzzer_sys::fuzz_target;
use oxpool_format::{
    LabelConfig, LABEL_CONFIG_BYTES, LABEL_CONFIG_HEADER_BYTES, LABEL_CONFIG_MAGIC,
};

#[path = "format_common.rs"]
mod format_common;

fn check(bytes: &[u8]) {
    if let Ok(config) = LabelConfig::decode(bytes) {
        let encoded = config.encode();
        assert_eq!(encoded.len() as u64, LABEL_CONFIG_BYTES);
        assert_eq!(LabelConfig::decode(&encoded), Ok(config));
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let config_bytes = LABEL_CONFIG_BYTES as usize;
    let mut sealed = format_common::envelope(
        LABEL_CONFIG_MAGIC,
        LABEL_CONFIG_HEADER_BYTES,
        config_bytes,
        data,
    );
    let payload_bytes = data.len().min(config_bytes - LABEL_CONFIG_HEADER_BYTES) as u32;
    sealed[12..16].copy_from_slice(&payload_bytes.to_le_bytes());
    format_common::reseal(&mut sealed);
    check(&sealed);
});
