//! The virtual node's kubelet API, end to end on a real provider node: `kubectl logs`, `exec`,
//! `attach`, `port-forward` and node stats of offloaded pods, run from the origin as a user
//! runs them, carried over the mutual-TLS link; and what is refused.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use refract_e2e::{busybox, free_port, kubectl_stdin, origin_get, Peering};

const WAIT: Duration = Duration::from_secs(90);

fn kubectl_cmd(p: &Peering, args: &[&str]) -> Command {
    let mut cmd = Command::new("kubectl");
    cmd.arg(format!("--kubeconfig={}", p.origin.kubeconfig.display()));
    cmd.args(args);
    cmd
}

/// Runs kubectl against the origin; returns (exit code, stdout, stderr).
fn kubectl_run(p: &Peering, args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let mut cmd = kubectl_cmd(p, args);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("kubectl");
    let mut input = child.stdin.take().expect("stdin");
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).expect("write stdin");
    }
    drop(input);
    let out = wait_with_deadline(child, Duration::from_secs(60));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `kubectl exec [-i] <pod> -- sh -c <script>` in namespace tools, with `stdin` piped in when
/// given; returns (exit code, stdout, stderr).
fn exec_sh(p: &Peering, pod: &str, script: &str, stdin: Option<&str>) -> (i32, String, String) {
    let mut args = vec!["-n", "tools", "exec"];
    if stdin.is_some() {
        args.push("-i");
    }
    args.extend([pod, "--", "sh", "-c", script]);
    kubectl_run(p, &args, stdin)
}

fn wait_with_deadline(mut child: Child, within: Duration) -> std::process::Output {
    let deadline = Instant::now() + within;
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "command did not finish within {within:?}; stdout {:?} stderr {:?}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Reads lines of a running child's stdout until one satisfies `want`, within `within`.
/// Returns the lines read; the child keeps running.
fn read_until(child: &mut Child, within: Duration, want: impl Fn(&str) -> bool) -> Vec<String> {
    let stdout = child.stdout.take().expect("stdout piped");
    let (tx, rx) = std::sync::mpsc::channel();
    // The thread drains stdout for as long as the child writes: kubectl dies of SIGPIPE when
    // its stdout closes.
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + within;
    let mut lines = Vec::new();
    while Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                let done = want(&line);
                lines.push(line);
                if done {
                    return lines;
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(_) => break,
        }
    }
    panic!("no wanted line within {within:?}; read {lines:?}");
}

