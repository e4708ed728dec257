//! User properties (`module:name=value`): kept across export and import, bounded per volume
//! and per pool (a refused change leaves every value as it was), and not carried to a clone.

mod common;

use common::*;
use oxpool_engine::props::{USER_PROPS_BYTES_MAX, USER_PROPS_POOL_BYTES_MAX};
use oxpool_format::TopVdevKind;

const VOLUME_BYTES: u64 = 1 << 20;

/// The pool's budget is counted over every volume: the volume that would pass it is refused,
/// with its earlier value kept, and room made on another volume lets it through.
#[test]
fn the_pools_user_property_budget_holds_across_volumes() {
    let (pool, mems) = mem_pool(TopVdevKind::Single, 1);
    // Each volume at its own limit: "u:p" and a value filling the rest.
    let value = "v".repeat(USER_PROPS_BYTES_MAX - "u:p".len());
    let fit = USER_PROPS_POOL_BYTES_MAX / USER_PROPS_BYTES_MAX;
    assert!(
        fit >= 2,
        "the budget holds more than one volume at its limit"
    );
    for i in 0..fit {
        pool.create_volume(&format!("v{i}"), VOLUME_BYTES, &[])
            .unwrap();
        pool.set_volume_prop(&format!("v{i}"), "u:p", &value)
            .unwrap();
    }
    // One more volume: a small property still fits nowhere, at creation or set later.
    let err = pool
        .create_volume(
            "extra",
            VOLUME_BYTES,
            &[("u:p".to_string(), "x".to_string())],
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("user properties"), "{err}");
    assert!(
        pool.volume("extra").is_err(),
        "a refused create leaves no volume"
    );
    pool.create_volume("extra", VOLUME_BYTES, &[]).unwrap();
    pool.set_volume_prop("extra", "u:q", "before").unwrap_err();
    assert_eq!(
        pool.volume("extra").unwrap().props().get("u:q").unwrap(),
        "-"
    );
    // Replacing a volume's own value by one as long is not counted twice.
    pool.set_volume_prop("v0", "u:p", &value.replace('v', "w"))
        .unwrap();
    // Room made on one volume lets the other through.
    pool.unset_volume_user_prop("v1", "u:p").unwrap();
    pool.set_volume_prop("extra", "u:q", "after").unwrap();
    pool.export().unwrap();
    let pool = reimport(&mems);
    assert_eq!(
        pool.volume("extra").unwrap().props().get("u:q").unwrap(),
        "after"
    );
    assert_eq!(pool.volume("v1").unwrap().props().get("u:p").unwrap(), "-");
    assert_eq!(
        pool.volume("v0").unwrap().props().get("u:p").unwrap(),
        value.replace('v', "w")
    );
    audit_clean(&pool, "after the budget");
}

/// A clone starts without its origin's user properties (in ZFS it inherits from its parent,
/// not its origin); ones given when it is made are kept.
#[test]
fn a_clone_does_not_carry_its_origins_user_properties() {
    let (pool, mems) = mem_pool(TopVdevKind::Single, 1);
    pool.create_volume("v", VOLUME_BYTES, &[]).unwrap();
    pool.set_volume_prop("v", "com.example:backup", "daily")
        .unwrap();
    pool.snapshot(&["v@s".to_string()]).unwrap();
    pool.clone_snapshot(
        "v",
        "s",
        "c",
        &[("com.example:owner".to_string(), "ops".to_string())],
    )
    .unwrap();
    let c = pool.volume("c").unwrap().props();
    assert_eq!(c.get("com.example:backup").unwrap(), "-");
    assert_eq!(c.get("com.example:owner").unwrap(), "ops");
    assert_eq!(c.user_props().len(), 1);
    assert_eq!(
        pool.volume("v")
            .unwrap()
            .props()
            .get("com.example:backup")
            .unwrap(),
        "daily"
    );
    pool.export().unwrap();
    let pool = reimport(&mems);
    assert_eq!(
        pool.volume("c").unwrap().props().user_props().len(),
        1,
        "the clone's own properties, and only those, after import"
    );
    audit_clean(&pool, "after the clone");
}
