//! Changing the children of top-level vdevs while the pool serves: attach, detach, replace
//! and hot spares. Each change builds a new [`Shape`] and swaps it in; the pool (`spa/`)
//! writes the labels and records the new tree in its next txg.
//!
//! A new member (attached, replacing, a spare stepping in) lacks every txg up to the open
//! one: reads go to the members that lack nothing, writes go to every member, and the
//! resilver (a scan) copies what it lacks; once its range is forgotten
//! ([`VdevTree::scrub_repaired_through`]), [`VdevTree::finish_replacements`] detaches the
//! member it replaced.

use crate::vdev::{Child, Leaf, Member, Shape, TopVdev, VdevTree};
use crate::{EngineError, Result};
use oxpool_format::{Guid, LeafConfig, PairKind, TopVdevKind, Txg, VdevId};
use std::sync::Arc;

/// A hot spare as `oxpool status` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpareStatus {
    /// Its path.
    pub name: String,
    /// Its guid.
    pub guid: Guid,
    /// AVAIL (ready to step in), INUSE (standing in for a device), or UNAVAIL (not found
    /// at import).
    pub state: &'static str,
    /// The device it stands in for, when INUSE.
    pub in_use_for: Option<String>,
}

/// What a detach took out of the tree.
#[derive(Debug)]
pub struct Detached {
    /// The member's leaf, if it was present.
    pub leaf: Option<Arc<Leaf>>,
    /// Its guid.
    pub guid: Guid,
    /// Whether it is one of the pool's hot spares (it goes back to AVAIL, keeping its
    /// labels, rather than having them cleared).
    pub spare: bool,
}

impl VdevTree {
    /// A new member lacks every txg up to the one open now: reads avoid it for every block
    /// until the resilver copied them.
    fn lacks_everything(&self, leaf: &Leaf) {
        leaf.health.note_missed(Txg(1), self.last_written());
    }

    /// The top-level vdev and child of `leaf`, or a not-found error naming it.
    fn place_of(&self, leaf: &Leaf) -> Result<(&TopVdev, usize)> {
        self.position(leaf)
            .ok_or_else(|| EngineError::NotFound(format!("device '{}' in the pool", leaf.name())))
    }

    /// The top-level vdev `top` and the child with a member `guid`.
    fn member_place(&self, top: VdevId, guid: Guid) -> Result<(&TopVdev, usize)> {
        let t = self
            .top(top)
            .ok_or_else(|| EngineError::NotFound(format!("vdev {}", top.0)))?;
        let index = t
            .shape()
            .children
            .iter()
            .position(|c| c.members().any(|m| m.config.guid == guid))
            .ok_or_else(|| {
                EngineError::NotFound(format!("device {:x} in vdev {}", guid.0, top.0))
            })?;
        Ok((t, index))
    }

    /// Whether `guid` is one of the pool's hot spares.
    pub fn is_spare(&self, guid: Guid) -> bool {
        self.spares
            .lock()
            .unwrap()
            .iter()
            .any(|m| m.config.guid == guid)
    }

    /// Attaches `new` (configured as `config`) beside `existing`: a single device becomes a
    /// 2-way mirror, a mirror gains a side. Refused on a raidz (expansion is not supported)
    /// and on a child being replaced.
    pub(crate) fn attach(&self, existing: &Leaf, new: Arc<Leaf>, config: LeafConfig) -> Result<()> {
        let _one = self.state_change.lock().unwrap();
        let (top, index) = self.place_of(existing)?;
        let shape = top.shape();
        let refuse = |why: String| {
            Err(EngineError::invalid(format!(
                "cannot attach {} to {}: {why}",
                new.name(),
                existing.name()
            )))
        };
        let mut next = (*shape).clone();
        match &shape.kind {
            TopVdevKind::Raidz(r) => {
                return refuse(format!(
                    "it is a column of raidz{}-{}, and raidz expansion is not supported (replace \
                     it instead)",
                    r.parity, top.id.0
                ))
            }
            TopVdevKind::Single => next.kind = TopVdevKind::Mirror,
            TopVdevKind::Mirror => {}
            // A hole has no member to attach to.
            TopVdevKind::Hole => return refuse("its vdev was removed".to_string()),
        }
        if shape.children[index].new.is_some() {
            return refuse(format!("{} is being replaced", existing.name()));
        }
        self.lacks_everything(&new);
        next.children.push(Child {
            old: Member {
                config,
                leaf: Some(new),
            },
            new: None,
        });
        self.swap_shape_adding(top, next);
        Ok(())
    }

