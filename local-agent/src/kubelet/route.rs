//! Which kubelet endpoint a request asks for, and how a kubelet authorizes it.

/// A kubelet endpoint the virtual node answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `/containerLogs/{namespace}/{pod}/{container}`.
    ContainerLogs(Target),
    /// `/exec/{namespace}/{pod}[/{uid}]/{container}`.
    Exec(Target),
    /// `/attach/{namespace}/{pod}[/{uid}]/{container}`.
    Attach(Target),
    /// `/portForward/{namespace}/{pod}[/{uid}]`.
    PortForward(Target),
    /// `/stats/summary`.
    StatsSummary,
    /// `/metrics/resource`.
    MetricsResource,
    /// `/healthz`.
    Healthz,
}

/// The pod (and container) a request names, in origin terms.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Target {
    /// Origin namespace.
    pub namespace: String,
    /// Origin pod name.
    pub pod: String,
    /// The pod's UID when the path names it.
    pub uid: Option<String>,
    /// The container; empty when the path names none.
    pub container: String,
}

impl Route {
    /// Parses a request path (without its query); `None` for anything a kubelet would 404.
    pub fn parse(path: &str) -> Option<Self> {
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        if parts
            .iter()
            .any(|p| p.is_empty() || *p == "." || *p == "..")
        {
            return None;
        }
        let target = |ns: &str, pod: &str, uid: Option<&str>, container: &str| Target {
            namespace: ns.to_string(),
            pod: pod.to_string(),
            uid: uid.map(str::to_string),
            container: container.to_string(),
        };
        Some(match parts.as_slice() {
            ["containerLogs", ns, pod, container] => {
                Route::ContainerLogs(target(ns, pod, None, container))
            }
            ["exec", ns, pod, container] => Route::Exec(target(ns, pod, None, container)),
            ["exec", ns, pod, uid, container] => Route::Exec(target(ns, pod, Some(uid), container)),
            ["attach", ns, pod, container] => Route::Attach(target(ns, pod, None, container)),
            ["attach", ns, pod, uid, container] => {
                Route::Attach(target(ns, pod, Some(uid), container))
            }
            ["portForward", ns, pod] => Route::PortForward(target(ns, pod, None, "")),
            ["portForward", ns, pod, uid] => Route::PortForward(target(ns, pod, Some(uid), "")),
            ["stats", "summary"] => Route::StatsSummary,
            ["metrics", "resource"] => Route::MetricsResource,
            ["healthz"] => Route::Healthz,
            _ => return None,
        })
    }

    /// The `nodes` subresource a kubelet checks the caller against, as the kubelet does:
    /// `stats`, `metrics` and `log` for those paths, `proxy` for everything else (exec,
    /// attach, port-forward and container logs included).
    pub fn subresource(&self) -> &'static str {
        match self {
            Route::StatsSummary => "stats",
            Route::MetricsResource => "metrics",
            _ => "proxy",
        }
    }
}

/// The authorization verb for an HTTP method, as a kubelet maps it.
pub fn verb(method: &http::Method) -> &'static str {
    match *method {
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => "get",
    }
}

/// The values of `key` in a query string, percent-decoded.
pub fn query_values(query: &str, key: &str) -> Vec<String> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .filter(|(k, _)| *k == key)
        .map(|(_, v)| decode(v))
        .collect()
}

/// The value of `key`, if present.
pub fn query_value(query: &str, key: &str) -> Option<String> {
    query_values(query, key).into_iter().next()
}

/// A boolean query flag as a kubelet reads it (`1` or `true`).
pub fn query_flag(query: &str, key: &str) -> bool {
    matches!(query_value(query, key).as_deref(), Some("1" | "true"))
}

fn decode(v: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let bytes = v.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = match bytes.get(i..i + 3) {
            Some([b'%', hi, lo]) => hex(*hi).zip(hex(*lo)).map(|(h, l)| h << 4 | l),
            _ => None,
        };
        match (escaped, bytes[i]) {
            (Some(b), _) => {
                out.push(b);
                i += 3;
            }
            (None, b'+') => {
                out.push(b' ');
                i += 1;
            }
            (None, b) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_paths_are_parsed() {
        assert_eq!(
            Route::parse("/containerLogs/ns/web/c"),
            Some(Route::ContainerLogs(Target {
                namespace: "ns".into(),
                pod: "web".into(),
                uid: None,
                container: "c".into()
            }))
        );
        let Some(Route::Exec(t)) = Route::parse("/exec/ns/web/1234/c") else {
            panic!("exec with uid")
        };
        assert_eq!(t.uid.as_deref(), Some("1234"));
        assert_eq!(
            Route::parse("/portForward/ns/web").map(|r| r.subresource()),
            Some("proxy")
        );
        assert_eq!(
            Route::parse("/stats/summary").map(|r| r.subresource()),
            Some("stats")
        );
        assert_eq!(
            Route::parse("/metrics/resource").map(|r| r.subresource()),
            Some("metrics")
        );
        for bad in [
            "/",
            "/exec/ns/web",
            "/containerLogs/ns/../c",
            "/run/ns/web/c",
            "/pods",
            "/stats//summary",
        ] {
            assert_eq!(Route::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn queries_are_decoded() {
        let q = "command=sh&command=-c&command=echo%20a%26b&input=1&tty=true&output=0";
        assert_eq!(query_values(q, "command"), ["sh", "-c", "echo a&b"]);
        assert!(query_flag(q, "input"));
        assert!(query_flag(q, "tty"));
        assert!(!query_flag(q, "output"));
        assert!(!query_flag(q, "error"));
        assert_eq!(query_value("x=%zz%4", "x").as_deref(), Some("%zz%4"));
    }

    #[test]
    fn verbs_follow_the_method() {
        assert_eq!(verb(&http::Method::POST), "create");
        assert_eq!(verb(&http::Method::GET), "get");
        assert_eq!(verb(&http::Method::HEAD), "get");
    }
}
