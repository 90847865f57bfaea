//! `flotilla workflows test`: a definition run through the real engine
//! against recorded answers on a virtual clock (`flotilla-rehearsal`),
//! its path printed, its outcome held to the one the fixtures expect.

use std::path::{Path, PathBuf};

use flotilla_rehearsal::{Fixtures, RehearsalError, rehearse};
use secrecy::{ExposeSecret as _, SecretString};

use crate::Failure;

/// Runs `files` (the workflow, then the definitions of children it
/// starts) against the fixtures at `responses`; prints the path.
pub(crate) async fn test(
    files: &[PathBuf],
    responses: &Path,
    database_url: &SecretString,
) -> Result<(), Failure> {
    let read = |path: &Path| {
        std::fs::read_to_string(path)
            .map_err(|e| Failure::usage(anyhow::anyhow!("reading {}: {e}", path.display())))
    };
    let mut definitions = Vec::new();
    for file in files {
        let document = flotilla_workflow::read_document(&read(file)?).map_err(|e| {
            Failure::usage(anyhow::anyhow!(
                "{} is neither JSON nor YAML: {e}",
                file.display()
            ))
        })?;
        definitions.push(document);
    }
    let fixtures = Fixtures::parse(&read(responses)?)
        .map_err(|e| Failure::usage(anyhow::anyhow!("{}: {e}", responses.display())))?;
    let rehearsal = rehearse(database_url.expose_secret(), &definitions, &fixtures)
        .await
        .map_err(|e| match e {
            RehearsalError::Fixtures(_) => Failure::usage(e),
            RehearsalError::Database(_) => Failure::delivery(e),
        })?;
    print!("{}", rehearsal.render());
    let mismatches = rehearsal.mismatches(fixtures.expect.as_ref());
    if mismatches.is_empty() {
        if fixtures.expect.is_some() {
            println!("as expected");
        }
        return Ok(());
    }
    for mismatch in &mismatches {
        println!("not as expected: {mismatch}");
    }
    Err(Failure::mismatch(anyhow::anyhow!(
        "{} difference(s) from the expected outcome",
        mismatches.len()
    )))
}
