//! Resumable receive (`recv -s`, `send -t TOKEN`, `recv -A`): a stream cut at any point and
//! continued from its token ends exactly as an uncut receive (the same bytes in every
//! received snapshot, the sender's guids, a clean audit); the target does not change until
//! the stream's END; stale and forged tokens get a clear error and change nothing.

mod common;

use common::*;
use oxpool_engine::{Pool, ReceiveOptions, SendOptions, SendWhat};
use oxpool_format::stream::StreamDecoder;
use oxpool_format::{ResumeToken, TopVdevKind};

const KIB: u64 = 1 << 10;

fn send(pool: &Pool, snap: &str, base: Option<&str>) -> Vec<u8> {
    let opts = SendOptions {
        base: base.map(str::to_string),
        intermediates: false,
        prefetch_bytes_max: 64 << 10,
    };
    let mut out = Vec::new();
    pool.send("src", snap, &opts, &mut out).unwrap();
    out
}

/// The stream `send -t token` writes, checked against its estimate.
fn send_resume(pool: &Pool, token: &str) -> oxpool_engine::Result<Vec<u8>> {
    send_resume_from(pool, token, None)
}

/// [`send_resume`] naming the volume that holds the token's snapshot.
fn send_resume_from(
    pool: &Pool,
    token: &str,
    volume: Option<&str>,
) -> oxpool_engine::Result<Vec<u8>> {
    let token: ResumeToken = token.parse().expect("a token the receiver made parses");
    let what = SendWhat::Resume {
        token: &token,
        volume,
    };
    let opts = SendOptions::default();
    let mut out = Vec::new();
    let stats = pool.send_what(&what, &opts, &mut out)?;
    let estimate = pool.send_estimate_what(&what, &opts)?;
    assert_eq!(estimate.stream_bytes, out.len() as u64);
    assert_eq!(estimate.data_records, stats.data_records);
    Ok(out)
}

fn recv_s(pool: &Pool, stream: &[u8], resumable: bool) -> oxpool_engine::Result<()> {
    let mut input = stream;
    let opts = ReceiveOptions {
        force: false,
        resumable,
        dry_run: false,
        snapshot: None,
    };
    pool.receive("copy", &mut input, &opts).map(|_| ())
}

fn guids(pool: &Pool, vol: &str) -> Vec<(String, u64)> {
    pool.snapshots(vol)
        .unwrap()
        .into_iter()
        .map(|s| (s.name, s.guid))
        .collect()
}

/// Where each record of `stream` ends (the last is the stream's length).
fn record_ends(stream: &[u8]) -> Vec<usize> {
    let mut dec = StreamDecoder::new();
    let mut at = 0;
    let mut ends = Vec::new();
    // Bounded by the stream: each round consumes bytes.
    while at < stream.len() {
        let d = dec.decode(&stream[at..]).unwrap();
        at += d.consumed_bytes;
        if d.record.is_some() {
            ends.push(at);
        }
    }
    ends
}

/// A source `src` of `size` bytes (blocks of `bs`): @a mixed data with a hole; @b
/// overwrites, a trim, write-zeroes and a grown size.
fn source(size: u64, bs: u64, seed: u64) -> (Pool, Vec<oxpool_io::MemoryBackend>) {
    let (pool, mems) = mem_pool(TopVdevKind::Single, 1);
    let vol = pool
        .create_volume(
            "src",
            size,
            &[
                ("volblocksize".into(), bs.to_string()),
                ("compression".into(), "lz4".into()),
            ],
        )
        .unwrap();
    write(&vol, 0, &content(Fill::Mixed, seed, (size / 2) as usize));
    write(
        &vol,
        size * 3 / 4,
        &content(Fill::Random, seed + 1, (size / 8) as usize),
    );
    pool.snapshot(&["src@a".into()]).unwrap();
    write(
        &vol,
        bs,
        &content(Fill::Random, seed + 2, (3 * bs) as usize),
    );
    oxpool_io::rt::block_on(vol.trim(size / 4, 4 * bs, false)).unwrap();
    oxpool_io::rt::block_on(vol.write_zeroes(size * 3 / 4 + bs, 2 * bs, false)).unwrap();
    pool.set_volume_prop("src", "volsize", &(size + 8 * bs).to_string())
        .unwrap();
    write(
        &vol,
        size + bs,
        &content(Fill::Random, seed + 3, bs as usize),
    );
    pool.snapshot(&["src@b".into()]).unwrap();
    (pool, mems)
}

