#!/usr/bin/env bash
# Builds the test bed's binaries from the Go module proxy into a cache outside the repo:
#   ${LOCKSTEP_CACHE:-~/.cache/lockstep}/bin/<name>-<version>/<name>
# Does nothing when all are present. Versions live in testbed/versions.env (one place).
#
# --check: build nothing; prove that every target, extra versions included, resolves from the
# committed go.mod/go.sum alone (`go list -mod=readonly -deps`, no compile: seconds once the
# modules are downloaded). A warm binary cache skips the build, so without this a go.sum that
# no longer resolves a binary stays hidden until a fresh machine meets it. .ci/run runs it first.
#
# NAME...: only the targets of those names (every version of each), for example
# `hack/build-bins.sh jobset lws trainer` to build (or measure cold) one controller alone.
set -euo pipefail
mode=build
only=()
for arg in "$@"; do
  case "$arg" in
    --check) mode=check ;;
    -*) echo "usage: $0 [--check] [NAME...]" >&2; exit 2 ;;
    *) only+=("$arg") ;;
  esac
done
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
  "jobset $JOBSET_VERSION jobset sigs.k8s.io/jobset"
  "lws $LWS_VERSION lws sigs.k8s.io/lws/cmd"
  "trainer $TRAINER_VERSION trainer github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"
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

if [ "${#only[@]}" -ne 0 ]; then  # NAME...: keep those targets alone
  kept=()
  for t in "${targets[@]}"; do
    read -r name _ _ _ <<<"$t"
    case " ${only[*]} " in *" $name "*) kept+=("$t") ;; esac
  done
  if [ "${#kept[@]}" -eq 0 ]; then
    echo "build-bins: no target named ${only[*]}" >&2
    exit 2
  fi
  targets=("${kept[@]}")
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

if [ "$mode" = check ]; then
  # One `go list` per module directory, over all of that directory's packages.
  declare -A pkgs=()
  for t in "${targets[@]}"; do
    read -r _ _ moddir pkg <<<"$t"
    pkgs[$moddir]+=" $pkg"
  done
  t0=$(date +%s)
  failed=0
  for moddir in "${!pkgs[@]}"; do
    # shellcheck disable=SC2086  # the package list is meant to split
    if ! out="$(cd "$here/gomod/$moddir" && go list -mod=readonly -deps ${pkgs[$moddir]} 2>&1 >/dev/null)"; then
      echo "build-bins --check: hack/gomod/$moddir does not resolve${pkgs[$moddir]}:" >&2
      echo "$out" | head -n 20 >&2
      failed=$((failed + 1))
    fi
  done
  if [ "$failed" -ne 0 ]; then
    echo "build-bins --check: $failed module set(s) do not resolve from their go.sum; fix with" >&2
    echo "  (cd hack/gomod/<set> && go mod tidy) or add the missing line go names" >&2
    exit 1
  fi
  echo "build-bins --check: all ${#targets[@]} targets in ${#pkgs[@]} module sets resolve from go.sum ($(( $(date +%s) - t0 ))s)"
  exit 0
fi

missing=0
for t in "${targets[@]}"; do
  read -r name version _ _ <<<"$t"
  [ -x "$cache/$name-$version/$name" ] || missing=$((missing + 1))
done
if [ "$missing" -eq 0 ]; then
  echo "build-bins: all ${#targets[@]} binaries present in $cache"
  exit 0
fi

# Module sets build side by side, LOCKSTEP_BUILD_JOBS at a time (default 2), the largest first;
# the targets of one set build in turn, so they share its compile cache instead of compiling
# the same packages twice at once. One `go build` already spreads its compiles over the cores,
# but its downloads, its link and the tail of each build leave a core idle: a second set fills
# it. Two kube-apiserver links at once peak near 4 GB, well inside the bed's memory.
build_one() {  # name version moddir pkg
  local name=$1 version=$2 moddir=$3 pkg=$4 flags t0 out tmp
  out="$cache/$name-$version/$name"
  [ -x "$out" ] && return 0
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
  echo "build-bins: building $name $version (hack/gomod/$moddir)"
  t0=$(date +%s)
  tmp="$out.tmp.$$"
  if ! (cd "$here/gomod/$moddir" && go build -trimpath -ldflags "$flags" -o "$tmp" "$pkg"); then
    rm -f "$tmp"
    echo "build-bins: building $name $version failed (see above); nothing was installed for it" >&2
    return 1
  fi
  mv "$tmp" "$out"  # atomic: a half-written binary never sits at the final path
  echo "build-bins: $name $version built in $(( $(date +%s) - t0 ))s"
}

build_set() {  # moddir: its targets in order, stopping at the first failure
  local t name version moddir pkg
  for t in "${targets[@]}"; do
    read -r name version moddir pkg <<<"$t"
    [ "$moddir" = "$1" ] || continue
    build_one "$name" "$version" "$moddir" "$pkg" || return 1
  done
}

# The sets in order of their cold build time, measured (docs/testbed.md): largest first.
order=(k8s-1.37 k8s kueue trainer kubeflow helm lws jobset kubeflow-1.9 kwok etcd)
sets=()
for m in "${order[@]}"; do
  for t in "${targets[@]}"; do
    read -r _ _ moddir _ <<<"$t"
    if [ "$moddir" = "$m" ]; then sets+=("$m"); break; fi
  done
done
for t in "${targets[@]}"; do  # any set not named in the order, last
  read -r _ _ moddir _ <<<"$t"
  case " ${sets[*]} " in *" $moddir "*) ;; *) sets+=("$moddir") ;; esac
done

jobs_max="${LOCKSTEP_BUILD_JOBS:-2}"
start_all=$(date +%s)
declare -A pid_set=()
failed=()
reap() {  # wait for one set to finish and note whether it failed
  local pid rc=0
  wait -n -p pid || rc=$?
  [ "$rc" -eq 0 ] || failed+=("${pid_set[$pid]}")
  unset "pid_set[$pid]"
}
for m in "${sets[@]}"; do
  while [ "${#pid_set[@]}" -ge "$jobs_max" ]; do reap; done
  build_set "$m" &
  pid_set[$!]="$m"
done
while [ "${#pid_set[@]}" -gt 0 ]; do reap; done
if [ "${#failed[@]}" -ne 0 ]; then
  echo "build-bins: the module set(s) ${failed[*]} failed to build (see above)" >&2
  exit 1
fi
echo "build-bins: done in $(( $(date +%s) - start_all ))s -> $cache"
