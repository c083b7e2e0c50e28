#!/usr/bin/env bash
# Builds the test bed's binaries from the Go module proxy into a cache outside the repo:
#   ${LOCKSTEP_CACHE:-~/.cache/lockstep}/bin/<name>-<version>/<name>
# Does nothing when all are present. Versions live in testbed/versions.env (one place).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck disable=SC1091
source "$here/../testbed/versions.env"
cache="${LOCKSTEP_CACHE:-$HOME/.cache/lockstep}/bin"

# -mod=readonly: the committed go.sum files pin every module; a missing hash fails the build
# instead of resolving anything new.
export CGO_ENABLED=0 GOFLAGS=-mod=readonly
# What upstream's hack/lib/version.sh stamps, into both version packages: `kubectl version`
# and the API server's /version then read v1.34.10, major 1, minor 34.
k8s_ldflags_for() {  # VERSION
  local minor pkg out="-s -w"
  minor="$(echo "$1" | cut -d. -f2)"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    out+=" -X $pkg.gitVersion=$1 -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    out+=" -X $pkg.gitCommit= -X $pkg.gitTreeState=clean"
    out+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$out"
}
k8s_ldflags="$(k8s_ldflags_for "$K8S_VERSION")"

# name version module-dir package [ldflags]
targets=(
  "etcd $ETCD_VERSION etcd go.etcd.io/etcd/server/v3"
  "kube-apiserver $K8S_VERSION k8s k8s.io/kubernetes/cmd/kube-apiserver"
  "kube-scheduler $K8S_VERSION k8s k8s.io/kubernetes/cmd/kube-scheduler"
  # The resourceclaim controller (DRA's ResourceClaimTemplates -> per-pod claims) lives here.
  "kube-controller-manager $K8S_VERSION k8s k8s.io/kubernetes/cmd/kube-controller-manager"
  "kubectl $K8S_VERSION k8s k8s.io/kubernetes/cmd/kubectl"
  "kwok $KWOK_VERSION kwok sigs.k8s.io/kwok/cmd/kwok"
  "scheduler-plugins $SCHEDULER_PLUGINS_VERSION k8s sigs.k8s.io/scheduler-plugins/cmd/scheduler"
  "training-operator $TRAINING_OPERATOR_VERSION kubeflow github.com/kubeflow/training-operator/cmd/training-operator.v1"
  "kueue $KUEUE_VERSION kueue sigs.k8s.io/kueue/cmd/kueue"
  "helm $HELM_VERSION helm helm.sh/helm/v3/cmd/helm"
)

# Other Kubernetes versions the test bed can run (TestBed(k8s=...), LOCKSTEP_K8S_VERSION):
# kube-apiserver, kube-scheduler and kubectl of each, from hack/gomod/k8s-<major.minor>.
for v in ${K8S_EXTRA_VERSIONS:-}; do
  for n in kube-apiserver kube-scheduler kubectl; do
    targets+=("$n $v k8s-$(echo "$v" | sed -E 's/^v([0-9]+[.][0-9]+)[.].*/\1/') k8s.io/kubernetes/cmd/$n")
  done
done

# Other training-operator versions (TRAINING_OPERATOR_EXTRA_VERSIONS), each from
# hack/gomod/kubeflow-<major.minor>: v1.9.3 for PyTorchJobs whose pods use DRA claims.
for v in ${TRAINING_OPERATOR_EXTRA_VERSIONS:-}; do
  targets+=("training-operator $v kubeflow-$(echo "$v" | sed -E 's/^v([0-9]+[.][0-9]+)[.].*/\1/') github.com/kubeflow/training-operator/cmd/training-operator.v1")
done

missing=0
for t in "${targets[@]}"; do
  read -r name version _ _ <<<"$t"
  [ -x "$cache/$name-$version/$name" ] || missing=$((missing + 1))
done
if [ "$missing" -eq 0 ]; then
  echo "build-bins: all ${#targets[@]} binaries present in $cache"
  exit 0
fi

# etcd v3.6.16 and kwok v0.8.0 declare `go 1.26.0` in their go.mod (Kubernetes 1.34 alone would
# do with 1.24); GOTOOLCHAIN=local: never download a toolchain behind the user's back.
need_go="1.26"
export GOTOOLCHAIN=local
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  PATH="$PATH:/usr/local/go/bin"
fi
if ! command -v go >/dev/null 2>&1; then
  echo "build-bins: Go >= $need_go is needed to build kube-apiserver, kube-scheduler, etcd and kwok." >&2
  echo "  Install it from https://go.dev/dl/ (or your distribution) and make sure 'go' is on PATH." >&2
  exit 2
fi
have_go="$(go env GOVERSION | sed 's/^go//')"
if [ "$(printf '%s\n%s\n' "$need_go" "$have_go" | sort -V | head -n1)" != "$need_go" ]; then
  echo "build-bins: Go $have_go is too old; Go >= $need_go is needed (etcd $ETCD_VERSION and kwok $KWOK_VERSION require it)." >&2
  echo "  Install a newer Go from https://go.dev/dl/." >&2
  exit 2
fi

tmp=""
trap '[ -n "$tmp" ] && rm -f "$tmp"' EXIT
start_all=$(date +%s)
for t in "${targets[@]}"; do
  read -r name version moddir pkg <<<"$t"
  out="$cache/$name-$version/$name"
  [ -x "$out" ] && continue
  mkdir -p "$(dirname "$out")"
  flags="-s -w"
  case "$moddir" in
    k8s) flags="$k8s_ldflags" ;;  # scheduler-plugins too: it links Kubernetes $K8S_VERSION
    k8s-*) flags="$(k8s_ldflags_for "$version")" ;;
  esac
  case "$name" in
    etcd) flags="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=lockstep" ;;
    kwok) flags="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" ;;
    # What helm's Makefile stamps: `helm version` reads v3.x, and `helm template` / `helm lint`
    # assume the Kubernetes minor of its client-go (HELM_K8S_MINOR) when no cluster is asked.
    helm) v3pkg=helm.sh/helm/v3
          flags="-s -w -X $v3pkg/internal/version.version=$HELM_VERSION"
          flags+=" -X $v3pkg/internal/version.gitTreeState=clean"
          for p in pkg/lint/rules pkg/chartutil; do
            flags+=" -X $v3pkg/$p.k8sVersionMajor=1 -X $v3pkg/$p.k8sVersionMinor=$HELM_K8S_MINOR"
          done ;;
  esac
  echo "build-bins: building $name $version (one at a time: the kube-apiserver link needs ~2 GB)"
  t0=$(date +%s)
  tmp="$out.tmp.$$"
  if ! (cd "$here/gomod/$moddir" && go build -trimpath -ldflags "$flags" -o "$tmp" "$pkg"); then
    echo "build-bins: building $name failed (see above); nothing was installed for it" >&2
    exit 1
  fi
  mv "$tmp" "$out"  # atomic: a half-written binary never sits at the final path
  tmp=""
  echo "build-bins: $name built in $(( $(date +%s) - t0 ))s"
done
echo "build-bins: done in $(( $(date +%s) - start_all ))s -> $cache"
