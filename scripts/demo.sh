#!/usr/bin/env bash
# The Refract demo: two real Kubernetes control planes on this machine (origin and provider),
# certificates for the peering, the agent pair connected over mutual TLS, and what an operator
# sees with grpcurl. Installs or builds what is missing first (cached).
#
# Everything listens on 127.0.0.1. Files live in .demo/. Ctrl-C stops it all (when run
# without a terminal, it stops by itself after showing the results).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEMO=$ROOT/.demo
B=$ROOT/target/debug
say() { printf '\n\033[1;34m==> %s\033[0m\n' "$*" >&2; }
run() { printf '\033[2m$ %s\033[0m\n' "$*" >&2; "$@"; }

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
# Ctrl-C (or SIGTERM) is how a terminal session ends the demo: stop everything, exit 0.
trap 'cleanup; exit 0' INT TERM

say "Preparing: toolchain (etcd, Kubernetes 1.20.2 with kubelet, containerd, grpcurl; cached after the first run)"
eval "$(scripts/ensure-toolchain.sh | grep '^REFRACT_K8S_BIN=')"
export REFRACT_K8S_BIN
say "Building the Refract binaries (cargo build; the first build takes several minutes on 2 cores)"
cargo build --workspace --bins --locked
say "Building the node images (pause, busybox) as OCI archives"
scripts/images.sh --base
BUSYBOX=$(awk '$1 == "busybox" {print $2}' target/images/images.txt)

rm -rf "$DEMO" && mkdir -p "$DEMO"

say "Starting two control planes: origin and provider (etcd + kube-apiserver + scheduler + controller-manager), the provider with a real node (containerd + kubelet)"
"$B/testkit" up --dir "$DEMO/clusters" --cluster origin --cluster provider --controllers \
  --node provider=10.200.0.0/16 >"$DEMO/testkit.out" 2>"$DEMO/testkit.log" &
pids+=($!)
for _ in $(seq 240); do grep -q ready "$DEMO/testkit.out" 2>/dev/null && break; sleep 1; done
grep -q ready "$DEMO/testkit.out" || { cat "$DEMO/testkit.log"; echo "control planes did not start" >&2; exit 1; }
ORIGIN=$DEMO/clusters/origin/kubeconfig
PROVIDER=$DEMO/clusters/provider/kubeconfig
grep -E '^(origin|provider):' "$DEMO/testkit.log" | sed 's/\x1b\[[0-9;]*m//g' >&2 || true

say "Minting the peering's certificates with refract-certs"
run "$B/refract-certs" ca --out "$DEMO/certs/ca"
run "$B/refract-certs" issue --ca-dir "$DEMO/certs/ca" --cluster-id provider --role server --ip 127.0.0.1 --dns localhost --out "$DEMO/certs/remote-agent" >/dev/null
run "$B/refract-certs" issue --ca-dir "$DEMO/certs/ca" --cluster-id origin --role client --out "$DEMO/certs/local-agent"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
WEBHOOK_PORT=$(free_port)
"$B/refract-certs" issue --ca-dir "$DEMO/certs/ca" --cluster-id origin-webhook --role server --ip 127.0.0.1 --out "$DEMO/certs/webhook" >/dev/null 2>&1
# The virtual node's kubelet API (logs, exec, port-forward, stats), served where the origin's
# API server calls it; it trusts that API server's kubelet client certificate (the origin's CA).
KUBELET_PORT=$(free_port)
"$B/refract-certs" issue --ca-dir "$DEMO/certs/ca" --cluster-id origin-kubelet --role server --ip 127.0.0.1 --out "$DEMO/certs/kubelet" >/dev/null 2>&1