/// Receives `stream` cut at `cuts` (increasing offsets into the stream of each attempt),
/// resuming from the token after each cut, and returns how many attempts were needed.
/// Asserts that the target does not change before the last attempt.
fn receive_with_cuts(src: &Pool, dst: &Pool, stream: &[u8], cuts: &[usize]) -> usize {
    let before = dst.volume("copy").ok().map(|v| read_all(&v));
    let before_snaps = dst.snapshots("copy").ok().map(|_| guids(dst, "copy"));
    let mut current = stream.to_vec();
    let mut attempts = 0;
    for &cut in cuts {
        attempts += 1;
        let cut = cut.min(current.len());
        let result = recv_s(dst, &current[..cut], true);
        if cut == current.len() {
            result.unwrap();
            return attempts;
        }
        let err = result.unwrap_err().to_string();
        assert!(!err.contains('\n'), "one line: {err}");
        // The target is as it was.
        assert_eq!(dst.volume("copy").ok().map(|v| read_all(&v)), before);
        assert_eq!(
            dst.snapshots("copy").ok().map(|_| guids(dst, "copy")),
            before_snaps
        );
        match dst.receive_resume_token("copy") {
            Some(token) => {
                assert!(err.contains(&token), "the error names the token: {err}");
                current = send_resume(src, &token).unwrap();
            }
            // Cut inside BEGIN: nothing was started, the whole stream goes again.
            None => {
                assert!(cut < record_ends(&current)[0], "no token after cut {cut}");
                current = stream.to_vec();
            }
        }
    }
    attempts += 1;
    recv_s(dst, &current, true).unwrap();
    attempts
}

/// Cut at every record boundary (and inside records) of a small volume's full and
/// incremental streams, resumed once: identical to the uncut receive.
#[test]
fn a_receive_cut_at_every_record_resumes_to_the_same_bytes() {
    let (src, _m) = source(256 * KIB, 4 * KIB, 1);
    let full = send(&src, "a", None);
    let inc = send(&src, "b", Some("a"));
    let a = snap_bytes(&src, "src", "a");
    let b = snap_bytes(&src, "src", "b");
    let src_guids = guids(&src, "src");
    for (kind, stream) in [("full", &full), ("incremental", &inc)] {
        let ends = record_ends(stream);
        assert!(ends.len() > 10, "{kind}: {} records", ends.len());
        let mut cuts: Vec<usize> = ends.clone();
        // And inside every fifth record.
        cuts.extend(ends.windows(2).step_by(5).map(|w| (w[0] + w[1]) / 2));
        cuts.insert(0, 10);
        for cut in cuts {
            let (dst, _d) = mem_pool(TopVdevKind::Single, 1);
            if kind == "incremental" {
                recv_s(&dst, &full, false).unwrap();
            }
            receive_with_cuts(&src, &dst, stream, &[cut]);
            let want = if kind == "full" { &a } else { &b };
            let last = if kind == "full" { "a" } else { "b" };
            assert_eq!(&snap_bytes(&dst, "copy", last), want, "{kind} cut at {cut}");
            assert_eq!(&read_all(&dst.volume("copy").unwrap()), want);
            let n = guids(&dst, "copy").len();
            assert_eq!(guids(&dst, "copy"), src_guids[..n], "{kind} cut at {cut}");
            assert!(dst.receive_resume_token("copy").is_none());
            assert_eq!(
                dst.volumes().len(),
                1,
                "{kind} cut at {cut}: a hidden volume left"
            );
            audit_clean(&dst, &format!("{kind} cut at {cut}"));
        }
    }
}

