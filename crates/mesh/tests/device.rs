//! The mesh device end to end (root): two devices in two network namespaces carry TCP both
//! ways, every byte intact (the segments cut from the TUN device's super-packets carry
//! right checksums, or the receiving stack drops them and the stream stalls).

mod pair;

#[test]
fn tcp_crosses_the_mesh_intact_both_ways() {
    let pair = pair::Pair::up("mt");
    let (rate, intact) = pair.stream(&pair.a, &pair.b, "10.208.4.1", 32 << 20);
    assert!(intact, "a → b: bytes lost or changed");
    assert!(rate > 0.0);
    let (_, intact) = pair.stream(&pair.b, &pair.a, "10.208.0.1", 32 << 20);
    assert!(intact, "b → a: bytes lost or changed");
}