say "Installing the CRDs (NamespaceOffloading in the origin, ShadowPod in the provider), the provider's refract-system namespace and the role each tenant is bound to in its own namespaces; the provider's node:"
run kubectl --kubeconfig "$ORIGIN" apply -f deploy/local-agent/namespaceoffloading-crd.yaml
run kubectl --kubeconfig "$PROVIDER" apply -f deploy/remote-agent/shadowpod-crd.yaml \
  -f deploy/remote-agent/namespace.yaml -f deploy/remote-agent/tenant-role.yaml
run kubectl --kubeconfig "$PROVIDER" get nodes -o wide
# The provider's storage: a stand-in provisioner whose volumes are folders the kubelet creates.
"$B/testkit" fake-provisioner --kubeconfig "$PROVIDER" >"$DEMO/fake-provisioner.log" 2>&1 &
pids+=($!)

say "Starting remote-agent in the provider cluster (gRPC on 127.0.0.1:$PORT)"
"$B/remote-agent" --listen "127.0.0.1:$PORT" \
  --tls-cert "$DEMO/certs/remote-agent/tls.crt" --tls-key "$DEMO/certs/remote-agent/tls.key" \
  --client-ca "$DEMO/certs/remote-agent/ca.crt" --cluster-id provider \
  --kubeconfig "$PROVIDER" --admin-listen 127.0.0.1:0 \
  --node-label topology.kubernetes.io/region=demo-provider >"$DEMO/remote-agent.log" 2>&1 &
pids+=($!)

say "Starting local-agent in the origin cluster"
ORIGIN_SERVER=$(kubectl --kubeconfig "$ORIGIN" config view -o jsonpath='{.clusters[0].cluster.server}')
ORIGIN_PORT=${ORIGIN_SERVER##*:}
"$B/local-agent" --remote "127.0.0.1:$PORT" \
  --remote-real-storage-class-name standard \
  --home-api-server-host 127.0.0.1 --home-api-server-port "$ORIGIN_PORT" \
  --tls-cert "$DEMO/certs/local-agent/tls.crt" --tls-key "$DEMO/certs/local-agent/tls.key" \
  --server-ca "$DEMO/certs/local-agent/ca.crt" --cluster-id origin --remote-cluster-id provider \
  --kubeconfig "$ORIGIN" --admin-listen 127.0.0.1:0 \
  --node-ip 127.0.0.1 --remote-pod-remap 10.200.0.0/16=10.71.0.0/16 \
  --kubelet-listen "127.0.0.1:$KUBELET_PORT" --kubelet-cert "$DEMO/certs/kubelet/tls.crt" \
  --kubelet-key "$DEMO/certs/kubelet/tls.key" --kubelet-client-ca "$DEMO/clusters/origin/ca.crt" \
  --webhook-listen "127.0.0.1:$WEBHOOK_PORT" --webhook-cert "$DEMO/certs/webhook/tls.crt" \
  --webhook-key "$DEMO/certs/webhook/tls.key" >"$DEMO/local-agent.log" 2>&1 &
pids+=($!)
kubectl --kubeconfig "$ORIGIN" apply -f - >/dev/null <<YAML
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: refract-local-agent}
webhooks:
- name: pods.offloading.refract.io
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  namespaceSelector: {matchLabels: {liqo.io/scheduling-enabled: "true"}}
  clientConfig: {url: "https://127.0.0.1:$WEBHOOK_PORT/mutate-pods", caBundle: $(base64 -w0 "$DEMO/certs/ca/ca.crt")}
  rules: [{operations: [CREATE], apiGroups: [""], apiVersions: [v1], resources: [pods]}]
- name: namespaceoffloadings.offloading.refract.io
  admissionReviewVersions: [v1]
  sideEffects: NoneOnDryRun
  failurePolicy: Ignore
  clientConfig: {url: "https://127.0.0.1:$WEBHOOK_PORT/gate-namespace", caBundle: $(base64 -w0 "$DEMO/certs/ca/ca.crt")}
  rules: [{operations: [CREATE, UPDATE], apiGroups: [offloading.refract.io], apiVersions: [v1alpha1], resources: [namespaceoffloadings]}]
YAML

