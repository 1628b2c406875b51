//! docs/testing.md shows the example test as it is in the code.

#[test]
fn the_testing_guide_shows_the_example_test_as_compiled() {
    let example = include_str!("my_saga.rs");
    let doc = include_str!("../../docs/testing.md");
    assert!(
        doc.contains(example.trim_end()),
        "docs/testing.md does not show testkit/tests/my_saga.rs as it is; paste it again"
    );
}
