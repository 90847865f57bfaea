//! `docker-compose.yml` against the binaries it runs: every environment
//! variable given to a service that runs a Flotilla binary (worker, relay,
//! migrate, demo target, demo driver) is one that binary documents in its
//! `--help` (`[env: NAME`), and so is every flag on its command line; every
//! binary compose runs is one the Dockerfile builds; and the compose
//! targets file names the same targets as `demo/targets.yaml`, on the
//! demo-target service. No Docker needed: the binaries are the ones built
//! beside this test (`cargo build --bins` first).
//!
//! The file itself is validated by `scripts/check-compose`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml_ng::{Mapping, Value};

/// Variables a binary reads outside clap, so absent from its `--help` but
/// legitimately set in compose, as `(binary, variable)`. None today: every
/// setting of every binary is a clap argument with `env`. (Examples that
/// would belong here: libpq's `PGSSLMODE` and friends, which sqlx reads
/// itself; a target header's `from_env` variable, which the worker reads
/// while loading the targets file.)
const READ_OUTSIDE_CLAP: &[(&str, &str)] = &[];

/// The image the Dockerfile builds, as compose names it.
const FLOTILLA_IMAGE_PREFIX: &str = "flotilla:";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace")
        .to_path_buf()
}

/// A YAML file with its `<<` merge keys applied (compose uses anchors and
/// merges for the shared settings).
fn load_yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut value: Value = serde_yaml_ng::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not YAML: {e}", path.display()));
    resolve_merges(&mut value);
    value
}

/// Applies `<<` merges depth first, so a merged mapping's own merges (an
/// anchor that merges another) are resolved before it is merged. Keys
/// already present win, then earlier sources over later ones (YAML's rule).
fn resolve_merges(value: &mut Value) {
    match value {
        Value::Mapping(mapping) => {
            for (_, child) in mapping.iter_mut() {
                resolve_merges(child);
            }
            if let Some(merge) = mapping.remove("<<") {
                let sources = match merge {
                    Value::Sequence(sources) => sources,
                    other => vec![other],
                };
                for source in sources {
                    let Value::Mapping(source) = source else {
                        panic!("a `<<` merge of something other than a mapping: {source:?}");
                    };
                    for (key, child) in source {
                        mapping.entry(key).or_insert(child);
                    }
                }
            }
        }
        Value::Sequence(items) => items.iter_mut().for_each(resolve_merges),
        Value::Tagged(tagged) => resolve_merges(&mut tagged.value),
        _ => {}
    }
}

/// A compose service that runs a Flotilla binary.
#[derive(Debug)]
struct FlotillaService {
    name: String,
    /// The command line, binary first.
    command: Vec<String>,
    /// Names of the variables its `environment` sets.
    environment: Vec<String>,
}

impl FlotillaService {
    fn binary(&self) -> &str {
        &self.command[0]
    }

    /// The subcommand words after the binary (`migrate`), up to the first flag.
    fn subcommands(&self) -> Vec<&str> {
        self.command[1..]
            .iter()
            .take_while(|word| !word.starts_with('-'))
            .map(String::as_str)
            .collect()
    }

    /// The long flags on its command line, without their values.
    fn flags(&self) -> Vec<&str> {
        self.command[1..]
            .iter()
            .filter(|word| word.starts_with("--"))
            .map(|word| word.split('=').next().unwrap_or(word))
            .collect()
    }
}

fn string_of(value: &Value, what: &str) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => panic!("{what}: expected a string, found {other:?}"),
    }
}

