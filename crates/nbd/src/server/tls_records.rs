//! TLS 1.3 records after the handshake, sealed and opened by oxpool itself (RFC 8446
//! section 5), for the AES-GCM suites.
//!
//! Why not OpenSSL's record layer: it copies plain text into its own record buffer before it
//! encrypts it there, and copies ciphertext into that buffer before it decrypts it there; with
//! a memory BIO a third copy moves the records to or from our socket buffers. Here the cipher
//! makes the only pass: a READ reply is encrypted from the data cache's blocks straight into
//! the send buffer, and a WRITE's records are decrypted from the receive buffer straight into
//! the blocks that become the volume's (`docs/tls.md`, "The data path"). The cipher is still
//! OpenSSL's (EVP AES-GCM, with its VAES code where the CPU has it); only the framing is ours.
//!
//! The handshake stays OpenSSL's. When it is done, the two application traffic secrets are
//! taken from OpenSSL's key log callback (the documented way to export them, `tls.rs`), and
//! this layer derives the keys and IVs from them (RFC 8446 section 7.3) and numbers records
//! from 0 in each direction: OpenSSL has sent no record under those keys (no session tickets)
//! and read none (no read-ahead during the handshake, so the client's first records are still
//! in our receive buffer).
//!
//! What a client may send after the handshake, besides application data: KeyUpdate (handled:
//! the receive key moves on, and if the client asks, ours too before our next record),
//! close_notify (the end), other alerts (an error). Anything else ends the connection, as does
//! a handshake message split across records (RFC 8446 allows it; no TLS library does it for a
//! five-byte KeyUpdate). We change our own key after [`RECORDS_PER_KEY_MAX`] records (RFC 8446
//! section 5.5's limit for AES-GCM is 2^24.5).
//!
//! Sans I/O: the session (`tls_session.rs`) owns the buffers and the socket.

use std::fmt;

use foreign_types::ForeignTypeRef;
use openssl::cipher::{Cipher, CipherRef};
use openssl::cipher_ctx::CipherCtx;
use openssl::hash::MessageDigest;
use openssl::pkey::PKey;
use openssl::sign::Signer;

/// A record's header: content type, legacy version, length.
pub(crate) const HEADER_BYTES: usize = 5;
/// AES-GCM's tag.
const TAG_BYTES: usize = 16;
/// Most plain text in one record (RFC 8446 section 5.1).
pub(crate) const PLAINTEXT_MAX_BYTES: usize = 16 * 1024;
/// Most bytes after the header of a protected record: the inner plain text may be 2^14 + 1
/// bytes (section 5.4: content, type, padding), and AES-GCM adds its tag. (Section 5.2's
/// 2^14 + 256 is for any AEAD; a longer AES-GCM record is a record_overflow.)
const CIPHERTEXT_MAX_BYTES: usize = PLAINTEXT_MAX_BYTES + 1 + TAG_BYTES;
/// The largest record a client may send, header included.
pub(crate) const RECORD_MAX_BYTES: usize = HEADER_BYTES + CIPHERTEXT_MAX_BYTES;
/// What one record adds to its plain text: header, inner content type, tag.
const RECORD_OVERHEAD_BYTES: usize = HEADER_BYTES + 1 + TAG_BYTES;
/// A KeyUpdate record: the overhead and the four-byte message header with its one byte.
const KEY_UPDATE_RECORD_BYTES: usize = RECORD_OVERHEAD_BYTES + 5;
/// The most [`Records::seal`] writes beyond its plain text (a KeyUpdate may go first).
pub(crate) const SEAL_EXTRA_MAX_BYTES: usize = KEY_UPDATE_RECORD_BYTES + RECORD_OVERHEAD_BYTES;

const CONTENT_ALERT: u8 = 21;
const CONTENT_HANDSHAKE: u8 = 22;
const CONTENT_APPLICATION_DATA: u8 = 23;
const HANDSHAKE_KEY_UPDATE: u8 = 24;
const ALERT_CLOSE_NOTIFY: u8 = 0;
const ALERT_USER_CANCELED: u8 = 90;
const ALERT_LEVEL_WARNING: u8 = 1;
/// Control records (alerts, KeyUpdates) larger than this are refused: a KeyUpdate is five
/// bytes, an alert two.
const CONTROL_CONTENT_MAX_BYTES: usize = 64;
/// Records in a row without a byte of data (KeyUpdates, warnings, empty records) after
/// which the client is refused: each costs work (a KeyUpdate three HMACs and a key schedule),
/// and a receive buffer holds thousands of them. OpenSSL's limits are of the same order (32
/// KeyUpdates, 32 empty records).
const EMPTY_RECORDS_IN_A_ROW_MAX: u32 = 32;
/// Alert levels and the descriptions we send (RFC 8446 section 6).
const ALERT_LEVEL_FATAL: u8 = 2;
const ALERT_UNEXPECTED_MESSAGE: u8 = 10;
const ALERT_BAD_RECORD_MAC: u8 = 20;
const ALERT_RECORD_OVERFLOW: u8 = 22;
const ALERT_INTERNAL_ERROR: u8 = 80;
/// An alert record.
pub(crate) const ALERT_RECORD_BYTES: usize = RECORD_OVERHEAD_BYTES + 2;

/// Records sealed under one key before we move to the next ourselves: 2^24, under RFC 8446
/// section 5.5's limit of 2^24.5 full records for AES-GCM.
pub(crate) const RECORDS_PER_KEY_MAX: u64 = 1 << 24;