/// `GET /stats/summary` straight at the virtual node's kubelet port with a bearer token; the
/// call must fail, and its stderr says why.
fn kubelet_stats_with_token(endpoint: &str, token: &str) -> String {
    let out = Command::new("kubectl")
        .args([
            "--kubeconfig=/dev/null",
            "-s",
            endpoint,
            "--insecure-skip-tls-verify",
        ])
        .arg(format!("--token={token}"))
        .args(["get", "--raw", "/stats/summary"])
        .output()
        .expect("kubectl");
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// TokenReviews the origin's API server has answered so far.
fn token_reviews(p: &Peering) -> u64 {
    let metrics = origin_get(p, &["--raw", "/metrics"]).expect("the API server's metrics");
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("apiserver_request_total{") && l.contains("resource=\"tokenreviews\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The virtual node's `/stats/summary` once it shows the offloaded pod `talker` with non-zero
/// CPU and memory, named as at the origin; printed with the source it came from.
async fn node_stats_of_talker(p: &Peering, source: &str) -> serde_json::Value {
    let summary = p
        .eventually(
            WAIT,
            &format!("stats of the offloaded pods ({source})"),
            || {
                let raw = origin_get(
                    p,
                    &[
                        "--raw",
                        "/api/v1/nodes/refract-provider/proxy/stats/summary",
                    ],
                )?;
                let v: serde_json::Value = serde_json::from_str(&raw).ok()?;
                let talker = v["pods"].as_array()?.iter().find(|pod| {
                    pod["podRef"]["name"] == "talker" && pod["podRef"]["namespace"] == "tools"
                })?;
                let cpu = talker["cpu"]["usageNanoCores"].as_u64()?;
                let mem = talker["memory"]["workingSetBytes"].as_u64()?;
                (cpu > 0 && mem > 0).then(|| v.clone())
            },
        )
        .await;
    let names: Vec<&str> = summary["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["podRef"]["name"].as_str())
        .collect();
    println!(
        "stats/summary ({source}): node {} cpu {} memory {}; pods {names:?}",
        summary["node"]["nodeName"],
        summary["node"]["cpu"]["usageNanoCores"],
        summary["node"]["memory"]["workingSetBytes"]
    );
    summary
}

/// `kubectl top pod -n tools` at the origin, once it lists `talker`.
async fn kubectl_top(p: &Peering) -> String {
    p.eventually(WAIT, "kubectl top pod at the origin", || {
        let (code, out, _) = kubectl_run(p, &["-n", "tools", "top", "pod", "--no-headers"], None);
        (code == 0 && out.lines().any(|l| l.starts_with("talker "))).then_some(out)
    })
    .await
}

async fn offloaded_and_running(p: &Peering, pods: &[&str]) {
    for pod in pods {
        p.eventually(WAIT, &format!("pod {pod} Running at the origin"), || {
            let phase = origin_get(
                p,
                &["-n", "tools", "pod", pod, "-o", "jsonpath={.status.phase}"],
            )?;
            (phase == "Running").then_some(())
        })
        .await;
    }
}

#[tokio::test]
async fn kubectl_logs_exec_attach_port_forward_and_stats_work_on_offloaded_pods() {
    let mut p = Peering::start_offloading().await.expect("peering");
    let image = busybox();
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!(
            r#"
apiVersion: v1
kind: Namespace
metadata: {{name: tools}}
---
apiVersion: offloading.refract.io/v1alpha1
kind: NamespaceOffloading
metadata: {{name: offloading, namespace: tools}}
spec: {{podOffloadingStrategy: Remote}}
---
apiVersion: v1
kind: Pod
metadata: {{name: talker, namespace: tools}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: "{image}"
    command: ["sh", "-c", "i=0; while true; do echo line-$i; i=$((i+1)); sleep 1; done"]
---
apiVersion: v1
kind: Pod
metadata: {{name: crasher, namespace: tools}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: "{image}"
    # Fails once, then runs: the state survives the restart in an emptyDir.
    command: ["sh", "-c", "if [ -e /state/ran ]; then echo second-run; exec sleep 3600; fi; touch /state/ran; echo first-run; sleep 2; exit 1"]
    volumeMounts: [{{name: state, mountPath: /state}}]
  volumes: [{{name: state, emptyDir: {{}}}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: reader, namespace: tools}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: "{image}"
    stdin: true
    command: ["sh", "-c", "while read l; do echo got-$l; done; sleep 3600"]
---
apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: tools}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: "{image}"
    command: ["sh", "-c", "mkdir -p /www && echo forwarded-ok > /www/index.html && exec httpd -f -p 8080 -h /www"]
"#
        ),
    );
    offloaded_and_running(&p, &["talker", "reader", "web"]).await;

    // logs, --tail.
    p.eventually(WAIT, "three log lines", || {
        let (code, out, _) = kubectl_run(&p, &["-n", "tools", "logs", "talker", "--tail=2"], None);
        (code == 0 && out.lines().count() == 2 && out.lines().all(|l| l.starts_with("line-")))
            .then_some(())
    })
    .await;
    let (code, out, err) = kubectl_run(&p, &["-n", "tools", "logs", "talker", "--tail=2"], None);
    println!("kubectl logs talker --tail=2 (exit {code}):\n{out}{err}");
    assert_eq!(out.lines().count(), 2, "--tail=2 gives two lines: {out:?}");
    let (_, stamped, _) = kubectl_run(
        &p,
        &["-n", "tools", "logs", "talker", "--tail=1", "--timestamps"],
        None,
    );
    assert!(
        stamped.starts_with("20") && stamped.contains(" line-"),
        "--timestamps prefixes the line: {stamped:?}"
    );
    let (_, limited, _) = kubectl_run(
        &p,
        &["-n", "tools", "logs", "talker", "--limit-bytes=4"],
        None,
    );
    assert_eq!(limited, "line", "--limit-bytes=4");

    // logs -f: new lines keep arriving, and Inspect shows the open session (not its content).
    let last: u64 = out
        .lines()
        .last()
        .and_then(|l| l.trim_start_matches("line-").parse().ok())
        .expect("a numbered line");
    let mut follow = kubectl_cmd(&p, &["-n", "tools", "logs", "-f", "talker", "--tail=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl logs -f");
    let target = format!("line-{}", last + 3);
    let lines = read_until(&mut follow, Duration::from_secs(30), |l| l == target);
    println!(
        "kubectl logs -f talker: ... {:?}",
        &lines[lines.len().saturating_sub(3)..]
    );
    let tenants = p.grpcurl(Some("client"), &["refract.v1.Inspect/ListTenants"]);
    let tenants = String::from_utf8_lossy(&tenants.stdout).into_owned();
    assert!(
        tenants.contains("\"call\": \"ContainerLogs\"") && tenants.contains("tools-origin/talker"),
        "Inspect lists the open logs session: {tenants}"
    );
    assert!(
        !tenants.contains("line-"),
        "Inspect never shows content: {tenants}"
    );
    let _ = follow.kill();
    let _ = follow.wait();
    p.eventually(
        Duration::from_secs(20),
        "the logs session closed at the provider",
        || {
            let out = p.grpcurl(Some("client"), &["refract.v1.Inspect/ListTenants"]);
            (!String::from_utf8_lossy(&out.stdout).contains("ContainerLogs")).then_some(())
        },
    )
    .await;

    // exec: output, exit code, stdin (end-of-file reaches the process), and a terminal.
    let (code, out, err) = exec_sh(&p, "talker", "echo exec-ok; hostname", None);
    println!("kubectl exec talker -- sh -c 'echo exec-ok; hostname' (exit {code}):\n{out}{err}");
    assert_eq!(
        (code, out.as_str()),
        (0, "exec-ok\ntalker\n"),
        "stderr: {err}"
    );
    let (code, _, err) = exec_sh(&p, "talker", "echo to-stderr >&2; exit 3", None);
    assert_eq!(code, 3, "the command's exit code comes back: {err}");
    assert!(err.contains("to-stderr"), "stderr comes back: {err:?}");
    let (code, out, err) = exec_sh(
        &p,
        "talker",
        "cat; echo eof-seen",
        Some("piped-in\nsecond\n"),
    );
    println!("printf 'piped-in\\nsecond\\n' | kubectl exec -i talker -- sh -c 'cat; echo eof-seen' (exit {code}):\n{out}{err}");
    assert_eq!(
        (code, out.as_str()),
        (0, "piped-in\nsecond\neof-seen\n"),
        "stderr: {err}"
    );
    // A terminal needs kubectl's stdin to be one: `script` gives it a pseudo-terminal.
    let tty_cmd = format!(
        "kubectl --kubeconfig={} -n tools exec -it talker -- tty",
        p.origin.kubeconfig.display()
    );
    let out = Command::new("script")
        .args(["-qec", &tty_cmd, "/dev/null"])
        .env("COLUMNS", "97")
        .env("LINES", "31")
        .stdin(Stdio::null())
        .output()
        .expect("script");
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    println!("script -qec 'kubectl exec -it talker -- tty':\n{text}");
    assert!(
        text.contains("/dev/pts/"),
        "the process has a terminal: {text:?}"
    );

    // attach: stdin reaches the main process, its output comes back.
    let mut attach = kubectl_cmd(&p, &["-n", "tools", "attach", "-i", "reader"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl attach");
    let mut stdin = attach.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || {
        for _ in 0..20 {
            if stdin.write_all(b"hello-attach\n").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    let lines = read_until(&mut attach, Duration::from_secs(30), |l| {
        l.contains("got-hello-attach")
    });
    println!("kubectl attach -i reader: {:?}", lines.last());
    let _ = attach.kill();
    let _ = attach.wait();
    let _ = writer.join();

    // port-forward: bytes to the pod's server and back.
    let local_port = free_port();
    let mut forward = kubectl_cmd(
        &p,
        &[
            "-n",
            "tools",
            "port-forward",
            "pod/web",
            &format!("{local_port}:8080"),
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("kubectl port-forward");
    read_until(&mut forward, Duration::from_secs(30), |l| {
        l.contains("Forwarding from")
    });
    for round in 0..3 {
        let mut tcp = std::net::TcpStream::connect(("127.0.0.1", local_port)).expect("connect");
        tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        tcp.write_all(b"GET /index.html HTTP/1.0\r\nHost: web\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        if let Err(e) = tcp.read_to_string(&mut answer) {
            let _ = forward.kill();
            let out = forward.wait_with_output().unwrap();
            panic!(
                "no answer through the forward: {e}\nkubectl: {}\nlocal agent: {}\nremote agent: {}",
                String::from_utf8_lossy(&out.stderr),
                tail(&p.local_log()),
                tail(&p.remote_log())
            );
        }
        println!("port-forward round {round}: {:?}", answer.lines().next());
        assert!(
            answer.starts_with("HTTP/1.") && answer.ends_with("forwarded-ok\n"),
            "{answer:?}"
        );
    }
    let _ = forward.kill();
    let _ = forward.wait();

    // logs --previous after a container restart.
    p.eventually(WAIT, "crasher restarted", || {
        let restarts: u32 = origin_get(
            &p,
            &[
                "-n",
                "tools",
                "pod",
                "crasher",
                "-o",
                "jsonpath={.status.containerStatuses[0].restartCount}",
            ],
        )?
        .parse()
        .ok()?;
        (restarts >= 1).then_some(())
    })
    .await;
    let previous = p
        .eventually(WAIT, "the previous instance's log", || {
            let (code, out, _) =
                kubectl_run(&p, &["-n", "tools", "logs", "crasher", "--previous"], None);
            (code == 0 && !out.is_empty()).then_some(out)
        })
        .await;
    let (_, current, _) = kubectl_run(&p, &["-n", "tools", "logs", "crasher"], None);
    println!("kubectl logs crasher --previous: {previous}kubectl logs crasher: {current}");
    assert_eq!(
        (previous.as_str(), current.as_str()),
        ("first-run\n", "second-run\n")
    );

    // Node stats, from the provider's metrics.k8s.io (the default `--pod-stats=metrics-api`,
    // read as the tenant): the offloaded pods with non-zero CPU and memory, named as at the
    // origin. The origin gets a metrics API too, from the virtual node's /metrics/resource,
    // for `kubectl top`.
    let bridge = refract_e2e::metrics_api::bridge_address(&p.provider).unwrap();
    let _provider_metrics = refract_e2e::metrics_api::serve(&p.provider, "localhost", bridge)
        .await
        .expect("provider metrics API");
    let _origin_metrics = refract_e2e::metrics_api::serve(&p.origin, "refract-provider", bridge)
        .await
        .expect("origin metrics API");
    let summary = node_stats_of_talker(&p, "metrics-api").await;
    let names: Vec<&str> = summary["pods"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["podRef"]["name"].as_str())
        .collect();
    assert!(
        names.contains(&"web") && names.contains(&"reader"),
        "{names:?}"
    );
    let top = kubectl_top(&p).await;
    println!("kubectl top pod -n tools (origin, provider stats from metrics.k8s.io):\n{top}");
    let tenant = "system:serviceaccount:refract-system:tenant-origin";
    assert_eq!(
        refract_e2e::can_i(&p.provider, tenant, "get", "nodes/proxy", "default"),
        "no",
        "the tenant may not reach kubelets"
    );

    // The opt-in source: the kubelets' summaries through nodes/proxy (this test's agent runs
    // with the admin's kubeconfig, which has the right rbac-kubelet-stats.yaml grants).
    p.restart_remote_with("--pod-stats=kubelet-summary".into())
        .await;
    let summary = node_stats_of_talker(&p, "kubelet-summary").await;
    let talker_cumulative = summary["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|pod| pod["podRef"]["name"] == "talker")
        .map(|pod| pod["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap_or(0));
    assert!(talker_cumulative > Some(0), "{summary}");
    let top = kubectl_top(&p).await;
    println!(
        "kubectl top pod -n tools (origin, provider stats from the kubelet's summary):\n{top}"
    );
    let metrics = origin_get(
        &p,
        &[
            "--raw",
            "/api/v1/nodes/refract-provider/proxy/metrics/resource",
        ],
    )
    .expect("metrics");
    assert!(
        metrics.contains("pod_memory_working_set_bytes{namespace=\"tools\",pod=\"talker\"}"),
        "{metrics}"
    );

    // Refusals. No credentials: 401. A token without rights: 403.
    let endpoint = format!("https://127.0.0.1:{}", p.kubelet_port);
    let probe = format!(
        "import ssl, urllib.request, urllib.error\nctx = ssl._create_unverified_context()\ntry:\n    urllib.request.urlopen('{endpoint}/stats/summary', context=ctx)\n    print(200)\nexcept urllib.error.HTTPError as e:\n    print(e.code, e.read().decode())\n"
    );
    let out = Command::new("python3")
        .args(["-c", &probe])
        .output()
        .expect("python3");
    let answer = String::from_utf8_lossy(&out.stdout);
    println!("anonymous GET /stats/summary on the virtual node's kubelet port: {answer}");
    assert!(answer.starts_with("401"), "anonymous: {answer}");
    let err = kubelet_stats_with_token(&endpoint, "not-a-token");
    assert!(err.contains("must be logged in"), "a bad token: {err}");
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: nobody, namespace: default}\n",
    );
    let token = p
        .eventually(WAIT, "a token for nobody", || {
            let secret = origin_get(
                &p,
                &[
                    "-n",
                    "default",
                    "sa",
                    "nobody",
                    "-o",
                    "jsonpath={.secrets[0].name}",
                ],
            )?;
            let b64 = origin_get(
                &p,
                &[
                    "-n",
                    "default",
                    "secret",
                    &secret,
                    "-o",
                    "jsonpath={.data.token}",
                ],
            )?;
            use base64::Engine;
            String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b64).ok()?).ok()
        })
        .await;
    let err = kubelet_stats_with_token(&endpoint, &token);
    assert!(
        err.contains("Forbidden"),
        "a token without nodes/stats: {err}"
    );

    // A flood of one bad token costs the origin a handful of TokenReviews, not one a request:
    // the refusal is reused, and the source is turned away (429) after repeated failures.
    let reviews_before = token_reviews(&p);
    let flood = format!(
        "import ssl, http.client, collections\nctx = ssl._create_unverified_context()\ncodes = collections.Counter()\nconn = http.client.HTTPSConnection('127.0.0.1', {}, context=ctx)\nfor _ in range(1000):\n    conn.request('GET', '/stats/summary', headers={{'Authorization': 'Bearer flood-token'}})\n    r = conn.getresponse(); r.read(); codes[r.status] += 1\nprint(' '.join(f'{{k}}:{{v}}' for k, v in sorted(codes.items())))\n",
        p.kubelet_port
    );
    let started = Instant::now();
    let out = Command::new("python3")
        .args(["-c", &flood])
        .output()
        .expect("python3");
    let codes = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let reviews = token_reviews(&p) - reviews_before;
    println!(
        "1,000 requests with one bad token in {:.1?}: answers {codes}; TokenReviews at the origin: {reviews}",
        started.elapsed()
    );
    assert!(
        codes.contains("429:") && !codes.contains("200:"),
        "{codes} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(reviews <= 3, "{reviews} TokenReviews for one bad token");

    // The provider refuses a pod that is not the tenant's, and a tenant asking for another's.
    let out = p.grpcurl_with(
        Some("client"),
        Some(r#"{"pod":{"namespace":"kube-system","name":"kube-proxy"}}"#),
        &["refract.v1.Kubelet/ContainerLogs"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("PermissionDenied") && err.contains("not one of this tenant's offloaded pods"),
        "{err}"
    );
    p.certs.issue("intruder", "intruder", "client", &[]);
    let out = p.grpcurl_with(
        Some("intruder"),
        Some(r#"{"pod":{"namespace":"tools-origin","name":"talker"}}"#),
        &["refract.v1.Kubelet/ContainerLogs"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("PermissionDenied"),
        "another tenant's pod: {err}"
    );
    let described = p.grpcurl(Some("client"), &["describe", "refract.v1.Kubelet"]);
    let described = String::from_utf8_lossy(&described.stdout);
    assert!(
        described.contains("rpc Exec") && described.contains("rpc PortForward"),
        "{described}"
    );
}
