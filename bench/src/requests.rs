//! What each API server served during a phase, from its own metrics: requests by verb and
//! resource, and watch events sent by kind. The load and the benchmark's own watches are the
//! same for every system, so a difference between systems is the system's.

use std::collections::BTreeMap;

/// Counts read off one API server's `/metrics`, by series description.
pub type Counts = BTreeMap<String, f64>;

/// The request and watch-event counters of the API server behind `client`; empty when its
/// metrics cannot be read (the phase is then reported without them).
pub async fn read(client: &kube::Client) -> Counts {
    let Ok(request) = http::Request::get("/metrics").body(Vec::new()) else {
        return Counts::new();
    };
    match client.request_text(request).await {
        Ok(text) => parse(&text),
        Err(_) => Counts::new(),
    }
}

/// Sums `apiserver_request_total` by verb, resource and subresource, and
/// `apiserver_watch_events_total` by kind.
fn parse(text: &str) -> Counts {
    let mut counts = Counts::new();
    for line in text.lines() {
        let (series, key) = if let Some(rest) = line.strip_prefix("apiserver_request_total{") {
            let subresource = label(rest, "subresource").filter(|s| !s.is_empty());
            let resource = match subresource {
                Some(sub) => format!("{}/{sub}", label(rest, "resource").unwrap_or_default()),
                None => label(rest, "resource").unwrap_or_default().to_string(),
            };
            (
                rest,
                format!("{} {resource}", label(rest, "verb").unwrap_or_default()),
            )
        } else if let Some(rest) = line.strip_prefix("apiserver_watch_events_total{") {
            (
                rest,
                format!("watch events {}", label(rest, "kind").unwrap_or_default()),
            )
        } else {
            continue;
        };
        let value = series
            .rsplit_once("} ")
            .and_then(|(_, v)| v.trim().parse::<f64>().ok());
        if let Some(v) = value {
            *counts.entry(key).or_default() += v;
        }
    }
    counts
}

/// The value of `name` in a series' label set (`a="x",b="y"} 3`).
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("{name}=\"");
    let mut from = 0;
    while let Some(found) = labels[from..].find(&key) {
        let at = from + found;
        let start = at + key.len();
        // At the start or after a comma: `resource` must not match inside `subresource`.
        if at == 0 || labels[..at].ends_with(',') {
            let rest = &labels[start..];
            return Some(&rest[..rest.find('"')?]);
        }
        from = start;
    }
    None
}

/// What grew from `before` to `after`, per `objects`, leaving out what grew by less than 0.01
/// per object (the benchmark's scrapes, leases, noise).
pub fn per_object(before: &Counts, after: &Counts, objects: usize) -> Vec<(String, f64)> {
    let n = objects.max(1) as f64;
    after
        .iter()
        .map(|(key, a)| (key.clone(), (a - before.get(key).unwrap_or(&0.0)) / n))
        .filter(|(_, per)| *per >= 0.01)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_by_verb_and_resource_and_watch_events_by_kind() {
        let text = r#"# HELP apiserver_request_total x
apiserver_request_total{code="201",component="apiserver",contentType="application/json",dry_run="",group="",resource="services",scope="resource",subresource="",verb="POST",version="v1"} 1000
apiserver_request_total{code="409",component="apiserver",contentType="application/json",dry_run="",group="",resource="services",scope="resource",subresource="",verb="POST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",contentType="application/json",dry_run="",group="",resource="services",scope="resource",subresource="status",verb="PATCH",version="v1"} 20
apiserver_watch_events_total{group="",kind="Service",version="v1"} 2000
"#;
        let counts = parse(text);
        assert_eq!(counts["POST services"], 1003.0);
        assert_eq!(counts["PATCH services/status"], 20.0);
        assert_eq!(counts["watch events Service"], 2000.0);
        let mut before = counts.clone();
        before.insert("POST services".into(), 3.0);
        before.insert("PATCH services/status".into(), 19.99);
        assert_eq!(
            per_object(&before, &counts, 1000),
            vec![("POST services".into(), 1.0)]
        );
    }
}
