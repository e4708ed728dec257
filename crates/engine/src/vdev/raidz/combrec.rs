//! Combinatorial reconstruction (ZFS's `vdev_raidz_combrec`): when a block fails its checksum
//! although no device reported an error (or fewer than explain it), some columns hold wrong
//! bytes silently. Try the hypotheses "these columns are bad" from the fewest columns up, in
//! ZFS's order, rebuild the data from the other columns, and keep the first hypothesis under
//! which the block verifies.
//!
//! This is the slow path of a read gone wrong, not the hot path: it may verify the block up to
//! sum over k <= parity of C(columns, k) times, and it allocates one buffer to save the
//! columns it overwrites.

use super::error::RaidzError;
use super::{ColumnSet, ParityKernels, RaidzMap, RAIDZ_WIDTH_MAX};

/// The data columns of a block in order, for the caller's checksum: their concatenation is the
/// block (padded to whole sectors).
pub struct DataColumns<'a> {
    columns: &'a [&'a mut [u8]],
}

impl<'a> DataColumns<'a> {
    /// The data columns of `cols` (a block's columns, `parity_count` parity first).
    pub fn new(cols: &'a [&'a mut [u8]], parity_count: usize) -> DataColumns<'a> {
        DataColumns {
            columns: &cols[parity_count..],
        }
    }

    /// The columns in block order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.columns.iter().map(|c| &**c)
    }

    /// Bytes of the block.
    pub fn len_bytes(&self) -> usize {
        self.columns.iter().map(|c| c.len()).sum()
    }

    /// Copies the block into `out`, which is [`DataColumns::len_bytes`] long.
    pub fn copy_to(&self, out: &mut [u8]) {
        assert_eq!(out.len(), self.len_bytes(), "block buffer length");
        let mut at = 0;
        for column in self.iter() {
            out[at..at + column.len()].copy_from_slice(column);
            at += column.len();
        }
    }
}

/// What a successful [`reconstruct_verified`] found and fixed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reconstructed {
    /// Columns whose buffers now hold the right bytes where their device has other bytes or
    /// none: the failed columns, and the columns found silently wrong. Write them back.
    pub repaired: ColumnSet,
    /// Columns that were read without an error but held wrong bytes: data columns the
    /// verified hypothesis rebuilt to different bytes, and parity columns that disagree with
    /// the verified data. The devices to charge a checksum error.
    pub silent: ColumnSet,
    /// Parity columns the verified solution used.
    pub parity_used: ColumnSet,
    /// Checksum verifications run.
    pub verifications: usize,
}

