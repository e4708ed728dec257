//! Objects: a block tree per object, dirty records per txg, holes with birth txgs, and
//! traversal by birth txg.

pub mod tree;