/// Random cuts on a larger volume, several in a row (each resumed stream cut again), and
/// the pool exported and imported between two of them.
#[test]
fn random_cuts_resume_again_and_again_across_import() {
    let (src, _m) = source(4 << 20, 16 * KIB, 7);
    let full = send(&src, "a", None);
    let inc = send(&src, "b", Some("a"));
    let mut rng = 0x9e37_79b9_u64;
    let mut next = |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    for round in 0..6 {
        let (dst, mems) = mem_pool(TopVdevKind::Single, 1);
        let mut current = full.clone();
        let mut dst = dst;
        // Three cuts, each into what the stream then is, then the rest whole.
        for cut_no in 0..3 {
            let cut = 200 + next(current.len() - 200);
            let err = recv_s(&dst, &current[..cut], true).unwrap_err();
            let token = dst
                .receive_resume_token("copy")
                .unwrap_or_else(|| panic!("round {round} cut {cut_no} at {cut}: no token ({err})"));
            if cut_no == 1 {
                // The partial state survives an export and import.
                dst.export().unwrap();
                dst = reimport(&mems);
                assert_eq!(dst.receive_resume_token("copy").as_deref(), Some(&*token));
            }
            current = send_resume(&src, &token).unwrap();
        }
        recv_s(&dst, &current, true).unwrap();
        assert_eq!(snap_bytes(&dst, "copy", "a"), snap_bytes(&src, "src", "a"));
        audit_clean(&dst, &format!("round {round}, full"));
        // The incremental, cut twice.
        let mut current = inc.clone();
        for _ in 0..2 {
            let cut = 200 + next(current.len() - 200);
            recv_s(&dst, &current[..cut], true).unwrap_err();
            let token = dst.receive_resume_token("copy").unwrap();
            current = send_resume(&src, &token).unwrap();
        }
        recv_s(&dst, &current, true).unwrap();
        assert_eq!(snap_bytes(&dst, "copy", "b"), snap_bytes(&src, "src", "b"));
        assert_eq!(guids(&dst, "copy"), guids(&src, "src"));
        audit_clean(&dst, &format!("round {round}, incremental"));
    }
}

