"""A stand-in for metrics-server, for the end-to-end tests only.

metrics-server cannot be built on the test machines (its Go modules are out of reach), so this
serves the part of `metrics.k8s.io/v1beta1` that `kubectl top pod` and Refract's remote agent
read, computed the way metrics-server computes it: it scrapes one node's `/metrics/resource`
through the API server's node proxy every few seconds, and a container's CPU is the rate of
`container_cpu_usage_seconds_total` between its last two scrapes; memory is
`container_memory_working_set_bytes`. The API server reaches it as an aggregated API
(APIService `v1beta1.metrics.k8s.io`) and authorizes every request itself before proxying.

usage: metrics_api.py BIND_IP PORT CERT KEY API_SERVER CA_FILE TOKEN NODE
"""

import http.server
import json
import re
import ssl
import sys
import threading
import time
import urllib.request
from datetime import datetime, timezone

bind_ip, port, cert, key, api_server, ca_file, token, node = sys.argv[1:9]
RESOLUTION = 3.0
SAMPLE = re.compile(r'^(container_cpu_usage_seconds_total|container_memory_working_set_bytes)'
                    r'\{([^}]*)\}\s+(\S+)(?:\s+(\d+))?$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

lock = threading.Lock()
previous = {}  # (namespace, pod, container) -> (seconds, cpu seconds)
pods = {}      # (namespace, pod) -> {"timestamp", "window", "containers": {name: usage}}


def scrape():
    context = ssl.create_default_context(cafile=ca_file)
    request = urllib.request.Request(
        f"{api_server}/api/v1/nodes/{node}/proxy/metrics/resource",
        headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, context=context, timeout=10) as answer:
        text = answer.read().decode()
    now = time.time()
    cpu, memory = {}, {}
    for line in text.splitlines():
        match = SAMPLE.match(line.strip())
        if not match:
            continue
        name, labels, value, stamp = match.groups()
        labels = dict(LABEL.findall(labels))
        if not {"namespace", "pod", "container"} <= labels.keys():
            continue
        at = int(stamp) / 1000 if stamp else now
        k = (labels["namespace"], labels["pod"], labels["container"])
        if name.startswith("container_cpu"):
            cpu[k] = (at, float(value))
        else:
            memory[k] = float(value)
    fresh = {}
    with lock:
        for k, (at, total) in cpu.items():
            last = previous.get(k)
            previous[k] = (at, total)
            if last is None or at <= last[0] or total < last[1]:
                continue
            rate = (total - last[1]) / (at - last[0])
            pod = fresh.setdefault(k[:2], {"timestamp": at, "window": at - last[0],
                                           "containers": {}})
            pod["containers"][k[2]] = {"cpu": f"{int(rate * 1e9)}n",
                                       "memory": str(int(memory.get(k, 0)))}
        pods.clear()
        pods.update(fresh)


def scraper():
    while True:
        try:
            scrape()
        except Exception as error:  # the next scrape tries again
            print(f"scrape failed: {error}", file=sys.stderr, flush=True)
        time.sleep(RESOLUTION)


def rfc3339(seconds):
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_metrics(namespace, name, pod):
    return {
        "kind": "PodMetrics", "apiVersion": "metrics.k8s.io/v1beta1",
        "metadata": {"name": name, "namespace": namespace,
                     "creationTimestamp": rfc3339(time.time())},
        "timestamp": rfc3339(pod["timestamp"]), "window": f"{pod['window']:.3f}s",
        "containers": [{"name": c, "usage": u} for c, u in sorted(pod["containers"].items())],
    }


RESOURCES = {
    "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "metrics.k8s.io/v1beta1",
    "resources": [{"name": "pods", "singularName": "", "namespaced": True,
                   "kind": "PodMetrics", "verbs": ["get", "list"]}],
}
ROUTE = re.compile(r'^/apis/metrics\.k8s\.io/v1beta1(?:/namespaces/([^/]+))?/pods(?:/([^/?]+))?')


class Handler(http.server.BaseHTTPRequestHandler):
    def answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        path = self.path.split("?")[0]
        if path.rstrip("/") == "/apis/metrics.k8s.io/v1beta1":
            return self.answer(200, RESOURCES)
        route = ROUTE.match(path)
        if not route:
            return self.answer(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                     "reason": "NotFound", "code": 404})
        namespace, name = route.groups()
        with lock:
            items = [pod_metrics(ns, n, p) for (ns, n), p in sorted(pods.items())
                     if namespace is None or ns == namespace]
        if name is not None:
            found = [i for i in items if i["metadata"]["name"] == name]
            if not found:
                return self.answer(404, {"kind": "Status", "apiVersion": "v1",
                                         "status": "Failure", "reason": "NotFound",
                                         "message": f"podmetrics {name} not found",
                                         "code": 404})
            return self.answer(200, found[0])
        self.answer(200, {"kind": "PodMetricsList", "apiVersion": "metrics.k8s.io/v1beta1",
                          "metadata": {}, "items": items})

    def log_message(self, *args):
        pass


threading.Thread(target=scraper, daemon=True).start()
server = http.server.ThreadingHTTPServer((bind_ip, int(port)), Handler)
tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
tls.load_cert_chain(cert, key)
server.socket = tls.wrap_socket(server.socket, server_side=True)
print(f"serving metrics.k8s.io on https://{bind_ip}:{port}, from node {node}", flush=True)
server.serve_forever()
