//! The Python package ships the contract's schemas inside it (a wheel
//! cannot follow a link out of its package): its copies must be the
//! contract's, byte for byte, and it must have every one.

use std::path::Path;

#[test]
fn the_python_packages_schemas_are_the_contracts_own() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let contract = root.join("schemas");
    let packaged = root.join("../clients/python/flotilla_client/schemas");
    let names = |dir: &Path| {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".avsc"))
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(&contract), names(&packaged), "the same schemas");
    for name in names(&contract) {
        assert!(
            std::fs::read(contract.join(&name)).unwrap()
                == std::fs::read(packaged.join(&name)).unwrap(),
            "clients/python/flotilla_client/schemas/{name} differs from contracts/schemas/{name}: copy it again"
        );
    }
}
