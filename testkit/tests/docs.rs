//! docs/testing.md shows the example tests as they are in the code.

#[test]
fn the_testing_guide_shows_the_example_tests_as_compiled() {
    let doc = include_str!("../../docs/testing.md");
    for (file, example) in [
        ("my_saga.rs", include_str!("my_saga.rs")),
        ("effects.rs", include_str!("effects.rs")),
    ] {
        assert!(
            doc.contains(example.trim_end()),
            "docs/testing.md does not show testkit/tests/{file} as it is; paste it again"
        );
    }
}