    /// Makes `old`'s child a pair (`old`, `new`) of `kind`: written on both, read from the
    /// member that lacks nothing for the block. Replacing a device that a hot spare stands
    /// in for makes the pair (spare, new): the faulted device leaves at once (refused if it
    /// is still needed), and the spare goes back to the spares when `new` is resilvered.
    pub(crate) fn replace(
        &self,
        top: VdevId,
        old: Guid,
        new: Arc<Leaf>,
        config: LeafConfig,
        kind: PairKind,
    ) -> Result<Option<Detached>> {
        let _one = self.state_change.lock().unwrap();
        let (top, index) = self.member_place(top, old)?;
        let shape = top.shape();
        let child = &shape.children[index];
        let old_name = child
            .members()
            .find(|m| m.config.guid == old)
            .map_or(String::new(), |m| m.config.path.clone());
        let refuse = |why: String| {
            Err(EngineError::invalid(format!(
                "cannot replace {old_name} with {}: {why}",
                new.name()
            )))
        };
        let is_old = child.old.config.guid == old;
        let mut next = (*shape).clone();
        let mut gone = None;
        match (&child.new, is_old) {
            (None, _) => {}
            (Some((PairKind::Spare, spare)), true) if kind == PairKind::Replacing => {
                // The faulted device leaves now; the spare holds the child until `new` is
                // resilvered.
                if let Some(l) = &child.old.leaf {
                    if let Err(why) = self.check_can_lose(top, l) {
                        return refuse(why);
                    }
                }
                gone = Some(Detached {
                    leaf: child.old.leaf.clone(),
                    guid: child.old.config.guid,
                    spare: false,
                });
                next.children[index] = Child {
                    old: spare.clone(),
                    new: None,
                };
            }
            (Some((PairKind::Spare, _)), _) => {
                return refuse(format!(
                    "{old_name} is a hot spare in use: detach it, or replace the device it \
                     stands in for"
                ))
            }
            (Some((PairKind::Replacing, _)), _) => {
                return refuse(format!(
                    "{} is being replaced already (detach one of the pair first)",
                    child.old.config.path
                ))
            }
        }
        self.lacks_everything(&new);
        next.children[index].new = Some((
            kind,
            Member {
                config,
                leaf: Some(new),
            },
        ));
        self.swap_shape_adding(top, next);
        Ok(gone)
    }

    /// Puts back `before`, the shape of vdev `top` before a member was added to it (attached
    /// or replacing) whose labels could not be written: that member holds nothing yet, and
    /// the change is undone whole. Whole matters for a replace of a device a hot spare stood
    /// in for: it also took that device out and made the spare a plain member, which taking
    /// out only the new member would have kept (the caller holds the configuration lock and
    /// the sync gate since the change: no other change and no txg came between).
    pub(crate) fn undo_member(&self, top: VdevId, before: Shape) -> Result<()> {
        let _one = self.state_change.lock().unwrap();
        let t = self
            .top(top)
            .ok_or_else(|| EngineError::NotFound(format!("vdev {}", top.0)))?;
        self.swap_shape(t, before);
        Ok(())
    }

