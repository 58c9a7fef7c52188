//! `refract-certs`: create a CA, issue, rotate and inspect Refract agent certificates.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use refract_certs::{output, Issued, LeafRequest, Role, Validity};
use refract_shared::tls::identity::{self, ClusterId};

/// Creates the certificates a Refract peering authenticates with.
///
/// A typical peering: one CA (`ca`), a server certificate for the provider's remote agent
/// (`issue --role server`), and a client certificate per origin cluster (`issue --role
/// client`). The remote agent takes the tenant from the client certificate's cluster id.
#[derive(Parser)]
#[command(name = "refract-certs", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a new CA (ca.crt, ca.key) in a folder.
    Ca {
        /// Folder to write ca.crt and ca.key into.
        #[arg(long)]
        out: PathBuf,
        /// The CA's common name.
        #[arg(long, default_value = "refract-ca")]
        name: String,
        /// Validity in days.
        #[arg(long, default_value_t = 3650)]
        days: i64,
        /// Overwrite an existing CA in that folder.
        #[arg(long)]
        force: bool,
    },
    /// Issue a server or client certificate for a cluster id.
    Issue {
        /// The cluster id the certificate identifies (becomes spiffe://refract/cluster/<id>).
        #[arg(long)]
        cluster_id: ClusterId,
        /// `server` for a remote agent, `client` for a local agent.
        #[arg(long, value_enum)]
        role: Role,
        /// DNS names local agents dial (servers; repeatable).
        #[arg(long = "dns")]
        dns_names: Vec<String>,
        /// IP addresses local agents dial (servers; repeatable).
        #[arg(long = "ip")]
        ips: Vec<IpAddr>,
        #[command(flatten)]
        common: LeafArgs,
    },
    /// Re-issue an existing certificate: same identity, role and names; new key and expiry.
    Rotate {
        /// The certificate to rotate (PEM).
        #[arg(long)]
        cert: PathBuf,
        #[command(flatten)]
        common: LeafArgs,
    },
    /// Make a tenant's key and a certificate request for its client certificate, for a
    /// peering by two admins: the key (tls.key) stays with the origin's admin; the request
    /// (tls.csr) goes to the provider's admin, who submits it as a Kubernetes
    /// CertificateSigningRequest (`--manifest` prints one) and approves it with `kubectl
    /// certificate approve`; the provider's remote agent signs it with the peering CA.
    Request {
        /// The origin's cluster id (becomes spiffe://refract/cluster/<id>).
        #[arg(long)]
        cluster_id: ClusterId,
        /// Write tls.key (mode 0600) and tls.csr into this folder.
        #[arg(long)]
        out: PathBuf,
        /// Also print the CertificateSigningRequest manifest for the provider (signerName
        /// refract.io/tenant-client, named refract-tenant-<cluster id>).
        #[arg(long)]
        manifest: bool,
    },
    /// Print a certificate's identity, names and expiry.
    Inspect {
        /// The certificate (PEM).
        cert: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
struct LeafArgs {
    /// Folder holding the CA (ca.crt, ca.key).
    #[arg(long)]
    ca_dir: PathBuf,
    /// Validity in days.
    #[arg(long, default_value_t = 365)]
    days: i64,
    /// Start of validity (RFC 3339); defaults to five minutes ago.
    #[arg(long, value_parser = parse_rfc3339)]
    not_before: Option<time::OffsetDateTime>,
    /// Write tls.crt, tls.key and ca.crt into this folder.
    #[arg(long, conflicts_with = "secret", required_unless_present = "secret")]
    out: Option<PathBuf>,
    /// Print a kubernetes.io/tls Secret manifest with this name instead of writing files.
    #[arg(long)]
    secret: Option<String>,
    /// Namespace of the Secret manifest.
    #[arg(long, default_value = "refract-system")]
    namespace: String,
}

impl LeafArgs {
    fn validity(&self) -> Validity {
        match self.not_before {
            Some(start) => Validity {
                not_before: start,
                not_after: start + time::Duration::days(self.days),
            },
            None => Validity::days_from_now(self.days),
        }
    }

    fn load_ca(&self) -> anyhow::Result<Issued> {
        let read = |f: &str| {
            let path = self.ca_dir.join(f);
            std::fs::read_to_string(&path).with_context(|| {
                format!(
                    "failed to read {} (create a CA with `refract-certs ca --out {}`)",
                    path.display(),
                    self.ca_dir.display()
                )
            })
        };
        Ok(Issued {
            cert_pem: read("ca.crt")?,
            key_pem: read("ca.key")?,
        })
    }

    fn emit(&self, ca: &Issued, leaf: &Issued) -> anyhow::Result<()> {
        if let Some(name) = &self.secret {
            refract_shared::stdout::write(&output::secret_manifest(
                name,
                &self.namespace,
                leaf,
                &ca.cert_pem,
            ))?;
            return Ok(());
        }
        let Some(dir) = self.out.as_deref() else {
            anyhow::bail!("give --out DIR to write files, or --secret NAME to print a Secret");
        };
        output::write_files(dir, leaf, &ca.cert_pem)
            .with_context(|| format!("failed to write certificate files into {}", dir.display()))?;
        eprintln!("wrote {}/{{tls.crt,tls.key,ca.crt}}", dir.display());
        print_summary(&dir.join(output::CERT_FILE), false)
    }
}

fn parse_rfc3339(s: &str) -> Result<time::OffsetDateTime, String> {
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .map_err(|e| format!("not an RFC 3339 time: {e}"))
}

fn main() -> anyhow::Result<()> {
    refract_shared::stdout::quiet_when_closed(run(Cli::parse()))
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Ca {
            out,
            name,
            days,
            force,
        } => create_ca(&out, &name, days, force),
        Command::Issue {
            cluster_id,
            role,
            dns_names,
            ips,
            common,
        } => {
            if role == Role::Server && dns_names.is_empty() && ips.is_empty() {
                bail!(
                    "a server certificate needs at least one --dns or --ip that local agents dial"
                );
            }
            let ca = common.load_ca()?;
            let request = LeafRequest {
                cluster_id,
                role,
                dns_names,
                ips,
                validity: common.validity(),
            };
            let leaf = refract_certs::issue(&ca, &request)?;
            common.emit(&ca, &leaf)
        }
        Command::Rotate { cert, common } => {
            let ca = common.load_ca()?;
            let pem = std::fs::read_to_string(&cert)
                .with_context(|| format!("failed to read {}", cert.display()))?;
            let leaf = refract_certs::reissue(&ca, &pem, common.validity())?;
            common.emit(&ca, &leaf)
        }
        Command::Request {
            cluster_id,
            out,
            manifest,
        } => request(&cluster_id, &out, manifest),
        Command::Inspect { cert, json } => print_summary(&cert, json),
    }
}