/// Stale, forged and foreign tokens, a plain receive over a saved one, and `recv -A`.
#[test]
fn stale_and_forged_tokens_are_refused_and_abort_discards() {
    let (src, _m) = source(256 * KIB, 4 * KIB, 3);
    let full = send(&src, "a", None);
    let (dst, _d) = mem_pool(TopVdevKind::Single, 1);
    let ends = record_ends(&full);
    recv_s(&dst, &full[..ends[10]], true).unwrap_err();
    let first = dst.receive_resume_token("copy").unwrap();
    let resumed = send_resume(&src, &first).unwrap();
    // Cut again further on: the first token is now stale.
    let resumed_ends = record_ends(&resumed);
    recv_s(&dst, &resumed[..resumed_ends[10]], true).unwrap_err();
    let second = dst.receive_resume_token("copy").unwrap();
    assert_ne!(first, second);
    let err = recv_s(&dst, &resumed, true).unwrap_err().to_string();
    assert!(err.contains("stale token"), "{err}");
    assert_eq!(dst.receive_resume_token("copy"), Some(second.clone()));

    // A forged token: its checksum does not match.
    let mut forged = second.clone().into_bytes();
    let at = forged.len() - 40;
    forged[at] = if forged[at] == b'0' { b'1' } else { b'0' };
    let forged = String::from_utf8(forged).unwrap();
    let err = forged.parse::<ResumeToken>().unwrap_err().to_string();
    assert!(err.contains("checksum"), "{err}");

    // A token of a snapshot the sender no longer has.
    let (other, _o) = source(256 * KIB, 4 * KIB, 3);
    let err = send_resume(&other, &second).unwrap_err().to_string();
    assert!(err.contains("no snapshot with the token's guid"), "{err}");
    assert!(!err.ends_with(": not found"), "{err}");

    // A plain receive does not overwrite the saved state.
    let err = recv_s(&dst, &full, false).unwrap_err().to_string();
    assert!(err.contains("recv -A"), "{err}");
    // A resumed stream without a saved state.
    let (fresh, _f) = mem_pool(TopVdevKind::Single, 1);
    let err = recv_s(&fresh, &send_resume(&src, &second).unwrap(), true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no partially received stream"), "{err}");
    assert!(!fresh.receive_datasets().iter().any(|n| n == "copy%recv"));

    // The saved state's hidden dataset is out of reach of every lookup by a user's name:
    // written to, snapshotted or set, it would no longer hold what the sender sent.
    assert_eq!(dst.receive_datasets(), ["copy%recv"]);
    let hidden = [
        dst.volume("copy%recv").map(|_| ()),
        dst.snapshot(&["copy%recv@x".to_string()]),
        dst.set_volume_prop("copy%recv", "sync", "always"),
        dst.destroy_volume("copy%recv"),
    ];
    for (i, r) in hidden.into_iter().enumerate() {
        let err = r.expect_err("a hidden dataset found by name").to_string();
        assert!(err.contains("not found"), "lookup {i}: {err}");
    }
    assert_eq!(dst.receive_datasets(), ["copy%recv"]);

    // -A discards it, nothing leaks, and the stream then arrives whole.
    dst.abort_receive("copy").unwrap();
    assert!(dst.receive_resume_token("copy").is_none());
    assert!(!dst.receive_datasets().iter().any(|n| n == "copy%recv"));
    assert!(dst.volumes().is_empty());
    audit_clean(&dst, "after recv -A");
    let err = dst.abort_receive("copy").unwrap_err().to_string();
    assert!(err.contains("no partially received stream"), "{err}");
    recv_s(&dst, &full, false).unwrap();
    assert_eq!(snap_bytes(&dst, "copy", "a"), snap_bytes(&src, "src", "a"));

    // Without -s, a cut receive keeps nothing.
    let inc = send(&src, "b", Some("a"));
    recv_s(&dst, &inc[..inc.len() / 2], false).unwrap_err();
    assert!(dst.receive_resume_token("copy").is_none());
    assert!(!dst.receive_datasets().iter().any(|n| n == "copy%recv"));
    audit_clean(&dst, "after a cut plain receive");
}

/// A guid names a snapshot within its volume, not within the pool: another volume of the
/// sending pool may hold a snapshot with the token's guid (a copy received within the pool,
/// or, here, one made from a crafted stream with other bytes). `send -t` then refuses to
/// pick one, and with the volume named continues from the blocks the receive started with.
#[test]
fn a_token_whose_guid_two_volumes_hold_needs_the_volume_named() {
    let (src, _m) = source(256 * KIB, 4 * KIB, 3);
    let full = send(&src, "a", None);
    let guid_a = guids(&src, "src")[0].1;
    // "dup" sorts before "src": a lookup by guid alone meets it first.
    let other = src
        .create_volume(
            "other",
            256 * KIB,
            &[("volblocksize".into(), "4096".into())],
        )
        .unwrap();
    write(&other, 0, &content(Fill::Random, 99, (128 * KIB) as usize));
    src.snapshot(&["other@a".into()]).unwrap();
    let mut stream = Vec::new();
    src.send("other", "a", &SendOptions::default(), &mut stream)
        .unwrap();
    let crafted = with_begin(&stream, |b| b.toguid = oxpool_format::Guid(guid_a));
    let opts = ReceiveOptions {
        force: false,
        resumable: false,
        dry_run: false,
        snapshot: None,
    };
    src.receive("dup", &mut crafted.as_slice(), &opts).unwrap();
    assert_eq!(guids(&src, "dup")[0].1, guid_a);
    assert_ne!(snap_bytes(&src, "dup", "a"), snap_bytes(&src, "src", "a"));

    let (dst, _d) = mem_pool(TopVdevKind::Single, 1);
    let ends = record_ends(&full);
    recv_s(&dst, &full[..ends[10]], true).unwrap_err();
    let token = dst.receive_resume_token("copy").unwrap();
    let pool = src.name();
    let err = send_resume(&src, &token).unwrap_err().to_string();
    assert!(
        err.contains(&format!("{pool}/dup, {pool}/src"))
            && err.contains("oxpool send -t TOKEN")
            && !err.contains('\n'),
        "{err}"
    );
    let err = send_resume_from(&src, &token, Some("other"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!(
            "{pool}/other has no snapshot with the token's guid"
        )),
        "{err}"
    );
    let err = send_resume_from(&src, &token, Some("gone"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("not found"), "{err}");

    let rest = send_resume_from(&src, &token, Some("src")).unwrap();
    recv_s(&dst, &rest, true).unwrap();
    assert_eq!(snap_bytes(&dst, "copy", "a"), snap_bytes(&src, "src", "a"));
    assert_eq!(guids(&dst, "copy"), guids(&src, "src")[..1]);
    audit_clean(&dst, "after the resume from the named volume");
    audit_clean(&src, "the sender");
}

/// `recv -s POOL/VOL@NAME` cut and resumed: without a name on the resuming command the
/// snapshot takes the one the interrupted receive was given; a name given again wins, and
/// is the one a later resume keeps.
#[test]
fn a_resumed_receive_keeps_the_name_it_was_given() {
    let (src, _m) = source(256 * KIB, 4 * KIB, 3);
    let full = send(&src, "a", None);
    let inc = send(&src, "b", Some("a"));
    let named = |name: &str| ReceiveOptions {
        force: false,
        resumable: true,
        dry_run: false,
        snapshot: Some(name.to_string()),
    };
    let (dst, _d) = mem_pool(TopVdevKind::Single, 1);
    // `stream` received under `name`, cut after its record `record`: the rest to resume with.
    let cut_under = |stream: &[u8], record: usize, name: &str| {
        let mut input = &stream[..record_ends(stream)[record]];
        dst.receive("copy", &mut input, &named(name)).unwrap_err();
        let token = dst
            .receive_resume_token("copy")
            .expect("a token after the cut");
        send_resume(&src, &token).unwrap()
    };
    let rest = cut_under(&full, 3, "mine");
    // A dry run of the resume says the name too.
    let mut input = &rest[..];
    let checked = dst
        .receive(
            "copy",
            &mut input,
            &ReceiveOptions {
                dry_run: true,
                ..ReceiveOptions::default()
            },
        )
        .unwrap();
    assert_eq!(checked[0].snapshot, format!("{}/copy@mine", dst.name()));
    recv_s(&dst, &rest, true).unwrap();
    let names: Vec<String> = guids(&dst, "copy").into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["mine"]);
    assert_eq!(
        snap_bytes(&dst, "copy", "mine"),
        snap_bytes(&src, "src", "a")
    );
    // The incremental, cut, resumed under another name given again.
    let rest = cut_under(&inc, 2, "first");
    // That resume, under a new name, cut too: the next resume without one keeps the new.
    let rest = cut_under(&rest, 2, "second");
    recv_s(&dst, &rest, true).unwrap();
    let names: Vec<String> = guids(&dst, "copy").into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["mine", "second"]);
    assert_eq!(
        snap_bytes(&dst, "copy", "second"),
        snap_bytes(&src, "src", "b")
    );
    audit_clean(&dst, "after named resumes");
}