/// The TLS 1.3 suites this layer seals and opens; any other agreement stays with OpenSSL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Suite {
    /// TLS_AES_128_GCM_SHA256.
    Aes128GcmSha256,
    /// TLS_AES_256_GCM_SHA384.
    Aes256GcmSha384,
}

impl Suite {
    /// The suite of an IANA (RFC) suite name, if this layer does it.
    pub(crate) fn from_standard_name(name: &str) -> Option<Suite> {
        match name {
            "TLS_AES_128_GCM_SHA256" => Some(Suite::Aes128GcmSha256),
            "TLS_AES_256_GCM_SHA384" => Some(Suite::Aes256GcmSha384),
            _ => None,
        }
    }

    fn cipher(self) -> &'static CipherRef {
        match self {
            Suite::Aes128GcmSha256 => Cipher::aes_128_gcm(),
            Suite::Aes256GcmSha384 => Cipher::aes_256_gcm(),
        }
    }

    fn digest(self) -> MessageDigest {
        match self {
            Suite::Aes128GcmSha256 => MessageDigest::sha256(),
            Suite::Aes256GcmSha384 => MessageDigest::sha384(),
        }
    }

    fn key_bytes(self) -> usize {
        match self {
            Suite::Aes128GcmSha256 => 16,
            Suite::Aes256GcmSha384 => 32,
        }
    }

    fn hash_bytes(self) -> usize {
        match self {
            Suite::Aes128GcmSha256 => 32,
            Suite::Aes256GcmSha384 => 48,
        }
    }
}

/// What went wrong with a record; each ends the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RecordError {
    /// A header that is not a TLS 1.3 protected record.
    BadHeader(String),
    /// A record longer than TLS 1.3 allows.
    Overflow(usize),
    /// The tag did not verify (a damaged or forged record, or a key out of step).
    BadRecordMac,
    /// A record or message TLS 1.3 does not allow here.
    Unexpected(String),
    /// The client sent an alert other than close_notify.
    Alert(u8),
    /// The cipher failed (OpenSSL's error).
    Cipher(String),
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordError::BadHeader(what) => write!(f, "bad record header: {what}"),
            RecordError::Overflow(length) => write!(f, "a record of {length} bytes"),
            RecordError::BadRecordMac => write!(f, "a record failed its integrity check"),
            RecordError::Unexpected(what) => write!(f, "unexpected {what}"),
            RecordError::Alert(code) => write!(f, "the client sent alert {code}"),
            RecordError::Cipher(err) => write!(f, "cipher: {err}"),
        }
    }
}

impl RecordError {
    /// The fatal alert that tells the client why (none after its own alert).
    pub(crate) fn alert(&self) -> Option<u8> {
        match self {
            RecordError::BadHeader(_) | RecordError::Unexpected(_) => {
                Some(ALERT_UNEXPECTED_MESSAGE)
            }
            RecordError::Overflow(_) => Some(ALERT_RECORD_OVERFLOW),
            RecordError::BadRecordMac => Some(ALERT_BAD_RECORD_MAC),
            RecordError::Cipher(_) => Some(ALERT_INTERNAL_ERROR),
            RecordError::Alert(_) => None,
        }
    }
}

impl From<openssl::error::ErrorStack> for RecordError {
    fn from(err: openssl::error::ErrorStack) -> RecordError {
        RecordError::Cipher(err.to_string())
    }
}

/// Key material (a traffic secret, a key, an IV) that is zeroed when dropped.
pub(crate) struct Secret(Vec<u8>);

impl Secret {
    /// Takes `bytes` as key material.
    pub(crate) fn new(bytes: Vec<u8>) -> Secret {
        Secret(bytes)
    }

    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        // Whoever reads freed memory must not find keys; black_box keeps the stores.
        self.0.fill(0);
        std::hint::black_box(&self.0);
    }
}

/// HKDF-Expand-Label(secret, label, "", len) (RFC 8446 section 7.1), for `len` up to the
/// hash's size: a single HMAC block.
fn expand_label(
    suite: Suite,
    secret: &[u8],
    label: &[u8],
    len: usize,
) -> Result<Secret, RecordError> {
    const PREFIX: &[u8] = b"tls13 ";
    debug_assert!(len <= suite.hash_bytes() && PREFIX.len() + label.len() <= 255);
    let key = PKey::hmac(secret)?;
    let mut signer = Signer::new(suite.digest(), &key)?;
    // HkdfLabel: length, label ("tls13 " + label), context (empty); then T(1)'s counter.
    signer.update(&(len as u16).to_be_bytes())?;
    signer.update(&[(PREFIX.len() + label.len()) as u8])?;
    signer.update(PREFIX)?;
    signer.update(label)?;
    signer.update(&[0, 1])?;
    let mut out = Secret(signer.sign_to_vec()?);
    out.0[len..].fill(0);
    out.0.truncate(len);
    Ok(out)
}

/// One direction's key: the traffic secret it came from (for the next, after a KeyUpdate),
/// the cipher context keyed once, the IV, and the next record's sequence number.
struct TrafficKey {
    suite: Suite,
    secret: Secret,
    ctx: CipherCtx,
    iv: [u8; 12],
    sequence: u64,
    encrypt: bool,
}

