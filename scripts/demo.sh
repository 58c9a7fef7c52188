#!/usr/bin/env bash
# The Refract demo: two real Kubernetes control planes on this machine (origin and provider),
# each with a real node, the agents' images pushed to a registry on loopback, the peering made
# with `refractctl peer` as a user makes it (both agents run as pods pulled from that registry),
# and what an operator sees with refractctl, kubectl and grpcurl. Installs or builds what is
# missing first (cached).
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

say "Starting two control planes: origin and provider (etcd + kube-apiserver + scheduler + controller-manager), each with a real node (containerd + kubelet), and an image registry on 127.0.0.1 that the nodes pull the agents from (the images are built with buildah and pushed first)"
"$B/testkit" up --dir "$DEMO/clusters" --cluster origin --cluster provider --controllers \
  --node origin=10.100.0.0/16 --node provider=10.200.0.0/16 --agent-images \
  >"$DEMO/testkit.out" 2>"$DEMO/testkit.log" &
pids+=($!)
for _ in $(seq 900); do grep -q ready "$DEMO/testkit.out" 2>/dev/null && break; kill -0 "${pids[-1]}" 2>/dev/null || break; sleep 1; done
grep -q ready "$DEMO/testkit.out" || { cat "$DEMO/testkit.log"; echo "control planes did not start" >&2; exit 1; }
ORIGIN=$DEMO/clusters/origin/kubeconfig
PROVIDER=$DEMO/clusters/provider/kubeconfig
REGISTRY=$(awk '$1 == "registry" {print $2}' "$DEMO/testkit.out")
grep -E '^(origin|provider):' "$DEMO/testkit.log" | sed 's/\x1b\[[0-9;]*m//g' >&2 || true
echo "agents' images: $REGISTRY/local-agent, $REGISTRY/remote-agent" >&2
# The provider's storage: a stand-in provisioner whose volumes are folders the kubelet creates.
"$B/testkit" fake-provisioner --kubeconfig "$PROVIDER" >"$DEMO/fake-provisioner.log" 2>&1 &
pids+=($!)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
say "Peering the two clusters with refractctl, as a user does: the provider's half (the remote agent, the peering CA), the tenant's key made in the origin and its CertificateSigningRequest approved in the provider, then the origin's half (the local agent, the webhook, the virtual node). Both clusters run on this machine, so the agents use host networking (--single-host)"
run "$B/refractctl" peer --origin-kubeconfig "$ORIGIN" --provider-kubeconfig "$PROVIDER" \
  --origin-id origin --provider-id provider --registry "$REGISTRY" \
  --single-host --grpc-port "$PORT" --remote-admin-port "$(free_port)" --webhook-port "$(free_port)" \
  --local-admin-port "$(free_port)" --kubelet-port "$(free_port)" \
  --local-agent-arg=--remote-pod-remap=10.200.0.0/16=10.71.0.0/16 \
  --local-agent-arg=--remote-real-storage-class-name=standard
say "The peering, as refractctl reports it"
run "$B/refractctl" status --origin-kubeconfig "$ORIGIN"
run "$B/refractctl" version --origin-kubeconfig "$ORIGIN"
run kubectl --kubeconfig "$ORIGIN" -n refract-system get deployments,pods -o wide
run kubectl --kubeconfig "$PROVIDER" -n refract-system get deployments,pods -o wide

# grpcurl with the origin's client certificate, as an operator inspects the link; refractctl
# put it in the origin's Secret (the key was made there and never left).
mkdir -p "$DEMO/certs/local-agent"
for f in tls.crt tls.key ca.crt; do
  kubectl --kubeconfig "$ORIGIN" -n refract-system get secret refract-local-agent-provider-tls \
    -o "go-template={{index .data \"$f\" | base64decode}}" >"$DEMO/certs/local-agent/$f"
done
GFLAGS=(-cacert "$DEMO/certs/local-agent/ca.crt" -cert "$DEMO/certs/local-agent/tls.crt" -key "$DEMO/certs/local-agent/tls.key")
G=(grpcurl "${GFLAGS[@]}" "127.0.0.1:$PORT")

say "What the remote agent serves (grpcurl with the origin's client certificate)"
run "${G[@]}" list
say "The connected tenant, as the remote agent sees it"
run "${G[@]}" refract.v1.Inspect/ListTenants
say "Health"
run "${G[@]}" grpc.health.v1.Health/Check
say "A client certificate from another CA is refused"
"$B/refract-certs" ca --out "$DEMO/certs/other-ca" 2>/dev/null
"$B/refract-certs" issue --ca-dir "$DEMO/certs/other-ca" --cluster-id origin --role client --out "$DEMO/certs/intruder" >/dev/null 2>&1
run grpcurl -cacert "$DEMO/certs/local-agent/ca.crt" -cert "$DEMO/certs/intruder/tls.crt" -key "$DEMO/certs/intruder/tls.key" "127.0.0.1:$PORT" list || true
sleep 1
kubectl --kubeconfig "$PROVIDER" -n refract-system logs deployment/refract-remote-agent --tail=200 \
  | grep 'refused connection' | tail -1 | sed 's/\x1b\[[0-9;]*m//g' >&2 || true

say "Offloading namespace 'shop': a ConfigMap, a Secret, a Service with its EndpointSlice, an Ingress"
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
run kubectl --kubeconfig "$ORIGIN" get nodes -L liqo.io/type
run kubectl --kubeconfig "$ORIGIN" describe node "refract-provider" | sed -n '/^Labels/,/^Taints/p;/^Conditions/,/^Addresses/p;/^Capacity/,/^System Info/p'
say "A remote pod deleted on the provider comes back; the origin counts a restart"
VICTIM=$(kubectl --kubeconfig "$PROVIDER" -n apps-origin get pods -o jsonpath='{.items[0].metadata.name}')
run kubectl --kubeconfig "$PROVIDER" -n apps-origin delete pod "$VICTIM" --grace-period=1 --wait=false
for _ in $(seq 60); do
  [ "$(kubectl --kubeconfig "$ORIGIN" -n apps get pod "$VICTIM" -o jsonpath='{.status.containerStatuses[0].restartCount},{.status.containerStatuses[0].ready}')" = 1,true ] && break; sleep 1
done
run kubectl --kubeconfig "$ORIGIN" -n apps get pod "$VICTIM" -o wide
say "Storage fabric and ServiceAccount tokens: a pod with a claim of the virtual class 'liqo' and a projected token"
# refractctl installed the origin's virtual storage class 'liqo'. The provider's storage class: the
# testkit's fake provisioner stands in for real storage.
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
  $B/refractctl status --origin-kubeconfig $ORIGIN
  $B/refractctl tap --origin-kubeconfig $ORIGIN --provider-id provider
  $B/refractctl unpeer --origin-kubeconfig $ORIGIN --provider-kubeconfig $PROVIDER --provider-id provider
Logs: kubectl --kubeconfig $ORIGIN -n refract-system logs deployment/refract-local-agent-provider,
      kubectl --kubeconfig $PROVIDER -n refract-system logs deployment/refract-remote-agent,
      $DEMO/testkit.log, the nodes' in $DEMO/clusters/{origin,provider}/node/
MSG
if [ -t 0 ]; then
  echo "Press Ctrl-C to stop everything." >&2
  wait
fi
