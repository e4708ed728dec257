//! The dataset layer: datasets (volumes, and later their snapshots and clones, and
//! filesystems), their names and lineage, the deadlists that decide which freed blocks
//! snapshots still hold, space accounting, and the scrub. Each txg, the pool's sync asks this
//! layer (through [`SyncClient`]) to write its changes; it asks the object layer to write each
//! dataset's dirty objects.

pub mod dataset;
pub mod deadlist;
pub mod scan;

use crate::dmu::tree::BlockTree;
use crate::spa::sync::{SyncClient, UpperMeta};
use crate::spa::Spa;
use crate::{EngineError, Result};
use dataset::Dataset;
use oxpool_format::{Dva, Txg, VolumeMeta};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// The registry's state (under one lock, never held across an await).
struct DslState {
    datasets: BTreeMap<String, Arc<Dataset>>,
    /// Destroyed since the last sync: their blocks are freed by the next one.
    destroyed: Vec<Arc<Dataset>>,
    /// Destroyed ones the running sync frees (their logs' places go with its metadata).
    syncing_destroyed: Vec<Arc<Dataset>>,
    next_id: u64,
}

/// A pool's datasets.
pub(crate) struct Datasets {
    pool_name: String,
    state: Mutex<DslState>,
    /// The scrub, if one ran since the pool was opened.
    pub scan: scan::Scan,
}

impl Datasets {
    /// No datasets yet; the next one gets id `next_id`.
    pub(crate) fn new(pool_name: &str, next_id: u64) -> Datasets {
        Datasets {
            pool_name: pool_name.to_string(),
            state: Mutex::new(DslState {
                datasets: BTreeMap::new(),
                destroyed: Vec::new(),
                syncing_destroyed: Vec::new(),
                next_id,
            }),
            scan: scan::Scan::default(),
        }
    }

    /// A new id for a dataset.
    pub(crate) fn next_id(&self) -> u64 {
        let mut s = self.state.lock().unwrap();
        let id = s.next_id;
        s.next_id += 1;
        id
    }

    /// Adds `ds` (created, or loaded at import); refused if the name is taken.
    pub(crate) fn insert(&self, ds: Arc<Dataset>) -> Result<()> {
        let mut s = self.state.lock().unwrap();
        if s.datasets.contains_key(&ds.name) {
            return Err(EngineError::Exists(format!(
                "{}/{}",
                self.pool_name, ds.name
            )));
        }
        s.datasets.insert(ds.name.clone(), ds);
        Ok(())
    }

    /// Removes dataset `name`; its blocks are freed by the next sync.
    pub(crate) fn destroy(&self, name: &str) -> Result<Arc<Dataset>> {
        let mut s = self.state.lock().unwrap();
        let ds = s
            .datasets
            .remove(name)
            .ok_or_else(|| EngineError::NotFound(format!("{}/{name}", self.pool_name)))?;
        ds.destroyed.store(true, Ordering::Release);
        s.destroyed.push(ds.clone());
        Ok(ds)
    }

    /// Every dataset, by name.
    pub(crate) fn all(&self) -> Vec<Arc<Dataset>> {
        self.state
            .lock()
            .unwrap()
            .datasets
            .values()
            .cloned()
            .collect()
    }

    fn live_and_destroyed(&self) -> (Vec<Arc<Dataset>>, Vec<Arc<Dataset>>) {
        let mut s = self.state.lock().unwrap();
        let destroyed = std::mem::take(&mut s.destroyed);
        s.syncing_destroyed.extend(destroyed.iter().cloned());
        (s.datasets.values().cloned().collect(), destroyed)
    }

    /// Writes every object of every dataset for txg `txg` (destroyed ones: frees all).
    async fn sync_all(&self, spa: &Spa, txg: Txg, freed: &mut Vec<Dva>) -> Result<()> {
        let (live, destroyed) = self.live_and_destroyed();
        for (list, destroy) in [(live, false), (destroyed, true)] {
            for ds in list {
                let props = ds.props.lock().unwrap().clone();
                for (_, obj) in ds.objset.objects() {
                    crate::dmu::sync::sync_object(
                        spa,
                        obj,
                        &ds.full_name,
                        &props,
                        txg,
                        destroy,
                        freed,
                    )
                    .await?;
                }
            }
        }
        Ok(())
    }
}

impl SyncClient for Datasets {
    fn sync<'a>(
        &'a self,
        spa: &'a Spa,
        txg: Txg,
        freed: &'a mut Vec<Dva>,
    ) -> Pin<Box<dyn Future<Output = Result<()>> + 'a>> {
        Box::pin(self.sync_all(spa, txg, freed))
    }

    fn meta(&self, _txg: Txg, freed: &mut Vec<Dva>) -> UpperMeta {
        let (live, destroyed, next_id) = {
            let mut s = self.state.lock().unwrap();
            (
                s.datasets.values().cloned().collect::<Vec<_>>(),
                std::mem::take(&mut s.syncing_destroyed),
                s.next_id,
            )
        };
        // The logs' places, without the pool's lock (committers allocate while holding
        // their log's lock).
        for ds in &destroyed {
            freed.extend(ds.log.take_to_free());
            freed.extend(ds.log.reserved());
        }
        let volumes = live
            .iter()
            .map(|ds| {
                freed.extend(ds.log.take_to_free());
                let mut reserved = ds.log.reserved();
                reserved.extend(ds.data().inplace_held.lock().unwrap().iter().copied());
                let head = ds.log.head();
                let p = ds.props.lock().unwrap();
                let data = ds.data();
                let t = data.tree.lock().unwrap();
                VolumeMeta {
                    id: ds.id,
                    name: ds.name.clone(),
                    props: p.to_pairs(),
                    // Not `p`'s: a resize in the open txg goes with its frees.
                    volsize_bytes: data.tree_size_bytes.load(Ordering::Relaxed),
                    volblocksize_bytes: p.volblocksize_bytes,
                    root: t.root(),
                    levels: t.levels(),
                    used_bytes: data.used_bytes.load(Ordering::Relaxed),
                    log_first: head.map(|h| h.0).unwrap_or_default(),
                    log_first_seq: head.map(|h| h.1).unwrap_or(0),
                    log_reserved: reserved,
                    compressed_bytes: data.compressed_bytes.load(Ordering::Relaxed),
                }
            })
            .collect();
        UpperMeta {
            volumes,
            next_volume_id: next_id,
        }
    }

    fn synced(&self, txg: Txg, cache_max_bytes: u64) {
        let live = self.all();
        let cache_blocks = (cache_max_bytes as usize / BlockTree::CACHED_BLOCK_BYTES).max(64);
        let per_dataset = (cache_blocks / live.len().max(1)).max(16);
        for ds in &live {
            for (_, obj) in ds.objset.objects() {
                obj.dirty.lock().unwrap().retire(txg);
                obj.tree.lock().unwrap().evict(per_dataset);
            }
        }
        for ds in &live {
            ds.log.txg_synced(txg);
        }
    }
}