impl TrafficKey {
    fn new(suite: Suite, secret: Secret, encrypt: bool) -> Result<TrafficKey, RecordError> {
        if secret.bytes().len() != suite.hash_bytes() {
            return Err(RecordError::Cipher(format!(
                "a traffic secret of {} bytes for {suite:?}",
                secret.bytes().len()
            )));
        }
        let key = expand_label(suite, secret.bytes(), b"key", suite.key_bytes())?;
        let iv_bytes = expand_label(suite, secret.bytes(), b"iv", 12)?;
        let mut iv = [0; 12];
        iv.copy_from_slice(iv_bytes.bytes());
        let mut ctx = CipherCtx::new()?;
        // Keyed once (the AES key schedule and GHASH tables); each record only sets its nonce.
        if encrypt {
            ctx.encrypt_init(Some(suite.cipher()), Some(key.bytes()), None)?;
        } else {
            ctx.decrypt_init(Some(suite.cipher()), Some(key.bytes()), None)?;
        }
        Ok(TrafficKey {
            suite,
            secret,
            ctx,
            iv,
            sequence: 0,
            encrypt,
        })
    }

    /// The next key (RFC 8446 section 7.2), its records numbered from 0.
    fn update(&mut self) -> Result<(), RecordError> {
        let next = expand_label(
            self.suite,
            self.secret.bytes(),
            b"traffic upd",
            self.suite.hash_bytes(),
        )?;
        *self = TrafficKey::new(self.suite, next, self.encrypt)?;
        Ok(())
    }

    /// Starts the record with `header` (its additional data) under the next sequence number.
    fn start_record(&mut self, header: &[u8]) -> Result<(), RecordError> {
        // A 64-bit count of records cannot wrap in practice; if it could, the nonce would repeat.
        if self.sequence == u64::MAX {
            return Err(RecordError::Unexpected("record number 2^64".into()));
        }
        let mut nonce = self.iv;
        for (byte, seq) in nonce[4..].iter_mut().zip(self.sequence.to_be_bytes()) {
            *byte ^= seq;
        }
        // SAFETY: `ctx` is a live cipher context keyed for this suite (its IV length is 12,
        // set by AES-GCM's default), `nonce` is 12 bytes that outlive the call; a null cipher
        // and key keep the context's, and -1 its direction. (The openssl crate's
        // `encrypt_init` would first query the IV length: a parameter lookup per record.)
        let done = unsafe {
            openssl_sys::EVP_CipherInit_ex(
                self.ctx.as_ptr(),
                std::ptr::null(),
                std::ptr::null_mut(),
                std::ptr::null(),
                nonce.as_ptr(),
                -1,
            )
        };
        if done != 1 {
            return Err(openssl::error::ErrorStack::get().into());
        }
        self.ctx.cipher_update(header, None)?;
        Ok(())
    }
}

impl Drop for TrafficKey {
    fn drop(&mut self) {
        // The secret (a `Secret`) zeroes itself; the cipher context cleans its own key; the
        // IV is not secret alone, but goes too.
        self.iv.fill(0);
        std::hint::black_box(&self.iv);
    }
}

/// The length of the record starting at `bytes` (header included) once its header is there
/// (`None` before), after checking the header: a protected record (outer type
/// application_data) with a length TLS 1.3 with AES-GCM allows. The legacy version is not
/// looked at (RFC 8446 section 5.1: ignored for all purposes).
pub(crate) fn record_bytes(bytes: &[u8]) -> Result<Option<usize>, RecordError> {
    if bytes.len() < HEADER_BYTES {
        return Ok(None);
    }
    if bytes[0] != CONTENT_APPLICATION_DATA {
        return Err(RecordError::BadHeader(format!(
            "content type {} after the handshake",
            bytes[0]
        )));
    }
    let length = usize::from(u16::from_be_bytes([bytes[3], bytes[4]]));
    if length < TAG_BYTES + 1 {
        return Err(RecordError::BadHeader(format!("length {length}")));
    }
    if length > CIPHERTEXT_MAX_BYTES {
        return Err(RecordError::Overflow(length));
    }
    Ok(Some(HEADER_BYTES + length))
}

/// The room a record of `record_bytes` (header included) needs to be opened straight into a
/// destination: its inner plain text but the content type byte.
pub(crate) fn content_bytes_max(record_bytes: usize) -> usize {
    record_bytes - HEADER_BYTES - TAG_BYTES - 1
}

/// What a record opened in place held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Opened {
    /// Application data: this many bytes of plain text, right after the record's header.
    Data(usize),
    /// A KeyUpdate or a warning alert, handled here; nothing for the caller.
    Control,
    /// close_notify: the client has finished.
    Closed,
}

/// Both directions of one connection's records.
pub(crate) struct Records {
    send: TrafficKey,
    receive: TrafficKey,
    /// The client asked for our key to change: a KeyUpdate goes before our next record.
    key_update_owed: bool,
    /// Records sealed under one key before we change it ([`RECORDS_PER_KEY_MAX`]; lower in
    /// tests).
    records_per_key_max: u64,
    /// Records opened since the last one with data ([`EMPTY_RECORDS_IN_A_ROW_MAX`]).
    empty_records_in_a_row: u32,
}