GFLAGS=(-cacert "$DEMO/certs/ca/ca.crt" -cert "$DEMO/certs/local-agent/tls.crt" -key "$DEMO/certs/local-agent/tls.key")
G=(grpcurl "${GFLAGS[@]}" "127.0.0.1:$PORT")
for _ in $(seq 30); do "${G[@]}" refract.v1.Inspect/ListTenants 2>/dev/null | grep -q '"connected": true' && break; sleep 1; done

say "What the remote agent serves (grpcurl with the origin's client certificate)"
run "${G[@]}" list
say "The connected tenant, as the remote agent sees it"
run "${G[@]}" refract.v1.Inspect/ListTenants
say "Health"
run "${G[@]}" grpc.health.v1.Health/Check
say "A client certificate from another CA is refused"
"$B/refract-certs" ca --out "$DEMO/certs/other-ca" 2>/dev/null
"$B/refract-certs" issue --ca-dir "$DEMO/certs/other-ca" --cluster-id origin --role client --out "$DEMO/certs/intruder" >/dev/null 2>&1
run grpcurl -cacert "$DEMO/certs/ca/ca.crt" -cert "$DEMO/certs/intruder/tls.crt" -key "$DEMO/certs/intruder/tls.key" "127.0.0.1:$PORT" list || true
grep 'refused connection' "$DEMO/remote-agent.log" | tail -1 | sed 's/\x1b\[[0-9;]*m//g' >&2

say "Offloading namespace 'shop': a ConfigMap, a Secret, a Service with its EndpointSlice, an Ingress"
run kubectl --kubeconfig "$ORIGIN" apply -f deploy/local-agent/namespaceoffloading-crd.yaml
kubectl --kubeconfig "$ORIGIN" apply -f - <<'YAML'
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: app-config, namespace: shop, labels: {app: web}}
data: {mode: production}
---
apiVersion: v1
kind: Secret
metadata: {name: db-credentials, namespace: shop}
stringData: {password: s3cr3t}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-origin-pods, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [10.0.3.7], conditions: {ready: true}}]
ports: [{name: http, port: 8080, protocol: TCP}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web, namespace: shop}
spec:
  ingressClassName: nginx
  rules: [{host: shop.example.com, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: local-only, namespace: shop, annotations: {liqo.io/skip-reflection: "true"}}
data: {note: "stays in the origin"}
---
apiVersion: offloading.refract.io/v1alpha1
kind: NamespaceOffloading
metadata: {name: offloading, namespace: shop}
spec: {namespaceMappingStrategy: DefaultName}
YAML
for _ in $(seq 30); do
  kubectl --kubeconfig "$PROVIDER" -n shop-origin get ingress web >/dev/null 2>&1 && break; sleep 1
done
sleep 1
say "The NamespaceOffloading's status in the origin"
run kubectl --kubeconfig "$ORIGIN" -n shop get namespaceoffloading
say "ORIGIN cluster, namespace shop"
run kubectl --kubeconfig "$ORIGIN" -n shop get configmaps,secrets,services,endpointslices,ingresses
say "PROVIDER cluster, twin namespace shop-origin (ClusterIP and node port chosen by the provider; 'local-only' skipped)"
run kubectl --kubeconfig "$PROVIDER" get namespace shop-origin --show-labels
run kubectl --kubeconfig "$PROVIDER" -n shop-origin get configmaps,secrets,services,endpointslices,ingresses -L offloading.refract.io/origin
say "What the remote agent recorded for the tenant (grpcurl, Inspect/ListObjects)"
LIST_OBJECTS='import json, sys
for o in json.load(sys.stdin).get("objects", []):
    r = o["object"]
    where = r.get("namespace", "") + "/" + r["name"] if r.get("namespace") else r["name"]
    print("  %-14s %-36s %s" % (r["kind"], where, o["outcome"]))'
grpcurl "${GFLAGS[@]}" -d '{"clusterId":"origin"}' "127.0.0.1:$PORT" refract.v1.Inspect/ListObjects | python3 -c "$LIST_OBJECTS"
say "Offloading a Deployment: namespace 'apps' with podOffloadingStrategy Remote (the webhook adds toleration and affinity)"
kubectl --kubeconfig "$ORIGIN" apply -f - <<YAML
apiVersion: v1
kind: Namespace
metadata: {name: apps}
---
apiVersion: offloading.refract.io/v1alpha1
kind: NamespaceOffloading
metadata: {name: offloading, namespace: apps}
spec: {podOffloadingStrategy: Remote}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: apps}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
        - name: web
          image: $BUSYBOX
          command: [sh, -c, 'echo "hello from \$(hostname), a real container on the provider"; trap "exit 0" TERM; while true; do sleep 1; done']
          resources: {requests: {cpu: 100m, memory: 16Mi}}