fn request(cluster_id: &ClusterId, out: &Path, manifest: bool) -> anyhow::Result<()> {
    let key_path = out.join("tls.key");
    if key_path.exists() {
        bail!(
            "{} exists; refusing to replace a key (a certificate issued for it would stop working)",
            key_path.display()
        );
    }
    let (request_pem, key_pem) = refract_certs::request::create_client_request(cluster_id)?;
    std::fs::create_dir_all(out)?;
    output::write_atomic(&key_path, key_pem.as_bytes(), 0o600)?;
    output::write_atomic(&out.join("tls.csr"), request_pem.as_bytes(), 0o644)?;
    eprintln!(
        "wrote {dir}/tls.key (keep it here) and {dir}/tls.csr (send it to the provider's admin)",
        dir = out.display()
    );
    if manifest {
        refract_shared::stdout::write(&output::csr_manifest(cluster_id, &request_pem))?;
    }
    Ok(())
}

fn create_ca(out: &Path, name: &str, days: i64, force: bool) -> anyhow::Result<()> {
    let key_path = out.join("ca.key");
    if key_path.exists() && !force {
        bail!(
            "{} exists; refusing to replace a CA (certificates it signed would stop working). Pass --force to replace it",
            key_path.display()
        );
    }
    let ca = refract_certs::create_ca(name, Validity::days_from_now(days))?;
    std::fs::create_dir_all(out)?;
    output::write_atomic(&key_path, ca.key_pem.as_bytes(), 0o600)?;
    output::write_atomic(&out.join("ca.crt"), ca.cert_pem.as_bytes(), 0o644)?;
    eprintln!("wrote {}/{{ca.crt,ca.key}}", out.display());
    Ok(())
}

fn print_summary(path: &Path, json: bool) -> anyhow::Result<()> {
    let pem = std::fs::read_to_string(path)
        .with_context(|| format!("failed to read {}", path.display()))?;
    let der = refract_certs::pem_to_der(&pem)?;
    let s = identity::summarize(&der)?;
    let now = time::OffsetDateTime::now_utc();
    let remaining = s.not_after - now;
    let fmt = |t: time::OffsetDateTime| {
        t.format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default()
    };
    let identity = match &s.cluster_id {
        Ok(id) => id.to_string(),
        Err(e) => format!("<none: {e}>"),
    };
    if json {
        let value = serde_json::json!({
            "clusterId": s.cluster_id.as_ref().ok().map(|c| c.to_string()),
            "subject": s.subject, "issuer": s.issuer, "serial": s.serial,
            "sans": s.sans, "isCA": s.is_ca,
            "notBefore": fmt(s.not_before), "notAfter": fmt(s.not_after),
            "expired": remaining.is_negative(),
        });
        refract_shared::stdout::write_line(&serde_json::to_string_pretty(&value)?)?;
    } else {
        let status = if remaining.is_negative() {
            format!("EXPIRED {} days ago", -remaining.whole_days())
        } else {
            format!("valid, expires in {} days", remaining.whole_days())
        };
        refract_shared::stdout::write(&format!(
            "cluster id: {identity}\nsubject:    {}\nissuer:     {}\nserial:     {}\nnames:      {}\nvalid:      {} .. {}\nstatus:     {status}\n",
            s.subject,
            s.issuer,
            s.serial,
            s.sans.join(", "),
            fmt(s.not_before),
            fmt(s.not_after),
        ))?;
    }
    Ok(())
}
