//! Objects: a block tree per object, dirty records per txg, holes with birth txgs, and the
//! sync that writes an object's dirty state into blocks. An object set is a dataset's
//! objects; nothing here assumes one tree per dataset.

pub mod dirty;
pub mod object;
pub mod sync;
pub mod tree;

pub use object::ObjectId;