YAML
for _ in $(seq 90); do
  [ "$(kubectl --kubeconfig "$ORIGIN" -n apps get pods --field-selector=status.phase=Running -o name 2>/dev/null | wc -l)" = 3 ] && break; sleep 1
done
say "ORIGIN: pods on the virtual node, Running, with provider IPs remapped (10.200.x -> 10.71.x)"
run kubectl --kubeconfig "$ORIGIN" -n apps get pods -o wide
say "PROVIDER: the same pods in the twin namespace, kept by ShadowPods, running as real containers"
run kubectl --kubeconfig "$PROVIDER" -n apps-origin get shadowpods,pods -o wide
say "ORIGIN: kubectl logs and exec on an offloaded pod, through the virtual node's kubelet API and the mTLS link (the origin holds no provider credential)"
FIRST=$(kubectl --kubeconfig "$PROVIDER" -n apps-origin get pods -o jsonpath='{.items[0].metadata.name}')
run kubectl --kubeconfig "$ORIGIN" -n apps logs "$FIRST"
run kubectl --kubeconfig "$ORIGIN" -n apps exec "$FIRST" -- sh -c 'echo "exec in $(hostname) at $(hostname -i) on the provider"'
say "The virtual node (90% of the provider's free resources, Ready while the link is up)"
run kubectl --kubeconfig "$ORIGIN" get nodes -L liqo.io/type,topology.kubernetes.io/region
run kubectl --kubeconfig "$ORIGIN" describe node "refract-provider" | sed -n '/^Labels/,/^Taints/p;/^Conditions/,/^Addresses/p;/^Capacity/,/^System Info/p'
say "A remote pod deleted on the provider comes back; the origin counts a restart"
VICTIM=$(kubectl --kubeconfig "$PROVIDER" -n apps-origin get pods -o jsonpath='{.items[0].metadata.name}')
run kubectl --kubeconfig "$PROVIDER" -n apps-origin delete pod "$VICTIM" --grace-period=1 --wait=false
for _ in $(seq 60); do
  [ "$(kubectl --kubeconfig "$ORIGIN" -n apps get pod "$VICTIM" -o jsonpath='{.status.containerStatuses[0].restartCount},{.status.containerStatuses[0].ready}')" = 1,true ] && break; sleep 1