impl Records {
    /// The records of a connection whose handshake agreed on `suite`, from the client's and
    /// the server's application traffic secrets.
    pub(crate) fn new(
        suite: Suite,
        client_secret: Secret,
        server_secret: Secret,
    ) -> Result<Records, RecordError> {
        Ok(Records {
            send: TrafficKey::new(suite, server_secret, true)?,
            receive: TrafficKey::new(suite, client_secret, false)?,
            key_update_owed: false,
            records_per_key_max: RECORDS_PER_KEY_MAX,
            empty_records_in_a_row: 0,
        })
    }

    #[cfg(test)]
    fn with_records_per_key_max(mut self, max: u64) -> Records {
        self.records_per_key_max = max;
        self
    }

    /// Opens the whole record `record` (as [`record_bytes`] measured it) straight into
    /// `out`, pieces of a destination in order that hold at least [`content_bytes_max`]
    /// bytes: `Some(n)` when it was application data without padding, its `n` bytes at the
    /// start of `out`. `None` when it was something else (a KeyUpdate, an alert, padding):
    /// nothing is counted then, and the caller opens the same record with
    /// [`Records::open_in_place`] (rare; `out` holds scratch). The bytes written to `out` are
    /// the caller's only once this returns `Some`, after the tag was checked.
    pub(crate) fn open_into<'a>(
        &mut self,
        record: &[u8],
        out: impl IntoIterator<Item = &'a mut [u8]>,
    ) -> Result<Option<usize>, RecordError> {
        let inner_len = record.len() - HEADER_BYTES - TAG_BYTES;
        let (header, rest) = record.split_at(HEADER_BYTES);
        let (inner, tag) = rest.split_at(inner_len);
        let (content, last) = inner.split_at(inner_len - 1);
        let key = &mut self.receive;
        key.start_record(header)?;
        let mut left = content;
        // Bounded by the pieces.
        for piece in out {
            if left.is_empty() {
                break;
            }
            let count = piece.len().min(left.len());
            key.ctx
                .cipher_update(&left[..count], Some(&mut piece[..count]))?;
            left = &left[count..];
        }
        assert!(left.is_empty(), "a record opened into too little room");
        let mut content_type = [0];
        key.ctx.cipher_update(last, Some(&mut content_type))?;
        key.ctx.set_tag(tag)?;
        key.ctx
            .cipher_final(&mut [])
            .map_err(|_| RecordError::BadRecordMac)?;
        if content_type[0] != CONTENT_APPLICATION_DATA {
            // Not counted: the same record is opened again, in place.
            return Ok(None);
        }
        key.sequence += 1;
        self.count_data(inner_len - 1)?;
        Ok(Some(inner_len - 1))
    }

    /// Counts records without data in a row; refuses the client past the limit.
    fn count_data(&mut self, bytes: usize) -> Result<(), RecordError> {
        if bytes > 0 {
            self.empty_records_in_a_row = 0;
            return Ok(());
        }
        self.empty_records_in_a_row += 1;
        if self.empty_records_in_a_row > EMPTY_RECORDS_IN_A_ROW_MAX {
            return Err(RecordError::Unexpected(format!(
                "more than {EMPTY_RECORDS_IN_A_ROW_MAX} records in a row without data"
            )));
        }
        Ok(())
    }

    /// Opens the whole record `record` where it is: application data is then at
    /// `record[HEADER_BYTES..HEADER_BYTES + n]`; control records are handled.
    pub(crate) fn open_in_place(&mut self, record: &mut [u8]) -> Result<Opened, RecordError> {
        let inner_len = record.len() - HEADER_BYTES - TAG_BYTES;
        let (header, rest) = record.split_at_mut(HEADER_BYTES);
        let (inner, tag) = rest.split_at_mut(inner_len);
        let key = &mut self.receive;
        key.start_record(header)?;
        key.ctx.cipher_update_inplace(inner, inner_len)?;
        key.ctx.set_tag(tag)?;
        key.ctx
            .cipher_final(&mut [])
            .map_err(|_| RecordError::BadRecordMac)?;
        key.sequence += 1;
        // The content type is the last byte that is not padding (zeros).
        let Some(type_at) = inner.iter().rposition(|&byte| byte != 0) else {
            return Err(RecordError::Unexpected("a record of padding only".into()));
        };
        let content = &inner[..type_at];
        let opened = match inner[type_at] {
            CONTENT_APPLICATION_DATA => Opened::Data(content.len()),
            CONTENT_ALERT => self.alert(content)?,
            CONTENT_HANDSHAKE => self.handshake(content)?,
            other => {
                return Err(RecordError::Unexpected(format!(
                    "record of content type {other} after the handshake"
                )))
            }
        };
        match opened {
            Opened::Data(bytes) => self.count_data(bytes)?,
            Opened::Control => self.count_data(0)?,
            Opened::Closed => {}
        }
        Ok(opened)
    }

    fn alert(&mut self, content: &[u8]) -> Result<Opened, RecordError> {
        let [_level, description] = content else {
            return Err(RecordError::Unexpected(format!(
                "alert of {} bytes",
                content.len()
            )));
        };
        match *description {
            ALERT_CLOSE_NOTIFY => Ok(Opened::Closed),
            // A warning a close_notify follows (RFC 8446 section 6.1).
            ALERT_USER_CANCELED => Ok(Opened::Control),
            code => Err(RecordError::Alert(code)),
        }
    }

    /// Handshake messages after the handshake: only KeyUpdate, whole, and last in its record
    /// (a message must not span a key change).
    fn handshake(&mut self, content: &[u8]) -> Result<Opened, RecordError> {
        if content.is_empty() || content.len() > CONTROL_CONTENT_MAX_BYTES {
            return Err(RecordError::Unexpected(format!(
                "handshake record of {} bytes after the handshake",
                content.len()
            )));
        }
        match content {
            [HANDSHAKE_KEY_UPDATE, 0, 0, 1, request] if *request <= 1 => {
                self.receive.update()?;
                if *request == 1 {
                    self.key_update_owed = true;
                }
                Ok(Opened::Control)
            }
            [message_type, ..] => Err(RecordError::Unexpected(format!(
                "handshake message {message_type} after the handshake ({} bytes)",
                content.len()
            ))),
            [] => unreachable!("checked above"),
        }
    }

    /// Seals `plain` (at most [`PLAINTEXT_MAX_BYTES`]) as one application data record into
    /// `out`, which has room for `plain.len() +` [`SEAL_EXTRA_MAX_BYTES`]; returns the bytes
    /// written. A KeyUpdate record goes first when the client asked for one or our key has
    /// sealed its share of records.
    pub(crate) fn seal(&mut self, plain: &[u8], out: &mut [u8]) -> Result<usize, RecordError> {
        assert!(
            plain.len() <= PLAINTEXT_MAX_BYTES,
            "plain text over a record"
        );
        assert!(
            out.len() >= plain.len() + SEAL_EXTRA_MAX_BYTES,
            "sealing into too little room"
        );
        let mut written = 0;
        if self.key_update_owed || self.send.sequence >= self.records_per_key_max {
            // update_not_requested: we only answer, or move on by ourselves.
            written +=
                self.seal_record(CONTENT_HANDSHAKE, &[HANDSHAKE_KEY_UPDATE, 0, 0, 1, 0], out)?;
            self.send.update()?;
            self.key_update_owed = false;
        }
        written += self.seal_record(CONTENT_APPLICATION_DATA, plain, &mut out[written..])?;
        Ok(written)
    }

    /// Seals a close_notify alert into `out` (room for [`ALERT_RECORD_BYTES`]).
    pub(crate) fn seal_close_notify(&mut self, out: &mut [u8]) -> Result<usize, RecordError> {
        self.seal_record(
            CONTENT_ALERT,
            &[ALERT_LEVEL_WARNING, ALERT_CLOSE_NOTIFY],
            out,
        )
    }

    /// Seals the fatal alert `description` (from [`RecordError::alert`]) into `out` (room for
    /// [`ALERT_RECORD_BYTES`]).
    pub(crate) fn seal_fatal_alert(
        &mut self,
        description: u8,
        out: &mut [u8],
    ) -> Result<usize, RecordError> {
        self.seal_record(CONTENT_ALERT, &[ALERT_LEVEL_FATAL, description], out)
    }

    fn seal_record(
        &mut self,
        content_type: u8,
        plain: &[u8],
        out: &mut [u8],
    ) -> Result<usize, RecordError> {
        let length = plain.len() + 1 + TAG_BYTES;
        let total = HEADER_BYTES + length;
        let out = &mut out[..total];
        let (header, rest) = out.split_at_mut(HEADER_BYTES);
        header.copy_from_slice(&[
            CONTENT_APPLICATION_DATA,
            3,
            3,
            (length >> 8) as u8,
            length as u8,
        ]);
        let (body, tag) = rest.split_at_mut(plain.len() + 1);
        let key = &mut self.send;
        key.start_record(header)?;
        key.ctx
            .cipher_update(plain, Some(&mut body[..plain.len()]))?;
        key.ctx
            .cipher_update(&[content_type], Some(&mut body[plain.len()..]))?;
        key.ctx.cipher_final(&mut [])?;
        key.ctx.tag(tag)?;
        key.sequence += 1;
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    //! Against OpenSSL's own record layer as the client: a handshake in memory, then records
    //! both ways, KeyUpdates both ways, damage and close.

    use super::*;
    use std::io::{self, Read, Write};
    use std::sync::{Arc, Mutex};

    use openssl::asn1::Asn1Time;
    use openssl::ec::{EcGroup, EcKey};
    use openssl::nid::Nid;
    use openssl::ssl::{
        ErrorCode, Ssl, SslContextBuilder, SslMethod, SslStream, SslVerifyMode, SslVersion,
    };
    use openssl::x509::{X509NameBuilder, X509};

    /// The key log's lines: label and secret.
    type KeyLog = Vec<(String, Vec<u8>)>;

    /// One direction of an in-memory connection.
    #[derive(Clone, Default)]
    struct Pipe(Arc<Mutex<Vec<u8>>>);

    struct End {
        incoming: Pipe,
        outgoing: Pipe,
    }

    impl Read for End {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            let mut bytes = self.incoming.0.lock().unwrap();
            if bytes.is_empty() {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let count = out.len().min(bytes.len());
            out[..count].copy_from_slice(&bytes[..count]);
            bytes.drain(..count);
            Ok(count)
        }
    }

    impl Write for End {
        fn write(&mut self, data: &[u8]) -> io::Result<usize> {
            self.outgoing.0.lock().unwrap().extend_from_slice(data);
            Ok(data.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn self_signed() -> (openssl::pkey::PKey<openssl::pkey::Private>, X509) {
        let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
        let key = PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap();
        let mut name = X509NameBuilder::new().unwrap();
        name.append_entry_by_text("CN", "localhost").unwrap();
        let name = name.build();
        let mut cert = X509::builder().unwrap();
        cert.set_version(2).unwrap();
        cert.set_subject_name(&name).unwrap();
        cert.set_issuer_name(&name).unwrap();
        cert.set_pubkey(&key).unwrap();
        cert.set_not_before(&Asn1Time::days_from_now(0).unwrap())
            .unwrap();
        cert.set_not_after(&Asn1Time::days_from_now(1).unwrap())
            .unwrap();
        cert.sign(&key, MessageDigest::sha256()).unwrap();
        (key, cert.build())
    }

    /// A finished TLS 1.3 handshake in memory, the server's records ours: (client, our
    /// records, client-to-server bytes, server-to-client bytes).
    fn connected(suite: &str) -> (SslStream<End>, Records, Pipe, Pipe) {
        let (key, cert) = self_signed();
        let secrets: Arc<Mutex<KeyLog>> = Arc::default();
        let mut server = SslContextBuilder::new(SslMethod::tls_server()).unwrap();
        server.set_private_key(&key).unwrap();
        server.set_certificate(&cert).unwrap();
        server.set_ciphersuites(suite).unwrap();
        server.set_num_tickets(0).unwrap();
        let log = secrets.clone();
        server.set_keylog_callback(move |_, line| {
            let mut fields = line.split(' ');
            let (Some(label), Some(_), Some(hex)) = (fields.next(), fields.next(), fields.next())
            else {
                return;
            };
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            log.lock().unwrap().push((label.to_string(), bytes));
        });
        let mut client = SslContextBuilder::new(SslMethod::tls_client()).unwrap();
        client.set_verify(SslVerifyMode::NONE);
        client
            .set_min_proto_version(Some(SslVersion::TLS1_3))
            .unwrap();
        client.set_ciphersuites(suite).unwrap();
        let (up, down) = (Pipe::default(), Pipe::default());
        let mut server = SslStream::new(
            Ssl::new(&server.build()).unwrap(),
            End {
                incoming: up.clone(),
                outgoing: down.clone(),
            },
        )
        .unwrap();
        let mut client = SslStream::new(
            Ssl::new(&client.build()).unwrap(),
            End {
                incoming: down.clone(),
                outgoing: up.clone(),
            },
        )
        .unwrap();
        let (mut client_done, mut server_done) = (false, false);
        for _ in 0..16 {
            if !client_done {
                match client.connect() {
                    Ok(()) => client_done = true,
                    Err(err) => assert_eq!(err.code(), ErrorCode::WANT_READ, "{err}"),
                }
            }
            if !server_done {
                match server.accept() {
                    Ok(()) => server_done = true,
                    Err(err) => assert_eq!(err.code(), ErrorCode::WANT_READ, "{err}"),
                }
            }
        }
        assert!(client_done && server_done, "handshake in memory");
        assert!(
            up.0.lock().unwrap().is_empty(),
            "OpenSSL left client bytes unread"
        );
        let secret = |label: &str| {
            let log = secrets.lock().unwrap();
            log.iter().find(|(l, _)| l == label).unwrap().1.clone()
        };
        let standard = server
            .ssl()
            .current_cipher()
            .unwrap()
            .standard_name()
            .unwrap();
        let records = Records::new(
            Suite::from_standard_name(standard).unwrap(),
            Secret::new(secret("CLIENT_TRAFFIC_SECRET_0")),
            Secret::new(secret("SERVER_TRAFFIC_SECRET_0")),
        )
        .unwrap();
        (client, records, up, down)
    }

    extern "C" {
        // libssl's; not in the openssl crate.
        fn SSL_key_update(
            ssl: *mut openssl_sys::SSL,
            update_type: std::os::raw::c_int,
        ) -> std::os::raw::c_int;
    }

    /// Makes OpenSSL's client send a KeyUpdate that asks for ours, with its next record.
    fn request_key_update(ssl: &openssl::ssl::SslRef) {
        const SSL_KEY_UPDATE_REQUESTED: std::os::raw::c_int = 1;
        // SAFETY: a live SSL object of a finished TLS 1.3 handshake, borrowed for the call.
        let done = unsafe { SSL_key_update(ssl.as_ptr(), SSL_KEY_UPDATE_REQUESTED) };
        assert_eq!(done, 1, "SSL_key_update");
    }

    /// The ciphertext bytes `plain_bytes` of plain text become in records of at most
    /// [`PLAINTEXT_MAX_BYTES`] (without a KeyUpdate).
    fn sealed_bytes(plain_bytes: usize) -> usize {
        plain_bytes + plain_bytes.div_ceil(PLAINTEXT_MAX_BYTES).max(1) * RECORD_OVERHEAD_BYTES
    }

    fn take(pipe: &Pipe) -> Vec<u8> {
        std::mem::take(&mut *pipe.0.lock().unwrap())
    }

    /// Splits `bytes` into whole records.
    fn split_records(bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut records = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let len = record_bytes(&bytes[at..]).unwrap().unwrap();
            records.push(bytes[at..at + len].to_vec());
            at += len;
        }
        records
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    /// Reads everything the client has to give.
    fn client_reads(client: &mut SslStream<End>, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        let mut at = 0;
        while at < len {
            at += client.ssl_read(&mut out[at..]).unwrap();
        }
        out
    }

    #[test]
    fn records_from_openssl_open_into_pieces_and_in_place() {
        for suite in ["TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384"] {
            let (mut client, mut records, up, _down) = connected(suite);
            for (round, len) in [1, 28, 4096, 16384, 40000].into_iter().enumerate() {
                let sent = pattern(len, round as u8);
                client.write_all(&sent).unwrap();
                let mut got = Vec::new();
                for (index, mut record) in split_records(&take(&up)).into_iter().enumerate() {
                    let room = content_bytes_max(record.len());
                    if index % 2 == 0 {
                        // Into three pieces, the way a WRITE's blocks take it.
                        let mut dest = vec![0xAA; room];
                        let (a, rest) = dest.split_at_mut(room / 3);
                        let (b, c) = rest.split_at_mut(room / 3);
                        let n = records
                            .open_into(&record, [a, b, c])
                            .unwrap()
                            .expect("application data");
                        got.extend_from_slice(&dest[..n]);
                    } else {
                        let Opened::Data(n) = records.open_in_place(&mut record).unwrap() else {
                            panic!("application data expected");
                        };
                        got.extend_from_slice(&record[HEADER_BYTES..HEADER_BYTES + n]);
                    }
                }
                assert_eq!(got, sent, "{suite}, {len} bytes");
            }
        }
    }

    #[test]
    fn our_records_are_read_by_openssl() {
        for suite in ["TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384"] {
            let (mut client, mut records, _up, down) = connected(suite);
            for (round, len) in [0, 1, 100, 16384].into_iter().enumerate() {
                let sent = pattern(len, round as u8);
                let mut out = vec![0; sealed_bytes(len) + SEAL_EXTRA_MAX_BYTES];
                let n = records.seal(&sent, &mut out).unwrap();
                assert_eq!(n, sealed_bytes(len), "one record, no KeyUpdate");
                down.0.lock().unwrap().extend_from_slice(&out[..n]);
                if len > 0 {
                    assert_eq!(client_reads(&mut client, len), sent, "{suite}");
                }
            }
            let mut out = [0; ALERT_RECORD_BYTES];
            let n = records.seal_close_notify(&mut out).unwrap();
            down.0.lock().unwrap().extend_from_slice(&out[..n]);
            let err = client.ssl_read(&mut [0; 8]).unwrap_err();
            assert_eq!(
                err.code(),
                ErrorCode::ZERO_RETURN,
                "close_notify read as the end"
            );
        }
    }

    #[test]
    fn key_updates_both_ways_and_by_count() {
        let (mut client, records, up, down) = connected("TLS_AES_128_GCM_SHA256");
        let mut records = records.with_records_per_key_max(3);
        // The client moves its key and asks us to move ours.
        request_key_update(client.ssl());
        client.write_all(b"after the update").unwrap();
        let mut got = Vec::new();
        let mut controls = 0;
        for mut record in split_records(&take(&up)) {
            match records.open_in_place(&mut record).unwrap() {
                Opened::Data(n) => got.extend_from_slice(&record[HEADER_BYTES..HEADER_BYTES + n]),
                Opened::Control => controls += 1,
                Opened::Closed => panic!("not closed"),
            }
        }
        assert_eq!((got.as_slice(), controls), (&b"after the update"[..], 1));
        assert!(records.key_update_owed, "the client asked for our update");
        // Ours goes before our next record; then 3 records per key: updates at 3 and 6.
        let mut wire = Vec::new();
        for round in 0..8u8 {
            let mut out = vec![0; 64 + SEAL_EXTRA_MAX_BYTES];
            let n = records.seal(&[round; 64], &mut out).unwrap();
            wire.extend_from_slice(&out[..n]);
        }
        let updates = split_records(&wire).len() - 8;
        assert_eq!(updates, 3, "one asked for, two by count");
        down.0.lock().unwrap().extend_from_slice(&wire);
        let read = client_reads(&mut client, 8 * 64);
        let expected: Vec<u8> = (0..8u8).flat_map(|r| [r; 64]).collect();
        assert_eq!(read, expected);
    }

    #[test]
    fn records_without_data_are_refused_past_the_limit() {
        let (mut client, mut records, up, _down) = connected("TLS_AES_128_GCM_SHA256");
        // KeyUpdates without data between them: up to the limit they are taken (and each
        // moves the key), the next is refused.
        for _ in 0..EMPTY_RECORDS_IN_A_ROW_MAX + 1 {
            request_key_update(client.ssl());
            // SSL_key_update sends it with the next handshake step or write: drive it.
            client.do_handshake().unwrap();
        }
        let wire = split_records(&take(&up));
        assert_eq!(wire.len() as u32, EMPTY_RECORDS_IN_A_ROW_MAX + 1);
        for (index, record) in wire.into_iter().enumerate() {
            let opened = records.open_in_place(&mut record.clone());
            if (index as u32) < EMPTY_RECORDS_IN_A_ROW_MAX {
                assert_eq!(opened, Ok(Opened::Control), "KeyUpdate {index}");
            } else {
                assert!(
                    matches!(opened, Err(RecordError::Unexpected(_))),
                    "{opened:?}"
                );
            }
        }
        // Data resets the count: as many again after a byte of data are fine.
        let (mut client, mut records, up, _down) = connected("TLS_AES_128_GCM_SHA256");
        for round in 0..2 {
            for _ in 0..EMPTY_RECORDS_IN_A_ROW_MAX {
                request_key_update(client.ssl());
                client.do_handshake().unwrap();
            }
            client.write_all(&[round]).unwrap();
        }
        let mut data = Vec::new();
        for mut record in split_records(&take(&up)) {
            if let Opened::Data(n) = records.open_in_place(&mut record).unwrap() {
                data.extend_from_slice(&record[HEADER_BYTES..HEADER_BYTES + n]);
            }
        }
        assert_eq!(data, [0, 1]);
    }

    #[test]
    fn our_fatal_alert_is_read_by_openssl() {
        let (mut client, mut records, _up, down) = connected("TLS_AES_128_GCM_SHA256");
        let mut out = [0; ALERT_RECORD_BYTES];
        let code = RecordError::BadRecordMac.alert().unwrap();
        let n = records.seal_fatal_alert(code, &mut out).unwrap();
        down.0.lock().unwrap().extend_from_slice(&out[..n]);
        let err = client.ssl_read(&mut [0; 8]).unwrap_err();
        assert_eq!(
            err.code(),
            ErrorCode::SSL,
            "a fatal alert ends OpenSSL's session"
        );
        assert!(
            err.to_string().contains("bad record mac"),
            "OpenSSL names the alert: {err}"
        );
    }

    #[test]
    fn damaged_or_replayed_records_and_bad_headers_are_refused() {
        let (mut client, mut records, up, _down) = connected("TLS_AES_128_GCM_SHA256");
        client.write_all(&pattern(1000, 1)).unwrap();
        client.write_all(&pattern(1000, 2)).unwrap();
        let wire = split_records(&take(&up));
        // A flipped bit anywhere after the header fails the tag and counts nothing.
        let mut damaged = wire[0].clone();
        damaged[HEADER_BYTES + 500] ^= 4;
        assert_eq!(
            records.open_in_place(&mut damaged.clone()),
            Err(RecordError::BadRecordMac)
        );
        let mut room = vec![0; 2000];
        assert_eq!(
            records.open_into(&damaged, [&mut room[..]]),
            Err(RecordError::BadRecordMac)
        );
        // Out of order (the second record first): its number is wrong.
        assert_eq!(
            records.open_in_place(&mut wire[1].clone()),
            Err(RecordError::BadRecordMac)
        );
        // The undamaged first still opens: failures did not move the count.
        assert_eq!(records.open_into(&wire[0], [&mut room[..]]), Ok(Some(1000)));
        // Headers: plain handshake, too short for a tag; too long (2^14 + 1 + 16 is the most).
        for header in [[22, 3, 3, 0, 40], [23, 3, 3, 0, 16]] {
            assert!(
                matches!(record_bytes(&header), Err(RecordError::BadHeader(_))),
                "{header:?}"
            );
        }
        assert_eq!(
            record_bytes(&[23, 3, 3, 0x40, 0x12]),
            Err(RecordError::Overflow(16402))
        );
        assert_eq!(RecordError::Overflow(16402).alert(), Some(22));
        assert_eq!(RecordError::BadRecordMac.alert(), Some(20));
        assert_eq!(record_bytes(&[23, 3, 3, 0x40]), Ok(None));
        assert_eq!(
            record_bytes(&[23, 3, 3, 0x40, 0x11]),
            Ok(Some(RECORD_MAX_BYTES))
        );
        // The legacy version is ignored.
        assert_eq!(record_bytes(&[23, 3, 1, 0, 40]), Ok(Some(45)));
    }

    proptest::proptest! {
        /// Any bytes a client sends: a header is refused or measured, and a whole record of
        /// random bytes fails its tag; nothing panics, and nothing is counted.
        #[test]
        fn random_bytes_are_refused_without_panicking(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
            as_record in proptest::prelude::any::<bool>(),
        ) {
            let mut bytes = bytes;
            if as_record && bytes.len() > HEADER_BYTES + TAG_BYTES {
                let length = (bytes.len() - HEADER_BYTES) as u16;
                bytes[..HEADER_BYTES].copy_from_slice(&[23, 3, 3, (length >> 8) as u8, length as u8]);
            }
            let mut records = Records::new(
                Suite::Aes128GcmSha256,
                Secret::new(vec![7; 32]),
                Secret::new(vec![9; 32]),
            )
            .unwrap();
            if let Ok(Some(len)) = record_bytes(&bytes) {
                if len <= bytes.len() {
                    let mut room = vec![0; content_bytes_max(len)];
                    proptest::prop_assert_eq!(
                        records.open_into(&bytes[..len], [&mut room[..]]),
                        Err(RecordError::BadRecordMac)
                    );
                    proptest::prop_assert_eq!(
                        records.open_in_place(&mut bytes[..len]),
                        Err(RecordError::BadRecordMac)
                    );
                }
            }
        }
    }

    #[test]
    fn close_notify_from_openssl_is_the_end() {
        let (mut client, mut records, up, _down) = connected("TLS_AES_128_GCM_SHA256");
        let _ = client.shutdown();
        let wire = split_records(&take(&up));
        assert_eq!(wire.len(), 1);
        let mut room = [0; 64];
        // Not application data: not counted by the direct open, then read in place.
        assert_eq!(records.open_into(&wire[0], [&mut room[..]]), Ok(None));
        assert_eq!(
            records.open_in_place(&mut wire[0].clone()),
            Ok(Opened::Closed)
        );
    }
}