    /// Detaches `leaf`: a side of a mirror, or either member of a replacing or spare pair.
    /// Refused, with the reason in one line and nothing changed, for the last side of a
    /// mirror, a single device, a raidz column that is not part of a pair, or a device whose
    /// blocks exist nowhere else. A mirror left with one side becomes a single device.
    pub(crate) fn detach(&self, top: VdevId, guid: Guid) -> Result<Detached> {
        let _one = self.state_change.lock().unwrap();
        let (top, index) = self.member_place(top, guid)?;
        let shape = top.shape();
        let child = &shape.children[index];
        let member = child
            .members()
            .find(|m| m.config.guid == guid)
            .expect("member_place found it");
        let name = member.config.path.clone();
        let leaf = member.leaf.clone();
        let refuse =
            |why: String| Err(EngineError::invalid(format!("cannot detach {name}: {why}")));
        // A member not present can go: it holds nothing the others need.
        let can_lose = |top: &TopVdev| match &leaf {
            Some(l) => self.check_can_lose(top, l),
            None => Ok(()),
        };
        let mut next = (*shape).clone();
        if let Some((_, new)) = &child.new {
            if let Err(why) = can_lose(top) {
                return refuse(why);
            }
            let stays = if new.config.guid == guid {
                child.old.clone()
            } else {
                new.clone()
            };
            next.children[index] = Child {
                old: stays,
                new: None,
            };
        } else {
            match &shape.kind {
                TopVdevKind::Raidz(r) => {
                    return refuse(format!(
                        "it is a column of raidz{}-{}: only a mirror side or a member of a \
                         replacing or spare pair can be detached",
                        r.parity, top.id.0
                    ))
                }
                TopVdevKind::Single if top.log => {
                    return refuse(
                        "it is the only device of its log vdev (`oxpool remove` takes a log \
                         device out)"
                            .to_string(),
                    )
                }
                TopVdevKind::Single => {
                    return refuse("it is the only device of its vdev".to_string())
                }
                TopVdevKind::Mirror if shape.children.len() == 1 => {
                    return refuse(format!("it is the last side of mirror-{}", top.id.0))
                }
                TopVdevKind::Mirror => {}
                TopVdevKind::Hole => return refuse("its vdev was removed".to_string()),
            }
            if let Err(why) = can_lose(top) {
                return refuse(why);
            }
            next.children.remove(index);
            // ZFS's rule: a mirror of one is a plain device again.
            if next.children.len() == 1 {
                next.kind = TopVdevKind::Single;
            }
        }
        self.swap_shape(top, next);
        Ok(Detached {
            leaf,
            guid,
            spare: self.is_spare(guid),
        })
    }

    /// Ends every replacement whose new member lacks nothing (its resilver finished): the
    /// old member is detached. Returns what was detached (the pool clears their labels, or
    /// gives spares back) and persists the new tree. Called by the scan right after a clean
    /// scan forgot what devices lacked.
    pub fn finish_replacements(&self) -> Vec<Detached> {
        let _one = self.state_change.lock().unwrap();
        let mut out = Vec::new();
        for top in self.tops() {
            let shape = top.shape();
            let mut next: Option<Shape> = None;
            for (i, child) in shape.children.iter().enumerate() {
                let Some((PairKind::Replacing, new)) = &child.new else {
                    continue;
                };
                let done = new
                    .leaf
                    .as_ref()
                    .is_some_and(|l| l.health.in_service() && l.health.missed().is_none());
                if !done {
                    continue;
                }
                tracing::info!(
                    old = child.old.config.path,
                    new = new.config.path,
                    "replacement resilvered: the old device is detached"
                );
                out.push(Detached {
                    leaf: child.old.leaf.clone(),
                    guid: child.old.config.guid,
                    spare: self.is_spare(child.old.config.guid),
                });
                next.get_or_insert_with(|| (*shape).clone()).children[i] = Child {
                    old: new.clone(),
                    new: None,
                };
            }
            if let Some(next) = next {
                self.swap_shape(top, next);
            }
        }
        if !out.is_empty() {
            self.on_record_change.notify();
        }
        out
    }

    /// Adds hot spares (their labels are written).
    pub(crate) fn add_spares(&self, spares: Vec<(LeafConfig, Arc<Leaf>)>) {
        let mut list = self.spares.lock().unwrap();
        for (config, leaf) in spares {
            list.push(Member {
                config,
                leaf: Some(leaf),
            });
        }
    }

    /// The spare `name` names (its path, its guid in hex, or a file name only it ends
    /// with), if any.
    pub(crate) fn spare_named(&self, name: &str) -> Option<Member> {
        let list = self.spares.lock().unwrap();
        let tail = format!("/{name}");
        list.iter()
            .find(|m| {
                m.config.path == name
                    || format!("{:x}", m.config.guid.0) == name
                    || (!name.contains('/') && m.config.path.ends_with(&tail))
            })
            .cloned()
    }

