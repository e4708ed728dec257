//! The dataset layer: datasets (volumes, their snapshots and clones), their names and
//! lineage, the deadlists that decide which freed blocks snapshots still hold, and space
//! accounting. Namespace changes are sync tasks, applied in syncing context.

pub mod deadlist;