/// Every service of `compose` that uses the Flotilla image.
fn flotilla_services(compose: &Value) -> Vec<FlotillaService> {
    let services = compose["services"]
        .as_mapping()
        .expect("docker-compose.yml has a `services` mapping");
    let mut found = Vec::new();
    for (name, service) in services {
        let name = string_of(name, "a service name");
        let image = service["image"].as_str().unwrap_or_default();
        let builds = service.get("build").is_some();
        if !image.starts_with(FLOTILLA_IMAGE_PREFIX) && !builds {
            continue;
        }
        assert!(
            builds && image.starts_with(FLOTILLA_IMAGE_PREFIX),
            "service {name}: a Flotilla service both builds the Dockerfile and names the image \
             `{FLOTILLA_IMAGE_PREFIX}…` (image {image:?}, build {builds})"
        );
        assert!(
            service.get("entrypoint").is_none(),
            "service {name}: the image has no entrypoint; name the binary in `command`"
        );
        assert!(
            service.get("env_file").is_none(),
            "service {name}: `env_file` hides variables from this check; use `environment`"
        );
        let command: Vec<String> = match service.get("command") {
            Some(Value::Sequence(words)) => words
                .iter()
                .map(|w| string_of(w, &format!("service {name}: a command word")))
                .collect(),
            Some(Value::String(line)) => line.split_whitespace().map(str::to_owned).collect(),
            Some(other) => panic!("service {name}: a command of an unexpected shape: {other:?}"),
            None => panic!(
                "service {name}: give every Flotilla service an explicit `command` naming its binary"
            ),
        };
        assert!(!command.is_empty(), "service {name}: an empty command");
        let environment = match service.get("environment") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Mapping(vars)) => vars
                .keys()
                .map(|k| string_of(k, &format!("service {name}: a variable name")))
                .collect(),
            Some(Value::Sequence(vars)) => vars
                .iter()
                .map(|entry| {
                    let entry = string_of(entry, &format!("service {name}: an environment entry"));
                    entry.split('=').next().unwrap_or_default().to_owned()
                })
                .collect(),
            Some(other) => {
                panic!("service {name}: an environment of an unexpected shape: {other:?}")
            }
        };
        found.push(FlotillaService {
            name,
            command,
            environment,
        });
    }
    found
}