    /// Removes an unused hot spare (`oxpool remove POOL SPARE`).
    pub(crate) fn remove_spare(&self, guid: Guid) -> Result<Member> {
        let _one = self.state_change.lock().unwrap();
        if let Some(whom) = self.spare_user(guid) {
            return Err(EngineError::invalid(format!(
                "cannot remove spare {:x}: it is in use for {whom} (detach it first)",
                guid.0
            )));
        }
        let mut list = self.spares.lock().unwrap();
        let at = list
            .iter()
            .position(|m| m.config.guid == guid)
            .ok_or_else(|| EngineError::NotFound(format!("spare {:x}", guid.0)))?;
        Ok(list.remove(at))
    }

    /// The path of the device the spare `guid` stands in for, if it is in use.
    fn spare_user(&self, guid: Guid) -> Option<String> {
        self.tops().find_map(|t| {
            t.shape().children.iter().find_map(|c| match &c.new {
                Some((_, m)) if m.config.guid == guid => Some(c.old.config.path.clone()),
                _ if c.old.config.guid == guid => c
                    .new
                    .as_ref()
                    .map(|(_, n)| format!("{} (replacing it)", n.config.path)),
                _ => None,
            })
        })
    }

    /// The hot spares and whether each is in use.
    pub fn spare_status(&self) -> Vec<SpareStatus> {
        let list = self.spares.lock().unwrap().clone();
        list.iter()
            .map(|m| {
                let user = self.spare_user(m.config.guid);
                SpareStatus {
                    name: m.config.path.clone(),
                    guid: m.config.guid,
                    state: match (&user, &m.leaf) {
                        (Some(_), _) => "INUSE",
                        (None, Some(_)) => "AVAIL",
                        (None, None) => "UNAVAIL",
                    },
                    in_use_for: user,
                }
            })
            .collect()
    }

    /// The hot spares, in use or not, present or not.
    pub(crate) fn spare_members(&self) -> Vec<Member> {
        self.spares.lock().unwrap().clone()
    }

    /// Every hot spare's leaf that is present (for labels and locks).
    pub fn spare_leaves(&self) -> Vec<Arc<Leaf>> {
        self.spares
            .lock()
            .unwrap()
            .iter()
            .filter_map(|m| m.leaf.clone())
            .collect()
    }

    /// Lets available hot spares stand in for FAULTED or REMOVED devices whose vdev can
    /// rebuild their blocks onto a spare (the other children hold them): the child becomes
    /// a spare pair (faulted, spare). A spare smaller than the device is not used. Returns
    /// whether any stepped in (the pool then persists the tree and starts a resilver).
    pub fn spares_step_in(&self) -> bool {
        let _one = self.state_change.lock().unwrap();
        let mut any = false;
        for top in self.tops().filter(|t| !t.log) {
            let shape = top.shape();
            let mut next: Option<Shape> = None;
            for (i, child) in shape.children.iter().enumerate() {
                if child.new.is_some() {
                    continue;
                }
                let Some(old) = child.old.leaf.as_ref() else {
                    continue;
                };
                use crate::vdev::LeafState::{Faulted, Removed};
                if !matches!(old.health.state(), Faulted | Removed) {
                    continue;
                }
                // The other children must hold every block for the spare to be rebuilt.
                let others_out = (0..shape.children.len())
                    .filter(|&c| c != i && !shape.children[c].whole())
                    .count();
                if shape.redundancy() == 0 || others_out >= shape.redundancy() {
                    continue;
                }
                let spare = self.spares.lock().unwrap().iter().find_map(|m| {
                    let leaf = m.leaf.as_ref()?;
                    let free = self.spare_user(m.config.guid).is_none()
                        && !next.as_ref().is_some_and(|n| {
                            n.children.iter().any(|c| {
                                c.new
                                    .as_ref()
                                    .is_some_and(|(_, x)| x.config.guid == m.config.guid)
                            })
                        });
                    (free
                        && leaf.health.in_service()
                        && m.config.size_bytes >= child.old.config.size_bytes)
                        .then(|| m.clone())
                });
                let Some(spare) = spare else {
                    continue;
                };
                tracing::warn!(
                    device = old.name(),
                    spare = spare.config.path,
                    "hot spare steps in"
                );
                if let Some(l) = &spare.leaf {
                    self.lacks_everything(l);
                }
                next.get_or_insert_with(|| (*shape).clone()).children[i].new =
                    Some((PairKind::Spare, spare));
            }
            if let Some(next) = next {
                self.swap_shape_adding(top, next);
                any = true;
            }
        }
        any
    }
}
