//! `--dry-run=client`: the objects a command would apply, printed instead of applied.

use serde_json::Value;

use crate::apply;
use crate::cli::{DryRunArgs, ManifestOutput};

/// Whether `args` asks for a dry run.
pub fn asked(args: &DryRunArgs) -> bool {
    args.dry_run.is_some()
}

/// What a dry run says beside the objects: on standard error, so that `-o yaml|json` stays
/// a document a pipe can read.
pub fn note(what: &str) {
    eprintln!("{what}");
}

/// An object named only, for a dry run that must not show contents it has not made yet (a key,
/// a certificate) or that are secret.
pub fn named(api_version: &str, kind: &str, name: &str, namespace: Option<&str>) -> Value {
    let mut object =
        serde_json::json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name}});
    if let Some(namespace) = namespace {
        object["metadata"]["namespace"] = Value::from(namespace);
    }
    object
}

/// Prints `objects`, which would be applied, as `args` asks: YAML documents, a JSON `List`, or
/// one line each.
pub fn print(objects: &[Value], args: &DryRunArgs) -> anyhow::Result<()> {
    print!("{}", render(objects, args.output, "(dry run)")?);
    Ok(())
}

/// Prints `objects`, which would be deleted, as [`print`] does, their lines saying so.
pub fn print_deleted(objects: &[Value], args: &DryRunArgs) -> anyhow::Result<()> {
    print!("{}", render(objects, args.output, "deleted (dry run)")?);
    Ok(())
}

fn render(objects: &[Value], output: Option<ManifestOutput>, said: &str) -> anyhow::Result<String> {
    Ok(match output {
        Some(ManifestOutput::Yaml) => {
            let mut text = String::new();
            for object in objects {
                text.push_str("---\n");
                text.push_str(&serde_yaml_ng::to_string(object)?);
            }
            text
        }
        Some(ManifestOutput::Json) => {
            let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects});
            serde_json::to_string_pretty(&list)? + "\n"
        }
        None => objects
            .iter()
            .map(|o| format!("{} {said}\n", apply::describe(o)))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn objects_print_as_yaml_documents_a_json_list_or_lines() {
        let objects = vec![
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "refract-system"}}),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a", "namespace": "refract-system"}}),
        ];
        let yaml = render(&objects, Some(ManifestOutput::Yaml), "(dry run)").unwrap();
        assert_eq!(yaml.matches("---\n").count(), 2, "{yaml}");
        assert!(yaml.contains("kind: Service"));
        let json: Value = serde_json::from_str(
            &render(&objects, Some(ManifestOutput::Json), "(dry run)").unwrap(),
        )
        .unwrap();
        assert_eq!(json["kind"], "List");
        assert_eq!(json["items"][1]["metadata"]["name"], "a");
        assert_eq!(
            render(&objects, None, "(dry run)").unwrap(),
            "Namespace refract-system (dry run)\nService refract-system/a (dry run)\n"
        );
    }
}