done
run kubectl --kubeconfig "$ORIGIN" -n apps get pod "$VICTIM" -o wide
say "Storage fabric and ServiceAccount tokens: a pod with a claim of the virtual class 'liqo' and a projected token"
run kubectl --kubeconfig "$ORIGIN" apply -f deploy/local-agent/storageclass.yaml
# The provider's storage class; the testkit's fake provisioner stands in for real storage.
kubectl --kubeconfig "$PROVIDER" apply -f - >/dev/null <<'YAML'
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: standard}
provisioner: refract.test/fake-provisioner
YAML
kubectl --kubeconfig "$ORIGIN" apply -f - <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data, namespace: apps}
spec: {storageClassName: liqo, accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
---
apiVersion: v1
kind: Pod
metadata: {name: db, namespace: apps}
spec:
  automountServiceAccountToken: false
  containers:
    - name: db
      image: $BUSYBOX
      command: [sh, -c, 'echo "data volume mounted at /data"; trap "exit 0" TERM; while true; do sleep 1; done']
      volumeMounts:
        - {name: data, mountPath: /data}
        - {name: kube-api-access, mountPath: /var/run/secrets/kubernetes.io/serviceaccount}
  volumes:
    - {name: data, persistentVolumeClaim: {claimName: data}}
    - name: kube-api-access
      projected: {sources: [{serviceAccountToken: {path: token, expirationSeconds: 3600}}]}
YAML
for _ in $(seq 90); do
  [ "$(kubectl --kubeconfig "$ORIGIN" -n apps get pod db -o jsonpath='{.status.phase}' 2>/dev/null)" = Running ] && break; sleep 1
done
say "ORIGIN: the claim is Bound to a PV that mirrors the provider's volume and is pinned to the virtual node"
run kubectl --kubeconfig "$ORIGIN" -n apps get pvc -o wide
run kubectl --kubeconfig "$ORIGIN" -n apps get pod db -o wide
run kubectl --kubeconfig "$ORIGIN" get pv -o custom-columns='NAME:.metadata.name,CAPACITY:.spec.capacity.storage,CLASS:.spec.storageClassName,CLAIM:.spec.claimRef.name,PROVIDER-VOLUME:.metadata.annotations.offloading\.refract\.io/remote-volume,NODE-AFFINITY:.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]'
say "PROVIDER: the claim with the peering's storage class 'standard', and the pod's token Secret"
run kubectl --kubeconfig "$PROVIDER" -n apps-origin get pvc
run kubectl --kubeconfig "$PROVIDER" -n apps-origin get secret db-token -L offloading.refract.io/service-account-name
say "The reflected token authenticates at the origin as the pod's service account (TokenReview)"
TOKEN=$(kubectl --kubeconfig "$PROVIDER" -n apps-origin get secret db-token -o json \
  | python3 -c 'import json,sys,base64; d=json.load(sys.stdin)["data"]; print(base64.b64decode(next(iter(d.values()))).decode())')
kubectl --kubeconfig "$ORIGIN" create -o jsonpath='authenticated={.status.authenticated} user={.status.user.username}{"\n"}' -f - <<YAML
apiVersion: authentication.k8s.io/v1
kind: TokenReview
spec: {token: "$TOKEN"}
YAML
run kubectl --kubeconfig "$PROVIDER" -n apps-origin get pod db -o jsonpath='{range .spec.containers[0].env[*]}{.name}={.value}{"\n"}{end}'

say "Preview: what the local agent would send for a Service, offline (local-agent preview)"
kubectl --kubeconfig "$ORIGIN" -n shop get service web -o yaml \
  | run "$B/local-agent" preview -f - --cluster-id origin --remote-cluster-id provider | head -30

cat >&2 <<MSG

Demo is up. Try:
  ${G[*]} refract.v1.Inspect/ListTenants
  grpcurl ${GFLAGS[*]} -d '{"clusterId":"origin"}' 127.0.0.1:$PORT refract.v1.Inspect/Tap
  kubectl --kubeconfig $ORIGIN -n shop get all,cm,secrets
  kubectl --kubeconfig $PROVIDER -n shop-origin get all,cm,secrets
  kubectl --kubeconfig $ORIGIN -n apps scale deployment web --replicas 5
  kubectl --kubeconfig $PROVIDER -n apps-origin get shadowpods,pods -o wide
  kubectl --kubeconfig $PROVIDER -n apps-origin logs $FIRST
Logs: $DEMO/{remote-agent,local-agent,testkit}.log, the provider node's in $DEMO/clusters/provider/node/
MSG
if [ -t 0 ]; then
  echo "Press Ctrl-C to stop everything." >&2
  wait
fi
