//! The images `scripts/images.sh` builds, found by name.
//!
//! testkit's nodes import `pause` and `busybox` from OCI archives. The agents' images (and
//! refractctl's) are never imported: the script pushes them to the process's [`Registry`] and
//! a node pulls them by reference, as a user's node pulls them from the user's registry. The
//! script rebuilds and pushes only what changed, so calling it once per test process costs
//! little.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use anyhow::{bail, Context};

pub use crate::registry::Registry;

/// One image: its reference and, for the base images, the archive a node imports.
#[derive(Debug, Clone)]
pub struct Image {
    /// `refract.local/<name>:<version>`, or for an image in the registry
    /// `127.0.0.1:<port>/refract/<name>:<version>-<revision>`.
    pub reference: String,
    /// The archive file; `None` for an image pulled from the registry.
    pub archive: Option<PathBuf>,
}

/// The workspace root (testkit lives in `<root>/testkit`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Which archives a process has built already: `base` (pause, busybox) or `agents` (all).
static BUILT: Mutex<Option<&'static str>> = Mutex::new(None);

/// The images by name (`pause`, `busybox`, and with `agents` also `local-agent`,
/// `remote-agent` and `refractctl`, pushed to [`Registry::shared`]), building what is missing
/// first. The agents come from the debug build the tests run, or from a release build with
/// `REFRACT_IMAGE_PROFILE=release`.
pub fn catalog(agents: bool) -> anyhow::Result<BTreeMap<String, Image>> {
    let wanted = if agents { "agents" } else { "base" };
    let mut built = BUILT
        .lock()
        .map_err(|_| anyhow::anyhow!("images lock poisoned"))?;
    if *built != Some("agents") && *built != Some(wanted) {
        let root = workspace_root();
        let mut cmd = Command::new(root.join("scripts/images.sh"));
        if agents {
            let profile = std::env::var("REFRACT_IMAGE_PROFILE").unwrap_or_else(|_| "debug".into());
            let registry = Registry::shared()?;
            cmd.args(["--profile", &profile, "--push"])
                .arg(format!("{}/refract", registry.address));
        } else {
            cmd.arg("--base");
        }
        let out = cmd.output().context("failed to run scripts/images.sh")?;
        if !out.status.success() {
            bail!(
                "scripts/images.sh failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        *built = Some(wanted);
    }
    read_list(&workspace_root().join("target/images/images.txt"))
}

fn read_list(path: &Path) -> anyhow::Result<BTreeMap<String, Image>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("failed to read {}", path.display()))?;
    text.lines()
        .map(|line| {
            let mut words = line.split(' ');
            match (words.next(), words.next(), words.next()) {
                (Some(name), Some(reference), Some(file)) => Ok((
                    name.to_string(),
                    Image {
                        reference: reference.to_string(),
                        archive: (file != "-").then(|| PathBuf::from(file)),
                    },
                )),
                _ => bail!("{}: malformed line {line:?}", path.display()),
            }
        })
        .collect()
}

/// The reference of image `name` in a catalog, or an error naming what is there.
pub fn reference(catalog: &BTreeMap<String, Image>, name: &str) -> anyhow::Result<String> {
    catalog
        .get(name)
        .map(|i| i.reference.clone())
        .with_context(|| format!("no image {name} (have: {:?})", catalog.keys()))
}