/// Makes a block verify: rebuilds the `failed` columns (no content: device error, or not
/// read) from parity and, if the block still fails `verify`, tries every set of up to
/// `parity - failed.len()` more columns as silently bad, fewest first, each set in ZFS's order
/// (lexicographic by child index), until the block verifies.
///
/// `cols` are the block's columns in map order, each exactly as long as the map says, all
/// read except the failed ones. On success every buffer holds the right bytes (data rebuilt,
/// bad or failed parity regenerated) and the result says which to write back. On failure the
/// columns that were read hold what was read (failed data columns hold garbage): nothing
/// explains the block within the parity, and every column read is suspect.
pub fn reconstruct_verified<F>(
    kernels: ParityKernels,
    map: &RaidzMap,
    cols: &mut [&mut [u8]],
    failed: ColumnSet,
    mut verify: F,
) -> Result<Reconstructed, RaidzError>
where
    F: FnMut(&DataColumns<'_>) -> bool,
{
    assert_eq!(cols.len(), map.column_count(), "columns of the block");
    for (c, col) in cols.iter().enumerate() {
        assert_eq!(col.len(), map.column_bytes(c), "column {c} buffer length");
    }
    let parity_count = map.parity_count();
    let data = map.data_columns();
    let parity = map.parity_columns();
    assert!(
        failed.is_subset(map.all_columns()),
        "failed columns {failed:?}"
    );
    if failed.len() > parity_count {
        return Err(RaidzError::TooManyMissing {
            missing: failed.intersection(data).len(),
            parity: parity_count - failed.intersection(parity).len(),
        });
    }

    // First hypothesis: only the failed columns are bad.
    let mut verifications = 1;
    let used = kernels.reconstruct(cols, parity_count, failed)?;
    if verify(&DataColumns::new(cols, parity_count)) {
        return Ok(finish(
            kernels,
            cols,
            parity_count,
            failed,
            ColumnSet::EMPTY,
            used,
            verifications,
        ));
    }

    // Candidates: the columns read, in order of child index (ZFS's `ltgts` walk children).
    let mut order = [0usize; RAIDZ_WIDTH_MAX];
    let mut candidate_count = 0;
    for column in map.all_columns().difference(failed).iter() {
        order[candidate_count] = column;
        candidate_count += 1;
    }
    let candidates = &mut order[..candidate_count];
    candidates.sort_by_key(|&c| map.column(c).child);

    let column_bytes_max = map.parity_column_bytes();
    let mut saved: Vec<u8> = Vec::new();
    // Bounded: at most `parity` levels, each C(candidates, k) hypotheses.
    for k in 1..=parity_count - failed.len() {
        if k > candidate_count {
            break;
        }
        // `pick` holds k increasing positions in `candidates`: the current hypothesis.
        let mut pick = [0usize; 3];
        for (i, slot) in pick.iter_mut().enumerate().take(k) {
            *slot = i;
        }
        loop {
            let suspects: ColumnSet = pick[..k].iter().map(|&i| candidates[i]).collect();
            let dead = failed.union(suspects);
            let suspect_data = suspects.intersection(data);
            // With no data column dead the data is as read, which already failed.
            if !dead.intersection(data).is_empty() {
                if saved.is_empty() {
                    saved = vec![0; column_bytes_max * parity_count];
                }
                for (slot, c) in suspect_data.iter().enumerate() {
                    let len = cols[c].len();
                    saved[slot * column_bytes_max..][..len].copy_from_slice(&cols[c][..]);
                }
                let used = kernels.reconstruct(cols, parity_count, dead)?;
                verifications += 1;
                if verify(&DataColumns::new(cols, parity_count)) {
                    // Suspects rebuilt to the bytes they held were not wrong after all.
                    let mut changed = ColumnSet::EMPTY;
                    for (slot, c) in suspect_data.iter().enumerate() {
                        let len = cols[c].len();
                        if cols[c][..] != saved[slot * column_bytes_max..][..len] {
                            changed.insert(c);
                        }
                    }
                    return Ok(finish(
                        kernels,
                        cols,
                        parity_count,
                        failed,
                        changed,
                        used,
                        verifications,
                    ));
                }
                for (slot, c) in suspect_data.iter().enumerate() {
                    let len = cols[c].len();
                    cols[c].copy_from_slice(&saved[slot * column_bytes_max..][..len]);
                }
            }
            if !next_combination(&mut pick[..k], candidate_count) {
                break;
            }
        }
    }
    Err(RaidzError::Unrecoverable {
        parity: parity_count,
    })
}

/// Advances `pick` (increasing positions below `n`) to the next combination in lexicographic
/// order; false after the last.
fn next_combination(pick: &mut [usize], n: usize) -> bool {
    let k = pick.len();
    // The rightmost position that can still move right.
    let Some(i) = (0..k).rev().find(|&i| pick[i] < n - k + i) else {
        return false;
    };
    pick[i] += 1;
    for j in i + 1..k {
        pick[j] = pick[j - 1] + 1;
    }
    true
}

/// The data verified: find the parity columns that disagree with it, regenerate the failed
/// and disagreeing parity, and report.
///
/// Every parity column read is checked, the ones the solution used too: over the bytes of the
/// columns it rebuilt a used row agrees by construction, but past the end of a short rebuilt
/// column (ZFS's short columns) the solution did not consume it, and a disagreement there is
/// real damage. A disagreement can never be the data's fault: the data verified.
fn finish(
    kernels: ParityKernels,
    cols: &mut [&mut [u8]],
    parity_count: usize,
    failed: ColumnSet,
    silent_data: ColumnSet,
    used: ColumnSet,
    verifications: usize,
) -> Reconstructed {
    let parity = ColumnSet::range(0, parity_count);
    let checkable = parity.difference(failed);
    let silent_parity = kernels.check_parity(cols, parity_count, checkable);
    let regenerate = parity.intersection(failed).union(silent_parity);
    kernels.regenerate_parity(cols, parity_count, regenerate);
    let silent = silent_data.union(silent_parity);
    Reconstructed {
        repaired: failed.union(silent),
        silent,
        parity_used: used,
        verifications,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combinations_in_lexicographic_order() {
        let mut pick = [0, 1];
        let mut seen = vec![pick];
        while next_combination(&mut pick, 4) {
            seen.push(pick);
        }
        assert_eq!(seen, vec![[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]]);
        let mut one = [0];
        let mut count = 1;
        while next_combination(&mut one, 5) {
            count += 1;
        }
        assert_eq!(count, 5);
    }
}
