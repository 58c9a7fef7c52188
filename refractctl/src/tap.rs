//! `refractctl tap`: a peering's stream, one readable line per message. The provider redacts
//! Secret data and tokens before anything leaves it; this prints sizes, never payloads.

use anyhow::Context;
use futures::StreamExt;
use refract_wire::proto::{
    local_message, remote_message, tap_event, LocalMessage, Outcome, RemoteMessage, TapEvent,
    TapRequest,
};

use crate::cli::TapArgs;
use crate::peering;

/// Runs `tap` until interrupted, --count messages or --for elapses.
pub async fn run(args: TapArgs) -> anyhow::Result<()> {
    let (origin, _) = peering::connect_cluster(
        args.origin.origin_kubeconfig.as_deref(),
        args.origin.origin_context.as_deref(),
        "origin",
    )
    .await?;
    let peering = peering::get(&origin, &args.provider_id).await?;
    let tenant = peering
        .origin
        .clone()
        .context("the local agent has no --cluster-id")?;
    let endpoint = peering
        .endpoint
        .clone()
        .context("the local agent has no --remote")?;
    // A tap stays open: no per-call timeout on its channel.
    let mut client = peering.inspect(&origin, peering::Calls::Open).await?;
    let mut stream = client
        .tap(TapRequest {
            cluster_id: tenant.to_string(),
        })
        .await
        .map_err(|s| {
            anyhow::anyhow!(
                "the provider refused the tap: {} {}",
                s.code(),
                crate::display::printable(s.message())
            )
        })?
        .into_inner();
    eprintln!("tapping tenant {tenant} at {endpoint} (→ origin to provider, ← provider to origin)");
    let until = args.duration.map(|d| tokio::time::Instant::now() + d);
    let mut seen = 0u64;
    loop {
        let next = match until {
            Some(t) => match tokio::time::timeout_at(t, stream.next()).await {
                Ok(n) => n,
                Err(_) => break,
            },
            None => stream.next().await,
        };
        match next {
            Some(Ok(event)) => {
                // Everything in a line came through the provider.
                println!("{}", crate::display::printable(&line(&event)));
                seen += 1;
                if args.count.is_some_and(|c| seen >= c) {
                    break;
                }
            }
            Some(Err(s)) => anyhow::bail!(
                "the tap ended: {} {}",
                s.code(),
                crate::display::printable(s.message())
            ),
            None => break,
        }
    }
    eprintln!("{seen} messages");
    Ok(())
}

/// One message as a line: time, direction, kind and what it is about.
pub fn line(event: &TapEvent) -> String {
    let mut out = format!("{} ", event.at);
    if event.dropped_before > 0 {
        out.push_str(&format!("({} dropped) ", event.dropped_before));
    }
    let what = match &event.message {
        Some(tap_event::Message::FromLocal(m)) => format!("→ {}", local(m)),
        Some(tap_event::Message::FromRemote(m)) => format!("← {}", remote(m)),
        None => "? (empty)".into(),
    };
    out + &what
}

fn local(m: &LocalMessage) -> String {
    use local_message::Kind;
    let obj = |o: &Option<refract_wire::proto::ObjectRef>| {
        o.as_ref().map(|o| o.display()).unwrap_or_default()
    };
    match &m.kind {
        Some(Kind::Hello(h)) => format!(
            "Hello {} agent {} protocol {} resume={}",
            h.cluster_id, h.agent_version, h.protocol_version, h.resume
        ),
        Some(Kind::Upsert(u)) => format!(
            "Upsert {} rev {} ({} bytes)",
            obj(&u.object),
            u.revision,
            u.object_json.len()
        ),
        Some(Kind::Delete(d)) => format!("Delete {} rev {}", obj(&d.object), d.revision),
        Some(Kind::SnapshotComplete(s)) => format!(
            "SnapshotComplete {} {} in {:?}",
            s.api_version, s.kind, s.namespace
        ),
        Some(Kind::StatusAck(a)) => format!("StatusAck pod {}", a.origin_uid),
        Some(Kind::InventoryRequest(r)) => {
            format!("InventoryRequest {} in {:?}", r.kind, r.namespace)
        }
        None => "(empty)".into(),
    }
}

fn remote(m: &RemoteMessage) -> String {
    use remote_message::Kind;
    match &m.kind {
        Some(Kind::Welcome(w)) => format!(
            "Welcome {} agent {} session {} resume={}",
            w.cluster_id, w.agent_version, w.session_id, w.resume
        ),
        Some(Kind::Ack(a)) => {
            let outcome = Outcome::try_from(a.outcome)
                .map(|o| o.as_str_name().trim_start_matches("OUTCOME_").to_string())
                .unwrap_or_else(|_| a.outcome.to_string());
            let what = a.object.as_ref().map(|o| o.display()).unwrap_or_default();
            let mut s = format!("Ack {what} rev {} {outcome}", a.revision);
            if !a.message.is_empty() {
                s.push_str(&format!(": {}", a.message));
            }
            s
        }
        Some(Kind::PodStatus(p)) => format!(
            "PodStatus {}/{} ({} bytes, recreations {})",
            p.namespace,
            p.name,
            p.status_json.len(),
            p.recreations
        ),
        Some(Kind::Event(e)) => format!(
            "Event about {}",
            e.involved.as_ref().map(|o| o.display()).unwrap_or_default()
        ),
        Some(Kind::Capacity(c)) => format!(
            "Capacity free {:?} api-server-ready={}",
            c.free, c.api_server_ready
        ),
        Some(Kind::PersistentVolume(v)) => format!(
            "PersistentVolume for claim {}/{}",
            v.claim_namespace, v.claim_name
        ),
        Some(Kind::Inventory(i)) => format!(
            "Inventory {} in {:?}: {} entries{}",
            i.kind,
            i.namespace,
            i.entries.len(),
            if i.last { " (last)" } else { "" }
        ),
        Some(Kind::CustomStatus(c)) => format!(
            "CustomStatus of {} ({} bytes)",
            c.object.as_ref().map(|o| o.display()).unwrap_or_default(),
            c.status_json.len()
        ),
        None => "(empty)".into(),
    }
}