/// The variables a `--help` text documents: clap prints `[env: NAME=value]`,
/// or `[env: NAME]` for the hidden (secret) ones.
fn documented_variables(help: &str) -> BTreeSet<String> {
    help.match_indices("[env: ")
        .map(|(at, marker)| {
            help[at + marker.len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect::<String>()
        })
        .filter(|name| !name.is_empty())
        .collect()
}

/// The long flags a `--help` text documents.
fn documented_flags(help: &str) -> BTreeSet<String> {
    help.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == '(')
        .filter(|word| word.starts_with("--") && word.len() > 2)
        .map(|word| {
            let end = word[2..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .map_or(word.len(), |i| i + 2);
            word[..end].to_owned()
        })
        .collect()
}

/// What a service sets or passes that its binary's help does not document.
fn undocumented(service: &FlotillaService, help: &str) -> Vec<String> {
    let variables = documented_variables(help);
    let flags = documented_flags(help);
    let mut problems = Vec::new();
    for name in &service.environment {
        let outside = READ_OUTSIDE_CLAP
            .iter()
            .any(|(binary, variable)| *binary == service.binary() && variable == name);
        if !variables.contains(name) && !outside {
            problems.push(format!(
                "service {}: {} is not a variable `{}` documents",
                service.name,
                name,
                help_command(service)
            ));
        }
    }
    for flag in service.flags() {
        if !flags.contains(flag) {
            problems.push(format!(
                "service {}: {} is not a flag `{}` documents",
                service.name,
                flag,
                help_command(service)
            ));
        }
    }
    problems
}

fn help_command(service: &FlotillaService) -> String {
    let mut words = vec![service.binary()];
    words.extend(service.subcommands());
    words.push("--help");
    words.join(" ")
}

fn help_of(service: &FlotillaService) -> String {
    // Panics naming the binary when it is not built (`scripts/test` builds
    // every binary, also of packages without integration tests).
    let path = flotilla_tests::process::workspace_binary(service.binary());
    let output = Command::new(&path)
        .args(service.subcommands())
        .arg("--help")
        .env_clear()
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
    assert!(
        output.status.success(),
        "`{}` failed: {}",
        help_command(service),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("help is UTF-8")
}

#[test]
fn every_variable_and_flag_given_to_a_flotilla_binary_is_one_it_documents() {
    let compose = load_yaml(&workspace_root().join("docker-compose.yml"));
    let services = flotilla_services(&compose);
    let binaries: BTreeSet<&str> = services.iter().map(FlotillaService::binary).collect();
    for expected in [
        "flotilla-worker",
        "flotilla-relay",
        "flotilla-demo-target",
        "flotilla-demo",
    ] {
        assert!(
            binaries.contains(expected),
            "no compose service runs {expected} (found {binaries:?})"
        );
    }
    let mut problems = Vec::new();
    let mut checked = 0;
    for service in &services {
        assert!(
            !service.environment.is_empty() || service.binary() == "flotilla",
            "service {}: no environment at all; is the file read right?",
            service.name
        );
        problems.extend(undocumented(service, &help_of(service)));
        checked += service.environment.len();
    }
    assert!(
        problems.is_empty(),
        "docker-compose.yml gives Flotilla binaries settings they do not document:\n  {}",
        problems.join("\n  ")
    );
    eprintln!(
        "compose: {checked} variables over {} services, all documented",
        services.len()
    );
}

#[test]
fn the_dockerfile_builds_every_binary_compose_runs() {
    let root = workspace_root();
    let compose = load_yaml(&root.join("docker-compose.yml"));
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).expect("a Dockerfile");
    let built: BTreeSet<&str> = dockerfile
        .lines()
        .find_map(|line| line.trim().strip_prefix("ARG BINARIES="))
        .expect("the Dockerfile lists its binaries in `ARG BINARIES=\"…\"`")
        .trim_matches('"')
        .split_whitespace()
        .collect();
    for service in flotilla_services(&compose) {
        assert!(
            built.contains(service.binary()),
            "service {} runs {}, which the Dockerfile does not build (it builds {built:?})",
            service.name,
            service.binary()
        );
    }
}

#[test]
fn compose_targets_are_the_demo_targets_on_the_demo_target_service() {
    let root = workspace_root();
    let demo = load_yaml(&root.join("demo/targets.yaml"));
    let compose_targets = load_yaml(&root.join("deploy/compose/targets.yaml"));
    let compose = load_yaml(&root.join("docker-compose.yml"));
    let address = compose["services"]["demo-target"]["environment"]["DEMO_TARGET_ADDR"]
        .as_str()
        .expect("the demo-target service sets DEMO_TARGET_ADDR");
    let port = address.rsplit(':').next().expect("an address with a port");
    let base_url = format!("http://demo-target:{port}");

    let targets = |doc: &Value, file: &str| -> Mapping {
        doc["targets"]
            .as_mapping()
            .unwrap_or_else(|| panic!("{file} has a `targets` mapping"))
            .clone()
    };
    let demo = targets(&demo, "demo/targets.yaml");
    let compose_targets = targets(&compose_targets, "deploy/compose/targets.yaml");
    let names = |m: &Mapping| {
        m.keys()
            .map(|k| string_of(k, "a target name"))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(&demo),
        names(&compose_targets),
        "deploy/compose/targets.yaml names other targets than demo/targets.yaml"
    );
    for (name, target) in &demo {
        let name = string_of(name, "a target name");
        let mut expected = target.clone();
        // HTTP targets point at the demo-target service; Kafka targets
        // name topics, the same everywhere.
        if expected["kind"].as_str() == Some("http") {
            expected["base_url"] = Value::String(base_url.clone());
        }
        assert_eq!(
            compose_targets[name.as_str()],
            expected,
            "target {name}: deploy/compose/targets.yaml should be demo/targets.yaml's with \
             base_url {base_url}"
        );
    }
}

/// The check itself: a variable or flag a binary does not document is
/// reported, a documented one (hidden secrets included) is not.
#[test]
fn an_undocumented_variable_or_flag_is_reported() {
    let help = "Options:\n      --database-url <DATABASE_URL>\n          Postgres [env: DATABASE_URL]\n\
                \x20     --worker-id <WORKER_ID>\n          [env: FLOTILLA_WORKER_ID=]\n\
                \x20 -h, --help\n          Print help\n";
    let service = |environment: &[&str], command: &[&str]| FlotillaService {
        name: "worker-x".into(),
        command: command.iter().map(|s| (*s).to_owned()).collect(),
        environment: environment.iter().map(|s| (*s).to_owned()).collect(),
    };
    let good = service(
        &["DATABASE_URL", "FLOTILLA_WORKER_ID"],
        &["flotilla-worker", "--worker-id", "w"],
    );
    assert_eq!(undocumented(&good, help), Vec::<String>::new());
    let bad = service(
        &["DATABASE_URL", "FLOTILLA_WORKER_IDD"],
        &["flotilla-worker", "--worker-idd=w"],
    );
    let problems = undocumented(&bad, help);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains("FLOTILLA_WORKER_IDD"), "{problems:?}");
    assert!(problems[1].contains("--worker-idd"), "{problems:?}");
}

/// Merges as compose applies them, nested ones included.
#[test]
fn merges_resolve_like_compose() {
    let mut value: Value = serde_yaml_ng::from_str(
        "a: &a {X: 1, Y: 1}\nb: &b {<<: *a, Y: 2, Z: 2}\nc: {<<: *b, Z: 3}\n",
    )
    .unwrap();
    resolve_merges(&mut value);
    let c = value["c"].as_mapping().unwrap();
    assert_eq!(c.len(), 3, "{c:?}");
    assert_eq!(value["c"]["X"], Value::from(1));
    assert_eq!(value["c"]["Y"], Value::from(2));
    assert_eq!(value["c"]["Z"], Value::from(3));
}
